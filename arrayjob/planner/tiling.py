"""Tiling: how each stored array is cut into blocks.

Blocks are whole multiples of the storage chunks along the rows (so a block read is a
set of whole-chunk GETs), sized between enough blocks to keep every worker busy and a
byte budget that keeps per-task memory bounded.
"""

from __future__ import annotations

import math

from arrayjob.io.arrays import ArrayInfo
from arrayjob.planner.physical import BlockGrid

TARGET_BLOCK_BYTES = 64 * 2**20


def row_grid(info: ArrayInfo, *, workers: int, block_rows: int | None = None,
             target_bytes: int = TARGET_BLOCK_BYTES) -> BlockGrid:
    """Row blocks of ``info`` (full width), aligned with its row chunks.

    >>> from arrayjob.io.storage import Location
    >>> x = ArrayInfo("X", Location("file", "/x"), (200_000, 32), "float64", (25_000, 32), 3)
    >>> row_grid(x, workers=2).block_shape
    (50000, 32)
    """
    rows = info.shape[0]
    if block_rows is None:
        chunk_rows = max(1, info.chunks[0])
        row_bytes = max(1, info.nbytes // max(1, rows))
        chunks = math.ceil(rows / chunk_rows) if rows else 1
        by_budget = max(1, target_bytes // (chunk_rows * row_bytes))
        by_parallelism = max(1, math.ceil(chunks / (2 * max(1, workers))))
        block_rows = chunk_rows * min(by_budget, by_parallelism)
    return BlockGrid(info.shape, (max(1, min(block_rows, rows)), *info.shape[1:]))


def aligned_row_grid(info: ArrayInfo, like: BlockGrid) -> BlockGrid:
    """The grid of ``info`` whose row blocks line up with ``like`` (e.g. y with X)."""
    return BlockGrid(info.shape, (like.block_shape[0], *info.shape[1:]))
