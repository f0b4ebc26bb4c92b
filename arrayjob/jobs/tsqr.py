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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.linalg.blas import dtrsm

from arrayjob import api as la
from arrayjob.api import (
    Job,
    JobContext,
    JobResult,
    Kernel,
    Pass,
    StagePlan,
    StorageCounters,
    Written,
    qr_flops,
    require,
    require_numeric,
    row_grid,
)

SUB_ROWS = 2048
COND_LIMIT = 1e6  # CholeskyQR2 only below this cond(R₁) = cond(A) (its limit is about 7·10⁷)
R1 = "tsqr-R1"  # the name the first factor is bound to in the second pass


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


def r_of_block(a: np.ndarray) -> np.ndarray:
    return qr_block(a)[1]


def qr_of_stack(r_stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return qr_block(r_stack)


def times_block(q: np.ndarray, q2: np.ndarray) -> np.ndarray:
    return q @ q2


def gram_block(a: np.ndarray) -> np.ndarray:
    """AᵢᵀAᵢ (NumPy runs ``a.T @ a`` as BLAS syrk)."""
    a = np.asarray(a, dtype=np.float64)
    return a.T @ a


def solve_block(a: np.ndarray, r: np.ndarray) -> np.ndarray:
    """a R⁻¹ for upper-triangular r: BLAS trsm on aᵀ, which is a's rows seen in Fortran
    order, so nothing is copied or transposed in memory."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    return dtrsm(1.0, r, a.T, side=0, lower=0, trans_a=1).T


def solved_gram_block(a: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Q₁ᵢᵀQ₁ᵢ for Q₁ᵢ = Aᵢ R₁⁻¹; Q₁ᵢ itself is dropped (recomputing it in the last pass costs
    less than keeping a second copy of A in the object store)."""
    q = solve_block(a, r)
    return q.T @ q


def solve_twice_block(a: np.ndarray, r1: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """Qᵢ = (Aᵢ R₁⁻¹) R₂⁻¹ — two solves in sequence, as CholeskyQR2's accuracy needs
    (Aᵢ (R₂R₁)⁻¹ in one solve leaves Q orthogonal only to u·cond(A))."""
    return solve_block(solve_block(a, r1), r2)


def cholesky_upper(gram: np.ndarray) -> np.ndarray | None:
    """Upper-triangular R with RᵀR = gram and positive diagonal, or None when the Cholesky
    fails or cond(R) exceeds ``COND_LIMIT`` (CholeskyQR2 would lose orthogonality)."""
    try:
        r = np.ascontiguousarray(np.linalg.cholesky(gram).T)
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(r)) or np.linalg.cond(r) > COND_LIMIT:
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
                                   cost=qr_block_cost)
        _, r = la.map_blocks(QR_OF_STACK, r_stack, outputs=[((blocks * d, d), "float64", None), ((d, d), "float64", None)],
                             cost=qr_block_cost)
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
        workers = ctx.session.options.cluster.workers
        plan = self.stages(workers)
        auto = self.params.method == "auto"
        first = plan["grams"] if auto else ctx.writing(plan.pass_named("householder"))
        with ctx.metrics.stage("load"):
            ctx.session.load(first)
        with ctx.metrics.stage(plan.passes[0].stage):
            r1 = cholesky_upper(sum_grams(ctx.session.compute(first)["grams"])) if auto else None
            if r1 is not None:
                r = ctx.session.compute(ctx.writing(plan.pass_named("q")), {R1: r1})
                R = np.triu(r["R2"] @ r1)
                how = "CholeskyQR2"
            else:  # A's blocks are loaded already when the check sent us here
                r = ctx.session.compute(ctx.writing(self.stages(workers, fallback=True).pass_named("householder"))
                                        if auto else first)
                R = np.triu(r["R"])
                how = "Householder TSQR" if not auto else \
                    f"Householder TSQR (cond(A) above {COND_LIMIT:.0e}, too high for CholeskyQR2)"
        written = (int(r["Q"][0]), int(r["Q"][1]))
        ctx.metrics.count_storage(StorageCounters(bytes_written=written[0], put_requests=written[1]))
        return JobResult({"R": R}, {"n_rows": n, "n_cols": d},
                         [f"R {d} × {d} by {how}; Q {n:,} × {d} written by the workers ({written[0]:,} bytes)"])
