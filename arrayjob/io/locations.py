"""What the planner and the runtime say about storage without touching it: locations
(URIs), the ``[storage]`` options, request counters and the metadata of a stored array.

Plain data only (no filesystem, Zarr or S3 library), so the planner can import it.
A URI is ``s3://bucket/key``, ``file:///abs/path`` or a local path (relative to the
working directory).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
from dataclasses import dataclass

import numpy as np

from arrayjob.errors import SpecError


@dataclass(frozen=True)
class StorageOptions:
    """The ``[storage]`` section. Unset fields fall back to the standard AWS environment.

    ``max_attempts`` and ``retry_timeout`` bound the retries of a request that failed
    transiently (5xx, 429, a dropped connection), for every S3 client arrayjob uses: each
    request is tried at most ``max_attempts`` times, and not retried once ``retry_timeout``
    seconds have passed since its first try.
    """

    endpoint_url: str | None = None
    region: str | None = None
    anon: bool = False
    profile: str | None = None
    max_attempts: int = dataclasses.field(default=10, metadata={"check": lambda v: 1 <= v <= 100,
                                                     "expect": "an integer from 1 to 100"})
    retry_timeout: float = dataclasses.field(default=180.0, metadata={"check": lambda v: 0 < v <= 3600,
                                                          "expect": "seconds, more than 0 and at most 3600"})


@dataclass(frozen=True)
class Location:
    """A place in storage: ``scheme`` is "s3" or "file"; ``path`` is "bucket/key" or absolute."""

    scheme: str
    path: str

    def __str__(self) -> str:
        return f"s3://{self.path}" if self.scheme == "s3" else self.path

    @property
    def is_s3(self) -> bool:
        return self.scheme == "s3"

    def join(self, *parts: str) -> Location:
        path = "/".join([self.path.rstrip("/"), *(p.strip("/") for p in parts)])
        return dataclasses.replace(self, path=path)

    @property
    def parent(self) -> Location:
        return dataclasses.replace(self, path=self.path.rstrip("/").rsplit("/", 1)[0])

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]


def parse_uri(text: str, *, key: str = "uri", base: str | None = None) -> Location:
    """Parse ``s3://bucket/key``, ``file://path`` or a local path; ``key`` names it in errors.
    A relative local path is taken relative to ``base`` (a directory), else to the working
    directory."""
    text = text.strip()
    if not text:
        raise SpecError(f"{key}: expected a URI (s3://bucket/key, file://path or a path), got an empty string")
    if "://" in text:
        scheme, _, rest = text.partition("://")
        scheme = scheme.lower()
        if scheme in ("s3", "s3a"):
            bucket, _, _ = rest.partition("/")
            if not bucket:
                raise SpecError(f"{key}: {text!r} names no bucket (expected s3://bucket/key)")
            return Location("s3", rest.rstrip("/"))
        if scheme == "file":
            return Location("file", os.path.abspath(os.path.join(base or "", rest)))
        raise SpecError(f"{key}: unsupported URI scheme {scheme!r} in {text!r} (expected s3:// or file://)")
    return Location("file", os.path.abspath(os.path.join(base or "", text)))


GLOB_CHARACTERS = "*?["


def split_glob(location: Location) -> tuple[Location, str]:
    """A location whose path holds a glob (``s3://b/features/part-*.parquet``) as the directory
    before its first wildcard and the pattern under it; any other location as itself and ""."""
    path = location.path
    first = min((i for i in map(path.find, GLOB_CHARACTERS) if i >= 0), default=-1)
    if first < 0:
        return location, ""
    root = path.rfind("/", 0, first)
    return dataclasses.replace(location, path=path[:root]), path[root + 1:]


@dataclass
class StorageCounters:
    """Requests and bytes, counted by the store that made them."""

    bytes_read: int = 0
    get_requests: int = 0
    bytes_written: int = 0
    put_requests: int = 0

    def add(self, other: StorageCounters) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


# A CSR matrix wider than this is held column-major (CSC) once a worker has read a row block of
# it (``io.sparse.read_sparse_block``): its products then gather from and scatter into vectors
# as long as the block's rows, which stay in cache, instead of as long as its columns, which do
# not. Measured quiet on a 250,000 × 2^20 block with 30 non-zeros a row (`bench_micro.py
# sparse-layout`, 1 thread): X @ w 13.9 ms against 14.6, Xᵀ @ r 14.1 against 17.8, for a
# conversion of 0.27 s once at the read: a gain only for jobs of many passes (under load 36 the
# same products had looked twice as fast as CSC). Narrower blocks stay CSR, the layout of the
# generated row loop (``kernels.rowloop``).
HELD_BY_COLUMNS_ABOVE = 2**17


@dataclass(frozen=True)
class SparseLayout:
    """A sparse matrix stored as a Zarr group of three 1-D arrays, AnnData's layout: ``data``
    (the values), ``indices`` (the column of each value, CSR) and ``indptr`` (n + 1 offsets
    into both, row i holding ``data[indptr[i]:indptr[i + 1]]``).

    The planner sees it through ``offsets``: ``indptr`` at every multiple of the array's row
    chunk (``ArrayInfo.chunks[0]``) and at n, read once on the driver (``io.sparse``). Every
    row block the planner cuts is a whole number of row chunks, so its non-zeros, the bytes it
    holds and the stored chunks of the three arrays its read touches follow from these alone.
    """

    format: str  # "csr" (row blocks); "csc" is read for jobs that need columns
    nnz: int
    index_dtype: str  # of ``indices``
    indptr_dtype: str
    data_chunk: int  # elements per stored chunk (or shard) of ``data``
    indices_chunk: int
    indptr_chunk: int
    offsets: tuple[int, ...]  # indptr[0], indptr[c], indptr[2c], ..., indptr[n]
    # bytes each stored chunk adds beyond its elements (4: a CRC32C codec), per array
    chunk_overhead: tuple[int, int, int] = (0, 0, 0)
    # only where the non-zeros are is read (a graph's adjacency): ``data`` is never read,
    # may be absent, and a block's values are ones (``io.sparse``'s ``pattern``)
    pattern: bool = False

    @property
    def axis(self) -> int:
        """The axis ``indptr`` runs along and blocks are cut across: rows (0) in CSR, columns (1) in CSC."""
        return 0 if self.format == "csr" else 1

    def nnz_between(self, start: int, stop: int, row_chunk: int, rows: int) -> int:
        """Non-zeros of rows [start, stop): both ends multiples of ``row_chunk`` or ``rows``."""
        return self._offset(stop, row_chunk, rows) - self._offset(start, row_chunk, rows)

    def _offset(self, row: int, row_chunk: int, rows: int) -> int:
        if row == rows:
            return self.offsets[-1]
        if row % row_chunk:
            raise ValueError(f"row {row} is not on a row chunk boundary (chunks of {row_chunk} rows)")
        return self.offsets[row // row_chunk]


@dataclass(frozen=True)
class TableSelection:
    """What ``[inputs]`` takes of a Parquet dataset: ``columns`` (names, in this order), a
    ``glob`` over the column names (in the files' order), one ``column`` (a vector), or, with
    none of them, every column; and what a null means ("error", or "zero": read as 0).
    ``id_column``: a column of any type carried, row for row, into a Parquet output
    (``TableTarget``), so its rows can be joined back; never read as a number."""

    columns: tuple[str, ...] = ()
    glob: str | None = None
    column: str | None = None
    nulls: str = "error"
    id_column: str | None = None

    def describe(self) -> str:
        """The selection as the spec wrote it, e.g. ``f*``, ``f0,f1``, ``label``; ``*`` for all."""
        return self.column or self.glob or ",".join(self.columns) or "*"


@dataclass(frozen=True)
class RowGroupChunks:
    """One row group of a Parquet dataset as the planner sees it (from its file's footer): where
    it is, its rows, and per selected leaf column its column chunk's (offset, compressed bytes,
    uncompressed bytes) in the file."""

    file: int  # into TableLayout.files
    index: int  # the row group's index within its file
    rows: int
    chunks: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class TableLayout:
    """A Parquet dataset (files under ``ArrayInfo.location``) read as a dense matrix of the
    selected numeric columns, or as a vector of one; read by ``io.parquet``.

    ``offsets`` holds the first row of each row group in the dataset, then the rows; a block
    of rows [r0, r1) reads every row group it overlaps, whole, of its selected columns only,
    so two blocks that share a row group both read it. ``footers`` are the files' footers as
    stored: the workers decode column chunks with them and read nothing else.
    """

    selection: TableSelection
    columns: tuple[str, ...]  # the selected columns, in matrix order
    list_size: int | None  # the one FixedSizeList column's width, if the matrix is that column
    files: tuple[str, ...]  # keys under the location ("": the location is the file), in row order
    sizes: tuple[int, ...]  # of each file, in bytes
    footers: tuple[bytes, ...]  # of each file: its metadata, length and magic, as stored
    row_groups: tuple[RowGroupChunks, ...]  # in row order, none empty
    offsets: tuple[int, ...]
    # of ``selection.id_column``, per row group: the (offset, compressed, uncompressed) bytes of
    # its column chunks (a nested type's leaves, which lie side by side, as one range)
    id_chunks: tuple[tuple[int, int, int], ...] = ()
    # per selected column: its type as Arrow names it ("int64", "double", ...), and its least and
    # greatest values where every row group's statistics give them (None where one does not):
    # metadata a job may check before anything is read (ALS's ids: integers from 0)
    types: tuple[str, ...] = ()
    bounds: tuple[tuple[float, float] | None, ...] = ()

    def groups(self, start: int, stop: int) -> range:
        """The row groups rows [start, stop) overlap."""
        if stop <= start:
            return range(0)
        return range(bisect.bisect_right(self.offsets, start) - 1, bisect.bisect_left(self.offsets, stop))

    def leaves(self, cols: slice) -> range:
        """The selected leaf columns that hold matrix columns ``cols`` (a list column: its one)."""
        return range(1) if self.list_size is not None else range(cols.start, cols.stop)

    def ranges(self, rows: slice, cols: slice) -> list[tuple[int, int, int]]:
        """The (file, start, stop) byte ranges reading rows ``rows`` of columns ``cols`` takes:
        each column chunk of its row groups, those that touch in a file joined into one, so
        one GET each (the selected columns of a row group are usually one range)."""
        pieces = sorted((g.file, offset, offset + length)
                        for g in (self.row_groups[i] for i in self.groups(rows.start, rows.stop))
                        for offset, length, _ in (g.chunks[j] for j in self.leaves(cols)))
        joined: list[tuple[int, int, int]] = []
        for file, start, stop in pieces:
            if joined and joined[-1][0] == file and joined[-1][2] >= start:
                joined[-1] = (file, joined[-1][1], max(joined[-1][2], stop))
            else:
                joined.append((file, start, stop))
        return joined

    @property
    def compressed_bytes(self) -> int:
        """The bytes of every selected column chunk, as stored."""
        return sum(length for g in self.row_groups for _, length, _ in g.chunks)


@dataclass(frozen=True)
class ArrayInfo:
    """What the planner knows of a stored array: its place, shape, dtype and storage chunks.

    A sparse matrix (``sparse`` set) is planned as an (n, d) array of ``dtype`` cut into row
    blocks of ``chunks[0]`` rows; its bytes are those its non-zeros take, not n × d. A Parquet
    dataset (``table`` set) is a dense float64 (n, d) matrix or (n,) vector whose blocks read
    the row groups they overlap (``zarr_format`` 0: not Zarr).
    """

    name: str
    location: Location
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    zarr_format: int
    # what a missing chunk means: "error" (lost data, refused) or "fill" (a sparse array:
    # read as the fill value); ``[inputs]`` sets it per input
    missing_chunks: str = "error"
    sparse: SparseLayout | None = None
    table: TableLayout | None = None

    @property
    def uri(self) -> str:
        """Where it is stored; of a Parquet input, with its columns (``…/features#f*``): X and y
        may be columns of the same files, and the planner tells stored arrays apart by this."""
        if self.table is not None:
            return f"{self.location}#{self.table.selection.describe()}"
        return str(self.location)

    @property
    def nbytes(self) -> int:
        """The bytes the array takes in memory (a sparse one: its three arrays)."""
        if self.sparse is not None:
            return self._sparse_bytes(self.sparse.nnz, self.shape[self.sparse.axis])
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def held_by_columns(self) -> bool:
        """A wide CSR matrix whose row blocks are held as CSC once read (``HELD_BY_COLUMNS_ABOVE``)."""
        return self.sparse is not None and self.sparse.axis == 0 and self.shape[1] > HELD_BY_COLUMNS_ABOVE

    def _sparse_bytes(self, nnz: int, rows: int) -> int:
        layout = self.sparse
        assert layout is not None
        pointers = (self.shape[1] if self.held_by_columns else rows) + 1
        return (nnz * (np.dtype(self.dtype).itemsize + np.dtype(layout.index_dtype).itemsize)
                + pointers * np.dtype(layout.indptr_dtype).itemsize)

    def block_nbytes(self, selection: tuple[slice, ...]) -> int:
        """The bytes block ``selection`` takes in memory once read."""
        if self.sparse is None:
            return math.prod(s.stop - s.start for s in selection) * np.dtype(self.dtype).itemsize
        axis = self.sparse.axis
        rows = selection[axis]
        return self._sparse_bytes(self.sparse.nnz_between(rows.start, rows.stop, self.chunks[axis], self.shape[axis]),
                                  rows.stop - rows.start)

    def block_reads(self, selection: tuple[slice, ...]) -> tuple[int, int]:
        """(bytes, GET requests) reading block ``selection`` takes: the stored chunks it touches,
        each read whole (a dense block covers whole chunks; a sparse one also reads the chunks of
        ``data`` and ``indices`` it shares with its neighbours; a Parquet block the selected
        column chunks of every row group it overlaps, ``TableLayout.ranges``)."""
        if self.table is not None:
            cols = selection[1] if len(selection) > 1 else slice(0, 1)
            ranges = self.table.ranges(selection[0], cols)
            return sum(stop - start for _, start, stop in ranges), len(ranges)
        if self.sparse is None:
            requests = math.prod(math.ceil(s.stop / c) - s.start // c
                                 for s, c in zip(selection, self.chunks, strict=True))
            if all(s.start % c == 0 and (s.stop % c == 0 or s.stop == n)
                   for s, c, n in zip(selection, self.chunks, self.shape, strict=True)):
                return self.block_nbytes(selection), requests  # whole chunks: what the block holds
            # a block cut across chunks (y read along X's row blocks) reads each chunk it touches whole
            return requests * math.prod(self.chunks) * np.dtype(self.dtype).itemsize, requests
        layout = self.sparse
        axis = layout.axis
        rows, row_chunk, n = selection[axis], self.chunks[axis], self.shape[axis]
        lo = layout.nnz_between(0, rows.start, row_chunk, n)
        hi = lo + layout.nnz_between(rows.start, rows.stop, row_chunk, n)
        nbytes = requests = 0
        members = [((rows.start, rows.stop + 1), layout.indptr_chunk, layout.indptr_dtype, layout.chunk_overhead[2]),
                   ((lo, hi), layout.data_chunk, self.dtype, layout.chunk_overhead[0]),
                   ((lo, hi), layout.indices_chunk, layout.index_dtype, layout.chunk_overhead[1])]
        if layout.pattern:  # no data read
            del members[1]
        for (start, stop), chunk, dtype, overhead in members:
            touched = math.ceil(stop / chunk) - start // chunk if stop > start else 0
            requests += touched
            nbytes += touched * (chunk * np.dtype(dtype).itemsize + overhead)
        return nbytes, requests

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def ids(self) -> ArrayInfo | None:
        """The id column of a Parquet input (``TableSelection.id_column``) as an (n,) input of
        its own, read with the same row groups (``io.parquet_blocks.read_table_column``); None
        where the input has none."""
        layout = self.table
        if layout is None or layout.selection.id_column is None:
            return None
        column = layout.selection.id_column
        groups = tuple(dataclasses.replace(g, chunks=(c,)) for g, c in zip(layout.row_groups, layout.id_chunks,
                                                                          strict=True))
        ids = dataclasses.replace(layout, selection=TableSelection(column=column), columns=(column,),
                                  list_size=None, row_groups=groups, id_chunks=(), types=(), bounds=())
        return ArrayInfo(f"{self.name}.{column}", self.location, (self.shape[0],), "object", (self.chunks[0],), 0,
                         table=ids)


@dataclass(frozen=True)
class TableTarget:
    """A per-row output written as a Parquet dataset, one file per row block, by the workers
    (``io.table_writer``): under ``location``, ``part-<first row>.parquet``, the first row
    zero-padded to the digits of the row count, so the files sort in row order. Each file holds
    the id column of the input the rows follow (``ids``, if it has one), then the output as the
    column ``name``: a number per row, or a fixed-size list of them for an (n, k) output."""

    name: str
    location: Location
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    ids: ArrayInfo | None = None

    @property
    def uri(self) -> str:
        return str(self.location)

    def block_requests(self, start: int, stop: int) -> StorageCounters:
        """What writing rows [start, stop) takes, without writing: one PUT of their bytes
        uncompressed (Snappy makes them fewer), and the GETs of the id column's row groups."""
        row_bytes = math.prod(self.shape[1:]) * np.dtype(self.dtype).itemsize
        counters = StorageCounters(bytes_written=(stop - start) * row_bytes, put_requests=1)
        if self.ids is not None:
            counters.bytes_read, counters.get_requests = self.ids.block_reads((slice(start, stop),))
        return counters

    def part_key(self, first_row: int) -> str:
        """The file holding rows from ``first_row``: ``part-0250000.parquet`` of 1,000,000 rows."""
        return f"part-{first_row:0{len(str(self.shape[0]))}d}.parquet"
