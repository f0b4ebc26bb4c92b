"""arrayjob: batch jobs of distributed linear-algebra ML over chunked Zarr arrays, on Ray."""

__version__ = "0.1.0"
