"""Linear regression (ridge), by the normal equations in one pass over X.

Objective: minimise (1/(2n)) ||X w + b − y||² + (l2/2) ||w||², intercept unpenalised —
scikit-learn's ``Ridge(alpha = l2·n)`` (``LinearRegression`` when l2 = 0).

One pass computes XᵀX, Xᵀy and the column sums of X and y in one kernel per row block;
the driver centres them and solves the d × d system (Cholesky, or least squares when
singular). Cost: reads X once (8nd bytes), 2nd² flops, moves d² + 2d + 2 floats per block.
Centring from sums loses accuracy when |mean| ≫ spread; ``method = "tsqr"`` is the
numerically careful alternative.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import scipy.linalg

from arrayjob import lazy as la
from arrayjob.jobs.base import Job, JobContext, JobResult, require, require_numeric


@dataclass(frozen=True)
class LinRegParams:
    l2: float = field(default=0.0, metadata={"check": lambda v: v >= 0 and np.isfinite(v), "expect": "a number >= 0"})
    fit_intercept: bool = True
    method: Literal["normal"] = "normal"


class LinearRegression(Job):
    name = "linreg"
    title = "linear regression"
    inputs = ("X", "y")
    Params = LinRegParams
    params: LinRegParams

    def check_inputs(self) -> None:
        X, y = self.arrays["X"], self.arrays["y"]
        require(X.ndim == 2, f"inputs.X: expected a 2-D array (rows × features), got shape {X.shape}")
        require(X.shape[0] > 0 and X.shape[1] > 0, f"inputs.X: expected at least one row and one column, got shape {X.shape}")
        require_numeric(X)
        require_numeric(y)
        require(y.shape in ((X.shape[0],), (X.shape[0], 1)),
                f"inputs.y: expected shape ({X.shape[0]},) to match the rows of inputs.X {X.shape}, got {y.shape}")

    def describe(self) -> str:
        X = self.arrays["X"]
        return f"{self.title} ({self.params.method}) on X {X.shape[0]:,} × {X.shape[1]:,}"

    def program(self) -> dict[str, la.BlockArray]:
        X = la.from_zarr(self.arrays["X"])
        y = la.from_zarr(self.arrays["y"])
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
        program = self.program()
        with ctx.metrics.stage("load"):
            ctx.session.load(program)
        with ctx.metrics.stage("fit"):
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
