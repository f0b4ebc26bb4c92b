"""Storage: URIs, Zarr arrays on S3 or local disk, block reads on workers, staged output commit."""

from arrayjob.io.storage import Location, StorageCounters, StorageOptions, parse_uri

__all__ = ["Location", "StorageCounters", "StorageOptions", "parse_uri"]
