"""ALS's block kernels: one half-iteration on one block of ratings (``algorithms.als`` is the job).

A block is a CSR matrix whose rows are the side being updated (users of a row block of R, or
items of a column block, read through the transpose of its CSC layout) and whose columns
index the other side's factors F (others × rank), a driver value. Row u's system is

- explicit (the weighted-λ form of Spark MLlib's ALS): (Σᵢ∈Ωᵤ fᵢfᵢᵀ + l2·nᵤ·I) xᵤ = Σᵢ∈Ωᵤ rᵤᵢ fᵢ;
- implicit (Hu, Koren & Volinsky 2008): (FᵀF + Σᵢ∈Ωᵤ α·rᵤᵢ·fᵢfᵢᵀ + l2·I) xᵤ = Σᵢ: rᵤᵢ>0 (1 + α·rᵤᵢ) fᵢ,
  FᵀF computed once on the driver (``gram``), so a row costs its own ratings only.

Only the upper triangle of a row's Σ wᵢfᵢfᵢᵀ is summed (the P = rank·(rank + 1)/2 pairs
k ≤ l): one sparse product per slab of rows, of the weights (a CSR matrix with the ratings'
structure) with a table of fᵢₖfᵢₗ for every row i of F (others × P, made once per call, while
it takes at most ``TABLE_BYTES``: each rating then costs P multiply-adds reading its item's
row of the table), else with the slab's own ratings' products, gathered (two gathers, P
multiplies and a write more per rating: a half-iteration on a million ratings of 25,000 rows
over 2,000 others took 0.06 s with the table and 0.6 s without at rank 8, 1.4 s and 8.9 s at
rank 32; best of five, one BLAS thread, a shared 2-core machine); the right-hand sides are one
product for the whole block; then one batched LAPACK solve per slab. A slab holds about
``SLAB_BYTES`` of products and of systems. A row with no ratings gets xᵤ = 0 (explicit: the
objective does not depend on it; implicit: its system's solution).

The item kernel also returns its block's terms of the objective, from the factors it has
just solved and the user factors (``objective_terms``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse

from arrayjob.algorithms.als.layout import canonical

SLAB_BYTES = 32 * 2**20  # of outer products, or of systems, per slab of rows (a row alone may pass it)
TABLE_BYTES = 64 * 2**20  # the most the other side's table of products fᵢₖfᵢₗ may take


def _slabs(indptr: np.ndarray, entries: int, rows: int) -> Iterator[tuple[int, int]]:
    """Consecutive row ranges [a, b) of at most ``rows`` rows holding at most ``entries``
    ratings (at least one row each)."""
    count = len(indptr) - 1
    start = 0
    while start < count:
        stop = int(np.searchsorted(indptr, indptr[start] + entries, side="right")) - 1
        stop = min(count, start + rows, max(stop, start + 1))
        yield start, stop
        start = stop


def solve_rows(ratings: scipy.sparse.csr_matrix, other: np.ndarray, l2: float, alpha: float | None,
               gram: np.ndarray | None = None) -> np.ndarray:
    """The new factors of ``ratings``' rows given the other side's ``other``: explicit when
    ``alpha`` is None, else implicit with confidence 1 + alpha·r and ``gram`` = otherᵀother.

    A row's Σ wᵢ fᵢfᵢᵀ is symmetric: only its upper triangle (the P = rank·(rank + 1)/2 pairs
    k ≤ l) is summed, as the product of the weights (a CSR matrix with the ratings' structure)
    with a table of fᵢₖfᵢₗ for every row i of ``other`` (others × P, computed once) when that
    takes at most ``TABLE_BYTES``; else with each slab's own ratings' products, gathered."""
    rank = other.shape[1]
    first, second = np.triu_indices(rank)  # the pairs k <= l
    pairs = len(first)
    indptr, indices = ratings.indptr, ratings.indices
    values = np.asarray(ratings.data, dtype=np.float64)
    if alpha is None:  # Σ fᵢfᵢᵀ and Σ rᵢfᵢ
        weights, targets = np.ones(len(values)), values
    else:  # Σ (cᵢ − 1) fᵢfᵢᵀ and Σ cᵢpᵢfᵢ
        weights, targets = alpha * values, np.where(values > 0, 1.0 + alpha * values, 0.0)
    shape = ratings.shape
    rhs = scipy.sparse.csr_matrix((targets, indices, indptr), shape=shape) @ other
    table = other[:, first] * other[:, second] if 8 * other.shape[0] * pairs <= TABLE_BYTES else None
    factors = np.empty((shape[0], rank))
    diagonal = np.arange(rank)
    for a, b in _slabs(indptr, max(1, SLAB_BYTES // (8 * pairs)), max(1, SLAB_BYTES // (8 * rank * rank))):
        lo, hi = int(indptr[a]), int(indptr[b])
        local = (indptr[a: b + 1] - lo).astype(np.int64)
        if table is not None:
            summed = scipy.sparse.csr_matrix((weights[lo:hi], indices[lo:hi], local), shape=(b - a, shape[1])) @ table
        else:
            gathered = other[indices[lo:hi]]
            products = gathered[:, first] * gathered[:, second]
            select = scipy.sparse.csr_matrix((weights[lo:hi], np.arange(hi - lo), local), shape=(b - a, hi - lo))
            summed = select @ products
        systems = np.empty((b - a, rank, rank))
        systems[:, first, second] = summed
        systems[:, second, first] = summed
        if alpha is None:
            counts = np.diff(local)
            systems[:, diagonal, diagonal] += l2 * counts[:, None]
            systems[counts == 0] = np.eye(rank)  # its right-hand side is 0: x = 0
        else:
            assert gram is not None
            systems += gram
            systems[:, diagonal, diagonal] += l2
        factors[a:b] = np.linalg.solve(systems, rhs[a:b, :, None])[:, :, 0]
    return factors


def objective_terms(ratings: scipy.sparse.csr_matrix, own: np.ndarray, other: np.ndarray,
                    alpha: float | None) -> np.ndarray:
    """A block's terms of the objective, (1, 3), with ``own`` the factors of its rows (items)
    and ``other`` the users': explicit [Σ (r − x·y)², Σ ‖xᵤ‖² over the ratings, Σᵢ nᵢ‖yᵢ‖²]
    (the driver adds l2 × the last two); implicit [Σ over the ratings of c(p − x·y)² − (x·y)²,
    0, 0] (the driver adds Σ over all pairs of (x·y)² = ⟨XᵀX, YᵀY⟩ and the penalty)."""
    indptr = ratings.indptr
    total = np.zeros(3)
    for a, b in _slabs(indptr, max(1, SLAB_BYTES // (8 * own.shape[1])), len(indptr)):
        lo, hi = int(indptr[a]), int(indptr[b])
        rows = np.repeat(np.arange(a, b), np.diff(indptr[a: b + 1]))
        theirs = other[ratings.indices[lo:hi]]
        predicted = np.einsum("ij,ij->i", own[rows], theirs)
        values = np.asarray(ratings.data[lo:hi], dtype=np.float64)
        if alpha is None:
            total[0] += float(np.sum((values - predicted) ** 2))
            total[1] += float(np.sum(theirs * theirs))
        else:
            confidence = 1.0 + alpha * values
            preference = (values > 0).astype(np.float64)
            total[0] += float(np.sum(confidence * (preference - predicted) ** 2 - predicted**2))
    if alpha is None:
        total[2] = float(np.diff(indptr) @ np.sum(own * own, axis=1))
    return total.reshape(1, 3)


@dataclass(frozen=True)
class UserStep:
    """Solve a row block's users (a CSR block of R, or a kept block of users built from a table:
    the CSC matrix of their columns in a (1, 1) object block) given the item factors (and,
    implicit, their Gram): the block's rows of X."""

    l2: float
    alpha: float | None  # None: explicit ratings

    def __call__(self, block: scipy.sparse.csr_matrix | np.ndarray, items: np.ndarray, *gram: np.ndarray) -> np.ndarray:
        if isinstance(block, np.ndarray) and block.dtype == object:
            (columns,) = block.ravel()
            ratings = columns.T  # items × users read as users × items: no copy
        else:
            ratings = canonical(scipy.sparse.csr_matrix(block))
        return solve_rows(ratings, items, self.l2, self.alpha, gram[0] if gram else None)


