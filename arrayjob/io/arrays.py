"""Zarr arrays by URI: metadata for the planner, block reads for the workers, writes for results.

Only metadata is read on the driver (``open_array_info``; a sparse group's in ``io.sparse``);
chunks are read by whichever process runs ``read_block``, so the driver never holds a big
array. ``read_block`` reads a dense array's block (``io.dense``), a sparse group's row block
(``io.sparse``) or a Parquet dataset's (``io.parquet_blocks``), whichever ``info`` is.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr
import zarr.errors
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.core.array_spec import ArrayConfigParams
from zarr.core.sync import sync

from arrayjob.errors import ArrayNotFound, GroupNotArray, InputError, StorageError
from arrayjob.io.backend import backend_for, describe_failure, is_storage_failure, is_storage_outage
from arrayjob.io.dense import chunk_key, failed_read, missing_chunk_message, read_dense_block
from arrayjob.io.locations import ArrayInfo, Location, StorageCounters, StorageOptions
from arrayjob.io.sparse import member_info, read_sparse_block, stored_members
from arrayjob.io.storage import zarr_store


def open_array_info(name: str, location: Location, options: StorageOptions, *,
                    missing_chunks: str = "error") -> ArrayInfo:
    """Read the metadata of the array named ``name`` (``inputs.<name>`` in errors).

    ``missing_chunks``: "error" (a chunk absent from storage is lost data: reading it fails)
    or "fill" (a sparse array: absent chunks read as the fill value)."""
    try:
        array = zarr.open_array(store=zarr_store(location, options, read_only=True), mode="r")
    except (FileNotFoundError, zarr.errors.ArrayNotFoundError, zarr.errors.NodeNotFoundError):
        if not _bucket_exists(location, options):
            bucket = location.path.partition("/")[0]
            raise InputError(f"inputs.{name}: bucket {bucket!r} does not exist (reading {location})") from None
        if _is_group(location, options):  # Zarr v2 says "no array" where v3 says "a group"
            raise GroupNotArray(f"inputs.{name}: {location} is a Zarr group, expected an array") from None
        raise ArrayNotFound(f"inputs.{name}: no Zarr array at {location}") from None
    except zarr.errors.NodeTypeValidationError:
        raise GroupNotArray(f"inputs.{name}: {location} is a Zarr group, expected an array") from None
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line naming the array
        if is_storage_outage(exc):
            raise StorageError(f"inputs.{name}: cannot read {location}: {describe_failure(exc)}") from None
        if is_storage_failure(exc):
            raise InputError(f"inputs.{name}: cannot read {location}: {describe_failure(exc)}") from None
        raise InputError(f"inputs.{name}: {location} is not a readable Zarr array: {describe_failure(exc)}") from None
    chunks = array.shards or array.chunks
    return ArrayInfo(
        name=name,
        location=location,
        shape=tuple(int(s) for s in array.shape),
        dtype=str(array.dtype),
        chunks=tuple(int(c) for c in chunks),
        zarr_format=int(array.metadata.zarr_format),
        missing_chunks=missing_chunks,
    )


def check_chunks_stored(info: ArrayInfo, options: StorageOptions) -> None:
    """Check that the first and the last chunk (or shard) of ``info`` exist: two HEAD requests
    that catch metadata declaring a shape the stored data do not have, before any planning.
    An empty array, or one whose missing chunks are to be read as fill values, passes. Of a
    sparse group, the chunks of ``data`` and ``indices`` (``indptr`` was read whole). A Parquet
    dataset passes: opening it read every file's footer, at its end."""
    if info.table is not None:
        return
    if info.sparse is not None:
        for member in stored_members(info):
            if member != "indptr":
                check_chunks_stored(member_info(info, member), options)
        return
    if info.missing_chunks == "fill" or 0 in info.shape:
        return
    try:
        store = backend_for(info.location, options).zarr_store(read_only=True)
        array = zarr.open_array(store=store, mode="r")
        grid = array.cdata_shape if array.shards is None else tuple(
            -(-s // c) for s, c in zip(array.shape, array.shards, strict=True))
        first = tuple(0 for _ in grid)
        last = tuple(g - 1 for g in grid)
        for index in dict.fromkeys([first, last]):
            key = chunk_key(array, index)
            if not sync(store.exists(key)):
                raise InputError(missing_chunk_message(info, key, array.shards is not None))
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001
        if is_storage_failure(exc):
            raise StorageError(f"inputs.{info.name}: {failed_read(info, 'the first and last chunks', exc, doing='checking')}") from None
        raise InputError(f"inputs.{info.name}: {info.uri} is not a readable Zarr array: "
                         f"{describe_failure(exc)}") from None


def _is_group(location: Location, options: StorageOptions) -> bool:
    try:
        zarr.open_group(store=zarr_store(location, options, read_only=True), mode="r")
    except Exception:  # noqa: BLE001 - no group there either
        return False
    return True


def read_group_attrs(location: Location, options: StorageOptions) -> dict[str, Any]:
    """The attributes of the Zarr group at ``location`` (metadata only: a published model's result)."""
    try:
        return dict(zarr.open_group(store=zarr_store(location, options, read_only=True), mode="r").attrs)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{location}: cannot read the group's attributes: {describe_failure(exc)}") from None


def _bucket_exists(location: Location, options: StorageOptions) -> bool:
    try:
        return backend_for(location, options).bucket_exists()
    except Exception:  # noqa: BLE001 - cannot tell: say what was not found instead
        return True


# How arrayjob writes arrays: every chunk stored, even one equal to the fill value (Zarr
# skips those by default), so a chunk missing from an array arrayjob wrote is lost data.
EVERY_CHUNK: ArrayConfigParams = {"write_empty_chunks": True}


def read_block(info: ArrayInfo, selection: tuple[slice, ...], options: StorageOptions) -> tuple[Any, StorageCounters]:
    """Read ``info[selection]``: a NumPy array, or of a sparse group (``info.sparse``) a SciPy
    CSR matrix of the rows ``selection[0]``; returns it and the requests it took.

    A missing chunk (unless ``info.missing_chunks`` is "fill") or a chunk that fails to decode
    (a checksum mismatch, bytes of the wrong size) is an ``InputError`` naming it; so is a null
    in a Parquet column (``info.table``), unless its input reads nulls as 0."""
    if info.table is not None:
        from arrayjob.io.parquet_blocks import (
            read_table_block,  # pyarrow, only where Parquet is read
        )

        return read_table_block(info, selection, options)
    if info.sparse is not None:
        return read_sparse_block(info, selection, options)
    return read_dense_block(info, selection, options)


def read_whole(info: ArrayInfo, options: StorageOptions, metrics: Any = None) -> np.ndarray:
    """Read a small array (factor matrices, initial centroids) on the driver, counted."""
    block, counters = read_block(info, tuple(slice(0, s) for s in info.shape), options)
    if metrics is not None:
        metrics.count_storage(counters)
    return block


@functools.lru_cache(maxsize=64)
def _open_for_writing(info: ArrayInfo, options: StorageOptions) -> tuple[zarr.Array, StorageCounters]:
    counters = StorageCounters()
    store = zarr_store(info.location, options, read_only=False, counters=counters)
    return zarr.open_array(store=store, mode="r+").with_config(EVERY_CHUNK), counters  # open_array drops config


def write_block(target: ArrayInfo, options: StorageOptions, selection: tuple[tuple[int, int], ...],
                block: np.ndarray) -> np.ndarray:
    """Write one block into a stored array (a task's body, ``planner.physical.WriteBlock``);
    returns [bytes written, PUTs]. Blocks cover whole chunks, so concurrent writers never
    touch the same chunk, and a retried task rewrites the same bytes (idempotent)."""
    try:
        array, counters = _open_for_writing(target, options)
        before = (counters.bytes_written, counters.put_requests)
        array[tuple(slice(a, b) for a, b in selection)] = block
    except Exception as exc:  # noqa: BLE001
        _open_for_writing.cache_clear()
        raise StorageError(f"output: writing a block of {target.uri} failed: {describe_failure(exc)}") from None
    return np.array([counters.bytes_written - before[0], counters.put_requests - before[1]], dtype=np.int64)


def create_array(
    location: Location,
    options: StorageOptions,
    *,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    dtype: str,
    counters: StorageCounters | None = None,
    checksum: bool = False,
) -> zarr.Array:
    """Create (replacing) an uncompressed Zarr v3 array for writing block by block.

    ``checksum``: each chunk ends with its CRC32C (Zarr's ``crc32c`` codec), which every
    read verifies: a chunk damaged at rest is refused instead of read as numbers.
    Every chunk is stored, even one that equals the fill value (Zarr skips those by
    default): a chunk missing from an array arrayjob wrote is lost data, as in any input.
    """
    store = zarr_store(location, options, read_only=False, counters=counters)
    return zarr.create_array(
        store=store, shape=shape, chunks=chunks, dtype=dtype, overwrite=True,
        compressors=[Crc32cCodec()] if checksum else None, config=EVERY_CHUNK,
    )


class ResultGroup:
    """The result Zarr v3 group of a run, in staging: big arrays are created here first and
    written by the workers; small arrays and attributes are added by the driver at the end."""

    def __init__(self, location: Location, options: StorageOptions) -> None:
        self.location = location
        self.options = options
        self.counters = StorageCounters()
        self._created = False

    def create_array(self, name: str, *, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: str) -> ArrayInfo:
        """An empty array the workers fill block by block (``lazy.store``)."""
        location = self.location.join(name)
        try:
            if not self._created:  # written only once a job has outputs to store
                zarr.open_group(store=zarr_store(self.location, self.options, read_only=False, counters=self.counters),
                                mode="w", zarr_format=3)
                self._created = True
            create_array(location, self.options, shape=shape, chunks=chunks, dtype=dtype, counters=self.counters,
                         checksum=True)
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"output: creating {location} failed: {describe_failure(exc)}") from None
        return ArrayInfo(name, location, tuple(shape), str(np.dtype(dtype)), tuple(chunks), 3)


def write_group(
    location: Location,
    options: StorageOptions,
    arrays: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any],
    counters: StorageCounters | None = None,
) -> None:
    """Add small arrays and attributes to the Zarr v3 group at ``location`` (created if new)."""
    store = zarr_store(location, options, read_only=False, counters=counters)
    try:
        group = zarr.open_group(store=store, mode="a", zarr_format=3)
        group.update_attributes(dict(attrs))  # one PUT (attrs.update writes zarr.json once per key)
        for name, value in arrays.items():
            value = np.asarray(value)
            group.create_array(name, data=value, chunks=value.shape or "auto", config=EVERY_CHUNK,
                               compressors=[ZstdCodec(level=0), Crc32cCodec()])
    except Exception as exc:  # noqa: BLE001
        raise StorageError(f"output: writing {location} failed: {describe_failure(exc)}") from None


