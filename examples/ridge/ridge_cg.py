"""Ridge regression by conjugate gradients: an iterative job written on ``arrayjob.api`` alone.

Minimises (1/(2n))·‖Xw − y‖² + (l2/2)·‖w‖² (no intercept), scikit-learn's
``Ridge(alpha=l2·n, fit_intercept=False)``, by conjugate gradients on the normal equations
(XᵀX/n + l2·I) w = Xᵀy/n (Hestenes & Stiefel, 1952). One pass over X computes Xᵀy; then
each iteration is one pass computing XᵀX·p, ``X @ p`` and ``X.T @ (...)`` fused into one kernel
per row block, so X is read once per iteration and only d floats per block come back.
The iterate, residual and direction are checkpointed each iteration: a killed run resumes.

Cost: 4·n·d flops and one d-vector a block per iteration; at most d iterations in exact
arithmetic, far fewer when XᵀX/n + l2·I is well conditioned.

Run it (docs/writing-jobs.md): ``PYTHONPATH=examples/ridge arrayjob run examples/ridge/ridge.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from arrayjob import api


@dataclass(frozen=True)
class RidgeParams:
    l2: float = field(default=1e-2, metadata={"check": lambda v: v > 0, "expect": "a number > 0"})
    tol: float = field(default=1e-10, metadata={"check": lambda v: 0 < v < 1, "expect": "a number between 0 and 1"})
    max_iter: int = field(default=200, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})


class RidgeCG(api.Job):
    title = "ridge regression by conjugate gradients"
    inputs = ("X", "y")
    Params = RidgeParams
    params: RidgeParams

    def check_inputs(self) -> None:
        api.require_matrix(self.arrays["X"])
        X, y = self.arrays["X"], self.arrays["y"]
        api.require(y.shape == (X.shape[0],), f"inputs.y: expected shape ({X.shape[0]},), got {y.shape}")

    def stages(self, workers: int) -> api.StagePlan:
        X, y = api.from_input(self.arrays["X"]), api.from_input(self.arrays["y"])
        p = api.value("p", (X.shape[1],))
        return api.StagePlan((
            api.Pass("xty", "load", {"b": X.T @ y}),
            api.Pass("product", "fit", {"Xp": X.T @ (X @ p)}, runs=api.EACH_ITERATION),
        ))

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        return [((self.arrays["X"].shape[1],), "float64", None)]

    def run(self, ctx: api.JobContext) -> api.JobResult:
        n, d = self.arrays["X"].shape
        l2, plan = self.params.l2, self.stages(ctx.workers)
        with ctx.stage("load"):
            ctx.load(plan["xty"])
            b = ctx.compute(plan["xty"])["b"] / n
        saved = ctx.restore()
        if saved is not None:
            w, r, p, k = saved.state["w"], saved.state["r"], saved.state["p"], saved.iteration
        else:
            w, r, p, k = np.zeros(d), b.copy(), b.copy(), 0
        with ctx.stage("fit"):
            while k < self.params.max_iter and np.linalg.norm(r) > self.params.tol * np.linalg.norm(b):
                Ap = ctx.compute(plan["product"], {"p": p})["Xp"] / n + l2 * p
                alpha = (r @ r) / (p @ Ap)
                w, r_next = w + alpha * p, r - alpha * Ap
                p, r, k = r_next + ((r_next @ r_next) / (r @ r)) * p, r_next, k + 1
                ctx.iteration(k, self.params.max_iter, residual=float(np.linalg.norm(r)))
                ctx.checkpoint(k, {"w": w, "r": r, "p": p})
        return api.JobResult({"coef": w}, {"iterations": k, "residual": float(np.linalg.norm(r))},
                             [f"{k} iterations, residual {np.linalg.norm(r):.3g}"])
