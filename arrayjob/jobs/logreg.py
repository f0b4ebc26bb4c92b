"""Logistic regression, binary or multinomial, with L2, L1 or elastic-net penalties and
sample weights; fitted by L-BFGS, OWL-QN or Newton's method.

Objective (row weights rᵢ, 1 without ``weights`` or ``class_weight``; intercepts unpenalised):

    F = (1/Σrᵢ) Σᵢ rᵢ lossᵢ + l1 ‖w‖₁ + (l2/2) ‖w‖²

binary (labels 0/1, s = 2y − 1): lossᵢ = log(1 + exp(−sᵢ (xᵢ·w + b)));
multinomial (labels 0..K−1): the softmax cross-entropy of xᵢ Wᵀ + b (``jobs.multinomial``).
This is scikit-learn's ``LogisticRegression(C = 1/((l1 + l2)·Σrᵢ), l1_ratio = l1/(l1 + l2))``
(C = 1/(l2·n) without weights or L1; ``solver="saga"`` when l1 > 0), and Spark MLlib's
``LogisticRegression(regParam = l1 + l2, elasticNetParam = l1/(l1 + l2))`` (with
``standardization=false``); weights as ``jobs.sample_weights`` defines them.

``family = "auto"`` is multinomial when y holds more than two classes. K is ``classes`` when
given; else a first pass over y alone (on the workers, in the load stage: 8n bytes, no X)
finds the largest label, each label checked to be an integer ≥ 0 where its block is read, and
K = largest + 1. With weights or balanced class weights, one more pass over y (and the
weights) sums each class's weight. The estimate reads no data: it prices ``classes`` classes,
or 2 when ``classes`` is 0.

The loss and gradient (Newton: and Hessian) are one lazy program over X; the planner cuts X
into row blocks, fuses the program into one kernel per block, and only the weights go out
and the partial sums come back per block. The solver runs on the driver (``jobs.penalised``:
L-BFGS, or OWL-QN when l1 > 0; or Newton steps with a backtracking line search, binary and
L2 only), and its whole state is checkpointed (``io.checkpoint``) so that a run resumed
after a kill ends exactly where an undisturbed run would.

Cost per evaluation, for X of n x d and K classes: one pass over X in memory (8nd bytes;
storage is read once per job), about 4nd flops (binary), 4ndK (multinomial), or 2nd² more
(Newton).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import scipy.linalg

from arrayjob import lazy as la
from arrayjob.jobs import multinomial, sample_weights
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
from arrayjob.jobs.penalised import Evaluator, Penalty, Sums, fit
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
    solver: Literal["lbfgs", "newton"] = "lbfgs"  # lbfgs: OWL-QN when l1 > 0
    family: Literal["auto", "binary", "multinomial"] = "auto"
    classes: int = field(default=0, metadata={"check": lambda v: v == 0 or v >= 2,
                                              "expect": "0 (found from y) or an integer >= 2"})
    l2: float = field(default=1e-4, metadata={"check": lambda v: v >= 0 and np.isfinite(v), "expect": "a number >= 0"})
    l1: float = field(default=0.0, metadata={"check": lambda v: v >= 0 and np.isfinite(v), "expect": "a number >= 0"})
    class_weight: Literal["none", "balanced"] = "none"
    fit_intercept: bool = True
    max_iter: int = field(default=100, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    tol: float = field(default=1e-6, metadata={"check": lambda v: v > 0 and np.isfinite(v), "expect": "a number > 0"})


class LogisticRegression(Job):
    name = "logreg"
    title = "logistic regression"
    inputs = ("X", "y", "weights")
    optional_inputs = ("weights",)
    sparse_inputs = ("X",)
    Params = LogRegParams
    params: LogRegParams
    found_classes: int | None = None  # K, once a run's first pass over y has found it

    def check_inputs(self) -> None:
        p = self.params
        require_features_and_targets(self.arrays)
        sample_weights.require_weights(self.arrays)
        d = self.arrays["X"].shape[1]
        require(p.family != "binary" or p.classes in (0, 2),
                f"params.classes: the binary family has 2 classes, got {p.classes}")
        if p.solver == "newton":
            require(p.family != "multinomial" and p.classes in (0, 2),
                    "params.solver: newton fits the binary family only (use lbfgs for more than two classes)")
            require(p.l1 == 0, "params.solver: newton takes no l1 penalty (use lbfgs: OWL-QN)")
            require(d <= NEWTON_MAX_FEATURES,
                    f"params.solver: newton forms a d × d Hessian on every pass (d = {d:,}: "
                    f"{size(8.0 * (d + 1) ** 2)} per block); use lbfgs above {NEWTON_MAX_FEATURES:,} features")

    @property
    def given_classes(self) -> int | None:
        """K, when the params fix it: 2 for the binary family (and Newton), or ``params.classes``."""
        p = self.params
        if p.family == "binary" or p.solver == "newton":
            return 2
        return p.classes or None

    @property
    def classes(self) -> int | None:
        """K, when known: given, or found by the run's first pass over y (None before it)."""
        return self.given_classes or self.found_classes

    @property
    def multinomial(self) -> bool:
        """Whether the fit is multinomial (with K assumed 2 while unknown, as the estimate does)."""
        return self.params.family == "multinomial" or (self.classes or 2) > 2

    @property
    def weighted(self) -> bool:
        return "weights" in self.arrays or self.params.class_weight == "balanced"

    def describe(self) -> str:
        X = self.arrays["X"]
        family = f"multinomial, {self.classes or 'K'} classes" if self.multinomial else "binary"
        return f"{self.title} ({family}, {self.params.solver}) on X {X.shape[0]:,} × {X.shape[1]:,}"

    def stages(self, workers: int) -> StagePlan:
        """The passes over y that find K and the class weights (load), then one evaluation at
        the start and one per iteration: an estimate's count. A line search that backtracks
        evaluates once more per step back (a run's ``evaluations``)."""
        y = la.from_zarr(self.arrays["y"], check=multinomial.CHECK_INTEGER_LABELS)
        passes = []
        if self.given_classes is None:
            passes.append(Pass("classes", "load", multinomial.labels_program(y)))
        if self.weighted:
            y = self._labels()
            passes.append(Pass("class_totals", "load",
                               multinomial.class_totals(y, self.classes or 2, sample_weights.sample_weights(self.arrays))))
        passes.append(Pass("evaluate", "fit", self._evaluation(), Runs(once=1, per_iteration=1)))
        return StagePlan(tuple(passes))

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        d = self.arrays["X"].shape[1]
        if self.multinomial:
            k = self.classes or 2
            return [((k, d), "float64", None), ((k,), "float64", None)]
        return [((d,), "float64", None), ((1,), "float64", None)]

    def _labels(self) -> la.BlockArray:
        """y, checked where each block is read: 0/1, or integers below K."""
        check = multinomial.check_classes(self.classes or 2) if self.multinomial else CHECK_LABELS
        y = la.from_zarr(self.arrays["y"], check=check)
        return y.sum(axis=1) if y.ndim == 2 else y

    def _evaluation(self) -> dict[str, la.BlockArray]:
        """Σ rᵢ lossᵢ and its gradient (Newton: and Hessian), in one pass over X."""
        X, y, p = la.from_zarr(self.arrays["X"]), self._labels(), self.params
        weights = sample_weights.sample_weights(self.arrays)
        if self.multinomial:
            k = self.classes or 2
            rows = multinomial.row_weights(y, k, weights, p.class_weight == "balanced")
            return multinomial.softmax_program(X, y, k, p.fit_intercept, rows)
        return _binary_program(X, y, p, weights)

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        n, d = self.arrays["X"].shape
        with ctx.metrics.stage("load"):
            if self.given_classes is None:
                largest = ctx.session.compute(self.stages(ctx.session.options.cluster.workers)["classes"])["largest"]
                self.found_classes = max(2, int(largest) + 1)
            plan = self.stages(ctx.session.options.cluster.workers)
            k = self.classes
            assert k is not None
            weight_sum, class_weight = float(n), None
            if self.weighted:
                totals = np.atleast_1d(ctx.session.compute(plan["class_totals"])["totals"])
                if p.class_weight == "balanced":
                    class_weight = sample_weights.balanced(totals)
                weight_sum = sample_weights.total(float(totals @ class_weight) if class_weight is not None
                                                  else float(totals.sum()))
            program = plan["evaluate"]
            ctx.session.load(program)
        coefs = k * d if self.multinomial else d
        penalty = Penalty(p.l1, p.l2, coefs)
        bound: dict[str, object] = {} if class_weight is None else (
            {"class_weight": class_weight} if self.multinomial else {"class_weight_0": class_weight[0],
                                                                      "class_weight_1": class_weight[1]})
        with ctx.metrics.stage(plan.stage_of("evaluate")):
            evaluate = Evaluator(self._sums(ctx, program, k, d, bound), weight_sum, penalty)
            x0 = np.zeros(coefs + (k if self.multinomial else 1) * p.fit_intercept)
            if p.solver == "newton":
                theta, iterations, objective, grad_norm = self._newton(evaluate, x0, ctx)
                solver = "newton"
            else:
                fitted = fit(evaluate, x0, tol=p.tol, max_iter=p.max_iter, ctx=ctx)
                theta, iterations, objective, grad_norm = fitted.theta, fitted.iterations, fitted.objective, \
                    fitted.gradient_norm
                solver = fitted.solver
        converged = grad_norm <= p.tol
        coef = theta[:coefs]
        if self.multinomial:
            coef = coef.reshape(k, d)
            # the softmax is unchanged by a shift of every intercept: report the ones that sum to 0
            intercept = theta[coefs:] - theta[coefs:].mean() if p.fit_intercept else np.zeros(k)
        else:
            intercept = theta[coefs:] if p.fit_intercept else np.zeros(1)
        attrs = {
            "objective": objective,
            "iterations": iterations,
            "evaluations": evaluate.evaluations,  # passes over X
            "converged": bool(converged),
            "gradient_norm": grad_norm,
            "solver": solver,
            "family": "multinomial" if self.multinomial else "binary",
            "classes": k,
            "nonzero": int(np.count_nonzero(coef)),
            "n_samples": n,
            "n_features": d,
        }
        if self.weighted:
            attrs["weight_sum"] = weight_sum
        if class_weight is not None:
            attrs["class_weight"] = [float(c) for c in class_weight]
        summary = [
            f"{'converged' if converged else 'did NOT converge'} in {iterations} iterations: "
            f"objective {objective:.10g}, gradient norm {grad_norm:.2e} (tol {p.tol:g})",
        ]
        if p.l1 > 0:
            summary.append(f"{attrs['nonzero']:,} of {coef.size:,} coefficients non-zero")
        return JobResult({"coef": coef, "intercept": intercept}, attrs, summary)

    def _sums(self, ctx: JobContext, program: dict[str, la.BlockArray], k: int, d: int,
              bound: dict[str, object]) -> Sums:
        """θ -> Σ rᵢ lossᵢ, its gradient and (Newton) Hessian: one pass over X."""
        fit_intercept, newton = self.params.fit_intercept, self.params.solver == "newton"

        if self.multinomial:
            def softmax_sums(theta: np.ndarray) -> tuple[float, np.ndarray, None]:
                r = ctx.session.compute(program, multinomial.values(theta, k, d, fit_intercept) | bound)
                return float(r["loss"]), multinomial.gradient(r, fit_intercept), None
            return softmax_sums

        def binary_sums(theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray | None]:
            values = {"w": theta[:d]} | ({"b": theta[d]} if fit_intercept else {}) | bound
            r = ctx.session.compute(program, values)
            grad = np.concatenate([r["grad_w"], [r["grad_b"]]] if fit_intercept else [r["grad_w"]])
            hess = None
            if newton:
                hess = np.empty((len(theta), len(theta)))
                hess[:d, :d] = r["hess_ww"]
                if fit_intercept:
                    hess[d, :d] = hess[:d, d] = r["hess_wb"]
                    hess[d, d] = r["hess_bb"]
            return float(r["loss"]), grad, hess
        return binary_sums

    def _newton(self, evaluate: Evaluator, x0: np.ndarray, ctx: JobContext) -> tuple[np.ndarray, int, float, float]:
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
            theta = x0
            loss, grad, hess = evaluate(theta)
            iterations = 0
        while iterations < p.max_iter and np.linalg.norm(grad) > p.tol:
            assert hess is not None
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
        return theta, iterations, loss, float(np.linalg.norm(grad))


