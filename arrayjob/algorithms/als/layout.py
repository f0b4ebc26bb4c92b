"""ALS's second layout of the ratings: R's columns (items) as CSC blocks, built once on the
workers from the CSR row blocks the user half-iterations read (``algorithms.als`` is the job that
keeps both; Spartan's duplication tiling).

The build is PageRank's (``algorithms.pagerank.graph``) on a ratings matrix: every row block is
transposed and cut by item block (``SplitByItemBlock``: SciPy's ``tocsc``, a counting sort,
so each item's users stay in ascending order), as plain arrays Ray hands over in place; every
column block's task slices its entries out of each row block's arrays and lays them out as a
CSC block of (all users) × (its items) (``BuildItemBlock``). A row block's arrays are padded
to the most entries any row block holds (a map_blocks output has blocks of one size): a
matrix whose row blocks hold very uneven numbers of ratings pays that padding once, in the
build. ``LayoutWork`` declares what the two block functions cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse


def index_dtype(n: int) -> str:
    """The integer type ids below ``n`` move in: 32 bits when they fit."""
    return "int32" if n <= np.iinfo(np.int32).max else "int64"


def canonical(block: scipy.sparse.csr_matrix) -> scipy.sparse.csr_matrix:
    """``block`` with sorted column indices and no repeats (a repeated entry summed, as SciPy
    reads one): a copy only when it is not so already (the stored block is read-only)."""
    if block.has_canonical_format:
        return block
    block = block.copy()
    block.sum_duplicates()
    return block


def csc_bytes(entries: float, lines: int, users: int) -> int:
    """The bytes of a CSC block of ``entries`` float64 ratings and ``lines`` columns: values,
    row indices and column pointers, in SciPy's index type (32 bits while they fit)."""
    index = 4 if max(users, entries) <= np.iinfo(np.int32).max else 8
    return int(np.ceil(entries)) * (8 + index) + (lines + 1) * index


@dataclass(frozen=True)
class SplitByItemBlock:
    """One row block of R (users × all items, CSR) as its entries sorted by item: (item ids,
    users within the block, ratings), each padded to ``entries``, and a (1, blocks + 1) row of
    where each item block's entries start (blocks of ``item_block`` items)."""

    items: int
    item_block: int
    entries: int

    def __call__(self, block: scipy.sparse.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        columns = canonical(scipy.sparse.csr_matrix(block)).tocsc()  # by item, users ascending
        count = columns.nnz
        item_ids = np.zeros(self.entries, dtype=index_dtype(self.items))
        item_ids[:count] = np.repeat(np.arange(self.items), np.diff(columns.indptr))
        users = np.zeros(self.entries, dtype=index_dtype(block.shape[0]))
        users[:count] = columns.indices
        ratings = np.zeros(self.entries)
        ratings[:count] = columns.data
        blocks = -(-self.items // self.item_block)
        bounds = np.minimum(np.arange(blocks + 1) * self.item_block, self.items)
        return item_ids, users, ratings, columns.indptr[bounds].astype(np.int64).reshape(1, -1)


@dataclass(frozen=True)
class BuildItemBlock:
    """Column block ``c`` of R (all users × items ``c·item_block …``) as a SciPy CSC matrix in a
    (1, 1) object block, from every row block's split (``SplitByItemBlock``; row blocks of
    ``block_rows`` users, arrays of ``entries``).

    ``unsorted``: the pieces come in no user order (blocks of a table of ratings, whose user
    ids are whole ids: ``block_rows`` 0), so the entries are sorted by (item, user).
    Built the other way round (users as the lines, items as the others), it is a block of
    users as the CSC matrix of their columns (``algorithms.als.table``)."""

    users: int
    items: int
    block_rows: int
    item_block: int
    entries: int
    unsorted: bool = False

    def __call__(self, block_id: np.ndarray, item_ids: np.ndarray, users: np.ndarray, ratings: np.ndarray,
                 starts: np.ndarray) -> np.ndarray:
        c = int(np.asarray(block_id).reshape(-1)[0])
        first = c * self.item_block
        width = min(self.item_block, self.items - first)
        spans = [(b * self.entries + int(starts[b, c]), b * self.entries + int(starts[b, c + 1]))
                 for b in range(starts.shape[0])]
        mine = np.concatenate([item_ids[lo:hi] for lo, hi in spans]).astype(np.int64) - first
        who = np.concatenate([users[lo:hi].astype(np.int64) + b * self.block_rows
                              for b, (lo, hi) in enumerate(spans)])
        values = np.concatenate([ratings[lo:hi] for lo, hi in spans])
        # row blocks come in user order and each is sorted by (item, user): a stable sort by
        # item leaves every item's users ascending
        order = np.lexsort((who, mine)) if self.unsorted else np.argsort(mine, kind="stable")
        indptr = np.zeros(width + 1, dtype=np.int64)
        np.cumsum(np.bincount(mine, minlength=width), out=indptr[1:])
        matrix = scipy.sparse.csc_matrix((values[order], who[order].astype(index_dtype(self.users)), indptr),
                                         shape=(self.users, width))
        out = np.empty((1, 1), dtype=object)
        out[0, 0] = matrix
        return out


@dataclass(frozen=True)
class LayoutWork:
    """The declared work (``planner.cost.WORK_KINDS``) of the build: the split reads a row
    block's ``entries`` ratings, counts them by item, writes three arrays and pads them; the
    build gathers its ``entries`` from every row block, sorts them by item and writes a CSC
    block. Ratings are taken to be spread evenly over the item blocks."""

    kind: str  # split | build
    entries: float  # a row block's padded entries (split); a column block's (build)
    items: int = 0  # the items a row block's counting sort runs over (split); a block's (build)

    def __call__(self, shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
        if self.kind == "split":
            return {"elementwise": 8.0 * self.entries + 2.0 * self.items}
        return {"edge_build": self.entries, "elementwise": float(self.items)}
