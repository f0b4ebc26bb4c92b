"""The runtime: executes a physical plan exactly as planned, and counts what happened."""
