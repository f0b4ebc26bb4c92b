"""L2-regularised logistic regression, fitted by L-BFGS or Newton's method.

Objective (labels y in {0, 1}, s = 2y - 1, intercept b unpenalised):

    f(w, b) = (1/n) sum_i log(1 + exp(-s_i (x_i . w + b))) + (l2/2) ||w||^2

This is scikit-learn's ``LogisticRegression(C=1/(l2 n))``. X stays partitioned in row
blocks on the workers; each evaluation is one pass over X computing loss and gradient
(and for Newton the Hessian) together per block, summed in a tree. Only the d+1
weights go out and d+1 (Newton: (d+1)^2) partial sums come back per block.

Cost per evaluation, for X of n x d in B blocks: reads 8nd bytes of memory (storage is
read once per job), 4nd flops (L-BFGS) or 2nd^2 more (Newton), moves B(d+2) floats
(Newton: B(d+1)^2 more) to the driver's reduction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import scipy.linalg
import scipy.optimize
from scipy.special import expit

from arrayjob.jobs.base import Job, JobContext, JobResult, require, require_numeric
from arrayjob.planner.mapreduce import row_map_reduce
from arrayjob.planner.physical import Kernel, PhysicalPlan, Source
from arrayjob.planner.tiling import aligned_row_grid, row_grid


def _check_labels(y: np.ndarray) -> str | None:
    if not np.all((y == 0) | (y == 1)):
        bad = y[(y != 0) & (y != 1)][0]
        return f"labels must be 0 or 1, found {bad.item()!r}"
    return None


def _margin_terms(X: np.ndarray, y: np.ndarray, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    d = X.shape[1]
    z = X @ theta[:d]
    if theta.shape[0] > d:
        z += theta[d]
    sign = 2.0 * y.reshape(-1) - 1.0
    margin = sign * z
    loss = float(np.logaddexp(0.0, -margin).sum())
    p = expit(-margin)  # sigmoid of minus the margin
    return loss, -sign * p, p


def loss_grad(X: np.ndarray, y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """[sum of losses, gradient wrt w, (gradient wrt b)] of one row block."""
    loss, dz, _ = _margin_terms(X, y, theta)
    out = np.empty(theta.shape[0] + 1)
    out[0] = loss
    out[1 : X.shape[1] + 1] = X.T @ dz
    if theta.shape[0] > X.shape[1]:
        out[-1] = dz.sum()
    return out


def loss_grad_hess(X: np.ndarray, y: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``loss_grad`` plus the Hessian of the summed loss wrt theta, of one row block."""
    d = X.shape[1]
    loss, dz, p = _margin_terms(X, y, theta)
    weight = p * (1.0 - p)
    out = np.empty(theta.shape[0] + 1)
    out[0] = loss
    out[1 : d + 1] = X.T @ dz
    hess = np.empty((theta.shape[0], theta.shape[0]))
    hess[:d, :d] = X.T @ (X * weight[:, None])
    if theta.shape[0] > d:
        out[-1] = dz.sum()
        hess[d, :d] = hess[:d, d] = X.T @ weight
        hess[d, d] = weight.sum()
    return out, hess


LOSS_GRAD = Kernel("logistic_loss_grad", loss_grad)
LOSS_GRAD_HESS = Kernel("logistic_loss_grad_hess", loss_grad_hess)
CHECK_LABELS = Kernel("check_labels", _check_labels)


