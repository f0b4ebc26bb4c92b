"""Parquet datasets as inputs: the footers, read on the driver into a ``TableLayout`` the
planner works from (the row blocks the workers read: ``io.parquet_blocks``).

A dataset is one file, a directory or prefix of files (hive-style ``key=value/`` partition
directories included; their values are not columns), or a glob (``part-*.parquet``; a wildcard
does not cross a ``/``). Its files are the objects there whose path has no segment starting with
``_`` or ``.`` (``_SUCCESS``, ``.crc`` files: pyarrow's and Spark's rule), in sorted key order:
byte order of the keys, as S3 lists them (``part-00010`` after ``part-00009``, but ``part-10``
before ``part-2``). Rows are numbered through the files in that order, so X and y taken from
the same files line up, run after run::

    read = open_table_info("X", parse_uri("s3://bucket/features/"), StorageOptions(),
                           TableSelection(glob="f*"))
    block, counters = parquet_blocks.read_table_block(read.info, (slice(0, read.info.chunks[0]), slice(0, d)), options)

Opening reads each file's footer and nothing else, in two GETs: its last 8 bytes (the footer's
length and the magic ``PAR1``), then the footer itself; files are read 16 at a time. (pyarrow's
own first read of a footer takes the file's last 64 KiB: one request fewer, but a small file
read whole, and ``plan`` and ``estimate`` read metadata only.) pyarrow decodes the footer
(``pyarrow.parquet.read_metadata`` over its bytes); the row groups and the offset and sizes of
each selected column chunk come from it.
"""

from __future__ import annotations

import fnmatch
import struct
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from arrayjob.errors import InputError
from arrayjob.io.backend import StorageBackend, backend_for, describe_failure, is_storage_failure
from arrayjob.io.locations import (
    ArrayInfo,
    Location,
    RowGroupChunks,
    StorageCounters,
    StorageOptions,
    TableLayout,
    TableSelection,
    split_glob,
)

MAGIC = b"PAR1"
# footers read at once, on the driver
FOOTER_READERS = 16


@dataclass(frozen=True)
class TableInfoRead:
    """A Parquet dataset opened: its metadata, and the footer GETs opening it took on the driver,
    for the run's metrics and the estimate (``Job.metadata_reads``)."""

    info: ArrayInfo
    counters: StorageCounters


def hidden(key: str) -> bool:
    """Whether ``key`` is not a data file of a dataset (a segment starts with ``_`` or ``.``)."""
    return any(part.startswith(("_", ".")) for part in key.split("/"))


def dataset_files(location: Location, options: StorageOptions) -> tuple[Location, list[str]]:
    """The dataset's root and the keys of its files under it, in row order. A location with no
    objects under it is the file itself (key "")."""
    root, pattern = split_glob(location)
    listed = backend_for(root, options).list()
    if pattern:
        wanted = pattern.split("/")
        return root, [k for k in listed if not hidden(k) and len(k.split("/")) == len(wanted)
                      and all(fnmatch.fnmatchcase(p, w) for p, w in zip(k.split("/"), wanted, strict=True))]
    if listed:
        return root, [k for k in listed if not hidden(k)]
    return root, [""]


def is_parquet_dataset(location: Location, options: StorageOptions) -> bool:
    """Whether ``location`` is unambiguously Parquet: a ``.parquet`` file, a glob, or a
    directory whose data files all end in ``.parquet`` (one listing; nothing is read)."""
    if split_glob(location)[1]:
        return True
    try:
        _, keys = dataset_files(location, options)
    except Exception:  # noqa: BLE001 - nothing listable there: not a dataset; the caller says what is
        return False
    if keys == [""]:
        return location.name.endswith(".parquet")
    return bool(keys) and all(k.endswith(".parquet") for k in keys)