def _binary_program(X: la.BlockArray, y: la.BlockArray, p: LogRegParams,
                    weights: la.BlockArray | None) -> dict[str, la.BlockArray]:
    """Σ rᵢ log(1 + exp(−sᵢ zᵢ)) and its gradient (Newton: Hessian) at the values ``w``, ``b``;
    rᵢ the sample weight times, when balanced, ``class_weight_0`` or ``class_weight_1``."""
    rows = weights
    if p.class_weight == "balanced":
        cw0 = la.value("class_weight_0", ())
        by_class = cw0 + (la.value("class_weight_1", ()) - cw0) * y
        rows = by_class if rows is None else rows * by_class
    w = la.value("w", (X.shape[1],))
    z = X @ w
    if p.fit_intercept:
        z = z + la.value("b", ())
    sign = 2.0 * y - 1.0
    margin = sign * z
    prob = la.sigmoid(-margin)
    dz = -sign * prob
    loss = la.logaddexp(0.0, -margin)
    if rows is not None:
        loss, dz = rows * loss, rows * dz
    out = {"loss": la.sum(loss), "grad_w": X.T @ dz}
    if p.fit_intercept:
        out["grad_b"] = la.sum(dz)
    if p.solver == "newton":
        weight = prob * (1.0 - prob)
        if rows is not None:
            weight = rows * weight
        out["hess_ww"] = la.einsum("ij,i,ik->jk", X, weight, X)
        if p.fit_intercept:
            out["hess_wb"] = X.T @ weight
            out["hess_bb"] = la.sum(weight)
    return out
