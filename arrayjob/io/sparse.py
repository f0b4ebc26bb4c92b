"""Sparse matrices stored as Zarr groups in AnnData's layout: the metadata the planner needs,
read on the driver, and the row blocks the workers read.

A group of ``encoding-type`` "csr_matrix" (or "csc_matrix"), ``encoding-version`` "0.1.0" and
``shape`` [n, d] holds three 1-D arrays: ``data`` (the values), ``indices`` (the column of each
value; the row, in CSC) and ``indptr`` (n + 1 offsets into both: row i holds
``data[indptr[i]:indptr[i + 1]]``). Zarr v2 or v3, on S3 or local disk, any chunking of the
three arrays, integer ``indices`` and ``indptr`` of any width::

    read = open_sparse_info("X", parse_uri("s3://bucket/X.zarr"), StorageOptions())
    block, counters = read_sparse_block(read.info, (slice(0, read.info.chunks[0]), slice(0, d)), options)

The driver reads ``indptr`` whole (4 or 8 bytes a row), once: the planner sizes every row block by
its non-zeros from it (``SparseLayout.offsets``), and its checks cost nothing more. ``data`` and
``indices`` are read only by the worker that holds a block, through ``io.dense`` like any dense
array, so a missing or corrupt chunk is named the same way.

A job that needs only where the non-zeros are (PageRank's adjacency: an unweighted graph) opens
its input as a ``pattern``: ``data`` is never read, and need not exist; a block's values are
ones. A pattern may also be a group without ``encoding-type``, read as CSR: ``indptr``,
``indices`` and a ``shape`` attribute, the layout arrayjob took for a graph before it read
AnnData's (``SparseLayout.pattern``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse
import zarr
from zarr.codecs import Crc32cCodec

from arrayjob.errors import InputError
from arrayjob.io.backend import describe_failure, is_storage_failure
from arrayjob.io.dense import read_dense_block
from arrayjob.io.locations import ArrayInfo, Location, SparseLayout, StorageCounters, StorageOptions
from arrayjob.io.storage import zarr_store

# AnnData's encoding-type -> SparseLayout.format
SPARSE_ENCODINGS = {"csr_matrix": "csr", "csc_matrix": "csc"}
MEMBERS = ("data", "indices", "indptr")
PATTERN_MEMBERS = ("indices", "indptr")  # what a pattern reads (``data``, if any, is ignored)


@dataclass(frozen=True)
class SparseInfoRead:
    """A sparse group opened: its metadata, and the requests opening it took on the driver (the
    metadata of the group and of its three arrays, and ``indptr`` whole), for the run's metrics
    and the estimate."""

    info: ArrayInfo
    counters: StorageCounters


def is_sparse_group(location: Location, options: StorageOptions) -> str | None:
    """The ``encoding-type`` ("csr_matrix" or "csc_matrix") of the Zarr group at ``location``, or
    None if there is no group there or it is no sparse matrix (metadata only)."""
    try:
        group = zarr.open_group(store=zarr_store(location, options, read_only=True), mode="r")
        kind = group.attrs.get("encoding-type")
    except Exception:  # noqa: BLE001 - nothing readable there is a sparse group: the caller says what is
        return None
    return kind if isinstance(kind, str) and kind in SPARSE_ENCODINGS else None


def open_sparse_info(name: str, location: Location, options: StorageOptions, *, missing_chunks: str = "error",
                     target_nnz_per_chunk: int | None = None, pattern: bool = False,
                     check_shape: Callable[[tuple[int, int]], None] | None = None) -> SparseInfoRead:
    """Open the sparse group named ``name`` (``inputs.<name>`` in errors): its attributes, the
    metadata of its arrays, and ``indptr`` whole, checked. ``check_shape`` sees the matrix's
    shape as soon as the attributes give it, before anything else is read.

    The row chunk (``ArrayInfo.chunks[0]``; a column chunk in CSC) holds on average about
    ``target_nnz_per_chunk`` non-zeros (default: the elements of a stored chunk of ``data``),
    so that a block's reads are close to whole chunks of ``data`` and ``indices``.

    ``pattern``: the non-zeros' places only (see the module note): ``data`` is not opened, a
    group without ``encoding-type`` is CSR, and the matrix's dtype is bool (its values, ones)."""
    counters = StorageCounters()

    def refuse(problem: str) -> InputError:
        return InputError(f"inputs.{name}: {location}: {problem}")

    members = PATTERN_MEMBERS if pattern else MEMBERS
    try:
        group = zarr.open_group(store=zarr_store(location, options, read_only=True, counters=counters), mode="r")
        attrs = dict(group.attrs)
        kind = attrs.get("encoding-type", "csr_matrix" if pattern else None)
        if not isinstance(kind, str) or kind not in SPARSE_ENCODINGS:
            what = f"encoding-type {kind!r}" if kind is not None else "no encoding-type attribute"
            raise refuse(f"{what}: not a sparse matrix group (expected AnnData's 'csr_matrix' or 'csc_matrix')")
        shape = _shape(attrs, refuse)
        if check_shape is not None:
            check_shape(shape)
        arrays = {member: _member(group, member, kind, members, refuse) for member in members}
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line naming the input
        if is_storage_failure(exc):
            raise InputError(f"inputs.{name}: cannot read {location}: {describe_failure(exc)}") from None
        raise refuse(f"not a readable Zarr group: {describe_failure(exc)}") from None

    data, indices, indptr = arrays.get("data"), arrays["indices"], arrays["indptr"]
    fmt = SPARSE_ENCODINGS[kind]
    axis = 0 if fmt == "csr" else 1
    line = "row" if axis == 0 else "column"
    for member, array, expected, kinds in (
            ("data", data, "numbers", np.number), ("indices", indices, "integers", np.integer),
            ("indptr", indptr, "integers", np.integer)):
        if array is not None and not np.issubdtype(array.dtype, kinds):
            raise refuse(f"'{member}' holds {array.dtype}, expected {expected}")
    nnz = int(indices.shape[0])
    if data is not None and data.shape[0] != nnz:
        raise refuse(f"'data' holds {data.shape[0]} values but 'indices' {nnz} (one column index per value)")
    if indptr.shape[0] != shape[axis] + 1:
        raise refuse(f"'indptr' holds {indptr.shape[0]} offsets, expected {shape[axis] + 1} for shape "
                     f"{list(shape)} (one per {line}, plus one)")

    values = data if data is not None else indices  # a pattern's blocks read as many values as indices
    layout = SparseLayout(
        format=fmt, nnz=nnz, index_dtype=str(indices.dtype), indptr_dtype=str(indptr.dtype),
        data_chunk=_chunk(values), indices_chunk=_chunk(indices), indptr_chunk=_chunk(indptr), offsets=(),
        chunk_overhead=(_overhead(data) if data is not None else 0, _overhead(indices), _overhead(indptr)),
        pattern=pattern)
    info = ArrayInfo(name=name, location=location, shape=shape, dtype=str(data.dtype) if data is not None else "bool",
                     chunks=shape, zarr_format=int(group.metadata.zarr_format), missing_chunks=missing_chunks,
                     sparse=layout)
    offsets, read = read_dense_block(member_info(info, "indptr"), (slice(0, shape[axis] + 1),), options)
    counters.add(read)
    _check_offsets(offsets, nnz, line, "data" if data is not None else "indices", refuse)

    lines = shape[axis]
    target = target_nnz_per_chunk or layout.data_chunk
    step = max(1, min(lines, round(target * lines / nnz))) if nnz else max(1, lines)
    boundaries = offsets[::step] if lines % step == 0 else np.append(offsets[::step], offsets[-1])
    layout = dataclasses.replace(layout, offsets=tuple(int(o) for o in boundaries))
    chunks = (step, shape[1]) if axis == 0 else (shape[0], step)
    return SparseInfoRead(dataclasses.replace(info, chunks=chunks, sparse=layout), counters)


