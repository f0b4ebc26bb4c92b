"""Dense block reads: a chunk-aligned block of one Zarr array, read by the process that is to
hold it (a worker, never the driver for a big array), its requests counted, and the chunk a
failed read hit named (missing, corrupt, or its request refused).

``io.arrays.read_block`` is the front every caller uses; it reads a dense array here, and a
sparse group's three member arrays are read through here too (``io.sparse``).
"""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np
import zarr

from arrayjob.errors import InputError, StorageError
from arrayjob.io.backend import (
    MissingChunk,
    backend_for,
    describe_failure,
    failed_request,
    is_storage_failure,
)
from arrayjob.io.locations import ArrayInfo, StorageCounters, StorageOptions


def chunk_key(array: zarr.Array, index: tuple[int, ...]) -> str:
    if array.metadata.zarr_format == 2:
        separator = array.metadata.dimension_separator or "."
        return separator.join(str(i) for i in index) or "0"
    return array.metadata.chunk_key_encoding.encode_chunk_key(index)


def missing_chunk_message(info: ArrayInfo, key: str, sharded: bool) -> str:
    index = tuple(int(i) for i in re.findall(r"\d+", key))  # "c/3/0" (v3), "3.0" (v2): keys from the array's root
    what = "shard" if sharded else "chunk"
    return (f"inputs.{info.name}: {what} {index} (key {key!r}) of {info.uri} is missing: lost data "
            f"(for a sparse array, missing_chunks = \"fill\" in [inputs] reads it as the fill value)")


@functools.lru_cache(maxsize=64)
def _open_for_reading(info: ArrayInfo, options: StorageOptions) -> tuple[zarr.Array, StorageCounters]:
    # Cached per worker process: a block read costs its chunk GETs, not a metadata GET too.
    counters = StorageCounters()
    store = backend_for(info.location, options).block_store(counters, refuse_missing=info.missing_chunks != "fill")
    return zarr.open_array(store=store, mode="r"), counters


def read_dense_block(
    info: ArrayInfo, selection: tuple[slice, ...], options: StorageOptions
) -> tuple[np.ndarray, StorageCounters]:
    """Read ``info[selection]``; returns the block and the requests it took.

    A missing chunk (unless ``info.missing_chunks`` is "fill") or a chunk that fails to
    decode (a checksum mismatch, bytes of the wrong size) is an ``InputError`` naming it."""
    try:
        array, counters = _open_for_reading(info, options)
    except Exception as exc:  # noqa: BLE001
        raise _read_failure(info, selection, exc) from None
    before = StorageCounters(**counters.as_dict())
    try:
        block = np.ascontiguousarray(array[selection])
    except MissingChunk as missing:
        raise InputError(missing_chunk_message(info, missing.key, array.shards is not None)) from None
    except Exception as exc:  # noqa: BLE001
        _open_for_reading.cache_clear()
        if not is_storage_failure(exc):
            _name_bad_chunk(info, array, selection)
        raise _read_failure(info, selection, exc) from None
    used = StorageCounters(
        **{k: v - getattr(before, k) for k, v in counters.as_dict().items()}
    )
    return block, used


def _read_failure(info: ArrayInfo, selection: tuple[slice, ...], exc: Exception) -> Exception:
    where = ", ".join(f"{s.start}:{s.stop}" for s in selection)
    if is_storage_failure(exc):
        return StorageError(f"inputs.{info.name}: {failed_read(info, where, exc)}")
    return InputError(f"inputs.{info.name}: block [{where}] of {info.uri} is corrupt: {describe_failure(exc)}")


def _name_bad_chunk(info: ArrayInfo, array: zarr.Array, selection: tuple[slice, ...]) -> None:
    """After a block failed to decode, read its chunks (shards) one by one to name the bad one;
    raises ``InputError`` for it, or returns if none fails alone. Costs requests only on failure."""
    ranges = [range(s.start // c, -(-s.stop // c)) for s, c in zip(selection, info.chunks, strict=True)]
    for index in itertools.product(*ranges):
        region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, info.chunks, info.shape, strict=True))
        try:
            array[region]
        except MissingChunk as missing:
            raise InputError(missing_chunk_message(info, missing.key, array.shards is not None)) from None
        except Exception as exc:  # noqa: BLE001
            if is_storage_failure(exc):
                return
            what = "shard" if array.shards is not None else "chunk"
            cause = describe_failure(exc)
            if "checksum do not match" in cause:  # zarr's Crc32cCodec
                cause = "its CRC32C checksum does not match its bytes"
            raise InputError(f"inputs.{info.name}: {what} {index} (key {chunk_key(array, index)!r}) of {info.uri} "
                             f"is corrupt: {cause}") from None


def failed_read(info: ArrayInfo, where: str, exc: BaseException, doing: str = "reading") -> str:
    """"reading chunk c/3/0 of s3://b/X.zarr failed: 403 Forbidden", naming the chunk when
    the failed request says which."""
    request = failed_request(exc)
    if request is not None:
        method, url, cause = request
        _, found, key = url.partition(info.location.path.rstrip("/") + "/")
        attempts = getattr(exc, "attempts", 1)
        tries = f" (after {attempts} attempts)" if attempts > 1 else ""
        if found:
            return f"{doing} chunk {key} of {info.uri} failed: {method} {cause}{tries}"
        return f"{doing} [{where}] of {info.uri} failed: {method} {url}: {cause}{tries}"
    return f"{doing} [{where}] of {info.uri} failed: {describe_failure(exc)}"
