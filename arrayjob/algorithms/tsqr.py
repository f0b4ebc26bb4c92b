"""QR of a tall-and-skinny matrix, A = QR (n ≫ d): CholeskyQR2 when A is well conditioned,
Householder TSQR otherwise.

``method = "auto"`` (default): CholeskyQR2 (Fukaya, Nakatsukasa, Yanagisawa & Yamamoto,
"CholeskyQR2: a simple and communication-avoiding algorithm for computing a tall-skinny
QR factorization", 2014). One pass sums the blocks' Grams AᵢᵀAᵢ; the driver factors
G = R₁ᵀR₁ (Cholesky) and checks cond(R₁) <= ``COND_LIMIT``. A second pass sums the Grams
of Q₁ = A R₁⁻¹ (BLAS trsm), G₂ = R₂ᵀR₂; a third forms Q = Q₁ R₂⁻¹ (Q₁ again, not kept),
and R = R₂R₁.
All of it is level-3 BLAS (one core, a 500,000 × 64 block of the bench's X: 0.76 s
against 1.81 s for the Householder block QR below; ``benchmarks/bench_micro.py tsqr-block``), and Q is orthogonal to machine precision while
cond(A) stays well below u^(-1/2) ≈ 7·10⁷ — the limit of 10⁶ leaves a margin of 60. When
the Cholesky fails or cond(R₁) is above the limit, the run falls back to Householder.

``method = "householder"``, and the fallback: direct TSQR (Benson, Gleich & Demmel,
"Direct QR factorizations for tall-and-skinny matrices in MapReduce architectures",
2013): each row block A_i = Q_i R_i; the stacked R_i are factored once more,
[R_1; …; R_B] = Q₂ R; and Q's block i is Q_i Q₂[i]. Within a task, LAPACK's QR runs on
sub-blocks of ``SUB_ROWS`` rows (measured: on 2 cores, QR of 64 columns streams 0.23 GB/s
at 1–4k rows but 0.09 GB/s at 65k), so each block is itself a small TSQR. Backward stable
for any A, including rank-deficient ones.

Either way Q is written by the workers into ``result.zarr/Q`` with A's row chunking, and
R comes back to the driver.

Cost: CholeskyQR2 reads A once (8nd bytes; the blocks stay in memory for its passes),
does 4nd² flops of Gram products (``contraction_flops``) and 3nd² of triangular solves
(``triangular_solve_flops``), writes Q (8nd bytes) and moves 2·B·d² floats of Grams.
Householder does about 4nd² flops of LAPACK QR (``qr_block_cost``) and 2nd² of BLAS to
form Q, and moves B·d² floats for the stacked R and back. Memory per task: one block of
A and its Q.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
from scipy.linalg.blas import dtrmm, dtrsm
from scipy.linalg.lapack import dtrtri

from arrayjob import api as la
from arrayjob.api import (
    Job,
    JobContext,
    JobResult,
    Kernel,
    Pass,
    StagePlan,
    Written,
    qr_flops,
    require,
    require_numeric,
    row_grid,
)

SUB_ROWS = 2048
COND_LIMIT = 1e6  # CholeskyQR2 only below this cond(R₁) = cond(A) (its limit is about 7·10⁷)
R1 = "tsqr-R1"  # the name the first factor is bound to in the second pass
PIECE_ROWS = 8192  # rows of a block assembled, solved and summed at a time (1–4 MiB: in cache)
SKETCH_ROWS_PER_COLUMN = 8  # a CountSketch of 8d rows: cond(A R_s⁻¹) about 2 on the bench's X and y
SKETCH_COND_LIMIT = 10.0  # one Cholesky of Q₁ᵀQ₁ leaves Q orthogonal to u·cond(Q₁)² <= 100u
SKETCH_SEED = 20240528


def _qr(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reduced QR with R padded to d × d (and Q to d columns) when a has fewer rows than d."""
    q, r = np.linalg.qr(a)
    d = a.shape[1]
    if r.shape[0] < d:
        q = np.pad(q, ((0, 0), (0, d - q.shape[1])))
        r = np.pad(r, ((0, d - r.shape[0]), (0, 0)))
    return q, r


