"""Matrix factorisation by alternating least squares: R ≈ X Yᵀ for a sparse ratings matrix R
(users × items), with user factors X (users × rank) and item factors Y (items × rank).

Explicit ratings minimise Σ₍ᵤ,ᵢ₎∈Ω (rᵤᵢ − xᵤ·yᵢ)² + l2 (Σᵤ nᵤ‖xᵤ‖² + Σᵢ nᵢ‖yᵢ‖²) over the
stored entries Ω of R, the weighted-λ form of Spark MLlib's ``ALS`` (Zhou, Wilkinson, Schreiber
& Pan, "Large-scale parallel collaborative filtering for the Netflix prize", 2008; nᵤ, nᵢ: the
ratings of user u and of item i). Implicit feedback (``implicit = true``; Hu, Koren & Volinsky,
"Collaborative filtering for implicit feedback datasets", 2008) minimises Σ over all pairs of
cᵤᵢ (pᵤᵢ − xᵤ·yᵢ)² + l2 (Σ‖xᵤ‖² + Σ‖yᵢ‖²), pᵤᵢ = [rᵤᵢ > 0], cᵤᵢ = 1 + alpha·rᵤᵢ (counts:
a negative rating is refused where its block is read). Each iteration solves every user's
rank × rank system given Y, then every item's given the new X (``algorithms.als.solve``), so the
objective never increases. A stored zero is a rating of 0 (explicit) or a pair of
confidence 1 with p = 0 (implicit, as an absent pair); a rating stored twice in a row is
summed, as SciPy reads it.

Two layouts of R (Spartan's duplication tiling; Huang et al. report ALS 40 % faster with it):
the users are solved from R's CSR row blocks, read once and kept by the block cache, and the
items from R's columns, built once on the workers from those row blocks into CSC column
blocks (``algorithms.als.layout``, the build PageRank's graph has: each row block transposed and
cut by item block, the pieces kept; each column block gathered from every row block's
pieces, kept between iterations, the pieces released) — two passes declared in "load", which
the estimate prices once. A half-iteration is one pass: one task per block solves its rows'
systems given the other side's factors, a driver value, and returns its rows of the factor
matrix, which the driver assembles. The item pass also returns each column block's terms of
the objective for the factors it has just solved (``als_solve.objective_terms``: the
residuals over Ω need both sides), so the objective after each iteration costs no pass of
its own.

R may also be a Parquet table of (user, item, rating) rows (``algorithms.als.table``): its row
blocks are split by user block and by item block and both layouts are built from the pieces
in "load" (a kept block of users then is the CSC matrix of their columns, read through its
transpose), so the iterations are the same as from a CSR group, and so are the factors.

When the memory budget cannot hold both layouts (and the build's pieces while it runs), the
one memory model decides as for any job (docs/operating.md, "Bigger than memory"): R's row
blocks stream (from the nodes' spill, or storage), the pieces and the column blocks are kept
in the spill and read back at each use, the build's gathered pieces go to the spill as it
runs; the results are the same, the iterations slower by those reads. The factors, returned
to the driver, must fit beside them.

Limits: X and Y live on the driver and go to every task of a half-iteration whole, so
8·(users + items)·rank bytes must fit the driver's memory and a task's argument (10 M users
at rank 32 are 2.6 GB: too many for one driver value). The layout build pads each row
block's pieces to the most ratings any row block holds (``algorithms.als.layout``).

Initial item factors: ``init``, the URI of an (items × rank) array, or random normal values
divided by √rank from ``seed``. X and Y are checkpointed after each iteration
(``io.checkpoint``); a resumed run builds the column layout again (it is deterministic) and
goes on from them.

Cost per iteration: each side reads its layout's nnz ratings once, in memory; about
4·nnz·rank² flops of outer products per side and one rank × rank solve per user and per item
(2/3·rank³ flops); Y (items × rank) goes to each of the B row blocks and X (users × rank) to
each of the C column blocks, and X and Y come back once. Build, once: two passes over the nnz
ratings and one shuffle of them (16 bytes a rating: item, user, rating), held twice while
the column blocks are gathered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse

from arrayjob import api as la
from arrayjob.algorithms.als.layout import (
    BuildItemBlock,
    LayoutWork,
    SplitByItemBlock,
    csc_bytes,
    index_dtype,
)
from arrayjob.algorithms.als.solve import ItemStep, SolveWork, UserStep
from arrayjob.algorithms.als.table import (
    NoRepeats,
    RatingsCheck,
    RatingsTable,
    SplitRatings,
    ratings_table,
)
from arrayjob.algorithms.tsqr import block_rows_for
from arrayjob.api import (
    EACH_ITERATION,
    InputError,
    Job,
    JobContext,
    JobResult,
    Kernel,
    Pass,
    StagePlan,
    open_array_info,
    parse_uri,
    require,
    require_numeric,
)

PIECES, COLUMNS = "als-pieces", "als-columns"  # handles of the split row blocks and of R's column layout


@dataclass(frozen=True)
class ALSParams:
    rank: int = field(metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    l2: float = field(default=0.1, metadata={"check": lambda v: v > 0 and np.isfinite(v), "expect": "a number > 0"})
    max_iter: int = field(default=10, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    seed: int = 0
    # or the URI of an (items × rank) array of initial item factors (a relative path: as the inputs)
    init: str = field(default="random", metadata={"uri": ("random",)})
    implicit: bool = False
    alpha: float = field(default=1.0, metadata={"check": lambda v: v >= 0 and np.isfinite(v),
                                                "expect": "a number >= 0"})


def negative_rating(block: scipy.sparse.csr_matrix) -> str | None:
    """What is wrong with a block of implicit feedback: a negative rating (a count is >= 0)."""
    values = np.asarray(block.data)
    if values.size and values.min() < 0:
        return f"a negative rating ({float(values.min()):g}; implicit feedback takes counts >= 0)"
    return None


class ALS(Job):
    name = "als"
    title = "ALS"
    inputs = ("R",)
    sparse_inputs = ("R",)
    Params = ALSParams
    params: ALSParams

    def check_inputs(self) -> None:
        R = self.arrays["R"]
        if R.table is not None:  # a table of (user, item, rating) rows (``algorithms.als.table``)
            self.table: RatingsTable | None = ratings_table(R)
            self.users, self.items, self.nnz = self.table.users, self.table.items, self.table.nnz
        else:
            self.table = None
            require(R.sparse is not None, f"inputs.R: expected a sparse ratings matrix (users × items, a CSR group "
                                          f"in AnnData's layout, or a Parquet table of user, item and rating "
                                          f"columns), got a dense array of shape {R.shape}")
            assert R.sparse is not None
            require(R.sparse.format == "csr", f"inputs.R: {R.uri}: a {R.sparse.format}_matrix group; ALS takes the "
                                              f"ratings as CSR (row u: the ratings of user u)")
            require_numeric(R)
            require(R.sparse.nnz > 0, f"inputs.R: {R.uri} holds no ratings")
            (self.users, self.items), self.nnz = R.shape, R.sparse.nnz
        p = self.params
        if p.init != "random":
            self.init_array = open_array_info("init", parse_uri(p.init, key="params.init"), self.storage)
            shape = (self.items, p.rank)
            require(self.init_array.shape == shape, f"params.init: expected an (items × rank) array of item factors, "
                                                    f"{shape}, got {self.init_array.shape}")

    @property
    def alpha(self) -> float | None:
        """The confidence scale the kernels take: None for explicit ratings."""
        return self.params.alpha if self.params.implicit else None

    def describe(self) -> str:
        kind = f"implicit, alpha = {self.params.alpha:g}" if self.params.implicit else "explicit, weighted-λ"
        layouts = ("CSR row blocks for the users, CSC column blocks (built once) for the items" if self.table is None
                   else "user blocks and item blocks, both built once from the table's row blocks")
        return (f"{self.title} ({kind}), rank {self.params.rank}, on R {self.users:,} users × {self.items:,} items, "
                f"{self.nnz:,} ratings{' (a table)' if self.table else ''}; R kept in two layouts: {layouts}")

    # -- blocks ---------------------------------------------------------------------------------
    def _row_blocks(self, workers: int) -> tuple[int, int]:
        """(rows per block, blocks) of R as stored: the planner's row blocks, chunk-aligned
        (users of a CSR R; ratings of a table)."""
        rows = block_rows_for(self, "R", workers)
        return rows, math.ceil(self.arrays["R"].shape[0] / rows)

    def _blocks_of(self, count: int, workers: int) -> tuple[int, int]:
        """(users or items per block, blocks): as many as R has row blocks (at most one per
        user or item), so every half-iteration runs as many tasks."""
        width = math.ceil(count / min(count, self._row_blocks(workers)[1]))
        return width, math.ceil(count / width)

    def _user_blocks(self, workers: int) -> tuple[int, int]:
        """(users per block, user blocks): R's row blocks, of a CSR R."""
        return self._row_blocks(workers) if self.table is None else self._blocks_of(self.users, workers)

    def _item_blocks(self, workers: int) -> tuple[int, int]:
        return self._blocks_of(self.items, workers)

    def _padded_entries(self, workers: int) -> int:
        """The most ratings a row block of R holds (of a CSR R: from the ``indptr`` read when R
        was opened): the length of every row block's split arrays."""
        R = self.arrays["R"]
        rows, blocks = self._row_blocks(workers)
        if R.sparse is None:
            return min(rows, self.nnz)
        users = R.shape[0]
        return max(1, max(R.sparse.nnz_between(b * rows, min((b + 1) * rows, users), R.chunks[0], users)
                          for b in range(blocks)))

    def _ratings(self) -> la.BlockArray:
        R = self.arrays["R"]
        if self.table is not None:
            check = RatingsCheck(self.users, self.items, R.table.columns if R.table else (), self.params.implicit)
            return la.from_input(R, Kernel("als_table_check", check))
        return la.from_input(R, Kernel("als_negative_rating", negative_rating) if self.params.implicit else None)

    def _block_bytes(self, side: str, workers: int) -> int:
        """A kept block's bytes: ratings spread evenly over the blocks."""
        width, blocks = self._item_blocks(workers) if side == "columns" else self._user_blocks(workers)
        return csc_bytes(self.nnz / blocks, width, self.users if side == "columns" else self.items)

    def _kept(self, side: str, workers: int) -> la.BlockArray:
        """R's column layout (``side`` "columns"), or of a table its user blocks ("rows"), as
        ``Session.persist(..., handle=COLUMNS)`` keeps it."""
        blocks = (self._item_blocks if side == "columns" else self._user_blocks)(workers)[1]
        return la.cached(f"{COLUMNS}:{side}", (blocks, 1), "object", (1, 1), self._block_bytes(side, workers))

    def _pieces_declared(self, workers: int) -> list[tuple[str, tuple[int, ...], str, tuple[int, ...]]]:
        """The split's outputs, (name, shape, dtype, block shape): every row block's entries
        sorted by item (item ids, users within the block, ratings), padded to the most any row
        block holds, and where each item block's entries start; of a table, its entries sorted
        by user block as well (``algorithms.als.table``)."""
        rows, row_blocks = self._row_blocks(workers)
        entries = self._padded_entries(workers)

        def side(prefix: str, lines: int, others: int, blocks: int) -> list[tuple[str, tuple[int, ...], str,
                                                                                  tuple[int, ...]]]:
            return [(f"{prefix}item_ids" if not prefix else f"{prefix}line_ids", (row_blocks * entries,),
                     index_dtype(lines), (entries,)),
                    (f"{prefix}user_ids" if not prefix else f"{prefix}other_ids", (row_blocks * entries,),
                     index_dtype(others), (entries,)),
                    (f"{prefix}ratings", (row_blocks * entries,), "float64", (entries,)),
                    (f"{prefix}starts", (row_blocks, blocks + 1), "int64", (1, blocks + 1))]

        if self.table is None:
            return side("", self.items, rows, self._item_blocks(workers)[1])
        return (side("by_user_", self.users, self.items, self._user_blocks(workers)[1])
                + side("by_item_", self.items, self.users, self._item_blocks(workers)[1]))

    def _split(self, workers: int) -> dict[str, la.BlockArray]:
        """Each CSR row block of R transposed and cut by item block (``algorithms.als.layout``); each
        block of a table cut by user block and by item block (``algorithms.als.table``)."""
        rows = self._row_blocks(workers)[0]
        width = self._item_blocks(workers)[0]
        entries = self._padded_entries(workers)
        declared = self._pieces_declared(workers)
        split: SplitByItemBlock | SplitRatings
        if self.table is None:
            split, name = SplitByItemBlock(self.items, width, entries), "als_split_by_item_block"
            cost = LayoutWork("split", entries, self.items)
        else:
            split = SplitRatings(self.users, self.items, self._user_blocks(workers)[0], width, entries)
            name, cost = "als_split_ratings", LayoutWork("split", 2 * entries, self.users + self.items)
        pieces = la.map_blocks(Kernel(name, split), self._ratings(),
                               outputs=[(shape, dtype, block[0]) for _, shape, dtype, block in declared],
                               block_rows=[rows], cost=cost)
        return {name: x for (name, *_), x in zip(declared, pieces, strict=True)}

    def _kept_pieces(self, workers: int) -> dict[str, la.BlockArray]:
        """The split's outputs as ``Session.persist(..., handle=PIECES)`` keeps them."""
        return {name: la.cached(f"{PIECES}:{name}", shape, dtype, block)
                for name, shape, dtype, block in self._pieces_declared(workers)}

    def _layout(self, workers: int) -> dict[str, la.BlockArray]:
        """R's CSC column blocks, each gathered from every row block's kept pieces
        (``algorithms.als.layout``); of a table, its user blocks too (``algorithms.als.table``)."""
        R = self.arrays["R"]
        rows = self._row_blocks(workers)[0]
        entries = self._padded_entries(workers)
        pieces = self._kept_pieces(workers)
        if self.table is None:
            width, blocks = self._item_blocks(workers)
            build = BuildItemBlock(self.users, self.items, rows, width, entries)
            (columns,) = la.map_blocks(
                Kernel("als_build_item_block", build), la.value("item_blocks", (blocks,), "int64"),
                pieces["item_ids"], pieces["user_ids"], pieces["ratings"], pieces["starts"],
                outputs=[((blocks, 1), "object", 1, self._block_bytes("columns", workers))],
                block_rows=[1, None, None, None, None], cost=LayoutWork("build", self.nnz / blocks, width))
            return {"columns": columns}
        built = {}
        for side, (lines, others), prefix in (("rows", ("user", "item"), "by_user_"),
                                             ("columns", ("item", "user"), "by_item_")):
            width, blocks = (self._user_blocks if side == "rows" else self._item_blocks)(workers)
            counts = {"user": self.users, "item": self.items}
            checked = NoRepeats(BuildItemBlock(counts[others], counts[lines], 0, width, entries, unsorted=True),
                                lines, str(R.location))
            (built[side],) = la.map_blocks(
                Kernel(f"als_build_{lines}_block", checked), la.value(f"{lines}_blocks", (blocks,), "int64"),
                *(pieces[f"{prefix}{name}"] for name in ("line_ids", "other_ids", "ratings", "starts")),
                outputs=[((blocks, 1), "object", 1, self._block_bytes(side, workers))],
                block_rows=[1, None, None, None, None], cost=LayoutWork("build", self.nnz / blocks, width))
        return built

    def _grams(self, name: str) -> tuple[la.BlockArray, ...]:
        rank = self.params.rank
        return (la.value(name, (rank, rank)),) if self.params.implicit else ()

    def _users(self, workers: int) -> dict[str, la.BlockArray]:
        """One task per row block of a CSR R (per kept user block of a table): its users'
        factors, given Y."""
        users, items, rank = self.users, self.items, self.params.rank
        rows, row_blocks = self._user_blocks(workers)
        gram = self._grams("item_gram")
        ratings, block = (self._ratings(), rows) if self.table is None else (self._kept("rows", workers), 1)
        (x,) = la.map_blocks(Kernel("als_users", UserStep(self.params.l2, self.alpha)), ratings,
                             la.value("item_factors", (items, rank)), *gram, outputs=[((users, rank), "float64", rows)],
                             block_rows=[block, None, *(None for _ in gram)],
                             cost=SolveWork(self.nnz / row_blocks, rows, rank))
        return {"user_factors": x}

    def _items(self, workers: int) -> dict[str, la.BlockArray]:
        """One task per kept column block: its items' factors given X, and its terms of the
        objective."""
        users, items, rank = self.users, self.items, self.params.rank
        width, blocks = self._item_blocks(workers)
        gram = self._grams("user_gram")
        y, terms = la.map_blocks(Kernel("als_items", ItemStep(self.params.l2, self.alpha)),
                                 self._kept("columns", workers), la.value("user_factors", (users, rank)), *gram,
                                 outputs=[((items, rank), "float64", width), ((blocks, 3), "float64", 1)],
                                 block_rows=[1, None, *(None for _ in gram)],
                                 cost=SolveWork(self.nnz / blocks, width, rank, objective=True))
        return {"item_factors": y, "terms": terms}

    def stages(self, workers: int) -> StagePlan:
        """In "load": R's row blocks (read by the first program, kept for the job), split by item
        block (kept as ``PIECES``: the split's results go to the spill where the budget has no
        room for them, as any kept blocks), and the build of the column layout from them (kept as
        ``COLUMNS``; the pieces released); then, each iteration, the users' pass over the row
        blocks and the items' pass over the column blocks."""
        return StagePlan((
            Pass("split", "load", self._split(workers), keeps=PIECES),
            Pass("layout", "load", self._layout(workers), keeps=COLUMNS, releases=(PIECES,)),
            Pass("users", "fit", self._users(workers), EACH_ITERATION),
            Pass("items", "fit", self._items(workers), EACH_ITERATION),
        ))

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        return [((self.users, self.params.rank), "float64", None), ((self.items, self.params.rank), "float64", None)]

    # -- the run --------------------------------------------------------------------------------
    def initial(self, ctx: JobContext) -> np.ndarray:
        """Y₀: ``init``'s array, or N(0, 1) / √rank from ``seed``."""
        p = self.params
        if p.init == "random":
            return np.random.default_rng(p.seed).standard_normal((self.items, p.rank)) / math.sqrt(p.rank)
        factors = ctx.read_whole(self.init_array).astype(np.float64)
        if not np.isfinite(factors).all():
            raise InputError("params.init: the initial item factors hold NaN or infinite values")
        return factors

    def objective(self, terms: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        """The objective from the item pass's terms (summed over its column blocks) and the factors."""
        t = terms.sum(axis=0)
        if not self.params.implicit:
            return float(t[0] + self.params.l2 * (t[1] + t[2]))
        pairs = float(np.sum((x.T @ x) * (y.T @ y)))  # Σ over all pairs of (x·y)²
        return float(t[0] + pairs + self.params.l2 * (np.sum(x * x) + np.sum(y * y)))

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        workers = ctx.workers
        plan = self.stages(workers)
        with ctx.stage("load"):
            # R's row blocks are read by the split (and stay for the users' passes); its pieces
            # are kept, not held as results, so the budget's split of R does not count them
            pieces = ctx.persist(plan["split"], handle=PIECES)
            blocks = {"item_blocks": np.arange(self._item_blocks(workers)[1], dtype=np.int64),
                      "user_blocks": np.arange(self._user_blocks(workers)[1], dtype=np.int64)}
            kept = ctx.persist(plan["layout"], blocks, handle=COLUMNS)
            ctx.release(pieces)
            # kept as the declared programs read them
            layouts = {side: self._kept(side, workers) for side in kept}
            for arrays, declared in ((pieces, self._kept_pieces(workers)), (kept, layouts)):
                assert {k: a.attrs for k, a in arrays.items()} == {k: a.attrs for k, a in declared.items()}
            saved = ctx.restore()  # the factors after an iteration
            if saved is None:
                y, x, objective, iterations = self.initial(ctx), None, [], 0
            else:
                st = saved.state
                y, x = st["item_factors"], st["user_factors"]
                objective, iterations = [float(v) for v in st["objective"]], int(st["iteration"])
        users, items = plan["users"], plan["items"]
        with ctx.stage(plan.stage_of("users")):
            while iterations < p.max_iter:
                x = ctx.compute(users, {"item_factors": y, **self._gram("item_gram", y)})["user_factors"]
                r = ctx.compute(items, {"user_factors": x, **self._gram("user_gram", x)})
                y = r["item_factors"]
                objective.append(self.objective(r["terms"], x, y))
                iterations += 1
                ctx.iteration(iterations, p.max_iter, objective=objective[-1])
                ctx.checkpoint(iterations, {"user_factors": x, "item_factors": y,
                                            "objective": np.array(objective), "iteration": iterations})
        ctx.release(kept)
        assert x is not None  # max_iter >= 1
        attrs = {"objective": objective, "iterations": iterations, "rank": p.rank, "l2": p.l2,
                 "implicit": p.implicit, **({"alpha": p.alpha} if p.implicit else {})}
        return JobResult({"user_factors": x, "item_factors": y}, attrs,
                         [f"{iterations} iterations: objective {objective[0]:.10g} after the first, "
                          f"{objective[-1]:.10g} after the last; {self.users:,} users × {self.items:,} items, "
                          f"rank {p.rank}"])

    def _gram(self, name: str, factors: np.ndarray) -> dict[str, np.ndarray]:
        """FᵀF for the implicit systems (none for explicit ratings)."""
        return {name: factors.T @ factors} if self.params.implicit else {}
