"""Least squares with an L1 (lasso) or elastic-net penalty, by OWL-QN: ``linreg``'s ``owlqn`` method.

Objective (row weights wᵢ, 1 without ``weights``; intercept unpenalised):

    F(w, b) = (1/(2Σwᵢ)) Σᵢ wᵢ (xᵢ·w + b − yᵢ)² + l1 ‖w‖₁ + (l2/2) ‖w‖²

This is scikit-learn's ``ElasticNet(alpha = l1 + l2, l1_ratio = l1/(l1 + l2))`` (``Lasso(alpha =
l1)`` when l2 = 0; with ``sample_weight``, which ElasticNet rescales to sum to n) and Spark
MLlib's ``LinearRegression(regParam = l1 + l2, elasticNetParam = l1/(l1 + l2),
standardization=false)``, which Spark also solves by OWL-QN.

Each evaluation is one pass over X: the residual z = Xw + b − y, ½Σwᵢzᵢ², Xᵀ(w∘z) and Σwᵢzᵢ
in one kernel per row block (a sparse X's non-zeros visited once); OWL-QN (Andrew & Gao 2007,
``solvers.owlqn`` through ``solvers.penalised``) runs on the driver from w = 0, b = 0 and is
checkpointed after each iteration. It stops when the pseudo-gradient's norm is at most
``tol`` times its norm at the start, after ``max_iter`` iterations, or when no step lowers F
at machine precision. Coefficients the L1 term holds at zero are exactly 0. Cost per
evaluation: 4nd flops (sparse: 4·nnz), d + 2 floats back per block; about one evaluation per
iteration once the step length settles.
"""

from __future__ import annotations

import numpy as np

from arrayjob import api as la
from arrayjob.api import JobContext, JobResult
from arrayjob.solvers.penalised import Evaluator, Penalty, Totals, fit


def program(X: la.BlockArray, y: la.BlockArray, weights: la.BlockArray | None,
            fit_intercept: bool) -> dict[str, la.BlockArray]:
    """½ Σ wᵢ zᵢ² and its gradient at the values ``w`` (and ``b``); Σ wᵢ when weighted."""
    z = X @ la.value("w", (X.shape[1],))
    if fit_intercept:
        z = z + la.value("b", ())
    z = z - y
    wz = z if weights is None else weights * z
    out = {"loss": 0.5 * (wz * z).sum(), "grad_w": X.T @ wz}
    if fit_intercept:
        out["grad_b"] = wz.sum()
    if weights is not None:
        out["weight_sum"] = weights.sum()
    return out


def solve(ctx: JobContext, evaluation: dict[str, la.BlockArray], n: int, d: int, *,
          l1: float, l2: float, fit_intercept: bool, tol: float, max_iter: int) -> JobResult:
    """Fit by OWL-QN, one pass of ``evaluation`` per trial point."""

    def sums(theta: np.ndarray) -> Totals:
        values = {"w": theta[:d]} | ({"b": theta[d]} if fit_intercept else {})
        r = ctx.compute(evaluation, values)
        grad = np.concatenate([r["grad_w"], [r["grad_b"]]] if fit_intercept else [r["grad_w"]])
        return float(r["loss"]), grad, None, float(r["weight_sum"]) if "weight_sum" in r else float(n)

    evaluate = Evaluator(sums, Penalty(l1, l2, d))
    fitted = fit(evaluate, np.zeros(d + fit_intercept), saved=ctx.restore(), tol=tol, max_iter=max_iter,
                 ctx=ctx, relative=True)
    coef = fitted.theta[:d]
    intercept = float(fitted.theta[d]) if fit_intercept else 0.0
    nonzero = int(np.count_nonzero(coef))
    attrs = {"objective": fitted.objective, "method": "owlqn", "iterations": fitted.iterations,
             "evaluations": evaluate.evaluations, "converged": fitted.converged,
             "gradient_norm": fitted.gradient_norm, "nonzero": nonzero, "n_samples": n, "n_features": d}
    if "weight_sum" in evaluation:
        attrs["weight_sum"] = evaluate.weight_sum
    summary = [f"OWL-QN {'converged' if fitted.converged else 'did NOT converge'} in {fitted.iterations} "
               f"iterations: objective {fitted.objective:.10g}, pseudo-gradient {fitted.gradient_norm:.2e} "
               f"(target {fitted.target:.2e}); {nonzero:,} of {d:,} coefficients non-zero"]
    return JobResult({"coef": coef, "intercept": np.array([intercept])}, attrs, summary)
