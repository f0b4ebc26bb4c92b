"""Storage: URIs, Zarr arrays on S3 or local disk, block reads on workers, staged output commit.

The package imports nothing itself: ``io.locations`` is plain data the planner may use;
the other modules reach storage libraries."""
