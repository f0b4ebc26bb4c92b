"""Where bytes live, by location: Zarr stores that count their requests, whole objects by
path, and the storage backend behind both (``io.backend``).

A URI is ``s3://bucket/key``, ``file:///abs/path`` or a local path (relative to the
working directory). Every Zarr store arrayjob opens is wrapped in a ``CountingStore``
so that bytes and requests are counted where they happen, on whichever process does
the I/O, and reported back with the task's result.
"""

from __future__ import annotations

from arrayjob.io.backend import CountingStore, StorageBackend, backend_for
from arrayjob.io.locations import Location, StorageCounters, StorageOptions, parse_uri

__all__ = ["CountingStore", "ObjectPaths", "StorageBackend", "backend_for", "filesystem", "parse_uri",
           "quiet_async_teardown", "zarr_store"]


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


class ObjectPaths:
    """Whole objects by full path ("bucket/key" on S3, an absolute path on disk), in the
    few fsspec-style calls that callers outside ``io`` make; each goes through the backend
    rooted at that path."""

    def __init__(self, scheme: str, options: StorageOptions) -> None:
        self.scheme = scheme
        self.options = options

    def _at(self, path: str) -> StorageBackend:
        return backend_for(Location(self.scheme, path), self.options)

    def exists(self, path: str) -> bool:
        """Whether an object, or any object under ``path/``, exists."""
        backend = self._at(path)
        return backend.exists() or bool(backend.list())

    def cat_file(self, path: str) -> bytes:
        return self._at(path).read_bytes()

    cat = cat_file

    def pipe_file(self, path: str, data: bytes) -> None:
        self._at(path).write_bytes("", data)

    def rm(self, path: str, recursive: bool = False) -> None:
        """Delete the object ``path`` (and, with ``recursive``, everything under it)."""
        backend = self._at(path)
        if recursive or backend.exists():
            backend.delete()
        else:
            raise FileNotFoundError(path)


def filesystem(scheme: str, options: StorageOptions) -> ObjectPaths:
    """Whole objects by full path on the storage of ``scheme`` (see ``ObjectPaths``)."""
    return ObjectPaths(scheme, options)


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
