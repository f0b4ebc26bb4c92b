"""Zarr stores by location, counting their requests, through the storage backend of the
location's scheme (``io.backend``).

A URI is ``s3://bucket/key``, ``file:///abs/path`` or a local path (relative to the
working directory). Every Zarr store arrayjob opens is wrapped in a ``CountingStore``
so that bytes and requests are counted where they happen, on whichever process does
the I/O, and reported back with the task's result.
"""

from __future__ import annotations

from arrayjob.io.backend import CountingStore, backend_for
from arrayjob.io.locations import Location, StorageCounters, StorageOptions


def zarr_store(
    location: Location,
    options: StorageOptions,
    *,
    read_only: bool,
    counters: StorageCounters | None = None,
    for_blocks: bool = False,
) -> CountingStore:
    """Open the Zarr store at ``location``, counting its requests into ``counters``.

    ``for_blocks``: the read-only store a worker reads its blocks through
    (``StorageBackend.block_store``).
    """
    backend = backend_for(location, options)
    if for_blocks and read_only:
        return backend.block_store(counters)
    return backend.zarr_store(read_only=read_only, counters=counters)


def quiet_async_teardown() -> None:
    """Drop one known piece of noise: after a failed S3 request, aiobotocore (under s3fs,
    which a user's own zarr/fsspec code in the same process may use) leaves a coroutine
    that Python finalises at exit in another context, printing "Exception ignored in:
    <coroutine …>" with a ValueError from contextvars. It follows a one-line error and says
    nothing more, so it is not printed; every other unraisable error still is."""
    import sys

    default = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        exc, obj = unraisable.exc_value, unraisable.object
        text = f"{type(obj).__module__}.{getattr(obj, '__qualname__', '')}"
        if isinstance(exc, ValueError) and "was created in a different Context" in str(exc) and (
            "coroutine" in type(obj).__name__ or "botocore" in text or "zarr" in text or "s3fs" in text
        ):
            return
        default(unraisable)

    sys.unraisablehook = hook
