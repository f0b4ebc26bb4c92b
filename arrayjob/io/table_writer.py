"""Per-row outputs as Parquet (``[output] format = "parquet"``): each row block written as one
file by the worker that computed it (``planner.physical.WriteBlock`` of a ``TableTarget``).

A file holds the rows' ids, read by the same worker from the id column of the input the rows
follow (``[inputs] X = { ..., id_column = "user_id" }``, of any Arrow type, as stored), then
the output: a column named as the output (``labels``), int64 or float64, or a fixed-size list
of float64 for an (n, k) output (PCA's scores). Snappy-compressed, one row group; written
whole by one PUT, so a retried task replaces the file with the same rows and a reader never
sees part of one. Nothing is published until ``_SUCCESS`` names the run (``io.output``)::

    pyarrow.dataset.dataset("out/runs/<run id>/labels").to_table()   # rows in input order
    spark.read.parquet("s3a://bucket/out/runs/<run id>/labels")
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from arrayjob.errors import StorageError
from arrayjob.io.backend import backend_for, describe_failure
from arrayjob.io.locations import StorageCounters, StorageOptions, TableTarget
from arrayjob.io.parquet_blocks import read_table_column

COMPRESSION = "snappy"


def rows_table(target: TableTarget, block: np.ndarray, ids: pa.ChunkedArray | None) -> pa.Table:
    """The rows of one block as the table its file holds: the ids, if any, then the output."""
    values = np.ascontiguousarray(block)
    column: pa.Array
    if values.ndim == 1:
        column = pa.array(values)
    else:
        width = values.shape[1]
        column = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width)
    columns = {target.name: column}
    if ids is not None and target.ids is not None:
        assert target.ids.table is not None
        columns = {target.ids.table.columns[0]: ids, **columns}
    return pa.table(columns)


def write_table_block(target: TableTarget, options: StorageOptions, selection: tuple[tuple[int, int], ...],
                      block: np.ndarray) -> np.ndarray:
    """Write the rows ``selection[0]`` of an output, ``block``, as ``target``'s file for them;
    returns [bytes written, PUTs, bytes read, GETs] (the reads: of the id column)."""
    lo, hi = selection[0]
    read = StorageCounters()
    ids = None
    if target.ids is not None:
        ids, read = read_table_column(target.ids, slice(lo, hi), options)
    sink = pa.BufferOutputStream()
    pq.write_table(rows_table(target, block, ids), sink, compression=COMPRESSION)
    data = sink.getvalue().to_pybytes()
    try:
        backend_for(target.location, options).write_bytes(target.part_key(lo), data)
    except Exception as exc:  # noqa: BLE001
        raise StorageError(f"output: writing rows {lo:,} to {hi:,} of {target.uri} failed: "
                           f"{describe_failure(exc)}") from None
    return np.array([len(data), 1, read.bytes_read, read.get_requests], dtype=np.int64)
