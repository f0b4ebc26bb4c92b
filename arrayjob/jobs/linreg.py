"""Linear regression (ridge), by TSQR or by the normal equations, in one pass over X.

Objective: minimise (1/(2n)) ||X w + b − y||² + (l2/2) ||w||², intercept unpenalised —
scikit-learn's ``Ridge(alpha = l2·n)`` (``LinearRegression`` when l2 = 0).

``method = "tsqr"`` (default): the R factor of [X 1 y] by TSQR (see ``jobs.tsqr``); the
ridge rows √(n·l2)·I are appended to R on the driver and factored again, and
R₁₁ θ = r₁₂ gives the coefficients; the residual is R's last diagonal entry. Backward
stable: no squared condition number. Cost: one pass over X, about 2n(d+2)² flops, moves
B(d+2)² floats.

``method = "normal"``: one pass computes XᵀX, Xᵀy and the column sums in one kernel per
row block; the driver centres them and solves the d × d system (Cholesky, or least
squares when singular). Cost: one pass over X, 2nd² flops, moves d² + 2d + 2 floats per
block. Faster, but it squares the condition number and centring from sums loses
accuracy when |mean| ≫ spread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import scipy.linalg

from arrayjob import lazy as la
from arrayjob.jobs.base import (
    Job,
    JobContext,
    JobResult,
    Pass,
    StagePlan,
    require_features_and_targets,
)
from arrayjob.jobs.tsqr import QR_OF_STACK, block_rows_for, qr_block_cost, r_of_block
from arrayjob.planner.kernel import Kernel


@dataclass(frozen=True)
class LinRegParams:
    l2: float = field(default=0.0, metadata={"check": lambda v: v >= 0 and np.isfinite(v), "expect": "a number >= 0"})
    fit_intercept: bool = True
    method: Literal["tsqr", "normal"] = "tsqr"


class LinearRegression(Job):
    name = "linreg"
    title = "linear regression"
    inputs = ("X", "y")
    Params = LinRegParams
    params: LinRegParams

    def check_inputs(self) -> None:
        require_features_and_targets(self.arrays)

    def describe(self) -> str:
        X = self.arrays["X"]
        return f"{self.title} ({self.params.method}) on X {X.shape[0]:,} × {X.shape[1]:,}"

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        return [((self.arrays["X"].shape[1],), "float64", None), ((1,), "float64", None)]

    def stages(self, workers: int) -> StagePlan:
        """One pass over X: R of [X 1 y] (``tsqr``), or the sums of the normal equations."""
        return StagePlan((Pass(self.params.method, "fit", self._one_pass(workers)),))

    def _one_pass(self, workers: int) -> dict[str, la.BlockArray]:
        X = la.from_zarr(self.arrays["X"])
        y = la.from_zarr(self.arrays["y"])
        if self.params.method == "tsqr":
            rows = block_rows_for(self, "X", workers)
            n, d = X.shape
            cols = d + (2 if self.params.fit_intercept else 1)
            blocks = -(-n // rows)
            kernel = AUGMENTED_R_WITH_ONES if self.params.fit_intercept else AUGMENTED_R
            (r_stack,) = la.map_blocks(kernel, X, y, outputs=[((blocks * cols, cols), "float64", cols)],
                                       block_rows=[rows, rows], cost=augmented_r_cost)
            _, r = la.map_blocks(QR_OF_STACK, r_stack, outputs=[((blocks * cols, cols), "float64", None),
                                                                 ((cols, cols), "float64", None)], cost=qr_block_cost)
            return {"R": r}
        if y.ndim == 2:
            y = y.sum(axis=1)
        return {
            "xtx": la.einsum("ij,ik->jk", X, X),
            "xty": X.T @ y,
            "sum_x": X.sum(axis=0),
            "sum_y": y.sum(),
            "sum_yy": (y * y).sum(),
        }

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        n, d = self.arrays["X"].shape
        plan = self.stages(ctx.session.options.cluster.workers)
        program, stage = plan[p.method], plan.stage_of(p.method)
        with ctx.metrics.stage("load"):
            ctx.session.load(program)
        if p.method == "tsqr":
            with ctx.metrics.stage(stage):
                coef, intercept, objective = self._from_r(ctx.session.compute(program)["R"], n, d)
            attrs = {"objective": float(objective), "method": p.method, "n_samples": n, "n_features": d}
            return JobResult({"coef": coef, "intercept": np.array([intercept])}, attrs,
                             [f"least squares by TSQR: objective {objective:.10g}"])
        with ctx.metrics.stage(stage):
            s = ctx.session.compute(program)
            gram, xty, sx, sy = s["xtx"], s["xty"], s["sum_x"], float(s["sum_y"])
            if p.fit_intercept:
                gram = gram - np.outer(sx, sx) / n
                xty = xty - sx * sy / n
            system = gram + n * p.l2 * np.eye(d)
            try:
                coef = scipy.linalg.solve(system, xty, assume_a="pos")
            except (np.linalg.LinAlgError, ValueError):
                coef = np.linalg.lstsq(system, xty, rcond=None)[0]
            intercept = (sy - sx @ coef) / n if p.fit_intercept else 0.0
            # ||Xw + b - y||² from the sums: no second pass over X.
            resid = (coef @ s["xtx"] @ coef + 2 * intercept * (sx @ coef) + n * intercept**2
                     - 2 * (coef @ s["xty"] + intercept * sy) + float(s["sum_yy"]))
            objective = max(resid, 0.0) / (2 * n) + 0.5 * p.l2 * float(coef @ coef)
        attrs = {"objective": float(objective), "method": p.method, "n_samples": n, "n_features": d}
        summary = [f"solved the {d} × {d} normal equations: objective {objective:.10g}"]
        return JobResult({"coef": coef, "intercept": np.array([intercept])}, attrs, summary)

    def _from_r(self, r: np.ndarray, n: int, d: int) -> tuple[np.ndarray, float, float]:
        """Coefficients from the R factor of [X 1 y] (or [X y]), ridge rows appended."""
        p = self.params
        k = r.shape[0] - 1  # parameter columns; the last column is y
        if p.l2 > 0:
            ridge = np.zeros((d, k + 1))
            ridge[:, :d] = np.sqrt(n * p.l2) * np.eye(d)
            r = np.linalg.qr(np.vstack([r, ridge]))[1]
        theta = scipy.linalg.solve_triangular(r[:k, :k], r[:k, k]) if np.all(np.diag(r[:k, :k]) != 0) \
            else np.linalg.lstsq(r[:k, :k], r[:k, k], rcond=None)[0]
        objective = float(r[k, k] ** 2) / (2 * n)
        return theta[:d], (float(theta[d]) if p.fit_intercept else 0.0), objective


def _augmented(X: np.ndarray, y: np.ndarray, ones: bool) -> np.ndarray:
    columns = [X, np.ones((X.shape[0], 1))] if ones else [X]
    return np.concatenate([*columns, y.reshape(-1, 1)], axis=1)


def augmented_r_cost(shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
    """Copying X, y (and ones) into one block, then ``qr_block`` of it (both kernels: the
    column of ones is priced as if present)."""
    rows, d = shapes[0][0], math.prod(shapes[0][1:])
    work = qr_block_cost([(rows, d + 2)])
    work["elementwise"] = work.get("elementwise", 0.0) + rows * (d + 2)
    return work


def augmented_r(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    return r_of_block(_augmented(X, y, ones=False))


def augmented_r_with_ones(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    return r_of_block(_augmented(X, y, ones=True))


AUGMENTED_R = Kernel("r_of_xy_block", augmented_r)
AUGMENTED_R_WITH_ONES = Kernel("r_of_x1y_block", augmented_r_with_ones)