@dataclass(frozen=True)
class ItemStep:
    """Solve a column block's items (a kept CSC block, in a (1, 1) object block) given the user
    factors (and, implicit, their Gram): the block's rows of Y and its terms of the objective."""

    l2: float
    alpha: float | None

    def __call__(self, blocks: np.ndarray, users: np.ndarray, *gram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        (columns,) = blocks.ravel()
        ratings = columns.T  # the CSC block's arrays read as CSR: items × users, no copy
        items = solve_rows(ratings, users, self.l2, self.alpha, gram[0] if gram else None)
        return items, objective_terms(ratings, items, users, self.alpha)


@dataclass(frozen=True)
class SolveWork:
    """The declared work (``planner.cost.WORK_KINDS``) of a half-iteration on one block of
    ``rows`` rows holding ``entries`` ratings (spread evenly over the blocks): the weighted
    sums of the pairs' products (2P flops a rating, P = rank·(rank + 1)/2) and the right-hand
    sides (2·rank), one LU solve a row (2/3·rank³ + 2·rank² flops); the products and gathers
    (P + rank elements a rating, at most); the item kernel also its objective terms (2·rank
    flops and two gathers of rank a rating)."""

    entries: float
    rows: int
    rank: int
    objective: bool = False

    def __call__(self, shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
        r = self.rank
        pairs = r * (r + 1) / 2
        flops = self.entries * (2.0 * pairs + 2.0 * r) + self.rows * (2.0 * r**3 / 3 + 2.0 * r * r)
        elements = self.entries * (pairs + r)
        if self.objective:
            flops += 2.0 * self.entries * r
            elements += 2.0 * self.entries * r
        return {"contraction_flops": flops, "elementwise": elements}