@dataclass(frozen=True)
class LogRegParams:
    solver: Literal["lbfgs", "newton"] = "lbfgs"
    l2: float = field(default=1e-4, metadata={"check": lambda v: v >= 0 and np.isfinite(v), "expect": "a number >= 0"})
    fit_intercept: bool = True
    max_iter: int = field(default=100, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    tol: float = field(default=1e-6, metadata={"check": lambda v: v > 0 and np.isfinite(v), "expect": "a number > 0"})


class LogisticRegression(Job):
    name = "logreg"
    title = "logistic regression"
    inputs = ("X", "y")
    Params = LogRegParams
    params: LogRegParams

    def check_inputs(self) -> None:
        X, y = self.arrays["X"], self.arrays["y"]
        require(X.ndim == 2, f"inputs.X: expected a 2-D array (rows × features), got shape {X.shape}")
        require(X.shape[0] > 0 and X.shape[1] > 0, f"inputs.X: expected at least one row and one column, got shape {X.shape}")
        require_numeric(X)
        require_numeric(y)
        require(
            y.shape in ((X.shape[0],), (X.shape[0], 1)),
            f"inputs.y: expected shape ({X.shape[0]},) to match the rows of inputs.X {X.shape}, got {y.shape}",
        )

    def describe(self) -> str:
        X = self.arrays["X"]
        return f"{self.title} ({self.params.solver}) on X {X.shape[0]:,} × {X.shape[1]:,}"

    def sources(self, workers: int) -> tuple[Source, Source]:
        X, y = self.arrays["X"], self.arrays["y"]
        grid = row_grid(X, workers=workers)
        return Source(X, grid), Source(y, aligned_row_grid(y, grid), check=CHECK_LABELS)

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        n, d = self.arrays["X"].shape
        sources = self.sources(ctx.workers)
        kernel = LOSS_GRAD if p.solver == "lbfgs" else LOSS_GRAD_HESS
        plan = row_map_reduce(sources, kernel, ("theta",))
        with ctx.metrics.stage("load"):
            ctx.executor.load(plan)
        with ctx.metrics.stage("fit"):
            if p.solver == "lbfgs":
                theta, iterations = self._lbfgs(ctx, plan, n, d)
            else:
                theta, iterations = self._newton(ctx, plan, n, d)
            objective, grad = self._objective(ctx, plan, theta, n, d)
        grad_norm = float(np.linalg.norm(grad))
        converged = grad_norm <= p.tol
        coef = theta[:d]
        intercept = theta[d:] if p.fit_intercept else np.zeros(1)
        attrs = {
            "objective": objective,
            "iterations": iterations,
            "converged": bool(converged),
            "gradient_norm": grad_norm,
            "solver": p.solver,
            "n_samples": n,
            "n_features": d,
        }
        summary = [
            f"{'converged' if converged else 'did NOT converge'} in {iterations} iterations: "
            f"objective {objective:.10g}, gradient norm {grad_norm:.2e} (tol {p.tol:g})",
        ]
        return JobResult({"coef": coef, "intercept": intercept}, attrs, summary)

    def _objective(self, ctx: JobContext, plan: PhysicalPlan, theta: np.ndarray, n: int, d: int) -> tuple[float, np.ndarray]:
        last = getattr(self, "_last", None)
        if last is not None and np.array_equal(last[0], theta):
            return last[1], last[2].copy()  # the solver's final point was just evaluated
        (parts,) = ctx.executor.run(plan, {"theta": theta})
        if isinstance(parts, tuple):
            parts = parts[0]
        loss, grad = self._regularise(parts, theta, n, d)
        self._last = (theta.copy(), loss, grad.copy())
        return loss, grad

    def _regularise(self, parts: np.ndarray, theta: np.ndarray, n: int, d: int) -> tuple[float, np.ndarray]:
        l2, w = self.params.l2, theta[:d]
        loss = parts[0] / n + 0.5 * l2 * float(w @ w)
        grad = parts[1:] / n
        grad[:d] += l2 * w
        return float(loss), grad

    def _initial(self, d: int) -> np.ndarray:
        return np.zeros(d + 1 if self.params.fit_intercept else d)

    def _lbfgs(self, ctx: JobContext, plan: PhysicalPlan, n: int, d: int) -> tuple[np.ndarray, int]:
        p = self.params
        last_grad = {"norm": np.inf}

        def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
            loss, grad = self._objective(ctx, plan, theta, n, d)
            last_grad["norm"] = float(np.linalg.norm(grad))
            return loss, grad

        def stop_when_small(intermediate_result: scipy.optimize.OptimizeResult) -> None:
            if last_grad["norm"] <= p.tol:
                raise StopIteration

        result = scipy.optimize.minimize(
            fun,
            self._initial(d),
            jac=True,
            method="L-BFGS-B",
            callback=stop_when_small,
            # tol is on the gradient's 2-norm (checked in the callback), not SciPy's max-norm.
            options={"maxiter": p.max_iter, "gtol": 0.0, "ftol": 64 * np.finfo(float).eps},
        )
        return result.x, int(result.nit)

    def _newton(self, ctx: JobContext, plan: PhysicalPlan, n: int, d: int) -> tuple[np.ndarray, int]:
        """Newton's method with a backtracking (Armijo) line search; one pass per trial point."""
        p = self.params
        penalty = np.full(d + 1 if p.fit_intercept else d, p.l2)
        if p.fit_intercept:
            penalty[d] = 0.0

        def evaluate(theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
            (parts,) = ctx.executor.run(plan, {"theta": theta})
            loss, grad = self._regularise(parts[0], theta, n, d)
            return loss, grad, parts[1] / n + np.diag(penalty)

        theta = self._initial(d)
        loss, grad, hess = evaluate(theta)
        iterations = 0
        while iterations < p.max_iter and np.linalg.norm(grad) > p.tol:
            try:
                step = scipy.linalg.solve(hess, grad, assume_a="pos")
            except (np.linalg.LinAlgError, ValueError):
                step = np.linalg.lstsq(hess, grad, rcond=None)[0]
            decrease = float(grad @ step)
            t = 1.0
            for _ in range(40):
                trial = theta - t * step
                trial_loss, trial_grad, trial_hess = evaluate(trial)
                if trial_loss <= loss - 1e-4 * t * decrease:
                    break
                t *= 0.5
            else:
                break  # no decrease possible at machine precision
            theta, loss, grad, hess = trial, trial_loss, trial_grad, trial_hess
            iterations += 1
        return theta, iterations
