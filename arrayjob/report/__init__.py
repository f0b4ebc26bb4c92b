"""The run report: report.json built from what a run measured and what the estimate said,
and report.html rendered from it."""
