"""Sample weights (the optional input ``weights``) and balanced class weights, as scikit-learn
defines them: ``logreg`` against ``LogisticRegression(sample_weight=..., class_weight=...)``,
``linreg``'s every method against ``Ridge``/``ElasticNet`` with ``sample_weight``; the invariants
(an integer weight repeats a row, a common scale changes nothing); bad weights named."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sklearn.linear_model import ElasticNet, Ridge
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

from arrayjob.algorithms.linreg import LinearRegression, LinRegParams
from arrayjob.algorithms.logreg import LogisticRegression, LogRegParams
from arrayjob.errors import InputError
from tests.harness.helpers import logreg_data, multinomial_data, sparse_logreg_data
from tests.harness.linear_models import (
    balanced,
    binary_objective,
    fit,
    inputs,
    least_squares_objective,
    softmax_objective,
)


def _weights(n, seed=0):
    return np.random.default_rng(seed).uniform(0.0, 3.0, n)


@pytest.mark.parametrize("family", ["binary", "multinomial"])
@pytest.mark.parametrize("weighted,class_weight", [(True, "none"), (False, "balanced"), (True, "balanced")],
                         ids=["weights", "balanced", "weights-balanced"])
def test_logreg_weights_match_sklearn(tmp_path, family, weighted, class_weight):
    if family == "binary":
        X, y = logreg_data(1500, 4, seed=1)
        y[:900] = 0.0  # unbalanced: 4 to 1, or so
    else:
        X, y = multinomial_data(1500, 4, 3, seed=1)
        y[:600] = 2.0
    weights = _weights(1500, 1) if weighted else None
    l2 = 1e-3
    arrays = inputs(tmp_path, X=X, y=y, **({"weights": weights} if weighted else {}))
    result, _ = fit(LogisticRegression(LogRegParams(l2=l2, class_weight=class_weight, tol=1e-8, max_iter=500), arrays))
    rows = balanced(y, weights) if class_weight == "balanced" else weights
    # scikit-learn minimises C·Σ rᵢ lossᵢ + ½‖w‖²: ours, times C·Σrᵢ, at C = 1/(l2·Σrᵢ)
    model = SkLogisticRegression(C=1 / (l2 * rows.sum()), class_weight=None if class_weight == "none" else "balanced",
                                 tol=1e-12, max_iter=10_000).fit(X, y, sample_weight=weights)
    assert result.attrs["weight_sum"] == pytest.approx(rows.sum(), rel=1e-12)
    if family == "binary":
        coef, intercept = model.coef_[0], model.intercept_
        objective = binary_objective(X, y, coef, intercept[0], 0.0, l2, rows)
    else:
        coef, intercept = model.coef_, model.intercept_ - model.intercept_.mean()
        objective = softmax_objective(X, y, coef, intercept, 0.0, l2, rows)
    np.testing.assert_allclose(result.arrays["coef"], coef, atol=1e-5)
    np.testing.assert_allclose(result.arrays["intercept"], intercept, atol=1e-5)
    assert result.attrs["objective"] == pytest.approx(objective, rel=1e-10)
    if class_weight == "balanced":
        totals = np.bincount(y.astype(int), weights=weights)
        np.testing.assert_allclose(result.attrs["class_weight"], totals.sum() / (len(totals) * totals), rtol=1e-12)


def test_newton_with_weights_matches_sklearn(tmp_path):
    X, y = logreg_data(1500, 4, seed=2)
    weights, l2 = _weights(1500, 2), 1e-3
    result, _ = fit(LogisticRegression(LogRegParams(solver="newton", l2=l2, tol=1e-10),
                                       inputs(tmp_path, X=X, y=y, weights=weights)))
    model = SkLogisticRegression(C=1 / (l2 * weights.sum()), tol=1e-12, max_iter=10_000).fit(X, y, sample_weight=weights)
    np.testing.assert_allclose(result.arrays["coef"], model.coef_[0], atol=1e-7)
    assert result.attrs["converged"] and result.attrs["solver"] == "newton"


def test_an_integer_weight_is_a_repeated_row_and_a_common_scale_changes_nothing(tmp_path):
    X, y = sparse_logreg_data(800, 20, seed=3)
    X, y = X.toarray(), y
    counts = np.random.default_rng(3).integers(0, 4, 800).astype(np.float64)  # 0 drops the row
    params = LogRegParams(l1=1e-3, l2=1e-3, tol=1e-10, max_iter=500)
    weighted = fit(LogisticRegression(params, inputs(tmp_path / "w", X=X, y=y, weights=counts)))[0]
    scaled = fit(LogisticRegression(params, inputs(tmp_path / "s", X=X, y=y, weights=7.5 * counts)))[0]
    repeated = np.repeat(np.arange(800), counts.astype(int))
    copies = fit(LogisticRegression(params, inputs(tmp_path / "r", X=X[repeated], y=y[repeated])))[0]
    for other in (scaled, copies):
        np.testing.assert_allclose(weighted.arrays["coef"], other.arrays["coef"], atol=1e-7)
        np.testing.assert_array_equal(weighted.arrays["coef"] == 0, other.arrays["coef"] == 0)
        assert weighted.attrs["objective"] == pytest.approx(other.attrs["objective"], rel=1e-10)


@pytest.mark.parametrize("method", ["tsqr", "normal", "cg", "owlqn"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_linreg_weights_match_sklearn(tmp_path, method, fit_intercept):
    X, _ = logreg_data(1200, 5, seed=4)
    y = X @ np.array([1.0, 0.0, -2.0, 0.5, 0.0]) + 0.5 + 0.3 * np.random.default_rng(4).standard_normal(1200)
    weights = _weights(1200, 4)
    l1, l2 = (0.02, 0.01) if method == "owlqn" else (0.0, 0.01)
    job = LinearRegression(LinRegParams(method=method, l1=l1, l2=l2, fit_intercept=fit_intercept, tol=1e-12),
                           inputs(tmp_path, X=X, y=y, weights=weights))
    result, _ = fit(job)
    if method == "owlqn":  # ElasticNet rescales its weights to sum to n: its objective is ours
        model = ElasticNet(alpha=l1 + l2, l1_ratio=l1 / (l1 + l2), fit_intercept=fit_intercept, tol=1e-14,
                           max_iter=1_000_000).fit(X, y, sample_weight=weights)
    else:  # Ridge minimises Σ wᵢ rᵢ² + α‖w‖²: ours times 2Σw at α = l2·Σw
        model = Ridge(alpha=l2 * weights.sum(), fit_intercept=fit_intercept, tol=1e-14).fit(X, y, sample_weight=weights)
    np.testing.assert_allclose(result.arrays["coef"], model.coef_, atol=1e-8)
    assert result.arrays["intercept"][0] == pytest.approx(model.intercept_, abs=1e-8)
    assert result.attrs["weight_sum"] == pytest.approx(weights.sum(), rel=1e-12)
    assert result.attrs["objective"] == pytest.approx(
        least_squares_objective(X, y, model.coef_, model.intercept_, l1, l2, weights), rel=1e-10)


def test_sparse_linreg_weights_match_ridge(tmp_path):
    X, _ = sparse_logreg_data(1500, 40, seed=5)
    y = X @ np.random.default_rng(5).standard_normal(40) + 0.5
    weights, l2 = _weights(1500, 5), 1e-3
    for method in ("normal", "cg"):
        job = LinearRegression(LinRegParams(method=method, l2=l2, tol=1e-12), inputs(tmp_path / method, X=X, y=y,
                                                                                 weights=weights))
        result, _ = fit(job)
        model = Ridge(alpha=l2 * weights.sum(), tol=1e-14).fit(X, y, sample_weight=weights)
        np.testing.assert_allclose(result.arrays["coef"], model.coef_, atol=1e-8)


@pytest.mark.parametrize("algorithm,weights,message", [
    ("logreg", -1.0, "inputs.weights: weights must be >= 0, found -1.0 in \\[\\d+:\\d+\\] of .*/weights"),
    ("linreg", -0.5, "inputs.weights: weights must be >= 0, found -0.5 in \\[\\d+:\\d+\\] of .*/weights"),
    ("logreg", 0.0, "inputs.weights: the weights sum to 0 \\(every row would be ignored\\)"),
    ("linreg", 0.0, "inputs.weights: the weights sum to 0 \\(every row would be ignored\\)"),
])
def test_bad_weights_are_one_line(tmp_path, algorithm, weights, message):
    X, y = logreg_data(500, 3, seed=6)
    w = np.zeros(500)
    w[321] = weights
    job = (LogisticRegression(LogRegParams(), inputs(tmp_path, X=X, y=y, weights=w)) if algorithm == "logreg"
           else LinearRegression(LinRegParams(), inputs(tmp_path, X=X, y=y, weights=w)))
    with pytest.raises(InputError) as raised:
        fit(job)
    assert re.fullmatch(message, str(raised.value))
