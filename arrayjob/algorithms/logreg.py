"""Logistic regression, binary or multinomial, with L2, L1 or elastic-net penalties and
sample weights; fitted by L-BFGS, OWL-QN or Newton's method.

Objective (row weights rᵢ, 1 without ``weights`` or ``class_weight``; intercepts unpenalised):

    F = (1/Σrᵢ) Σᵢ rᵢ lossᵢ + l1 ‖w‖₁ + (l2/2) ‖w‖²

binary (labels 0/1, s = 2y − 1): lossᵢ = log(1 + exp(−sᵢ (xᵢ·w + b)));
multinomial (labels 0..K−1): the softmax cross-entropy of xᵢ Wᵀ + b (``solvers.multinomial``).
This is scikit-learn's ``LogisticRegression(C = 1/((l1 + l2)·Σrᵢ), l1_ratio = l1/(l1 + l2))``
(C = 1/(l2·n) without weights or L1; ``solver="saga"`` when l1 > 0), and Spark MLlib's
``LogisticRegression(regParam = l1 + l2, elasticNetParam = l1/(l1 + l2))`` (with
``standardization=false``); weights as ``solvers.sample_weights`` defines them.

``family = "auto"`` is multinomial when y holds more than two classes. K is ``classes`` when
given (2 for the binary family); else the first evaluation finds it, with no pass of its own:
it reads y with the check that every label is an integer ≥ 0 (on the workers, where each block
is read) and returns the largest label besides the loss, and K = largest + 1. On binary data
that pass is the fit's first evaluation; on more classes (or with balanced class weights) it
costs one pass over X, after which the multinomial program reads the same blocks. A resumed
run takes K from its checkpoint. The estimate reads no data: it prices ``classes`` classes,
or 2 when ``classes`` is 0. Balanced class weights take one more pass over y (and the weights),
summing each class's weight, once K is known.

The loss and gradient (Newton: and Hessian) are one lazy program over X; the planner cuts X
into row blocks, fuses the program into one kernel per block, and only the weights go out
and the partial sums come back per block. The solver runs on the driver (``solvers.penalised``:
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

from arrayjob import api as la
from arrayjob.api import (
    Checkpoint,
    Job,
    JobContext,
    JobResult,
    Kernel,
    Pass,
    Runs,
    StagePlan,
    require,
    require_features_and_targets,
    size,
)
from arrayjob.solvers import multinomial, sample_weights
from arrayjob.solvers.penalised import Evaluator, Penalty, Sums, Totals, fit

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
    found_classes: int | None = None  # K, once a run's first evaluation has found it

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
        solver = "owlqn" if self.params.l1 > 0 else self.params.solver
        return f"{self.title} ({family}, {solver}) on X {X.shape[0]:,} × {X.shape[1]:,}"

    def stages(self, workers: int) -> StagePlan:
        """With balanced class weights, a pass over y (and the weights) summing each class's
        weight; then one evaluation at the start and one per iteration: an estimate's count.
        A line search that backtracks evaluates once more per step back (a run's ``evaluations``)."""
        passes = []
        if self.params.class_weight == "balanced":
            totals = multinomial.class_totals(self._labels(), self.classes or 2, sample_weights.sample_weights(self.arrays))
            passes.append(Pass("class_totals", "fit", totals))
        passes.append(Pass("evaluate", "fit", self._evaluation(), Runs(once=1, per_iteration=1)))
        return StagePlan(tuple(passes))

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        d = self.arrays["X"].shape[1]
        if self.multinomial:
            k = self.classes or 2
            return [((k, d), "float64", None), ((k,), "float64", None)]
        return [((d,), "float64", None), ((1,), "float64", None)]

    def _labels(self) -> la.BlockArray:
        """y, checked where each block is read: 0/1 (binary), integers below K (K given), or
        integers ≥ 0 (K to be found: one check, so every program reads the same blocks of y)."""
        if self.given_classes is None:
            check = multinomial.CHECK_INTEGER_LABELS
        else:
            check = multinomial.check_classes(self.given_classes) if self.multinomial else CHECK_LABELS
        y = la.from_input(self.arrays["y"], check=check)
        return y.sum(axis=1) if y.ndim == 2 else y

    def _evaluation(self) -> dict[str, la.BlockArray]:
        """Σ rᵢ lossᵢ and its gradient (Newton: and Hessian) in one pass over X; Σ rᵢ when rows
        are weighted, and the largest label when K is to be found."""
        X, y, p = la.from_input(self.arrays["X"]), self._labels(), self.params
        weights = sample_weights.sample_weights(self.arrays)
        if self.multinomial:
            k = self.classes or 2
            rows = multinomial.row_weights(y, k, weights, p.class_weight == "balanced")
            out = multinomial.softmax_program(X, y, k, p.fit_intercept, rows)
        else:
            out = _binary_program(X, y, p, weights)
        if self.given_classes is None:
            out["largest"] = y.max()
        return out

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        n, d = self.arrays["X"].shape
        workers = ctx.workers
        self.found_classes = None  # each run finds K afresh (or from its checkpoint)
        with ctx.stage("load"):
            ctx.load(self.stages(workers)["evaluate"])
        with ctx.stage("fit"):
            saved = ctx.restore()
            declared = (self.multinomial, self.classes or 2)
            first = None  # the first pass, when it found K: (θ, its totals), or None if it is of no use
            if self.given_classes is None:
                if saved is not None:  # θ's size says: d (+ 1), or K (d + 1)
                    size, per_class = len(saved.state["x"]), d + p.fit_intercept
                    self.found_classes = 2 if size == per_class else size // per_class
                else:
                    first = self._find_classes(ctx, workers)
            k = self.classes
            assert k is not None
            plan = self.stages(workers)
            program = plan["evaluate"]
            if (self.multinomial, k) != declared:  # the same blocks (one check of y), another program
                ctx.load(program)
            class_weight = None
            if p.class_weight == "balanced":
                class_weight = sample_weights.balanced(np.atleast_1d(ctx.compute(plan["class_totals"])["totals"]))
                first = None  # its loss weighed every class alike
            coefs = k * d if self.multinomial else d
            evaluate = Evaluator(self._sums(ctx, program, k, d, class_weight), Penalty(p.l1, p.l2, coefs))
            x0 = np.zeros(coefs + (k if self.multinomial else 1) * p.fit_intercept)
            if first is not None and len(first[0]) == len(x0):
                evaluate.take(x0, first[1])  # the first pass was the first evaluation
            elif first is not None:
                evaluate.evaluations = 1  # a pass over X all the same
            flat = False
            if p.solver == "newton":
                theta, iterations, objective, grad_norm = self._newton(evaluate, x0, saved, ctx)
                solver = "newton"
            else:
                invariance = multinomial.LeastPenalty(k, d, p.l1, p.l2) if self.multinomial else None
                fitted = fit(evaluate, x0, saved=saved, tol=p.tol, max_iter=p.max_iter, ctx=ctx, invariance=invariance)
                theta, iterations, objective, grad_norm = fitted.theta, fitted.iterations, fitted.objective, \
                    fitted.gradient_norm
                solver, flat = fitted.solver, fitted.flat
        converged = bool(grad_norm <= p.tol)
        # passes over X per iteration, the first evaluation (at the start) included
        attrs: dict[str, object] = {
            "objective": objective, "iterations": iterations, "evaluations": evaluate.evaluations,
            "evaluations_per_iteration": round(evaluate.evaluations / max(iterations, 1), 4),
            "converged": converged, "gradient_norm": grad_norm, "solver": solver}
        if flat and not converged:
            attrs["no_further_decrease"] = True  # tol was out of reach: f is at its rounding level
        return self._result(theta, k, class_weight, evaluate, attrs)

    def _find_classes(self, ctx: JobContext, workers: int) -> tuple[np.ndarray, Totals]:
        """K from the first pass (the declared program at θ = 0, which checks every label is an
        integer ≥ 0 and finds the largest): the pass's θ and totals, for the first evaluation."""
        k = 2 if self.multinomial else None  # K as declared before it is found
        program = self.stages(workers)["evaluate"]
        d, fit_intercept = self.arrays["X"].shape[1], self.params.fit_intercept
        theta = np.zeros((k or 1) * d + (k or 1) * fit_intercept)
        ones = None if self.params.class_weight == "none" else np.ones(2)
        results: dict[str, np.ndarray] = {}
        totals = self._sums(ctx, program, k or 2, d, ones, results)(theta)
        self.found_classes = max(2, int(results["largest"]) + 1)
        return theta, totals

    def _result(self, theta: np.ndarray, k: int, class_weight: np.ndarray | None, evaluate: Evaluator,
                attrs: dict[str, object]) -> JobResult:
        p = self.params
        n, d = self.arrays["X"].shape
        coefs = k * d if self.multinomial else d
        coef = theta[:coefs]
        if self.multinomial:
            coef = coef.reshape(k, d)
            # the softmax is unchanged by a shift of every intercept: report the ones that sum to 0
            intercept = theta[coefs:] - theta[coefs:].mean() if p.fit_intercept else np.zeros(k)
            attrs |= {"family": "multinomial", "classes": k}
        else:
            intercept = theta[coefs:] if p.fit_intercept else np.zeros(1)
        attrs |= {"n_samples": n, "n_features": d}
        if p.l1 > 0:
            attrs["nonzero"] = int(np.count_nonzero(coef))
        if "weights" in self.arrays or class_weight is not None:
            attrs["weight_sum"] = evaluate.weight_sum
        if class_weight is not None:
            attrs["class_weight"] = [float(c) for c in class_weight]
        outcome = f"{'converged' if attrs['converged'] else 'did NOT converge'} in {attrs['iterations']} iterations"
        if attrs.get("no_further_decrease"):
            outcome += " (no further decrease possible at machine precision)"
        summary = [
            f"{outcome}: objective {attrs['objective']:.10g}, gradient norm {attrs['gradient_norm']:.2e} "
            f"(tol {p.tol:g}); {attrs['evaluations']} evaluations, {attrs['evaluations_per_iteration']:.2f} an iteration",
        ]
        if p.l1 > 0:
            summary.append(f"{attrs['nonzero']:,} of {coef.size:,} coefficients non-zero")
        return JobResult({"coef": coef, "intercept": intercept}, attrs, summary)

    def _sums(self, ctx: JobContext, program: dict[str, la.BlockArray], k: int, d: int,
              class_weight: np.ndarray | None, results: dict[str, np.ndarray] | None = None) -> Sums:
        """θ -> Σ rᵢ lossᵢ, its gradient and (Newton) Hessian, Σ rᵢ: one pass over X (its raw
        results left in ``results``)."""
        fit_intercept, newton, n = self.params.fit_intercept, self.params.solver == "newton", self.arrays["X"].shape[0]
        multinomial_fit = "grad_W" in program
        bound: dict[str, object] = {}
        if class_weight is not None:
            bound = {"class_weight": class_weight} if multinomial_fit else \
                {"class_weight_0": class_weight[0], "class_weight_1": class_weight[1]}

        def sums(theta: np.ndarray) -> Totals:
            if multinomial_fit:
                r = ctx.compute(program, multinomial.values(theta, k, d, fit_intercept) | bound)
                grad, hess = multinomial.gradient(r, fit_intercept), None
            else:
                r = ctx.compute(program, {"w": theta[:d]} | ({"b": theta[d]} if fit_intercept else {}) | bound)
                grad, hess = np.concatenate([r["grad_w"], [r["grad_b"]]] if fit_intercept else [r["grad_w"]]), None
                if newton:
                    hess = np.empty((len(theta), len(theta)))
                    hess[:d, :d] = r["hess_ww"]
                    if fit_intercept:
                        hess[d, :d] = hess[:d, d] = r["hess_wb"]
                        hess[d, d] = r["hess_bb"]
            if results is not None:
                results.update(r)
            return float(r["loss"]), grad, hess, float(r["weight_sum"]) if "weight_sum" in r else float(n)
        return sums

    def _newton(self, evaluate: Evaluator, x0: np.ndarray, saved: Checkpoint | None,
                ctx: JobContext) -> tuple[np.ndarray, int, float, float]:
        """Newton's method with a backtracking (Armijo) line search; one pass per trial point.
        Its state (iterate, f, g, Hessian, counters) is checkpointed after each iteration when due."""
        p = self.params
        if saved is not None:
            st = saved.state
            theta, loss, grad, hess = st["theta"], float(st["loss"]), st["grad"], st["hess"]
            iterations = int(st["iteration"])
            evaluate.resume(theta, loss, grad, hess, int(st["evaluations"]), float(st.get("weight_sum", np.nan)))
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
            ctx.iteration(iterations, p.max_iter, objective=loss, gradient_norm=float(np.linalg.norm(grad)))
            ctx.checkpoint(iterations, {"theta": theta, "loss": loss, "grad": grad, "hess": hess,
                                        "iteration": iterations, "evaluations": evaluate.evaluations,
                                        "weight_sum": evaluate.weight_sum})
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
    if rows is not None:
        out["weight_sum"] = la.sum(rows)
    if p.solver == "newton":
        weight = prob * (1.0 - prob)
        if rows is not None:
            weight = rows * weight
        out["hess_ww"] = la.einsum("ij,i,ik->jk", X, weight, X)
        if p.fit_intercept:
            out["hess_wb"] = X.T @ weight
            out["hess_bb"] = la.sum(weight)
    return out
