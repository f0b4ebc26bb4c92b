"""ALS's ratings from a table: a Parquet dataset of (user, item, rating) rows, named as
``R = { uri = ..., columns = ["user", "item", "rating"] }`` (those three columns, in that
order, of any names; ``algorithms.als`` is the job).

What the footers say is checked on the driver, before anything is read (and ``nulls =
"zero"``, which would make a missing id user or item 0, is refused): three columns, the
ids integer columns (Arrow's int8 … uint64; ids are numbers 0..users − 1 and 0..items − 1,
not names), every row group carrying statistics of them (Parquet writers do by default) with
no id below 0. The users are the greatest user id + 1, the items the greatest item id + 1
(those statistics: a user or item beyond the last rated one has no factor); the ratings are
the table's rows.

The table's row blocks (whole row groups, read by the workers through the Parquet reader of
any input: nulls and NaN refused there) become both of the layouts the CSR input has, with
no matrix on the driver: each block is checked (``RatingsCheck``), then sorted twice, by user
block and by item block (``SplitRatings``, a counting sort each, padded to the block's rows),
and each user block's and each item block's CSC matrix is gathered from every table block's
pieces (``algorithms.als.layout.BuildItemBlock``, entries sorted by (line, other) since table
blocks come in no order; ``NoRepeats`` refuses a (user, item) pair rated twice, which Spark
would take as two ratings and SciPy would sum: a table of ratings holds one a pair). A user
block is kept as the CSC matrix of its users' columns (items × users), read by the user
kernel through its transpose, as the item kernel reads an item block.

Cost, once, in "load": the table read once (24 bytes a rating as float64), two counting sorts
and one shuffle of both copies (16 bytes a rating each), held twice while the blocks are
gathered; then each iteration as with a CSR input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arrayjob.algorithms.als.layout import BuildItemBlock, index_dtype
from arrayjob.api import ArrayInfo, InputError, require

ROLES = ("user", "item", "rating")  # R's three columns, in this order


@dataclass(frozen=True)
class RatingsTable:
    """The shape of ratings held as a table: (users, items), and the ratings (its rows)."""

    users: int
    items: int
    nnz: int


def ratings_table(R: ArrayInfo) -> RatingsTable:
    """What R's footers say of its ratings; ``InputError`` (exit 2) for what cannot be ratings."""
    layout = R.table
    assert layout is not None
    columns = list(layout.columns)
    require(layout.list_size is None and len(columns) == 3 and R.ndim == 2,
            f"inputs.R: a table of ratings is read as three columns, user, item and rating, in that order "
            f"(columns = [\"user\", \"item\", \"rating\"]); got {len(columns)}: {', '.join(columns) or 'none'}")
    require(layout.selection.nulls != "zero", "inputs.R: nulls = \"zero\" would read a missing user or item id as "
                                              "0, another user's or item's; a table of ratings refuses nulls")
    for role, column, kind, bounds in zip(ROLES[:2], columns, layout.types, layout.bounds, strict=False):
        require(kind.startswith(("int", "uint")),
                f"inputs.R: column {column!r} (the {role} ids) is {kind}; ids are integers 0, 1, 2, …")
        require(bounds is not None,
                f"inputs.R: column {column!r} (the {role} ids) has no statistics in some row group of {R.location}, "
                f"so its largest id (the {role}s) is unknown without reading it: write the files with statistics "
                "(pyarrow's and Spark's default)")
        assert bounds is not None
        require(bounds[0] >= 0, f"inputs.R: column {column!r} (the {role} ids) holds a negative id ({bounds[0]:g}) "
                                f"in {R.location}; ids are integers 0, 1, 2, …")
    user_bounds, item_bounds = layout.bounds[0], layout.bounds[1]
    assert user_bounds is not None and item_bounds is not None
    return RatingsTable(int(user_bounds[1]) + 1, int(item_bounds[1]) + 1, R.shape[0])


@dataclass(frozen=True)
class RatingsCheck:
    """What is wrong with a block of the table, where it is read (its statistics said nothing
    is, so only a file that lies about them gets here): an id outside [0, users) or [0, items);
    implicit feedback, also a negative rating."""

    users: int
    items: int
    columns: tuple[str, ...]
    implicit: bool

    def __call__(self, block: np.ndarray) -> str | None:
        for j, (role, count) in enumerate(zip(ROLES, (self.users, self.items), strict=False)):
            ids = block[:, j]
            bad = (ids < 0) | (ids >= count) | (ids != np.floor(ids))
            if bad.any():
                return (f"a {role} id of {ids[bad][0]:g} in column {self.columns[j]!r}, outside 0..{count - 1} "
                        "(its statistics said otherwise)")
        if self.implicit and block.shape[0] and block[:, 2].min() < 0:
            return f"a negative rating ({block[:, 2].min():g}; implicit feedback takes counts >= 0)"
        return None


@dataclass(frozen=True)
class SplitRatings:
    """A block of the table (rows of user, item, rating) sorted twice: by user block (blocks of
    ``user_block`` users) and by item block, each as (line ids, other ids, ratings), padded to
    ``entries``, and a (1, blocks + 1) row of where each block's entries start: the pieces
    ``BuildItemBlock`` gathers (with ``block_rows`` 0: the other ids are whole ids)."""

    users: int
    items: int
    user_block: int
    item_block: int
    entries: int

    def __call__(self, block: np.ndarray) -> tuple[np.ndarray, ...]:
        users, items, ratings = block[:, 0].astype(np.int64), block[:, 1].astype(np.int64), block[:, 2]
        return (*self._side(users, items, ratings, self.user_block, self.users, self.items),
                *self._side(items, users, ratings, self.item_block, self.items, self.users))

    def _side(self, lines: np.ndarray, others: np.ndarray, ratings: np.ndarray, width: int, count: int,
              other_count: int) -> tuple[np.ndarray, ...]:
        blocks = -(-count // width)
        owner = lines // width
        order = np.argsort(owner, kind="stable")
        n = len(lines)
        line_ids = np.zeros(self.entries, dtype=index_dtype(count))
        line_ids[:n] = lines[order]
        other_ids = np.zeros(self.entries, dtype=index_dtype(other_count))
        other_ids[:n] = others[order]
        values = np.zeros(self.entries)
        values[:n] = ratings[order]
        starts = np.searchsorted(owner[order], np.arange(blocks + 1)).astype(np.int64).reshape(1, -1)
        return line_ids, other_ids, values, starts


@dataclass(frozen=True)
class NoRepeats:
    """``build`` (a block of users or of items, as the CSC matrix of its lines' columns), refusing
    a (user, item) pair rated twice: one line naming the pair and R."""

    build: BuildItemBlock
    lines_are: str  # "user" or "item": what the block's columns are
    where: str

    def __call__(self, *pieces: np.ndarray) -> np.ndarray:
        out = self.build(*pieces)
        matrix = out[0, 0]
        rows = matrix.indices
        same = np.flatnonzero(rows[1:] == rows[:-1])
        line_of = np.repeat(np.arange(matrix.shape[1]), np.diff(matrix.indptr))
        same = same[line_of[same] == line_of[same + 1]]
        if same.size:
            line = int(line_of[same[0]]) + int(np.asarray(pieces[0]).reshape(-1)[0]) * self.build.item_block
            other = int(rows[same[0]])
            user, item = (line, other) if self.lines_are == "user" else (other, line)
            raise InputError(f"inputs.R: user {user} rated item {item} more than once in {self.where}; ALS takes "
                             "one rating per (user, item) pair (sum or drop the repeats first)")
        return out
