"""Parquet row blocks, read by the worker that is to hold them (never the driver, for a big
input): the byte ranges ``TableLayout.ranges`` names, one ranged GET each through the storage
backend (obstore on S3, as every other read), decoded by pyarrow's Parquet reader from those
bytes and the file's footer the layout carries. Nothing else is read, so a block's requests
are exactly ``ArrayInfo.block_reads``; ``io.arrays.read_block`` dispatches here.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from arrayjob.errors import InputError, StorageError
from arrayjob.io.backend import StorageBackend, backend_for, describe_failure
from arrayjob.io.locations import ArrayInfo, Location, StorageCounters, StorageOptions
from arrayjob.io.parquet import MAGIC

# rows written at a time when columns become a row-major block: 4,096 rows of 64 float64 columns
# are 2 MB, about a core's L2 (measured on a 250,000 × 64 row group: about twice as fast as
# writing whole columns, under load 48)
TRANSPOSE_ROWS = 4096


def read_table_block(info: ArrayInfo, selection: tuple[slice, ...],
                     options: StorageOptions) -> tuple[np.ndarray, StorageCounters]:
    """Read rows ``selection[0]`` (of columns ``selection[1]``) of Parquet ``info`` as a float64
    array; returns it and the requests it took: one ranged GET per byte range of
    ``TableLayout.ranges`` (the selected column chunks of every row group the rows overlap),
    exactly ``info.block_reads(selection)``. pyarrow decodes the fetched column chunks with
    the file's footer from the layout, so nothing else is read.

    A null in a selected column is an ``InputError`` naming the column, the file, the row group
    and the row, unless ``nulls = "zero"``: then it reads as 0."""
    layout = info.table
    assert layout is not None
    rows = selection[0]
    cols = selection[1] if len(selection) > 1 else slice(0, 1)
    counters = StorageCounters()
    names = list(layout.columns) if layout.list_size is not None else list(layout.columns[cols])
    out = np.empty((rows.stop - rows.start, cols.stop - cols.start))
    for i, lo, hi, table in _row_groups(info, rows, cols, names, options, counters):
        into = out[lo - rows.start:hi - rows.start]
        if layout.list_size is not None:
            into[:] = _values(info, table, names, i, lo)[:, cols]
        else:  # straight into the block: no matrix per row group copied once more
            _values(info, table, names, i, lo, into)
    return (out[:, 0] if len(info.shape) == 1 else out), counters


def read_table_column(info: ArrayInfo, rows: slice, options: StorageOptions) -> tuple[pa.ChunkedArray, StorageCounters]:
    """Rows ``rows`` of the one column of ``info`` (an input's id column, ``ArrayInfo.ids``) as
    Arrow stores them, of whatever type, nulls and all; and the requests it took, one ranged
    GET per row group, as ``read_table_block``."""
    layout = info.table
    assert layout is not None
    counters = StorageCounters()
    parts = [table.column(0) for _, _, _, table in
             _row_groups(info, rows, slice(0, 1), list(layout.columns), options, counters)]
    return pa.chunked_array([c for part in parts for c in part.chunks], type=parts[0].type), counters


def _row_groups(info: ArrayInfo, rows: slice, cols: slice, names: list[str], options: StorageOptions,
                counters: StorageCounters) -> Iterator[tuple[int, int, int, pa.Table]]:
    """For each row group rows ``rows`` overlap: its index, the rows [lo, hi) of the dataset it
    gives, and those rows of columns ``names``, decoded from byte ranges fetched first, one GET
    each (``TableLayout.ranges``), counted into ``counters``."""
    layout = info.table
    assert layout is not None
    backend = backend_for(info.location, options)
    fetched: dict[int, dict[int, memoryview]] = {}
    for file, start, stop in layout.ranges(rows, cols):
        fetched.setdefault(file, {})[start] = _fetch(info, backend, file, start, stop, counters)
    for i in layout.groups(rows.start, rows.stop):
        group, first = layout.row_groups[i], layout.offsets[i]
        lo, hi = max(rows.start, first), min(rows.stop, first + group.rows)
        source = _Fetched(layout.sizes[group.file], fetched.get(group.file, {}),
                          lambda start, stop, f=group.file: _fetch(info, backend, f, start, stop, counters))
        try:
            parquet = pq.ParquetFile(source, metadata=_metadata(layout.footers[group.file]), pre_buffer=False)
            table = parquet.read_row_group(group.index, columns=names, use_threads=False)
        except (InputError, StorageError):
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow could not decode what was read
            raise InputError(f"inputs.{info.name}: row group {group.index} of {_file(info, group.file)} is corrupt: "
                             f"{describe_failure(exc)}") from None
        yield i, lo, hi, table.slice(lo - first, hi - lo)


def _file(info: ArrayInfo, file: int) -> Location:
    assert info.table is not None
    key = info.table.files[file]
    return info.location.join(key) if key else info.location


def _fetch(info: ArrayInfo, backend: StorageBackend, file: int, start: int, stop: int,
           counters: StorageCounters) -> memoryview:
    assert info.table is not None
    try:
        return backend.read_range(info.table.files[file], start, stop, counters)
    except FileNotFoundError:
        raise InputError(f"inputs.{info.name}: {_file(info, file)} is missing: lost data (it was there when "
                         "the job was planned)") from None
    except Exception as exc:  # noqa: BLE001
        raise StorageError(f"inputs.{info.name}: reading bytes {start:,} to {stop:,} of {_file(info, file)} failed: "
                           f"{describe_failure(exc)}") from None


@functools.lru_cache(maxsize=64)
def _metadata(footer: bytes) -> Any:
    """A file's metadata, decoded by pyarrow from its footer bytes (once per worker process)."""
    return pq.read_metadata(pa.BufferReader(MAGIC + footer))


class _Fetched(io.RawIOBase):
    """The column chunks fetched of one file, as the file pyarrow's reader reads them from: a
    read outside them (pyarrow asks no more than the ranges the layout gives, except of files
    from parquet-mr before 1.2.9, which it pads) is fetched then, one GET, counted."""

    def __init__(self, size: int, parts: dict[int, memoryview], fetch: Any) -> None:
        super().__init__()
        self._size, self._parts, self._fetch, self._position = size, parts, fetch, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = base + offset
        return self._position

    def read(self, size: int | None = -1) -> Any:
        """Bytes ``size`` from the position: a view of the fetched bytes, not a copy (pyarrow
        takes any buffer; a copy of each column chunk would cost once more)."""
        start = self._position
        stop = self._size if size is None or size < 0 else min(self._size, start + size)
        data = next((part[start - at:stop - at] for at, part in self._parts.items()
                     if at <= start and stop <= at + part.nbytes), None)
        if data is None:
            data = self._fetch(start, stop)
        self._position = start + len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _values(info: ArrayInfo, table: pa.Table, names: list[str], group: int, first_row: int,
            into: np.ndarray | None = None) -> np.ndarray:
    """The rows of ``table`` (from row ``first_row`` of the dataset, in row group ``group``) as a
    float64 matrix, one column per name (a FixedSizeList column: one per element), written
    ``into`` that matrix if given (not for a FixedSizeList); a null is refused or read as 0,
    as ``nulls`` says."""
    layout = info.table
    assert layout is not None
    zero = layout.selection.nulls == "zero"
    if layout.list_size is not None:
        lists = table.column(names[0]).combine_chunks()
        k = layout.list_size
        values = lists.values.slice(lists.offset * k, len(lists) * k)  # a null list's slots too
        null_lists = lists.is_null().to_numpy(zero_copy_only=False)
        nulls = null_lists | values.is_null().to_numpy(zero_copy_only=False).reshape(-1, k).any(axis=1)
        if nulls.any() and not zero:
            raise _null(info, names[0], group, first_row + int(np.argmax(nulls)))
        matrix = np.asarray(pc.fill_null(values, 0).to_numpy(zero_copy_only=False), dtype=np.float64).reshape(-1, k)
        if null_lists.any():  # (without nulls, pyarrow's array is read-only: never written to)
            matrix = matrix.copy()
            matrix[null_lists] = 0.0
        return matrix
    out = np.empty((table.num_rows, len(names))) if into is None else into
    columns = []
    for name in names:
        column = table.column(name)
        if column.null_count:
            if not zero:
                nulls = column.is_null().to_numpy()
                raise _null(info, name, group, first_row + int(np.argmax(nulls)))
            column = pc.fill_null(column, 0)
        columns.append(column.to_numpy())
    # columns into a row-major block, a band of rows at a time: a whole column at a time would
    # stride through all of it once per column (64 passes over 128 MB for a 250,000 × 64 row
    # group, each line fetched again), a band's rows stay in cache across its columns
    for start in range(0, table.num_rows, TRANSPOSE_ROWS):
        stop = start + TRANSPOSE_ROWS
        for j, values in enumerate(columns):
            out[start:stop, j] = values[start:stop]
    return out


def _null(info: ArrayInfo, column: str, group: int, row: int) -> InputError:
    layout = info.table
    assert layout is not None
    chunk = layout.row_groups[group]
    file_start = layout.offsets[next(i for i, g in enumerate(layout.row_groups) if g.file == chunk.file)]
    return InputError(f"inputs.{info.name}: column {column!r} holds a null at row {row:,} (row {row - file_start:,} "
                      f"of {_file(info, chunk.file)}, in its row group {chunk.index}); nulls = \"zero\" in [inputs] "
                      "reads nulls as 0")
