"""Principal component analysis (and truncated SVD, ``center = false``): the top ``k``
right singular vectors of X − 1μᵀ (n × d), exactly through TSQR's R, or by randomized
subspace iteration.

``method = "exact"``: one pass computes R of the centred X (``algorithms.tsqr``'s kernels), the
driver takes the SVD of R (d × d): X − 1μᵀ = QR = (Q U) Σ Vᵀ, so the components are Vᵀ's
first rows and the singular values Σ's, those of X − 1μᵀ (scikit-learn's
``PCA(svd_solver="full")``, which flips signs so that each component's largest entry is
positive, as here). Centring is done per block: block b subtracts its own mean μ_b and
returns R_b of X_b − 1μ_bᵀ, its row count n_b and μ_b; one combining task stacks the R_b and
the rows √n_b (μ_b − μ)ᵀ and factors them once more, which is R of X − 1μᵀ, since
(X − 1μᵀ)ᵀ(X − 1μᵀ) = Σ_b (X_b − 1μ_bᵀ)ᵀ(X_b − 1μ_bᵀ) + n_b (μ_b − μ)(μ_b − μ)ᵀ (Chan, Golub
& LeVeque's pairwise update of sums of squares, "Algorithms for computing the sample variance",
1983, applied to R factors). That is as accurate as a first pass for μ and then R of
X − 1μᵀ (each entry is centred with the rounding of one subtraction, by a mean of its own
size), in one pass; R of [1 X] with its first row dropped would be exact algebra too, but
Householder's backward error is relative to the uncentred columns, so when |μ| ≫ spread it
loses the digits the centring should have kept. Cost: one pass over X (8nd bytes), about
4nd² flops of LAPACK QR and B·d² floats moved (B row blocks); the driver does O(d³).
``auto`` chooses it for a dense X with at most 2,048 columns.

``method = "randomized"``: subspace iteration on the d × d matrix XcᵀXc, Xc = X − 1μᵀ never
formed (Halko, Martinsson & Tropp, "Finding structure with randomness", SIAM Review 2011,
Algorithm 4.4, run on the side of the d columns). With l = k + ``n_oversamples`` and a
Gaussian Ω (d × l, from ``seed``), V₀ = orth(Ω) and V_j = orth(XcᵀXc V_{j−1}) for
j = 1 … ``n_iter``: each iteration is one pass whose blocks compute Y_b = X_b V − 1(μᵀV)
and X_bᵀY_b − μ(1ᵀY_b), so the n × l product never leaves its worker and only d × l comes
back; the QR of it is on the driver. A last pass gives Z = XcᵀXc V_q and the Rayleigh–Ritz
step B = V_qᵀZ = W Λ Wᵀ (l × l): components (V_q W)ᵀ, singular values √λ. The distance of
the i-th right singular vector from the basis shrinks as (σ_{l+1}/σ_i)^{2q} (Saad, "Numerical
Methods for Large Eigenvalue Problems", 2nd ed. 2011, Thm 5.2), so a clear gap after the k-th
value makes a few iterations enough.
Orthonormalising after XcᵀXc rather than after each of Xc and Xcᵀ (Halko's Alg. 4.4)
loses accuracy only in components with σ_i below √u·σ₁ ≈ 1.5·10⁻⁸σ₁ (u = 2⁻⁵³), which carry
less than u of the leading variance. The first
pass computes 1ᵀX with XᵀXΩ, before μ is known, and centres XᵀXΩ afterwards
(XᵀXΩ − μ(1ᵀXΩ)): its cancellation only perturbs the random start. A sparse X stays sparse:
centring applies to the products, never to X. Cost: n_iter + 1 passes, each 4·nnz·l flops
(dense: 4ndl) and d·l floats out to each block and back; the total variance (for
``explained_variance_ratio``) is Σ(x − μ)² on a dense X and Σx² − n‖μ‖² on a sparse one
(which loses digits when |μ| ≫ spread). The basis is checkpointed after each iteration.
``auto`` chooses it for a sparse X or one with more than 2,048 columns.

Outputs: ``components`` (k, d), ``singular_values``, ``explained_variance`` (σ²/(n − 1), as
scikit-learn), ``explained_variance_ratio`` (σ² over the total ‖Xc‖²_F), ``mean`` (zeros when
``center = false``), and with ``scores = true`` the scores (X − 1μᵀ)Vₖ (n × k), written by
the workers chunked like X.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from arrayjob import api as la
from arrayjob.algorithms.tsqr import block_rows_for, r_of_block, r_of_block_cost, tsqr_program
from arrayjob.api import (
    EACH_ITERATION,
    Job,
    JobContext,
    JobResult,
    Kernel,
    Pass,
    StagePlan,
    Written,
    require,
    require_matrix,
    size,
)

# ``auto`` factors a dense X exactly up to this many columns (R is 32 MB), randomized above
EXACT_AUTO_FEATURES = 2048
# and ``exact`` refuses more: every block returns a d × d R (512 MB at this many columns)
EXACT_MAX_FEATURES = 8192


@dataclass(frozen=True)
class PCAParams:
    k: int = field(metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    center: bool = True
    method: Literal["auto", "exact", "randomized"] = "auto"
    scores: bool = False
    # randomized only: power iterations, extra columns of the basis, the seed of its start
    n_iter: int = field(default=4, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    n_oversamples: int = field(default=10, metadata={"check": lambda v: v >= 0, "expect": "an integer >= 0"})
    seed: int = 0


def centred_r_block(a: object) -> tuple[np.ndarray, np.ndarray]:
    """R of the block less its own mean, and the row [rows, mean…] the combine step needs."""
    a = np.asarray(a, dtype=np.float64)
    mean = a.mean(axis=0)
    return r_of_block(a - mean), np.concatenate([[a.shape[0]], mean])[None, :]


def combine_centred(r_stack: np.ndarray, moments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """R of X − 1μᵀ and μ, from the blocks' R_b (stacked) and rows [n_b, μ_b]: the R of
    [R_1; …; R_B; √n_1(μ_1 − μ)ᵀ; …; √n_B(μ_B − μ)ᵀ]."""
    counts, means = moments[:, 0], moments[:, 1:]
    mean = counts @ means / counts.sum()
    return r_of_block(np.concatenate([r_stack, np.sqrt(counts)[:, None] * (means - mean)])), mean


def centred_r_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    rows, d = shapes[0]
    work = r_of_block_cost([(rows, d)])
    work["elementwise"] = work.get("elementwise", 0.0) + 2.0 * rows * d
    return work


def combine_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    (rows, d), (blocks, _) = shapes
    return r_of_block_cost([(rows + blocks, d)])


CENTRED_R = Kernel("centred_r_block", centred_r_block)
COMBINE_CENTRED = Kernel("combine_centred_r", combine_centred)


def centred_r_program(X: la.BlockArray, block_rows: int) -> tuple[la.BlockArray, la.BlockArray]:
    """(R of X − 1μᵀ, μ) in one pass: R_b of each centred block, combined with the means."""
    n, d = X.shape
    blocks = math.ceil(n / block_rows)
    r_stack, moments = la.map_blocks(CENTRED_R, X, outputs=[((blocks * d, d), "float64", d),
                                                            ((blocks, d + 1), "float64", 1)],
                                     block_rows=[block_rows], cost=centred_r_cost)
    r, mean = la.map_blocks(COMBINE_CENTRED, r_stack, moments,
                            outputs=[((d, d), "float64", None), ((d,), "float64", None)], cost=combine_cost)
    return r, mean


def orthonormal(z: np.ndarray) -> np.ndarray:
    """An orthonormal basis of z's columns (Householder QR: orthonormal even when z is not of
    full rank)."""
    return np.linalg.qr(z)[0]


def flip_signs(components: np.ndarray) -> np.ndarray:
    """Each row's largest entry (by magnitude) made positive: scikit-learn's ``svd_flip`` on
    the components (``u_based_decision=False``), so results compare without a sign."""
    rows = np.arange(components.shape[0])
    signs = np.sign(components[rows, np.abs(components).argmax(axis=1)])
    return components * np.where(signs == 0, 1.0, signs)[:, None]


class PCA(Job):
    name = "pca"
    title = "PCA"
    inputs = ("X",)
    sparse_inputs = ("X",)
    row_input = "X"  # scores (params.scores), a row of k per row of X
    Params = PCAParams
    params: PCAParams

    def check_inputs(self) -> None:
        X = self.arrays["X"]
        require_matrix(X)
        n, d = X.shape
        require(self.params.k <= min(n, d),
                f"params.k: {self.params.k} components but inputs.X {n:,} × {d:,} has at most {min(n, d):,}")
        require(self.params.method != "exact" or X.sparse is None,
                "params.method: exact factors dense blocks and inputs.X is sparse (use \"randomized\" or \"auto\")")
        require(self.params.method != "exact" or d <= EXACT_MAX_FEATURES,
                f"params.method: exact returns a d × d R from every block (d = {d:,}: {size(8.0 * d * d)} per block); "
                f"use randomized above {EXACT_MAX_FEATURES:,} features")

    @property
    def method(self) -> str:
        """The method that runs: ``params.method``, with ``auto`` resolved from X."""
        if self.params.method != "auto":
            return self.params.method
        X = self.arrays["X"]
        return "exact" if X.sparse is None and X.shape[1] <= EXACT_AUTO_FEATURES else "randomized"

    @property
    def basis_columns(self) -> int:
        """l = k + n_oversamples, at most d: the columns of the randomized basis."""
        return min(self.params.k + self.params.n_oversamples, self.arrays["X"].shape[1])

    def describe(self) -> str:
        X = self.arrays["X"]
        how = ("exact: SVD of TSQR's R" if self.method == "exact" else
               f"randomized: {self.params.n_iter} power iterations on a basis of {self.basis_columns}")
        kind = ", sparse" if X.sparse is not None else ""
        centred = "" if self.params.center else ", uncentred"
        return f"{self.title} ({how}{centred}), k = {self.params.k}, on X {X.shape[0]:,} × {X.shape[1]:,}{kind}"

    def program(self, workers: int = 2) -> dict[str, la.BlockArray]:
        """The pass ``arrayjob plan`` shows: the fit's (exact: R's; randomized: an iteration's),
        not the scores'."""
        plan = self.stages(workers)
        return dict((plan.pass_named("factor") if self.method == "exact" else plan.main).program)

    def iterations_assumed(self, iterations: int | None = None) -> tuple[int, str]:
        if self.method == "exact":
            return 1, "a single pass"
        if iterations:
            return iterations, "--iterations"
        return self.params.n_iter - 1, "params.n_iter - 1 (after the first pass)"

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        (n, d), k = self.arrays["X"].shape, self.params.k
        small: list[tuple[tuple[int, ...], str, int | None]] = [
            ((k, d), "float64", None), ((k,), "float64", None), ((k,), "float64", None), ((k,), "float64", None),
            ((d,), "float64", None)]
        return small + ([((n, k), "float64", self.arrays["X"].chunks[0])] if self.params.scores else [])

    def stages(self, workers: int) -> StagePlan:
        """``exact``: the pass for R (and μ). ``randomized``: the first pass (XᵀXΩ with 1ᵀX), a
        pass per further iteration, the Rayleigh–Ritz pass. Then, with ``scores``, the pass
        whose workers write the scores."""
        info = self.arrays["X"]
        X = la.from_input(info)
        n, d = X.shape
        if self.method == "exact":
            rows = block_rows_for(self, "X", workers)
            r, mean = centred_r_program(X, rows) if self.params.center else (tsqr_program(X, rows, with_q=False)[1], None)
            passes = [Pass("factor", "fit", {"R": r, **({"mean": mean} if mean is not None else {})})]
        else:
            start = X @ la.value("basis", (d, self.basis_columns))
            y = start - la.value("shift", (self.basis_columns,))
            product = {"xty": X.T @ y, "sum_y": y.sum(axis=0)}
            if info.sparse is None and self.params.center:
                total = la.square(X - la.value("mean", (d,))).sum()
            else:  # Σx² on the non-zeros (minus n‖μ‖² on the driver)
                total = (X * X).sum()
            passes = [Pass("start", "fit", {"xty": X.T @ start, "sum_y": start.sum(axis=0), "sum_x": X.sum(axis=0)}),
                      Pass("power", "fit", product, EACH_ITERATION),
                      Pass("ritz", "fit", {**product, "total": total})]
        if self.params.scores:
            k = self.params.k
            if info.sparse is None and self.params.center:
                scores = (X - la.value("mean", (d,))) @ la.value("basis", (d, k))
            else:  # X Vₖ − 1(μᵀVₖ): X stays sparse
                scores = X @ la.value("basis", (d, k)) - la.value("shift", (k,))
            passes.append(Pass("scores", "fit", {"scores": scores},
                               writes={"scores": Written((n, k), (info.chunks[0], k), "float64", info)}))
        return StagePlan(tuple(passes))

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        n, d = self.arrays["X"].shape
        plan = self.stages(ctx.workers)
        with ctx.stage("load"):
            ctx.load(plan.passes[0].program)
        with ctx.stage("fit"):
            if self.method == "exact":
                components, singular, total, mean = self._exact(ctx, plan, d)
                attrs: dict[str, object] = {}
                summary = f"SVD of the {d} × {d} R of TSQR"
            else:
                components, singular, total, mean, iterations = self._randomized(ctx, plan, n, d)
                attrs = {"iterations": iterations, "n_oversamples": self.basis_columns - p.k}
                summary = (f"randomized subspace iteration, {iterations} power iterations on a basis of "
                           f"{self.basis_columns} columns")
            components = flip_signs(components)
            arrays = {"components": components, "singular_values": singular,
                      "explained_variance": singular**2 / max(n - 1, 1),
                      "explained_variance_ratio": singular**2 / total if total > 0 else np.zeros(p.k),
                      "mean": mean}
            written = self._scores(ctx, plan, components, mean, arrays)
        ratio = float(arrays["explained_variance_ratio"].sum())
        attrs |= {"method": self.method, "center": p.center, "k": p.k, "n_samples": n, "n_features": d,
                  "total_variance": total / max(n - 1, 1), "explained_variance_ratio_sum": ratio}
        lines = [f"{summary}: {p.k} components explain {ratio:.6g} of the variance"]
        if written is not None:
            lines.append(f"scores {n:,} × {p.k} written by the workers ({written:,} bytes)")
        return JobResult(arrays, attrs, lines)

    def _exact(self, ctx: JobContext, plan: StagePlan, d: int) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        r = ctx.compute(plan["factor"])
        mean = r["mean"] if self.params.center else np.zeros(d)
        singular, vt = np.linalg.svd(np.triu(r["R"]))[1:]
        k = self.params.k
        return vt[:k], singular[:k], float(singular @ singular), mean

    def _randomized(self, ctx: JobContext, plan: StagePlan, n: int,
                    d: int) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, int]:
        """Subspace iteration on XcᵀXc, then Rayleigh–Ritz; the basis is checkpointed."""
        p = self.params

        def centred(r: dict[str, np.ndarray], mean: np.ndarray) -> np.ndarray:  # XcᵀXc V from XᵀY and 1ᵀY
            return r["xty"] - np.outer(mean, r["sum_y"])

        saved = ctx.restore()
        if saved is not None:
            basis, mean, iterations = saved.state["basis"], saved.state["mean"], int(saved.state["iteration"])
        else:
            omega = orthonormal(np.random.default_rng(p.seed).standard_normal((d, self.basis_columns)))
            r = ctx.compute(plan["start"], {"basis": omega})
            mean = r["sum_x"] / n if p.center else np.zeros(d)
            basis, iterations = orthonormal(centred(r, mean)), 1
            self._tick(ctx, iterations, basis, mean)
        while iterations < p.n_iter:
            basis = orthonormal(centred(ctx.compute(plan["power"], self._values(basis, mean)), mean))
            iterations += 1
            self._tick(ctx, iterations, basis, mean)
        r = ctx.compute(plan["ritz"], self._values(basis, mean))
        gram = basis.T @ centred(r, mean)
        eigenvalues, vectors = np.linalg.eigh((gram + gram.T) / 2)
        order = np.argsort(eigenvalues)[::-1][: p.k]
        total = float(r["total"]) - (n * float(mean @ mean) if self.arrays["X"].sparse is not None or not p.center
                                     else 0.0)
        return (basis @ vectors[:, order]).T, np.sqrt(np.maximum(eigenvalues[order], 0.0)), max(total, 0.0), mean, \
            iterations

    def _tick(self, ctx: JobContext, iteration: int, basis: np.ndarray, mean: np.ndarray) -> None:
        ctx.iteration(iteration, self.params.n_iter)
        ctx.checkpoint(iteration, {"basis": basis, "mean": mean, "iteration": iteration})

    @staticmethod
    def _values(basis: np.ndarray, mean: np.ndarray) -> dict[str, np.ndarray]:
        return {"basis": basis, "shift": mean @ basis, "mean": mean}

    def _scores(self, ctx: JobContext, plan: StagePlan, components: np.ndarray, mean: np.ndarray,
                arrays: dict[str, np.ndarray]) -> int | None:
        """The scores pass, if asked for: written by the workers (the bytes), or, without a
        result group (a job run in-process), returned with the other arrays."""
        if not self.params.scores:
            return None
        values = {"basis": components.T.copy(), "shift": mean @ components.T, "mean": mean}
        if not ctx.writes_result:
            arrays["scores"] = ctx.compute(plan["scores"], values)["scores"]
            return None
        r = ctx.compute(ctx.writing(plan.pass_named("scores")), values)
        return ctx.count_writes(plan.pass_named("scores"), r)
