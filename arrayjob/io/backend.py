"""The storage interface: one ``StorageBackend`` per storage system, chosen by ``backend_for``.

A backend is rooted at a ``Location`` (a directory or an S3 prefix). It opens Zarr stores
there, each wrapped in a ``CountingStore`` so that bytes and requests are counted in the
process that makes them, and moves whole objects by key: ``"report.json"``,
``"runs/<run id>/result.zarr/zarr.json"``; the empty key is the location itself.

Whole-object operations fail with ``OSError``: ``FileNotFoundError`` for a missing
object, ``FileExistsError`` when an exclusive write finds one. The concrete backends are
private modules (``io/_local.py``, ``io/_s3.py``)::

    backend = backend_for(parse_uri("s3://bucket/out"), StorageOptions())
    backend.write_bytes("_SUCCESS", b"{}", exclusive=True)
"""

from __future__ import annotations

import importlib
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

from arrayjob.io.locations import Location, StorageCounters, StorageOptions
from arrayjob.io.transient import transient

# scheme -> "module:class"; a backend's storage library is imported only when it is used
_BACKENDS = {"file": "arrayjob.io._local:LocalBackend", "s3": "arrayjob.io._s3:S3Backend"}


# Zarr's metadata documents: absent ones are probed when an array is opened (v2 and v3 alike)
_METADATA_KEYS = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})