def qr_block(a: np.ndarray, sub_rows: int = SUB_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """QR of one tall block, as a TSQR over sub-blocks of ``sub_rows`` rows."""
    rows, d = a.shape
    if rows <= 2 * sub_rows:
        return _qr(a)
    pieces = [_qr(a[s: s + sub_rows]) for s in range(0, rows, sub_rows)]
    q2, r = _qr(np.concatenate([r for _, r in pieces]))
    q = np.empty((rows, d))
    for i, (qi, _) in enumerate(pieces):
        np.matmul(qi, q2[i * d: (i + 1) * d], out=q[i * sub_rows: i * sub_rows + qi.shape[0]])
    return q, r


def qr_block_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    """The work of ``qr_block`` on an m × d block: QR of each sub-block and of their stacked
    R factors (LAPACK), and Q_i · Q₂ᵢ for each sub-block (BLAS)."""
    rows, d = shapes[0]
    if rows <= 2 * SUB_ROWS:
        return {"qr_flops": qr_flops(rows, d)}
    full, rest = divmod(rows, SUB_ROWS)
    pieces = full + (rest > 0)
    return {"qr_flops": full * qr_flops(SUB_ROWS, d) + qr_flops(rest, d) + qr_flops(pieces * d, d),
            "contraction_flops": 2.0 * rows * d * d}


def times_block_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    (rows, d), (_, k) = shapes
    return {"contraction_flops": 2.0 * rows * d * k}


# rows lo:hi of a block as a new float64 array (it is overwritten), in the memory order asked for
Order = Literal["C", "F"]
Rows = Callable[[int, int, Order], np.ndarray]


def householder_r(a: np.ndarray, sub_rows: int = SUB_ROWS) -> np.ndarray:
    """R of a tall block by Householder QR (LAPACK geqrf, ``mode="r"``) of its sub-blocks of
    ``sub_rows`` rows, their R factors stacked and factored once more: a TSQR inside the task,
    Q never formed. Backward stable for any block, rank-deficient ones included."""
    a = np.asarray(a, dtype=np.float64)
    rows, cols = a.shape
    return householder_r_of_rows(_rows_of(a), rows, cols, sub_rows)


def householder_r_of_rows(rows_of: Rows, rows: int, cols: int, sub_rows: int = SUB_ROWS) -> np.ndarray:
    if rows <= 2 * sub_rows:
        return _r(rows_of(0, rows, "C"))
    return _r(np.concatenate([_r(rows_of(s, min(s + sub_rows, rows), "C")) for s in range(0, rows, sub_rows)]))


def _r(a: np.ndarray) -> np.ndarray:
    """R of a, padded to d × d when a has fewer rows than d."""
    r = cast(np.ndarray, np.linalg.qr(a, mode="r"))
    d = a.shape[1]
    return r if r.shape[0] == d else np.pad(r, ((0, d - r.shape[0]), (0, 0)))


def r_of_block(a: np.ndarray) -> np.ndarray:
    """R of one tall block, Q never formed (``r_of_rows``)."""
    a = np.asarray(a, dtype=np.float64)
    rows, cols = a.shape
    return r_of_rows(_rows_of(a), rows, cols)


def _rows_of(a: np.ndarray) -> Rows:
    def rows_of(lo: int, hi: int, order: Order) -> np.ndarray:
        return np.array(a[lo:hi], order=order)
    return rows_of


def r_of_rows(rows_of: Rows, rows: int, cols: int) -> np.ndarray:
    """R of an m × d block given by its rows (``rows_of(lo, hi, order)``; a job's block such as
    [X 1 y] is assembled a piece at a time, in cache), Q never formed: randomized Cholesky
    QR (Fan, Guo & Lin 2021; Balabanov, "Randomized Cholesky QR factorizations", 2022).

    A sketch S A (``SKETCH_ROWS_PER_COLUMN``·d rows, each the sum of the rows of one residue
    class with random signs: a CountSketch) is factored by Householder, S A = Q_s R_s; then
    Q₁ = A R_s⁻¹ (trsm, a piece at a time) has a condition number near 1 whatever A's, and one
    Cholesky of Q₁ᵀQ₁ = R₂ᵀR₂ finishes it: R = R₂ R_s. The check: cond(R₂) <= ``SKETCH_COND_LIMIT``,
    so that Q₁ᵀQ₁'s rounding (u·cond(R₂)²) stays at Householder's level; a block that fails it
    (a sketch that missed a direction, a rank-deficient block) is factored by
    ``householder_r_of_rows``. Cost: md² flops of trsm and md² of Gram (syrk), and two reads of
    the block; Householder costs 2md², mostly level-2 LAPACK."""
    d = cols
    if rows <= max(2 * SUB_ROWS, 4 * SKETCH_ROWS_PER_COLUMN * d):
        return householder_r_of_rows(rows_of, rows, cols)
    rs = _r(_sketch(rows_of, rows, d))
    diagonal = np.abs(np.diag(rs))
    if not np.all(np.isfinite(rs)) or diagonal.min() <= np.finfo(float).eps * diagonal.max():
        return householder_r_of_rows(rows_of, rows, cols)
    gram = np.zeros((d, d))
    for lo in range(0, rows, PIECE_ROWS):
        # Q₁'s piece in place of the piece (a new array, Fortran order: trsm from the right, no copy)
        q = dtrsm(1.0, rs, rows_of(lo, min(lo + PIECE_ROWS, rows), "F"), side=1, lower=0, overwrite_b=1)
        gram += q.T @ q
    r2 = cholesky_upper(gram, SKETCH_COND_LIMIT)
    if r2 is None:
        return householder_r_of_rows(rows_of, rows, cols)
    return np.triu(r2 @ rs)


def _sketch(rows_of: Rows, rows: int, d: int) -> np.ndarray:
    """S A for the CountSketch S that adds row i of A, times its own random sign, into row
    i mod m (m = ``SKETCH_ROWS_PER_COLUMN``·d); the signs drawn from a fixed seed, so the same
    block gives the same R, bit for bit. (One sign per run of m rows would not do: a column
    of ones would be sketched by one sum of signs, its norm off by that sum's luck.)"""
    m = SKETCH_ROWS_PER_COLUMN * d
    signs = np.where(np.random.default_rng(SKETCH_SEED).random(rows) < 0.5, -1.0, 1.0)
    sketch = np.zeros((m, d))
    step = m * max(1, PIECE_ROWS // m)
    for lo in range(0, rows, step):
        piece = rows_of(lo, min(lo + step, rows), "C")
        piece *= signs[lo: lo + piece.shape[0], None]
        runs = piece.shape[0] // m
        sketch += piece[: runs * m].reshape(runs, m, d).sum(axis=0)
        rest = piece.shape[0] - runs * m
        if rest:
            sketch[:rest] += piece[runs * m:]
    return sketch


def r_of_block_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    """The work of ``r_of_rows`` on an m × d block that passes the check (as the estimate
    assumes of every input): the sketch, one trsm and one Gram."""
    rows, d = shapes[0][0], math.prod(shapes[0][1:])
    return {"contraction_flops": 2.0 * rows * d * d, "triangular_solve_flops": float(rows * d * d),
            "elementwise": 2.0 * rows * d}


def r_of_stack(r_stack: np.ndarray) -> np.ndarray:
    """The R that combines the blocks' stacked R factors (a small Householder QR, R only)."""
    return householder_r(r_stack)


def r_of_stack_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    rows, d = shapes[0]
    return {"qr_flops": qr_flops(rows, d) / 2}  # R only: half the flops of a QR with Q formed


def qr_of_stack(r_stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return qr_block(r_stack)


def times_block(q: np.ndarray, q2: np.ndarray) -> np.ndarray:
    return q @ q2


def gram_block(a: np.ndarray) -> np.ndarray:
    """AᵢᵀAᵢ (NumPy runs ``a.T @ a`` as BLAS syrk)."""
    a = np.asarray(a, dtype=np.float64)
    return a.T @ a


def solve_block(a: np.ndarray, r: np.ndarray) -> np.ndarray:
    """a R⁻¹ for upper-triangular r: R⁻¹ by LAPACK trtri (d × d), then BLAS trmm on aᵀ, which
    is a's rows seen in Fortran order, so nothing is transposed in memory. OpenBLAS's trsm of
    a 500,000 × 64 block runs at a third of GEMM's rate (229 ms on one core) and trmm with the
    inverse at half (125 ms), to 1e-15 of trsm's result. CholeskyQR2 calls it with cond(r) <=
    ``COND_LIMIT`` (then the inverse's error is of trsm's order, u·cond(r)) and with R₂ near
    the identity."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    inverse, info = dtrtri(r, lower=0)
    if info != 0:  # a zero on the diagonal: trsm's inf and NaN, as before
        return dtrsm(1.0, r, a.T, side=0, lower=0, trans_a=1).T
    return dtrmm(1.0, inverse, a.T, side=0, lower=0, trans_a=1).T


def solved_gram_block(a: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Q₁ᵢᵀQ₁ᵢ for Q₁ᵢ = Aᵢ R₁⁻¹; Q₁ᵢ itself is dropped (recomputing it in the last pass costs
    less than keeping a second copy of A in the object store)."""
    q = solve_block(a, r)
    return q.T @ q


def solve_twice_block(a: np.ndarray, r1: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """Qᵢ = (Aᵢ R₁⁻¹) R₂⁻¹ — two solves in sequence, as CholeskyQR2's accuracy needs
    (Aᵢ (R₂R₁)⁻¹ in one solve leaves Q orthogonal only to u·cond(A))."""
    return solve_block(solve_block(a, r1), r2)


def cholesky_upper(gram: np.ndarray, limit: float = COND_LIMIT) -> np.ndarray | None:
    """Upper-triangular R with RᵀR = gram and positive diagonal, or None when the Cholesky
    fails or cond(R) exceeds ``limit`` (default ``COND_LIMIT``: CholeskyQR2 would lose
    orthogonality)."""
    try:
        r = np.ascontiguousarray(np.linalg.cholesky(gram).T)
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(r)) or np.linalg.cond(r) > limit:
        return None
    return r


def cholesky_of_stack(gram_stack: np.ndarray) -> np.ndarray:
    """R₂ from the stacked Grams of Q₁ (near the identity once the first pass passed its check)."""
    d = gram_stack.shape[1]
    return np.ascontiguousarray(np.linalg.cholesky(gram_stack.reshape(-1, d, d).sum(axis=0)).T)


def gram_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    rows, d = shapes[0]
    return {"contraction_flops": 2.0 * rows * d * d}


def solve_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    rows, d = shapes[0]
    return {"triangular_solve_flops": float(rows * d * d)}


def solved_gram_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    return {**solve_cost(shapes), **gram_cost(shapes)}


def solve_twice_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    return {"triangular_solve_flops": 2 * solve_cost(shapes)["triangular_solve_flops"]}


QR_BLOCK = Kernel("qr_block", qr_block)
R_OF_BLOCK = Kernel("r_of_block", r_of_block)
QR_OF_STACK = Kernel("qr_of_stack", qr_of_stack)
R_OF_STACK = Kernel("r_of_stack", r_of_stack)
TIMES_BLOCK = Kernel("q_times_q2", times_block)
GRAM_BLOCK = Kernel("gram_block", gram_block)
SOLVED_GRAM = Kernel("solved_gram", solved_gram_block)
CHOLESKY_OF_STACK = Kernel("cholesky_of_stack", cholesky_of_stack)
SOLVE_TWICE = Kernel("solve_twice", solve_twice_block)


def tsqr_program(A: la.BlockArray, block_rows: int, *, with_q: bool) -> tuple[la.BlockArray | None, la.BlockArray]:
    """(Q or None, R) of A, as lazy arrays: map, factor the stacked R, map again."""
    n, d = A.shape
    blocks = math.ceil(n / block_rows)
    if not with_q:
        (r_stack,) = la.map_blocks(R_OF_BLOCK, A, outputs=[((blocks * d, d), "float64", d)], block_rows=[block_rows],
                                   cost=r_of_block_cost)
        (r,) = la.map_blocks(R_OF_STACK, r_stack, outputs=[((d, d), "float64", None)], cost=r_of_stack_cost)
        return None, r
    q1, r_stack = la.map_blocks(QR_BLOCK, A, outputs=[((n, d), "float64", block_rows), ((blocks * d, d), "float64", d)],
                                block_rows=[block_rows], cost=qr_block_cost)
    q2, r = la.map_blocks(QR_OF_STACK, r_stack, outputs=[((blocks * d, d), "float64", None), ((d, d), "float64", None)],
                          cost=qr_block_cost)
    (q,) = la.map_blocks(TIMES_BLOCK, q1, q2, outputs=[((n, d), "float64", block_rows)], block_rows=[block_rows, d],
                         cost=times_block_cost)
    return q, r


def gram_program(A: la.BlockArray, block_rows: int) -> la.BlockArray:
    """CholeskyQR2's first pass: the blocks' Grams AᵢᵀAᵢ, stacked (B·d × d); the driver sums them."""
    n, d = A.shape
    blocks = math.ceil(n / block_rows)
    (grams,) = la.map_blocks(GRAM_BLOCK, A, outputs=[((blocks * d, d), "float64", d)], block_rows=[block_rows],
                             cost=gram_cost)
    return grams


def cholesky_qr2_program(A: la.BlockArray, r1: la.BlockArray, block_rows: int) -> tuple[la.BlockArray, la.BlockArray]:
    """CholeskyQR2's second and third passes given R₁: (Q, R₂), with R = R₂R₁."""
    n, d = A.shape
    blocks = math.ceil(n / block_rows)
    (grams,) = la.map_blocks(SOLVED_GRAM, A, r1, outputs=[((blocks * d, d), "float64", d)],
                             block_rows=[block_rows, None], cost=solved_gram_cost)
    (r2,) = la.map_blocks(CHOLESKY_OF_STACK, grams, outputs=[((d, d), "float64", None)])
    (q,) = la.map_blocks(SOLVE_TWICE, A, r1, r2, outputs=[((n, d), "float64", block_rows)],
                         block_rows=[block_rows, None, None], cost=solve_twice_cost)
    return q, r2


def sum_grams(stack: np.ndarray) -> np.ndarray:
    d = stack.shape[1]
    return stack.reshape(-1, d, d).sum(axis=0)


def block_rows_for(job: Job, name: str, workers: int) -> int:
    """Chunk-aligned row blocks: about two per worker, at most 256 MiB each."""
    return row_grid(job.arrays[name], workers=workers).block_shape[0]


@dataclass(frozen=True)
class TSQRParams:
    method: Literal["auto", "householder"] = "auto"


class TSQR(Job):
    name = "tsqr"
    title = "TSQR"
    inputs = ("A",)
    Params = TSQRParams

    def check_inputs(self) -> None:
        A = self.arrays["A"]
        require(A.ndim == 2, f"inputs.A: expected a 2-D array (rows × columns), got shape {A.shape}")
        require_numeric(A)
        require(A.shape[0] >= A.shape[1] > 0,
                f"inputs.A: expected a tall matrix (rows >= columns > 0), got shape {A.shape}")

    def describe(self) -> str:
        A = self.arrays["A"]
        return f"{self.title} of A {A.shape[0]:,} × {A.shape[1]:,}"

    def stages(self, workers: int, fallback: bool = False) -> StagePlan:
        """CholeskyQR2: the Gram pass (``grams``), then the pass that forms Q (``q``, given
        R₁). Householder TSQR in one pass (``householder``): the method asked for, or, with
        ``fallback``, after the Gram pass when A failed the condition check. An estimate
        assumes A passes it (the fallback costs about 2.5 times the work)."""
        A = la.from_input(self.arrays["A"])
        rows = block_rows_for(self, "A", workers)
        writes = {"Q": Written(A.shape, (self.arrays["A"].chunks[0], A.shape[1]), "float64")}  # by the workers
        if self.params.method == "householder" or fallback:
            q, r = tsqr_program(A, rows, with_q=True)
            assert q is not None
            householder = Pass("householder", "factor", {"Q": q, "R": r}, writes=writes)
            if self.params.method == "householder":
                return StagePlan((householder,))
        grams = Pass("grams", "factor", {"grams": gram_program(A, rows)})
        if fallback:
            return StagePlan((grams, householder))
        d = A.shape[1]
        q, r2 = cholesky_qr2_program(A, la.value(R1, (d, d)), rows)
        return StagePlan((grams, Pass("q", "factor", {"Q": q, "R2": r2}, writes=writes)))

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        A = self.arrays["A"]
        return [(A.shape, "float64", A.chunks[0]), ((A.shape[1], A.shape[1]), "float64", None)]

    def run(self, ctx: JobContext) -> JobResult:
        A = self.arrays["A"]
        n, d = A.shape
        workers = ctx.workers
        plan = self.stages(workers)
        auto = self.params.method == "auto"
        first = plan["grams"] if auto else ctx.writing(plan.pass_named("householder"))
        with ctx.stage("load"):
            ctx.load(first)
        with ctx.stage(plan.passes[0].stage):
            r1 = cholesky_upper(sum_grams(ctx.compute(first)["grams"])) if auto else None
            if r1 is not None:
                wrote = plan.pass_named("q")
                r = ctx.compute(ctx.writing(wrote), {R1: r1})
                R = np.triu(r["R2"] @ r1)
                how = "CholeskyQR2"
            else:  # A's blocks are loaded already when the check sent us here
                wrote = (self.stages(workers, fallback=True) if auto else plan).pass_named("householder")
                r = ctx.compute(ctx.writing(wrote) if auto else first)
                R = np.triu(r["R"])
                how = "Householder TSQR" if not auto else \
                    f"Householder TSQR (cond(A) above {COND_LIMIT:.0e}, too high for CholeskyQR2)"
        written = ctx.count_writes(wrote, r)
        return JobResult({"R": R}, {"n_rows": n, "n_cols": d},
                         [f"R {d} × {d} by {how}; Q {n:,} × {d} written by the workers ({written:,} bytes)"])
