"""L2-regularised logistic regression, fitted by L-BFGS or Newton's method.

Objective (labels y in {0, 1}, s = 2y - 1, intercept b unpenalised):

    f(w, b) = (1/n) sum_i log(1 + exp(-s_i (x_i . w + b))) + (l2/2) ||w||^2

This is scikit-learn's ``LogisticRegression(C=1/(l2 n))``. The loss and gradient (and for
Newton the Hessian) are one lazy program over X; the planner cuts X into row blocks,
fuses the program into one kernel per block, and only the weights go out and d+2
(Newton: (d+1)^2 more) partial sums come back per block. The solver itself (L-BFGS from
``jobs.lbfgs``, or Newton steps with a backtracking line search) runs on the driver, and
its whole state is checkpointed (``io.checkpoint``) so that a run resumed after a kill ends
exactly where an undisturbed run would.

Cost per evaluation, for X of n x d: one pass over X in memory (8nd bytes; storage is
read once per job), about 4nd flops (L-BFGS) or 2nd^2 more (Newton).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import scipy.linalg

from arrayjob import lazy as la
from arrayjob.jobs import lbfgs
from arrayjob.jobs.base import (
    Job,
    JobContext,
    JobResult,
    Pass,
    Runs,
    StagePlan,
    require,
    require_features_and_targets,
)
from arrayjob.planner.kernel import Kernel
from arrayjob.units import size

# Newton's d × d Hessian comes back from every block: 512 MB at this many features
NEWTON_MAX_FEATURES = 8192


def _check_labels(y: np.ndarray) -> str | None:
    if not np.all((y == 0) | (y == 1)):
        bad = y[(y != 0) & (y != 1)][0]
        return f"labels must be 0 or 1, found {bad.item()!r}"
    return None


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
    sparse_inputs = ("X",)
    Params = LogRegParams
    params: LogRegParams

    def check_inputs(self) -> None:
        require_features_and_targets(self.arrays)
        d = self.arrays["X"].shape[1]
        require(self.params.solver != "newton" or d <= NEWTON_MAX_FEATURES,
                f"params.solver: newton forms a d × d Hessian on every pass (d = {d:,}: {size(8.0 * (d + 1) ** 2)} "
                f"per block); use lbfgs above {NEWTON_MAX_FEATURES:,} features")

    def describe(self) -> str:
        X = self.arrays["X"]
        return f"{self.title} ({self.params.solver}) on X {X.shape[0]:,} × {X.shape[1]:,}"

    def stages(self, workers: int) -> StagePlan:
        """One evaluation at the start and one per iteration: an estimate's count. A line
        search that backtracks evaluates once more per step back (a run's ``evaluations``)."""
        return StagePlan((Pass("evaluate", "fit", self._evaluation(), Runs(once=1, per_iteration=1)),))

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        return [((self.arrays["X"].shape[1],), "float64", None), ((1,), "float64", None)]

    def _evaluation(self) -> dict[str, la.BlockArray]:
        """Loss and gradient (Newton: and Hessian) of the summed loss, in one pass over X."""
        X = la.from_zarr(self.arrays["X"])
        y = la.from_zarr(self.arrays["y"], check=CHECK_LABELS)
        if y.ndim == 2:
            y = y.sum(axis=1)
        d = X.shape[1]
        w = la.value("w", (d,))
        z = X @ w
        if self.params.fit_intercept:
            z = z + la.value("b", ())
        sign = 2.0 * y - 1.0
        margin = sign * z
        p = la.sigmoid(-margin)
        dz = -sign * p
        out = {"loss": la.sum(la.logaddexp(0.0, -margin)), "grad_w": X.T @ dz}
        if self.params.fit_intercept:
            out["grad_b"] = la.sum(dz)
        if self.params.solver == "newton":
            weight = p * (1.0 - p)
            out["hess_ww"] = la.einsum("ij,i,ik->jk", X, weight, X)
            if self.params.fit_intercept:
                out["hess_wb"] = X.T @ weight
                out["hess_bb"] = la.sum(weight)
        return out

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        n, d = self.arrays["X"].shape
        plan = self.stages(ctx.session.options.cluster.workers)
        program = plan["evaluate"]
        with ctx.metrics.stage("load"):
            ctx.session.load(program)
        with ctx.metrics.stage(plan.stage_of("evaluate")):
            evaluate = _Evaluator(ctx, program, n, d, p)
            theta, iterations = (self._lbfgs if p.solver == "lbfgs" else self._newton)(evaluate, d, ctx)
            objective, grad, _ = evaluate(theta)
        grad_norm = float(np.linalg.norm(grad))
        converged = grad_norm <= p.tol
        attrs = {
            "objective": objective,
            "iterations": iterations,
            "evaluations": evaluate.evaluations,  # passes over X
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
        intercept = theta[d:] if p.fit_intercept else np.zeros(1)
        return JobResult({"coef": theta[:d], "intercept": intercept}, attrs, summary)

    def _initial(self, d: int) -> np.ndarray:
        return np.zeros(d + 1 if self.params.fit_intercept else d)

    def _lbfgs(self, evaluate: _Evaluator, d: int, ctx: JobContext) -> tuple[np.ndarray, int]:
        """L-BFGS (``jobs.lbfgs``), its whole state checkpointed after each iteration when due."""
        p, checkpoints = self.params, ctx.checkpoints

        def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
            loss, grad, _ = evaluate(theta)
            return loss, grad

        saved = checkpoints.restore()
        if saved is not None:
            state = lbfgs.LBFGSState.from_dict(saved.state)
            evaluate.resume(state.x, state.f, state.g, None, int(saved.state["evaluations"]))
        else:
            state = lbfgs.LBFGSState.start(self._initial(d), fun)

        def save(state: lbfgs.LBFGSState) -> None:
            ctx.metrics.iteration(state.iteration, p.max_iter, objective=state.f,
                                  gradient_norm=float(np.linalg.norm(state.g)))
            checkpoints.tick(state.iteration, state.as_dict() | {"evaluations": evaluate.evaluations})

        state = lbfgs.minimize(fun, state, tol=p.tol, max_iter=p.max_iter, on_iteration=save)
        return state.x, state.iteration

    def _newton(self, evaluate: _Evaluator, d: int, ctx: JobContext) -> tuple[np.ndarray, int]:
        """Newton's method with a backtracking (Armijo) line search; one pass per trial point.
        Its state (iterate, f, g, Hessian, counters) is checkpointed after each iteration when due."""
        p, checkpoints = self.params, ctx.checkpoints
        saved = checkpoints.restore()
        if saved is not None:
            st = saved.state
            theta, loss, grad, hess = st["theta"], float(st["loss"]), st["grad"], st["hess"]
            iterations = int(st["iteration"])
            evaluate.resume(theta, loss, grad, hess, int(st["evaluations"]))
        else:
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
            ctx.metrics.iteration(iterations, p.max_iter, objective=loss, gradient_norm=float(np.linalg.norm(grad)))
            checkpoints.tick(iterations, {"theta": theta, "loss": loss, "grad": grad, "hess": hess,
                                          "iteration": iterations, "evaluations": evaluate.evaluations})
        return theta, iterations


class _Evaluator:
    """theta -> (objective, gradient, Hessian or None): one cluster pass, the last one cached."""

    def __init__(self, ctx: JobContext, program: dict[str, la.BlockArray], n: int, d: int,
                 params: LogRegParams) -> None:
        self.ctx, self.program, self.n, self.d, self.params = ctx, program, n, d, params
        self.last: tuple[np.ndarray, float, np.ndarray, np.ndarray | None] | None = None
        self.last_grad_norm = np.inf
        self.evaluations = 0

    def resume(self, theta: np.ndarray, loss: float, grad: np.ndarray, hess: np.ndarray | None,
               evaluations: int) -> None:
        """Be as after ``evaluations`` passes, the last at ``theta`` (a checkpoint's state)."""
        self.last = (np.array(theta), loss, np.array(grad), hess)
        self.last_grad_norm = float(np.linalg.norm(grad))
        self.evaluations = evaluations

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray | None]:
        if self.last is not None and np.array_equal(self.last[0], theta):
            return self.last[1], self.last[2].copy(), self.last[3]
        n, d, p = self.n, self.d, self.params
        self.evaluations += 1
        values = {"w": theta[:d]}
        if p.fit_intercept:
            values["b"] = theta[d]
        r = self.ctx.session.compute(self.program, values)
        w = theta[:d]
        loss = float(r["loss"]) / n + 0.5 * p.l2 * float(w @ w)
        grad = np.concatenate([r["grad_w"], [r["grad_b"]]] if p.fit_intercept else [r["grad_w"]]) / n
        grad[:d] += p.l2 * w
        hess = None
        if p.solver == "newton":
            k = theta.shape[0]
            hess = np.empty((k, k))
            hess[:d, :d] = r["hess_ww"]
            if p.fit_intercept:
                hess[d, :d] = hess[:d, d] = r["hess_wb"]
                hess[d, d] = r["hess_bb"]
            hess /= n
            hess[np.arange(d), np.arange(d)] += p.l2
        self.last = (theta.copy(), loss, grad.copy(), hess)
        self.last_grad_norm = float(np.linalg.norm(grad))
        return loss, grad, hess