class MissingChunk(Exception):  # noqa: N818 - a signal caught by io.arrays.read_block, never shown
    """A chunk (or shard) object that a read needed is absent from a store that refuses fill values."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class CountingStore(WrapperStore[Store]):
    """A Zarr store that counts the GET and PUT requests and bytes of the store it wraps.

    ``refuse_missing``: a GET of a chunk key that finds no object raises ``MissingChunk``
    instead of returning nothing, which Zarr would read as the array's fill value. The
    GET is the one Zarr makes anyway, so refusing costs no request.
    """

    def __init__(self, store: Store, counters: StorageCounters | None = None, *,
                 refuse_missing: bool = False) -> None:
        super().__init__(store)
        self.counters = counters if counters is not None else StorageCounters()
        self.refuse_missing = refuse_missing

    def _with_store(self, store: Store) -> CountingStore:
        return type(self)(store, self.counters, refuse_missing=self.refuse_missing)

    def _absent(self, key: str) -> None:
        if self.refuse_missing and key.rsplit("/", 1)[-1] not in _METADATA_KEYS:
            raise MissingChunk(key)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        value = await self._store.get(key, prototype, byte_range)
        self.counters.get_requests += 1
        if value is None:
            self._absent(key)
        else:
            self.counters.bytes_read += len(value)
        return value

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        values = await self._store.get_partial_values(prototype, key_ranges)
        self.counters.get_requests += len(key_ranges)
        self.counters.bytes_read += sum(len(v) for v in values if v is not None)
        for (key, _), value in zip(key_ranges, values, strict=True):
            if value is None:
                self._absent(key)
        return values

    async def set(self, key: str, value: Buffer) -> None:
        await self._store.set(key, value)
        self.counters.put_requests += 1
        self.counters.bytes_written += len(value)

    async def exists(self, key: str) -> bool:
        self.counters.get_requests += 1  # a HEAD request on S3
        return await self._store.exists(key)


class StorageBackend(ABC):
    """Zarr stores and whole objects under one location of one storage system."""

    def __init__(self, location: Location, options: StorageOptions) -> None:
        self.location = location
        self.options = options

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.location)!r})"

    def child(self, *parts: str) -> StorageBackend:
        """The same storage rooted at ``location.join(*parts)``."""
        return type(self)(self.location.join(*parts), self.options)

    # Zarr

    def zarr_store(self, *, read_only: bool, counters: StorageCounters | None = None) -> CountingStore:
        """The Zarr store (array or group) at this location, counting into ``counters``."""
        return CountingStore(self._zarr_store(read_only=read_only), counters)

    def block_store(self, counters: StorageCounters | None = None, *, refuse_missing: bool = True) -> CountingStore:
        """A read-only store for a worker's chunk-aligned block reads (the load stage); a
        missing chunk raises ``MissingChunk`` unless ``refuse_missing`` is false."""
        return CountingStore(self._zarr_store(read_only=True), counters, refuse_missing=refuse_missing)

    @abstractmethod
    def _zarr_store(self, *, read_only: bool) -> Store: ...

    # whole objects, by key under the location

    @abstractmethod
    def exists(self, key: str = "") -> bool:
        """Whether the object ``key`` exists (a prefix with objects under it is not one)."""

    @abstractmethod
    def read_bytes(self, key: str = "") -> bytes:
        """The content of the object ``key``; ``FileNotFoundError`` if there is none."""

    @abstractmethod
    def write_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> None:
        """Write the object ``key`` whole; a reader sees the old or the new content, never a part.

        ``exclusive``: create only, atomically; ``FileExistsError`` if ``key`` exists (a
        conditional PUT on S3), so that of two writers exactly one succeeds.
        """

    @abstractmethod
    def list(self, prefix: str = "") -> dict[str, int]:
        """Every object under ``prefix/`` (recursively), by key relative to the location,
        sorted, with its size in bytes. An object named ``prefix`` itself is not listed."""

    @abstractmethod
    def move(self, moves: Iterable[tuple[str, str]]) -> int:
        """Move objects (source key, target key), replacing targets; returns the requests
        it took (renames on a filesystem take none, server-side copies one PUT each)."""

    @abstractmethod
    def delete(self, prefix: str = "") -> None:
        """Delete the object ``prefix`` and every object under ``prefix/``; nothing there is fine."""

    # byte ranges of one object (a Parquet file's footer and column chunks), each one GET,
    # counted into ``counters`` as a Zarr store counts its own

    def read_range(self, key: str, start: int, stop: int, counters: StorageCounters | None = None) -> memoryview:
        """Bytes [start, stop) of the object ``key`` (fewer if it ends first): one ranged GET.

        A read-only view, not a copy: of the file's pages mapped (a big range on local disk) or
        of the response's body (S3). The Parquet load decodes column chunks from it; copying
        them into a ``bytes`` first cost as much as decoding them (``benchmarks/parquet.py``)."""
        data = self._read_range(key, start, stop)
        _count_get(counters, data)
        return data

    def read_tail(self, key: str, length: int, counters: StorageCounters | None = None) -> tuple[bytes, int]:
        """The last ``length`` bytes of the object ``key`` (all of it, if shorter) and its size
        in bytes: one GET (a suffix range on S3, which needs no size first)."""
        data, size = self._read_tail(key, length)
        _count_get(counters, data)
        return data, size

    @abstractmethod
    def _read_range(self, key: str, start: int, stop: int) -> memoryview: ...

    @abstractmethod
    def _read_tail(self, key: str, length: int) -> tuple[bytes, int]: ...

    def bucket_exists(self) -> bool:
        """Whether the bucket the location lies in exists (a filesystem has none: True)."""
        return True

    def prune(self) -> None:  # noqa: B027 - a no-op where storage has no directories
        """Remove the empty directories under the location, itself included, that deletes
        left behind (a filesystem's; an object store has none). Never removes an object."""

    # checks before a run writes here (``JobOutput.check``): prompt, and they leave nothing

    @abstractmethod
    def check_reachable(self) -> None:
        """Check, reading only, that objects could live here: the storage answers (within
        seconds, not after minutes of retries), the bucket exists, no file stands where a
        directory must be. ``OSError`` whose message says what is wrong."""

    @abstractmethod
    def probe_write(self, key: str) -> int | None:
        """Create the empty object ``key`` and delete it again, with no retries to speak of;
        ``OSError`` saying why it cannot be written. Returns the bytes free for objects
        here, or None where storage sets no limit."""


def _count_get(counters: StorageCounters | None, data: bytes | memoryview) -> None:
    if counters is not None:
        counters.get_requests += 1
        counters.bytes_read += data.nbytes if isinstance(data, memoryview) else len(data)


def backend_for(location: Location, options: StorageOptions) -> StorageBackend:
    """The backend of ``location``'s storage system, rooted at ``location``."""
    try:
        module, _, name = _BACKENDS[location.scheme].partition(":")
    except KeyError:
        raise ValueError(f"no storage backend for scheme {location.scheme!r} (known: {', '.join(_BACKENDS)})") from None
    backend: type[StorageBackend] = getattr(importlib.import_module(module), name)
    return backend(location, options)


def is_storage_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the storage failing (retryable), as opposed to missing or bad content."""
    if isinstance(exc, FileNotFoundError):
        return False
    module: Any = type(exc).__module__
    return isinstance(exc, (ConnectionError, TimeoutError, OSError)) or module.startswith(
        ("aiohttp", "botocore", "obstore")
    )


def is_storage_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is the storage being unavailable (no answer, a dropped or refused
    connection, a timeout, a 5xx after the retries): a rerun later may succeed, so a
    scheduler should retry (exit 4). A refusal (403), a missing object or bucket and a bad
    name stay wrong however often they are retried (exit 2)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, FileExistsError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return transient(exc)


# object_store's request failures: "Generic S3 error: Error performing GET <url> in 1.7s,
# after 10 retries, max_retries: 10, retry_timeout: 180s  - HTTP error: error sending request"
# (no "after ..." when it did not retry); a refusal ends "... status code: 403 Forbidden: <Error>..."
_REQUEST_FAILURE = re.compile(r"Error performing (\w+) (\S+) in [^,-]*(?:, after (\d+) retries[^-]*)? - (.+)$")


def failed_request(exc: BaseException) -> tuple[str, str, str] | None:
    """The method, URL and cause ("403 Forbidden", "error sending request") of a failed S3
    request, if ``exc`` is one."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    match = _REQUEST_FAILURE.search(text)
    if not match:
        return None
    method, url, _, cause = match.groups()
    cause = cause.strip()
    if status := re.search(r"status code: (\d{3} [^:]*)", cause):
        cause = status.group(1).strip()
    elif cause.startswith("HTTP error: "):
        cause = cause.removeprefix("HTTP error: ")
    return method, url, cause


def describe_failure(exc: BaseException) -> str:
    """One short line for ``exc``: its first line, a failed request as "GET <url>: <cause>"
    (with the attempts made, when the storage layer retried it)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if request := failed_request(exc):
        method, url, cause = request
        text = f"{method} {url}: {cause}"
    attempts = getattr(exc, "attempts", 1)
    if attempts > 1:
        text += f" (after {attempts} attempts)"
    return text if len(text) < 200 else text[:197] + "..."


# Retries of transient request failures, counted by every storage client of this process
# (``io._s3``: obstore's requests and botocore's). A Ray worker runs one task at a time, so
# a task's retries are the difference across it (``io.arrays.read_block``).
_retries = 0
_retries_lock = threading.Lock()


def count_retries(n: int = 1) -> None:
    global _retries
    with _retries_lock:
        _retries += n


def storage_retries() -> int:
    """The requests this process has retried after a transient failure, so far."""
    return _retries