def _shape(attrs: dict[str, Any], refuse: Any) -> tuple[int, int]:
    shape = attrs.get("shape")
    if shape is None:
        raise refuse("no shape attribute (expected shape = [rows, columns])")
    if (not isinstance(shape, list | tuple) or len(shape) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        raise refuse(f"shape attribute {shape!r} is not two non-negative integers [rows, columns]")
    return int(shape[0]), int(shape[1])


def _member(group: zarr.Group, member: str, kind: str, members: tuple[str, ...], refuse: Any) -> zarr.Array:
    try:
        array = group[member]
    except KeyError:
        what = (f"a {kind} group holds data, indices and indptr" if members == MEMBERS
                else f"the pattern of a {kind} group is read from indices and indptr")
        raise refuse(f"member array '{member}' is missing ({what})") from None
    if not isinstance(array, zarr.Array):
        raise refuse(f"'{member}' is a group, expected a 1-D array")
    if array.ndim != 1:
        raise refuse(f"'{member}' is {array.ndim}-D, expected a 1-D array")
    return array


def _chunk(array: zarr.Array) -> int:
    """The elements of a stored object of ``array``: a shard's, if sharded."""
    return int((array.shards or array.chunks)[0])


def _overhead(array: zarr.Array) -> int:
    """The bytes a stored chunk adds to its elements: 4 with a CRC32C codec (v3)."""
    codecs = getattr(array.metadata, "codecs", ())
    return 4 if any(isinstance(c, Crc32cCodec) for c in codecs) else 0


def _check_offsets(indptr: np.ndarray, nnz: int, line: str, values: str, refuse: Any) -> None:
    """``indptr`` starts at 0, never decreases and ends at the number of values."""
    if int(indptr[0]) != 0:
        raise refuse(f"'indptr' starts at {int(indptr[0])}, expected 0")
    decreasing = np.flatnonzero(indptr[1:] < indptr[:-1])
    if decreasing.size:
        i = int(decreasing[0])
        raise refuse(f"'indptr' decreases at {line} {i} (indptr[{i}] = {int(indptr[i])}, "
                     f"indptr[{i + 1}] = {int(indptr[i + 1])})")
    if int(indptr[-1]) != nnz:
        raise refuse(f"'indptr' ends at {int(indptr[-1])} but '{values}' holds {nnz} values")


def stored_members(info: ArrayInfo) -> tuple[str, ...]:
    """The member arrays of sparse ``info`` its blocks are read from: ``indices`` and ``indptr``,
    and ``data`` unless only its pattern is read."""
    assert info.sparse is not None
    return PATTERN_MEMBERS if info.sparse.pattern else MEMBERS


def member_info(info: ArrayInfo, member: str) -> ArrayInfo:
    """One of the three arrays of sparse ``info`` as a dense 1-D array, for ``io.dense`` (a
    failed read names its chunk in it: ``inputs.X: chunk (3,) (key 'c/3') of …/X.zarr/data``)."""
    layout = info.sparse
    assert layout is not None
    if member not in stored_members(info):
        raise ValueError(f"{info.uri}: only the pattern of {info.name} is read, not its '{member}'")
    lines = info.shape[layout.axis]
    length, dtype, chunk = {
        "data": (layout.nnz, info.dtype, layout.data_chunk),
        "indices": (layout.nnz, layout.index_dtype, layout.indices_chunk),
        "indptr": (lines + 1, layout.indptr_dtype, layout.indptr_chunk),
    }[member]
    return ArrayInfo(name=info.name, location=info.location.join(member), shape=(length,), dtype=dtype,
                     chunks=(chunk,), zarr_format=info.zarr_format, missing_chunks=info.missing_chunks)


def read_sparse_block(info: ArrayInfo, selection: tuple[slice, ...],
                      options: StorageOptions) -> tuple[Any, StorageCounters]:
    """Read rows ``selection[0]`` of sparse ``info`` (``selection[1]`` spans every column; in
    CSC, columns ``selection[1]``) as a SciPy CSR (CSC) matrix, a wide CSR one converted to CSC
    (``ArrayInfo.held_by_columns``); returns it and the requests it
    took: the chunks of ``indptr`` its rows touch, then those of ``data`` and ``indices`` its
    values touch, exactly ``info.block_reads(selection)``.

    A column index outside the matrix is an ``InputError`` naming the row; a missing or
    corrupt chunk is named as for a dense array (``io.dense``)."""
    layout = info.sparse
    assert layout is not None
    axis = layout.axis
    major, minor = selection[axis], info.shape[1 - axis]
    if (selection[1 - axis].start, selection[1 - axis].stop) != (0, minor):
        raise ValueError(f"a block of sparse {info.name} spans every {'column' if axis == 0 else 'row'}, "
                         f"got {selection}")
    indptr, counters = read_dense_block(member_info(info, "indptr"), (slice(major.start, major.stop + 1),), options)
    lo, hi = int(indptr[0]), int(indptr[-1])
    data = (np.ones(hi - lo, dtype=info.dtype) if layout.pattern
            else _read_values(info, "data", lo, hi, options, counters))
    indices = _read_values(info, "indices", lo, hi, options, counters)
    indptr = indptr - lo
    _check_indices(info, indices, indptr, major.start, minor)
    lines = major.stop - major.start
    if axis == 0:
        block = scipy.sparse.csr_matrix((data, indices, indptr), shape=(lines, minor))
        return (block.tocsc() if info.held_by_columns else block), counters
    return scipy.sparse.csc_matrix((data, indices, indptr), shape=(minor, lines)), counters


def _read_values(info: ArrayInfo, member: str, lo: int, hi: int, options: StorageOptions,
                 counters: StorageCounters) -> np.ndarray:
    array = member_info(info, member)
    if hi == lo:  # a block without non-zeros reads nothing
        return np.empty(0, dtype=array.dtype)
    values, read = read_dense_block(array, (slice(lo, hi),), options)
    counters.add(read)
    return values


def _check_indices(info: ArrayInfo, indices: np.ndarray, indptr: np.ndarray, first: int, minor: int) -> None:
    """Every index of the block lies in [0, minor); else an ``InputError`` naming the first
    row (column, in CSC) that holds one outside."""
    position = index_outside(indices, minor)
    if position is not None:
        line = first + int(np.searchsorted(indptr, position, side="right")) - 1
        raise index_outside_error(info, line, int(indices[position]), minor)


def index_outside(indices: np.ndarray, minor: int) -> int | None:
    """The position of the first of ``indices`` outside [0, minor), or None."""
    if not indices.size or (int(indices.min()) >= 0 and int(indices.max()) < minor):
        return None
    return int(np.flatnonzero((indices < 0) | (indices >= minor))[0])


def index_outside_error(info: ArrayInfo, line: int, index: int, minor: int) -> InputError:
    """The error for row ``line`` (column, in CSC) of sparse ``info`` holding ``index``, outside
    [0, minor): for blocks read here and for jobs that read the member arrays themselves."""
    kind, other = ("row", "column") if info.sparse is None or info.sparse.axis == 0 else ("column", "row")
    return InputError(f"inputs.{info.name}: {info.uri}: {kind} {line} holds {other} index {index}, "
                      f"outside [0, {minor})")
