"""Linear regression: least squares, ridge (TSQR, the normal equations, conjugate gradients)
or with an L1 / elastic-net penalty (OWL-QN).

Objective: minimise (1/(2n)) ||X w + b − y||² + l1 ||w||₁ + (l2/2) ||w||², intercept
unpenalised — scikit-learn's ``Ridge(alpha = l2·n)`` (``LinearRegression`` when l2 = 0), and
``ElasticNet(alpha = l1 + l2, l1_ratio = l1/(l1 + l2))`` when l1 > 0 (``solvers.elastic_net``).
With sample weights (the optional input ``weights``, (n,), ≥ 0) the loss is the weighted mean
(1/(2Σwᵢ)) Σ wᵢ (xᵢ·w + b − yᵢ)²: ``Ridge(alpha = l2·Σwᵢ)`` and ``ElasticNet`` with the same
``sample_weight``; each method below scales X's rows by √wᵢ (TSQR) or weights its sums, and n
becomes Σwᵢ.

``method = "tsqr"`` (default): the R factor of [X 1 y] by an R-only TSQR, Q never formed:
each block's R by a sketch-preconditioned Cholesky QR (``tsqr.r_of_rows``; Householder when
its check fails), the blocks' stacked R factors by Householder; the ridge rows √(n·l2)·I are
appended to R on the driver and factored again, and R₁₁ θ = r₁₂ gives the coefficients; the
residual is R's last diagonal entry. Backward stable: no squared condition number. Cost: one
pass over X (each block read twice in memory), about 2n(d+2)² flops (n(d+2)² of trsm, as many
of Gram), moves B(d+2)² floats.

``method = "normal"``: one pass computes XᵀX, Xᵀy and the column sums in one kernel per
row block; the driver centres them and solves the d × d system (Cholesky, or least
squares when singular). Cost: one pass over X, 2nd² flops, moves d² + 2d + 2 floats per
block. Faster, but it squares the condition number and centring from sums loses
accuracy when |mean| ≫ spread.

``method = "cg"``: conjugate gradients on the (centred, ridge) normal equations, for a
sparse X too wide for a d × d matrix (hashed features: d = 2²⁰). One pass for Xᵀy and the
sums, then one pass per iteration computing XᵀXv and 1ᵀXv for the search direction v (X's
non-zeros visited once), and one last pass for the residual. The centring is applied to the
products (X − 1μᵀ)v, never to X, so X stays sparse. The state (iterate, residual,
direction) is checkpointed after each iteration. Converges to ‖r‖ ≤ tol·‖Xᵀy‖ in at most d
iterations in exact arithmetic; in practice in far fewer when X is well conditioned (use
l2 > 0 otherwise). Cost: 4·nnz flops and a d-vector per block per iteration.

``method = "owlqn"``: the L1 / elastic-net fit (``solvers.elastic_net``), one pass per evaluation.
The other methods refuse l1 > 0.

``method = "refined"``: the normal equations, then refined against X itself: one pass
computes the residual r = y − Xw − b with Xᵀr, 1ᵀr and ‖r‖², and the same factored system
solves for the correction (iterative refinement; Higham, "Accuracy and Stability of
Numerical Algorithms", ch. 12 and 20). Each step shrinks the error by about u·κ(X)², and the
residual computed from X itself sets the limit, which is a backward-stable method's: about
u·κ(X). So the normal equations' Cholesky is checked first (columns scaled to unit norm, its
condition number estimated by LAPACK's trcon): if the expected rate, u·κ² times the digits
centring from sums lost (a mean far from the spread), is over ``normal_equations.REFINE_RATE_LIMIT``, or the
Cholesky fails, or refinement stops converging, the fit runs TSQR instead (one more pass; the
result says so). It stops once the last correction, times κ, is below the coefficients' norm (what is
left is then below u·κ). Cost: two passes where X is well conditioned (the Gram pass, one
refinement pass of two matrix-vector products), against TSQR's trsm and second Gram.

``method = "auto"`` (the default): ``owlqn`` when l1 > 0; else ``refined`` for a dense X; for a
sparse one, ``normal`` while d ≤ 4096 (a 128 MB Gram matrix on the driver) and ``cg`` above.
The plan and the result say which.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import scipy.linalg

from arrayjob import api as la
from arrayjob.algorithms.tsqr import (
    R_OF_STACK,
    Order,
    block_rows_for,
    r_of_block_cost,
    r_of_rows,
    r_of_stack_cost,
)
from arrayjob.api import (
    EACH_ITERATION,
    Job,
    JobContext,
    JobResult,
    Kernel,
    Pass,
    Runs,
    StagePlan,
    require,
    require_features_and_targets,
)
from arrayjob.solvers import elastic_net, sample_weights
from arrayjob.solvers.normal_equations import REFINE_MAX_STEPS, FactoredNormalEquations, quadratic

# A sparse X with at most this many columns is solved by the normal equations (its d × d
# Gram matrix fits the driver: 128 MB), a wider one by conjugate gradients.
NORMAL_MAX_FEATURES = 4096


@dataclass(frozen=True)
class LinRegParams:
    l2: float = field(default=0.0, metadata={"check": lambda v: v >= 0 and np.isfinite(v), "expect": "a number >= 0"})
    l1: float = field(default=0.0, metadata={"check": lambda v: v >= 0 and np.isfinite(v), "expect": "a number >= 0"})
    fit_intercept: bool = True
    method: Literal["auto", "refined", "tsqr", "normal", "cg", "owlqn"] = "auto"
    # iterative methods only: stop at ‖residual‖ ≤ tol·‖Xᵀy‖ (cg), at ‖pseudo-gradient‖ ≤
    # tol·its norm at the start (owlqn), or after max_iter iterations
    tol: float = field(default=1e-10, metadata={"check": lambda v: 0 < v < 1, "expect": "a number between 0 and 1"})
    max_iter: int = field(default=1000, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})


class LinearRegression(Job):
    name = "linreg"
    title = "linear regression"
    inputs = ("X", "y", "weights")
    optional_inputs = ("weights",)
    sparse_inputs = ("X",)
    Params = LinRegParams
    params: LinRegParams

    def check_inputs(self) -> None:
        require_features_and_targets(self.arrays)
        sample_weights.require_weights(self.arrays)
        method = self.params.method
        require(method not in ("tsqr", "refined") or self.arrays["X"].sparse is None,
                f"params.method: {method} factors dense blocks and inputs.X is sparse (use \"normal\", \"cg\" or "
                "\"auto\")")
        require(self.params.l1 == 0 or method in ("auto", "owlqn"),
                f"params.method: {method} solves least squares with an l2 penalty only; l1 > 0 needs \"owlqn\" "
                "(or \"auto\")")

    @property
    def method(self) -> str:
        """The method that runs: ``params.method``, with ``auto`` resolved from X."""
        if self.params.method != "auto":
            return self.params.method
        if self.params.l1 > 0:
            return "owlqn"
        X = self.arrays["X"]
        if X.sparse is None:
            return "refined"
        return "normal" if X.shape[1] <= NORMAL_MAX_FEATURES else "cg"

    def describe(self) -> str:
        X = self.arrays["X"]
        kind = ", sparse" if X.sparse is not None else ""
        return f"{self.title} ({self.method}) on X {X.shape[0]:,} × {X.shape[1]:,}{kind}"

    def iterations_assumed(self, iterations: int | None = None) -> tuple[int, str]:
        if self.method == "refined":
            return 1, "the Gram pass and one refinement pass; TSQR's pass too where X is too ill-conditioned"
        if self.method not in ("cg", "owlqn"):
            return 1, "a single pass"
        return super().iterations_assumed(iterations)

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        return [((self.arrays["X"].shape[1],), "float64", None), ((1,), "float64", None)]

    def stages(self, workers: int) -> StagePlan:
        """One pass over X: R of [X 1 y] (``tsqr``), or the sums of the normal equations;
        ``cg``: the sums, a product with XᵀX per iteration, and the residual; ``owlqn``: one
        evaluation at the start and one per iteration."""
        X = la.from_input(self.arrays["X"])
        y = _vector(la.from_input(self.arrays["y"]))
        w = sample_weights.sample_weights(self.arrays)
        if self.method == "owlqn":
            return StagePlan((Pass("evaluate", "fit", elastic_net.program(X, y, w, self.params.fit_intercept),
                                   Runs(once=1, per_iteration=1)),))
        if self.method == "cg":
            z = X @ la.value("v", (X.shape[1],))
            b = la.value("b", ())
            wy, wz, rss = y, z, la.square(z + b - y)
            moments = {"sum_x": X.sum(axis=0)}
            if w is not None:
                wy, wz, rss = w * y, w * z, w * rss
                moments = {"sum_x": X.T @ w, "sum_w": w.sum()}
            return StagePlan((
                Pass("moments", "fit", {"xty": X.T @ wy, **moments, "sum_y": wy.sum()}),
                Pass("cg", "fit", {"xtxv": X.T @ wz, "sum_xv": wz.sum()}, EACH_ITERATION),
                Pass("residual", "fit", {"rss": rss.sum()}),
            ))
        if self.method == "refined":  # TSQR's pass too, run only if refinement cannot be trusted
            return StagePlan((Pass("normal", "fit", self._one_pass(workers, "normal")),
                              Pass("refine", "fit", self._refine_pass(X, y, w))))
        return StagePlan((Pass(self.method, "fit", self._one_pass(workers, self.method)),))

    def _refine_pass(self, X: la.BlockArray, y: la.BlockArray, w: la.BlockArray | None) -> dict[str, la.BlockArray]:
        """At the coefficients v and intercept b: r = y − Xv − b, then Xᵀr, 1ᵀr and rᵀr (each
        weighted by w): the normal equations' residual and the objective, from X itself."""
        r = y - X @ la.value("v", (X.shape[1],))
        if self.params.fit_intercept:
            r = r - la.value("b", ())
        wr = r if w is None else w * r
        return {"xtr": X.T @ wr, "sum_r": wr.sum(), "rss": (wr * r).sum()}

    def _one_pass(self, workers: int, method: str) -> dict[str, la.BlockArray]:
        X = la.from_input(self.arrays["X"])
        y = la.from_input(self.arrays["y"])
        w = sample_weights.sample_weights(self.arrays)
        if method == "tsqr":
            rows = block_rows_for(self, "X", workers)
            n, d = X.shape
            cols = d + (2 if self.params.fit_intercept else 1)
            blocks = -(-n // rows)
            kernel = AUGMENTED_R_WITH_ONES if self.params.fit_intercept else AUGMENTED_R
            operands = [X, y]
            if w is not None:  # rows scaled by √wᵢ
                kernel = WEIGHTED_R_WITH_ONES if self.params.fit_intercept else WEIGHTED_R
                operands.append(w)
            (r_stack,) = la.map_blocks(kernel, *operands, outputs=[((blocks * cols, cols), "float64", cols)],
                                       block_rows=[rows] * len(operands), cost=augmented_r_cost)
            (r,) = la.map_blocks(R_OF_STACK, r_stack, outputs=[((cols, cols), "float64", None)], cost=r_of_stack_cost)
            return {"R": r} if w is None else {"R": r, "sum_w": w.sum()}
        y = _vector(y)
        if w is None:
            return {
                "xtx": la.einsum("ij,ik->jk", X, X),
                "xty": X.T @ y,
                "sum_x": X.sum(axis=0),
                "sum_y": y.sum(),
                "sum_yy": (y * y).sum(),
            }
        wy = w * y
        return {
            "xtx": la.einsum("ij,i,ik->jk", X, w, X),
            "xty": X.T @ wy,
            "sum_x": X.T @ w,
            "sum_y": wy.sum(),
            "sum_yy": (wy * y).sum(),
            "sum_w": w.sum(),
        }

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        n, d = self.arrays["X"].shape
        plan = self.stages(ctx.workers)
        if self.method == "cg":
            return self._cg(ctx, plan, n, d)
        if self.method == "owlqn":
            with ctx.stage("load"):
                ctx.load(plan["evaluate"])
            with ctx.stage(plan.stage_of("evaluate")):
                return elastic_net.solve(ctx, plan["evaluate"], n, d, l1=p.l1, l2=p.l2, fit_intercept=p.fit_intercept,
                                         tol=p.tol, max_iter=p.max_iter)
        if self.method == "refined":
            with ctx.stage("load"):
                ctx.load(plan["normal"])
            with ctx.stage(plan.stage_of("normal")):
                return self._refined(ctx, plan, n, d)
        program, stage = plan[self.method], plan.stage_of(self.method)
        with ctx.stage("load"):
            ctx.load(program)
        if self.method == "tsqr":
            with ctx.stage(stage):
                computed = ctx.compute(program)
                total = sample_weights.total(float(computed["sum_w"])) if "sum_w" in computed else float(n)
                coef, intercept, objective = self._from_r(computed["R"], total, d)
            attrs = self._attrs(objective, n, d, total)
            return JobResult({"coef": coef, "intercept": np.array([intercept])}, attrs,
                             [f"least squares by TSQR: objective {objective:.10g}"])
        with ctx.stage(stage):
            s = ctx.compute(program)
            total = sample_weights.total(float(s["sum_w"])) if "sum_w" in s else float(n)
            gram, xty, sx, sy = s["xtx"], s["xty"], s["sum_x"], float(s["sum_y"])
            if p.fit_intercept:
                gram = gram - np.outer(sx, sx) / total
                xty = xty - sx * sy / total
            system = gram + total * p.l2 * np.eye(d)
            try:
                coef = scipy.linalg.solve(system, xty, assume_a="pos")
            except (np.linalg.LinAlgError, ValueError):
                coef = np.linalg.lstsq(system, xty, rcond=None)[0]
            intercept = (sy - sx @ coef) / total if p.fit_intercept else 0.0
            # ||Xw + b - y||² (weighted) from the sums: no second pass over X.
            resid = (quadratic(s["xtx"], sx, total, coef, intercept)
                     - 2 * (coef @ s["xty"] + intercept * sy) + float(s["sum_yy"]))
            objective = max(resid, 0.0) / (2 * total) + 0.5 * p.l2 * float(coef @ coef)
        attrs = self._attrs(objective, n, d, total)
        summary = [f"solved the {d} × {d} normal equations: objective {objective:.10g}"]
        return JobResult({"coef": coef, "intercept": np.array([intercept])}, attrs, summary)

    def _refined(self, ctx: JobContext, plan: StagePlan, n: int, d: int) -> JobResult:
        """The normal equations, refined against X's residuals; TSQR if they cannot be trusted."""
        p = self.params
        s = ctx.compute(plan["normal"])
        total = sample_weights.total(float(s["sum_w"])) if "sum_w" in s else float(n)
        system = FactoredNormalEquations.of(s["xtx"], s["sum_x"], total, p.l2, p.fit_intercept)
        why = system.unsuitable()
        steps = 0
        if why is None:
            coef, intercept = system.solve(s["xty"], float(s["sum_y"]))
            previous = math.inf
            while True:
                values = {"v": coef, "b": intercept} if p.fit_intercept else {"v": coef}
                r = ctx.compute(plan["refine"], values)
                xtr, sum_r = r["xtr"], float(r["sum_r"])
                dc, db = system.solve(xtr - total * p.l2 * coef, sum_r)
                # ‖r − Aδ‖² for A = [X 1] (weighted): the residual after the correction, without a pass
                rss = float(r["rss"]) - 2 * (float(dc @ xtr) + db * sum_r) + system.quadratic(dc, db)
                coef, intercept = coef + dc, intercept + db
                steps += 1
                correction = float(np.linalg.norm(dc))
                ctx.iteration(steps, REFINE_MAX_STEPS, correction=correction)
                size = math.hypot(correction, db)
                if system.condition * size <= math.hypot(float(np.linalg.norm(coef)), intercept):
                    break  # what is left of the error is below u·κ: a backward-stable solver's
                if steps == REFINE_MAX_STEPS or size > 0.5 * previous:
                    why = f"refinement did not converge in {steps} steps (last correction {size:.1e})"
                    break
                previous = size
        if why is not None:
            computed = ctx.compute(self._one_pass(ctx.workers, "tsqr"))
            coef, intercept, objective = self._from_r(computed["R"], total, d)
            attrs = self._attrs(objective, n, d, total) | {
                "method": "tsqr", "refinement": {"steps": steps, "instead": why}}
            return JobResult({"coef": coef, "intercept": np.array([intercept])}, attrs,
                             [f"least squares by TSQR ({why}): objective {objective:.10g}"])
        objective = max(rss, 0.0) / (2 * total) + 0.5 * p.l2 * float(coef @ coef)
        attrs = self._attrs(objective, n, d, total) | {
            "refinement": {"steps": steps, "condition_estimate": float(system.condition)}}
        summary = [f"the {d} × {d} normal equations, refined against X in {steps} step{'s' if steps > 1 else ''} "
                   f"(condition number about {system.condition:.2g}): objective {objective:.10g}"]
        return JobResult({"coef": coef, "intercept": np.array([intercept])}, attrs, summary)

    def _attrs(self, objective: float, n: int, d: int, total: float) -> dict[str, object]:
        attrs: dict[str, object] = {"objective": float(objective), "method": self.method, "n_samples": n,
                                    "n_features": d}
        if "weights" in self.arrays:
            attrs["weight_sum"] = total
        return attrs

    def _cg(self, ctx: JobContext, plan: StagePlan, n: int, d: int) -> JobResult:
        """Conjugate gradients on (XcᵀWXc + Σw·l2·I) w = XcᵀW(y − ȳ), Xc = X − 1μᵀ never formed
        (μ, ȳ: the weighted means; W = I without weights)."""
        p = self.params
        with ctx.stage("load"):
            ctx.load(plan["moments"])
        with ctx.stage("fit"):
            m = ctx.compute(plan["moments"])
            total = sample_weights.total(float(m["sum_w"])) if "sum_w" in m else float(n)
            mean = m["sum_x"] / total if p.fit_intercept else np.zeros(d)
            y_mean = float(m["sum_y"]) / total if p.fit_intercept else 0.0
            rhs = m["xty"] - total * mean * y_mean

            def product(v: np.ndarray) -> np.ndarray:  # (XcᵀWXc + Σw·l2·I) v, one pass over X
                r = ctx.compute(plan["cg"], {"v": v})
                mv = float(mean @ v)
                return r["xtxv"] - mv * total * mean - mean * (float(r["sum_xv"]) - total * mv) + total * p.l2 * v

            saved = ctx.restore()
            if saved is not None:
                st = saved.state
                w, resid, direction = st["w"], st["resid"], st["direction"]
                iterations = int(st["iteration"])
            else:
                w, resid, direction, iterations = np.zeros(d), rhs.copy(), rhs.copy(), 0
            target = p.tol * float(np.linalg.norm(rhs))
            rs = float(resid @ resid)
            while np.sqrt(rs) > target and iterations < p.max_iter:
                step = product(direction)
                curvature = float(direction @ step)
                if curvature <= 0:
                    break  # a singular system (l2 = 0, a column of zeros): w is a least-squares solution
                alpha = rs / curvature
                w = w + alpha * direction
                resid = resid - alpha * step
                rs, previous = float(resid @ resid), rs
                direction = resid + (rs / previous) * direction
                iterations += 1
                ctx.iteration(iterations, p.max_iter, residual=float(np.sqrt(rs)), target=target)
                ctx.checkpoint(iterations, {"w": w, "resid": resid, "direction": direction,
                                            "iteration": iterations})
            intercept = y_mean - float(mean @ w)
            rss = float(ctx.compute(plan["residual"], {"v": w, "b": intercept})["rss"])
        objective = rss / (2 * total) + 0.5 * p.l2 * float(w @ w)
        converged = bool(np.sqrt(rs) <= target)
        attrs = self._attrs(objective, n, d, total) | {
            "iterations": iterations, "converged": converged, "residual_norm": float(np.sqrt(rs))}
        summary = [f"conjugate gradients {'converged' if converged else 'did NOT converge'} in {iterations} "
                   f"iterations: objective {objective:.10g}, residual {np.sqrt(rs):.2e} (target {target:.2e})"]
        return JobResult({"coef": w, "intercept": np.array([intercept])}, attrs, summary)

    def _from_r(self, r: np.ndarray, total: float, d: int) -> tuple[np.ndarray, float, float]:
        """Coefficients from the R factor of [X 1 y] (or [X y]; rows scaled by √wᵢ), ridge rows
        appended; ``total``: n, or Σwᵢ."""
        p = self.params
        k = r.shape[0] - 1  # parameter columns; the last column is y
        if p.l2 > 0:
            ridge = np.zeros((d, k + 1))
            ridge[:, :d] = np.sqrt(total * p.l2) * np.eye(d)
            r = np.linalg.qr(np.vstack([r, ridge]))[1]
        theta = scipy.linalg.solve_triangular(r[:k, :k], r[:k, k]) if np.all(np.diag(r[:k, :k]) != 0) \
            else np.linalg.lstsq(r[:k, :k], r[:k, k], rcond=None)[0]
        objective = float(r[k, k] ** 2) / (2 * total)
        return theta[:d], (float(theta[d]) if p.fit_intercept else 0.0), objective


def _vector(y: la.BlockArray) -> la.BlockArray:
    """y as (n,): an (n, 1) input summed over its one column."""
    return y.sum(axis=1) if y.ndim == 2 else y


def _augmented_r(X: np.ndarray, y: np.ndarray, ones: bool, w: np.ndarray | None = None) -> np.ndarray:
    """R of [X 1 y] (or [X y]; rows scaled by √wᵢ), the block assembled a piece at a time."""
    root = None if w is None else np.sqrt(np.asarray(w, dtype=np.float64).reshape(-1))
    y = np.asarray(y, dtype=np.float64).reshape(-1)

    d = X.shape[1]

    def rows_of(lo: int, hi: int, order: Order) -> np.ndarray:
        block = np.empty((hi - lo, d + 1 + ones), order=order)
        block[:, :d] = X[lo:hi]
        if ones:
            block[:, d] = 1.0
        block[:, -1] = y[lo:hi]
        if root is not None:
            block *= root[lo:hi, None]
        return block

    return r_of_rows(rows_of, X.shape[0], X.shape[1] + (2 if ones else 1))


def augmented_r_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    """``r_of_rows`` of [X 1 y] (both kernels: the column of ones is priced as if present),
    its pieces assembled twice (and scaled by √wᵢ when weighted)."""
    rows, d = shapes[0][0], math.prod(shapes[0][1:])
    work = r_of_block_cost([(rows, d + 2)])
    work["elementwise"] = work.get("elementwise", 0.0) + 2 * rows * (d + 2) * (2 if len(shapes) > 2 else 1)
    return work


def augmented_r(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    return _augmented_r(X, y, ones=False)


def augmented_r_with_ones(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    return _augmented_r(X, y, ones=True)


def weighted_r(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _augmented_r(X, y, ones=False, w=w)


def weighted_r_with_ones(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _augmented_r(X, y, ones=True, w=w)


AUGMENTED_R = Kernel("r_of_xy_block", augmented_r)
AUGMENTED_R_WITH_ONES = Kernel("r_of_x1y_block", augmented_r_with_ones)
WEIGHTED_R = Kernel("r_of_weighted_xy_block", weighted_r)
WEIGHTED_R_WITH_ONES = Kernel("r_of_weighted_x1y_block", weighted_r_with_ones)