def open_table_info(name: str, location: Location, options: StorageOptions,
                    selection: TableSelection) -> TableInfoRead:
    """Read the footers of the Parquet dataset at ``location`` (``inputs.<name>`` in errors) and
    check them: every file Parquet, the selected columns present and numeric in each, of the
    same types in all, at least one row. Reads footers only.

    The row chunk (``ArrayInfo.chunks[0]``) is the commonest row count of a row group (of two
    as common, the larger): where row groups are of one size, as writers make them, every
    block the planner cuts is whole row groups."""
    counters = StorageCounters()
    try:
        root, keys = dataset_files(location, options)
    except Exception as exc:  # noqa: BLE001
        root = split_glob(location)[0]
        if not _bucket_exists(root, options):
            raise InputError(f"inputs.{name}: bucket {root.path.partition('/')[0]!r} does not exist "
                             f"(reading {location})") from None
        raise InputError(f"inputs.{name}: cannot list {location}: {describe_failure(exc)}") from None
    if not keys:
        raise InputError(f"inputs.{name}: no Parquet files at {location}: an empty dataset")
    backend = backend_for(root, options)
    reads = [StorageCounters() for _ in keys]
    with ThreadPoolExecutor(min(FOOTER_READERS, len(keys))) as pool:
        files = list(pool.map(lambda k, c: _footer(name, backend, k, root.join(k) if k else root, c), keys, reads))
    for read in reads:
        counters.add(read)
    first = files[0]
    columns, _, list_size = _select(name, first, selection)
    groups: list[RowGroupChunks] = []
    offsets = [0]
    id_chunks: list[tuple[int, int, int]] = []
    bounds: list[tuple[float, float] | None] = [(float("inf"), float("-inf")) for _ in columns]
    for f, file in enumerate(files):
        found, leaves, _ = _select(name, file, selection, against=None if f == 0 else first)
        _agree(name, first, file, columns, found)
        id_leaves = _id_leaves(name, first, file, selection.id_column) if selection.id_column else range(0)
        for g in range(file.metadata.num_row_groups):
            row_group = file.metadata.row_group(g)
            if row_group.num_rows == 0:
                continue
            if list_size is None:
                bounds = [_widened(b, row_group.column(leaf).statistics) for b, leaf in zip(bounds, leaves, strict=True)]
            stored = tuple(_chunk(name, file, g, row_group.column(leaf)) for leaf in leaves)
            groups.append(RowGroupChunks(f, g, row_group.num_rows, stored))
            offsets.append(offsets[-1] + row_group.num_rows)
            if id_leaves:
                id_chunks.append(_joined([_chunk(name, file, g, row_group.column(leaf)) for leaf in id_leaves]))
    rows = offsets[-1]
    if rows == 0:
        raise InputError(f"inputs.{name}: the dataset at {location} holds no rows ({len(files)} file(s)): "
                         "an empty dataset")
    counts = Counter(g.rows for g in groups)
    row_chunk = max(counts, key=lambda r: (counts[r], r))
    layout = TableLayout(selection=selection, columns=columns, list_size=list_size, files=tuple(keys),
                         sizes=tuple(f.size for f in files), footers=tuple(f.footer for f in files),
                         row_groups=tuple(groups), offsets=tuple(offsets), id_chunks=tuple(id_chunks),
                         types=tuple(str(first.metadata.schema.to_arrow_schema().field(c).type) for c in columns),
                         bounds=tuple(bounds) if list_size is None else ())
    width = list_size if list_size is not None else len(columns)
    shape, chunks = ((rows,), (row_chunk,)) if selection.column is not None else ((rows, width), (row_chunk, width))
    info = ArrayInfo(name=name, location=root, shape=shape, dtype="float64", chunks=chunks, zarr_format=0,
                     table=layout)
    return TableInfoRead(info, counters)


def _widened(bounds: tuple[float, float] | None, statistics: Any) -> tuple[float, float] | None:
    """``bounds`` (least, greatest) widened by a column chunk's ``statistics``; None once a
    chunk has none (then nothing is known of the column's values without reading them)."""
    if bounds is None or statistics is None or not statistics.has_min_max:
        return None
    low, high = statistics.min, statistics.max
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)):
        return None
    return min(bounds[0], low), max(bounds[1], high)


def _bucket_exists(location: Location, options: StorageOptions) -> bool:
    try:
        return backend_for(location, options).bucket_exists()
    except Exception:  # noqa: BLE001 - cannot tell: say what failed instead
        return True


@dataclass(frozen=True)
class _File:
    key: str
    where: Location
    size: int
    footer: bytes
    metadata: Any  # pyarrow.parquet.FileMetaData


def _footer(name: str, backend: StorageBackend, key: str, where: Location, counters: StorageCounters) -> _File:
    """One file: its size, its footer as stored (metadata, their length, ``PAR1``) and the
    metadata pyarrow decodes from it."""
    def refuse(problem: str) -> InputError:
        return InputError(f"inputs.{name}: {where} is not a Parquet file: {problem}")

    try:
        tail, size = backend.read_tail(key, 8, counters)
        if size < 12 or tail[-4:] != MAGIC:
            raise refuse("it does not end in the Parquet magic bytes 'PAR1'"
                         if size >= 12 else f"{size} bytes, too short to hold a footer")
        length = struct.unpack("<I", tail[:4])[0]
        if length + 12 > size:
            raise refuse(f"its footer claims {length:,} bytes of a {size:,}-byte file")
        footer = bytes(backend.read_range(key, size - length - 8, size - 8, counters)) + tail
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"inputs.{name}: no Parquet file or dataset at {where}") from None
    except Exception as exc:  # noqa: BLE001
        if is_storage_failure(exc):
            raise InputError(f"inputs.{name}: cannot read {where}: {describe_failure(exc)}") from None
        raise
    try:
        metadata = pq.read_metadata(pa.BufferReader(MAGIC + footer))
    except (pa.ArrowException, OSError) as exc:
        raise refuse(f"its footer does not decode: {describe_failure(exc)}") from None
    return _File(key, where, size, footer, metadata)


def _leaf_count(kind: pa.DataType) -> int:
    """The Parquet leaf columns an Arrow field of type ``kind`` is stored as."""
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_count(kind.value_type)
    return 1


def numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _select(name: str, file: _File, selection: TableSelection,
            against: _File | None = None) -> tuple[tuple[str, ...], tuple[int, ...], int | None]:
    """The selected columns of ``file`` (names in matrix order), their leaf column indices, and
    the FixedSizeList width if the matrix is one such column. ``against``: the first file, whose
    columns a glob or "every column" found (named when this file lacks one)."""
    schema = file.metadata.schema.to_arrow_schema()
    names = list(schema.names)
    if selection.column is not None:
        wanted = [selection.column]
    elif selection.columns:
        wanted = list(selection.columns)
    elif selection.glob is not None:
        wanted = [n for n in names if fnmatch.fnmatchcase(n, selection.glob)]
        if not wanted and against is None:
            raise InputError(f"inputs.{name}: no column of {file.where} matches {selection.glob!r} "
                             f"(its columns: {_listed(names)})")
    else:
        wanted = names
    for column in wanted:
        if column not in names:
            raise InputError(f"inputs.{name}: column {column!r} is not in {file.where} (its columns: {_listed(names)})")
    first_leaf = [0]
    for field in schema:
        first_leaf.append(first_leaf[-1] + _leaf_count(field.type))
    types = {field.name: field.type for field in schema}
    lists = [c for c in wanted if pa.types.is_fixed_size_list(types[c]) and numeric(types[c].value_type)]
    if lists and (len(wanted) > 1 or selection.column is not None):
        what = "a vector (column =) is one numeric column" if selection.column is not None else \
            f"a list column is a matrix by itself (columns = [{lists[0]!r}])"
        raise InputError(f"inputs.{name}: column {lists[0]!r} of {file.where} is {types[lists[0]]}; {what}")
    for column in wanted:
        if column not in lists and not numeric(types[column]):
            raise InputError(f"inputs.{name}: column {column!r} of {file.where} is {types[column]}, not numeric "
                             "(integers, floats or booleans; a fixed-size list of them is a matrix)")
    leaves = tuple(first_leaf[names.index(c)] for c in wanted)
    return tuple(wanted), leaves, (types[lists[0]].list_size if lists else None)


def _agree(name: str, first: _File, other: _File, columns: tuple[str, ...], found: tuple[str, ...]) -> None:
    """``other`` holds the same selected columns as ``first``, of the same types."""
    if found != columns:
        raise InputError(f"inputs.{name}: schemas disagree: {first.where} has columns {_listed(columns)} "
                         f"selected, {other.where} {_listed(found)}")
    a, b = first.metadata.schema.to_arrow_schema(), other.metadata.schema.to_arrow_schema()
    for column in columns:
        if a.field(column).type != b.field(column).type:
            raise InputError(f"inputs.{name}: schemas disagree: column {column!r} is {a.field(column).type} in "
                             f"{first.where} but {b.field(column).type} in {other.where}")


def _id_leaves(name: str, first: _File, file: _File, column: str) -> range:
    """The leaf columns of ``file`` that store the id column ``column`` (of any type, the same in
    every file)."""
    schema = file.metadata.schema.to_arrow_schema()
    if column not in schema.names:
        raise InputError(f"inputs.{name}.id_column: column {column!r} is not in {file.where} "
                         f"(its columns: {_listed(schema.names)})")
    kind, expected = schema.field(column).type, first.metadata.schema.to_arrow_schema().field(column).type
    if kind != expected:
        raise InputError(f"inputs.{name}.id_column: schemas disagree: column {column!r} is {expected} in "
                         f"{first.where} but {kind} in {file.where}")
    start = sum(_leaf_count(schema.field(i).type) for i in range(schema.names.index(column)))
    return range(start, start + _leaf_count(kind))


def _joined(chunks: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    """The column chunks of one column's leaves (written one after another) as one range."""
    start = min(offset for offset, _, _ in chunks)
    stop = max(offset + length for offset, length, _ in chunks)
    return start, stop - start, sum(size for _, _, size in chunks)


def _listed(names: Any, most: int = 8) -> str:
    names = list(names)
    shown = ", ".join(names[:most])
    return shown + (f", … ({len(names)} in all)" if len(names) > most else "") if names else "none"


def _chunk(name: str, file: _File, group: int, column: Any) -> tuple[int, int, int]:
    """(offset, compressed bytes, uncompressed bytes) of a column chunk, where pyarrow's reader
    takes its range from: the dictionary page, if it comes first, else the first data page."""
    start = column.data_page_offset
    dictionary = column.dictionary_page_offset
    if column.has_dictionary_page and dictionary is not None and 0 < dictionary < start:
        start = dictionary
    length = column.total_compressed_size
    if start < 4 or length < 0 or start + length > file.size - len(file.footer):
        raise InputError(f"inputs.{name}: {file.where} is corrupt: column {column.path_in_schema!r} of row group "
                         f"{group} lies at bytes {start:,} to {start + length:,}, outside its data")
    return int(start), int(length), int(column.total_uncompressed_size)