def write_requests(driver_arrays: Mapping[str, tuple[tuple[int, ...], str]],
                   worker_arrays: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], str]]) -> StorageCounters:
    """The requests a run's output writes make, without the run: ``ResultGroup.create_array``
    for the arrays the workers fill (plus one PUT per chunk they write) and ``write_group``
    for the driver's small arrays (``_stand_in``: values that compress as fitted ones do), replayed in
    a temporary local directory, so zarr's own metadata requests are counted as a run counts
    them. Worker processes' metadata GETs are not counted, as in a run (see docs/report.md)."""
    import tempfile

    from arrayjob.io.locations import parse_uri

    with tempfile.TemporaryDirectory(prefix="arrayjob-write-") as tmp:
        group = ResultGroup(parse_uri(tmp).join("result.zarr"), StorageOptions())
        counters = group.counters
        for name, (shape, chunks, dtype) in worker_arrays.items():
            group.create_array(name, shape=shape, chunks=chunks, dtype=dtype)
            counters.put_requests += math.prod(-(-s // c) for s, c in zip(shape, chunks, strict=True))
            counters.bytes_written += math.prod(shape) * np.dtype(dtype).itemsize
        # a driver array is written as one chunk, so a stand-in of one element per axis makes
        # the same requests; a big one is counted at its full size, not written (PageRank's
        # rank vector for 10⁹ nodes is 8 GB: writing ones took half of each estimate's 60 s)
        big = {name: (shape, dtype) for name, (shape, dtype) in driver_arrays.items()
               if math.prod(shape) * np.dtype(dtype).itemsize > STAND_IN_BYTES}
        write_group(group.location, StorageOptions(),
                    {name: _stand_in(tuple(1 for _ in shape) if name in big else shape, dtype)
                     for name, (shape, dtype) in driver_arrays.items()}, {"fit": 0.0}, counters)
        counters.bytes_written += sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in big.values())
    return counters


def _stand_in(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """An array of ``shape`` written as a fitted one would be: random bytes, which zstd leaves
    their size, as it leaves fitted floats (ALS's user factors, 200,000 × 8, were priced at the
    few bytes ones compress to: 2.8 kB estimated against 13.5 MB written). Never all zeros,
    whose chunks zarr skips."""
    count = math.prod(shape)
    data = np.random.default_rng(0).bytes(count * np.dtype(dtype).itemsize)
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy() if count else np.zeros(shape, dtype)


# Driver arrays above this are priced by their size instead of written by ``write_requests``.
STAND_IN_BYTES = 64 * 2**20
