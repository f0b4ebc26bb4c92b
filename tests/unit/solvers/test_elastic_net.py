"""L1 and elastic-net penalties: OWL-QN on the driver, ``linreg`` against scikit-learn's
``ElasticNet``/``Lasso`` and ``logreg`` (binary and multinomial) against ``LogisticRegression``'s
saga, at tight tolerance: objective values, coefficients and their pattern of exact zeros."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import ElasticNet
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

from arrayjob.algorithms.linreg import LinearRegression, LinRegParams
from arrayjob.algorithms.logreg import LogisticRegression, LogRegParams
from arrayjob.solvers import lbfgs, multinomial, owlqn
from tests.harness.helpers import (
    logreg_data,
    multinomial_data,
    sparse_logreg_data,
)
from tests.harness.linear_models import (
    binary_objective,
    fit,
    inputs,
    least_squares_objective,
    softmax_objective,
)

TRUE_W = np.array([1.5, 0.0, 0.0, -2.0, 0.0, 0.3, 0.0, 0.05])


def regression_data(n, seed):
    X, _ = logreg_data(n, 8, seed=seed)
    return X, X @ TRUE_W + 0.5 + 0.3 * np.random.default_rng(seed).standard_normal(n)


def elastic_net(X, y, l1, l2, weights=None):
    """scikit-learn's fit of linreg's objective: ElasticNet(alpha = l1 + l2, l1_ratio = l1/(l1 + l2))."""
    model = ElasticNet(alpha=l1 + l2, l1_ratio=l1 / (l1 + l2), tol=1e-14, max_iter=1_000_000)
    return model.fit(X, y, sample_weight=weights)


def saga(X, y, l1, l2):
    """scikit-learn's fit of logreg's objective: C = 1/(n(l1 + l2)), l1_ratio = l1/(l1 + l2)."""
    model = SkLogisticRegression(C=1 / (X.shape[0] * (l1 + l2)), l1_ratio=l1 / (l1 + l2), solver="saga",
                                 tol=1e-12, max_iter=1_000_000)
    return model.fit(X, y)


def test_owlqn_without_l1_is_lbfgs_and_with_it_matches_elastic_net():
    """On a NumPy objective (no cluster): OWL-QN with c = 0 reaches L-BFGS's minimum; with an
    L1 term, scikit-learn's coordinate descent's, the same coordinates exactly 0."""
    X, y = regression_data(400, 1)
    n, d, l2 = 400, 8, 0.02

    def fun(theta):
        r = X @ theta[:d] + theta[d] - y
        return 0.5 * r @ r / n + 0.5 * l2 * theta[:d] @ theta[:d], np.append(X.T @ r / n + l2 * theta[:d], r.sum() / n)

    plain = lbfgs.minimize(fun, lbfgs.LBFGSState.start(np.zeros(d + 1), fun), tol=1e-11, max_iter=500)
    c = np.zeros(d + 1)
    quasi = owlqn.minimize(fun, owlqn.start(np.zeros(d + 1), fun, c), c, tol=1e-11, max_iter=500)
    # tol = 1e-11 is out of L-BFGS's reach here: it stops where no step lowers f by more than
    # rounding (|∇f| about 1e-8), which leaves θ known to about √(2·ulp(f)/λ_min)
    assert plain.flat and quasi.f == pytest.approx(plain.f, rel=1e-15)
    np.testing.assert_allclose(quasi.x, plain.x, atol=1e-8)
    c[:d] = l1 = 0.05
    sparse = owlqn.minimize(fun, owlqn.start(np.zeros(d + 1), fun, c), c, tol=1e-11, max_iter=500)
    reference = elastic_net(X, y, l1, l2)
    np.testing.assert_allclose(sparse.x[:d], reference.coef_, atol=1e-9)
    np.testing.assert_array_equal(sparse.x[:d] == 0, reference.coef_ == 0)
    assert sparse.f == pytest.approx(least_squares_objective(X, y, reference.coef_, reference.intercept_, l1, l2),
                                     rel=1e-13)


def test_pseudo_gradient_is_the_steepest_one_sided_slope():
    x, g, c = np.array([1.0, -1.0, 0.0, 0.0, 0.0]), np.array([0.3, 0.3, 0.3, -0.7, 0.7]), np.full(5, 0.5)
    # at 0: |g| ≤ c is a minimum along the coordinate (0); else the slope towards decrease
    np.testing.assert_allclose(owlqn.pseudo_gradient(x, g, c), [0.8, -0.2, 0.0, -0.2, 0.2])


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("l1,l2", [(0.05, 0.0), (0.05, 0.02)], ids=["lasso", "elastic-net"])
def test_linreg_with_l1_matches_elastic_net(tmp_path, sparse, l1, l2):
    if sparse:
        X, _ = sparse_logreg_data(2000, 30, seed=2)
        y = X @ (np.random.default_rng(2).standard_normal(30) * (np.arange(30) % 3 == 0)) + 0.5
        y = y + 0.1 * np.random.default_rng(3).standard_normal(2000)
        l1 = l1 / 5  # keep some coefficients
    else:
        X, y = regression_data(2000, 2)
    job = LinearRegression(LinRegParams(l1=l1, l2=l2), inputs(tmp_path, X=X, y=y))
    assert job.method == "owlqn"  # method auto, l1 > 0
    result, _ = fit(job)
    coef, intercept = result.arrays["coef"], result.arrays["intercept"][0]
    reference = elastic_net(X, y, l1, l2)
    np.testing.assert_array_equal(coef == 0, reference.coef_ == 0)
    assert 0 < result.attrs["nonzero"] == np.count_nonzero(reference.coef_) < X.shape[1]
    np.testing.assert_allclose(coef, reference.coef_, atol=1e-7)
    assert intercept == pytest.approx(reference.intercept_, abs=1e-7)
    objective = least_squares_objective(X, y, reference.coef_, reference.intercept_, l1, l2)
    assert result.attrs["objective"] == pytest.approx(objective, rel=1e-12)
    assert result.attrs["converged"] and result.attrs["method"] == "owlqn"


@pytest.mark.parametrize("family", ["binary", "multinomial"])
@pytest.mark.parametrize("l1,l2", [(0.02, 0.0), (0.02, 0.01)], ids=["l1", "elastic-net"])
def test_logreg_with_l1_matches_saga(tmp_path, family, l1, l2):
    if family == "binary":  # three informative features, three of noise
        X, y = logreg_data(800, 3, seed=4)
        X = np.hstack([X, np.random.default_rng(4).standard_normal((800, 3))])
    else:
        X, y = multinomial_data(800, 5, 3, seed=4)
    job = LogisticRegression(LogRegParams(l1=l1, l2=l2, tol=1e-9, max_iter=1000), inputs(tmp_path, X=X, y=y))
    result, _ = fit(job)
    reference = saga(X, y, l1, l2)
    coef, intercept = result.arrays["coef"], result.arrays["intercept"]
    assert result.attrs["solver"] == "owlqn" and result.attrs.get("family", "binary") == family
    if family == "binary":
        ref_coef, ref_intercept = reference.coef_[0], reference.intercept_
        objective = binary_objective(X, y, ref_coef, ref_intercept[0], l1, l2)
    else:
        ref_coef, ref_intercept = reference.coef_, reference.intercept_ - reference.intercept_.mean()
        objective = softmax_objective(X, y, ref_coef, ref_intercept, l1, l2)
    np.testing.assert_array_equal(coef == 0, ref_coef == 0)
    assert 0 < result.attrs["nonzero"] == np.count_nonzero(ref_coef) < coef.size
    np.testing.assert_allclose(coef, ref_coef, atol=1e-6)
    np.testing.assert_allclose(intercept, ref_intercept, atol=1e-6)
    assert result.attrs["objective"] == pytest.approx(objective, rel=1e-10)


def test_least_penalty_shift_is_the_minimum_along_the_softmax_invariance():
    """Per feature, the v minimising l1 Σₖ|Wₖ + v| + (l2/2) Σₖ(Wₖ + v)², against a fine grid (and
    the kinks); no move where none lowers the penalty."""
    rng = np.random.default_rng(7)
    grid = np.linspace(-4.0, 4.0, 40_001)
    for l1, l2 in [(0.1, 0.01), (1.0, 0.0), (0.0, 1.0), (0.1, 1.0)]:
        W = rng.standard_normal((4, 30)) * (rng.random((4, 30)) < 0.7)
        v = multinomial.least_penalty_shift(W, l1, l2)
        for j in range(30):
            def h(t, a=W[:, j], l1=l1, l2=l2):
                return l1 * np.abs(a[:, None] + t).sum(axis=0) + 0.5 * l2 * ((a[:, None] + t) ** 2).sum(axis=0)
            best = min(h(grid).min(), h(-W[:, j]).min())
            assert h(np.array([v[j]]))[0] <= best + 1e-12 and h(np.array([v[j]]))[0] <= h(np.zeros(1))[0]
    assert not np.any(multinomial.least_penalty_shift(W - W.mean(axis=0), 0.0, 1.0))  # centred: stays


def test_multinomial_elastic_net_moves_along_the_softmax_invariance(tmp_path):
    """Four classes, a weak l2: OWL-QN's steps alone creep along the directions that move every
    class's coefficients together (curvature K·l2, L1 kinks); moved to their least penalty after
    each step, the fit converges to saga's solution (here in 85 iterations; without the moves,
    not in 500)."""
    X, y = multinomial_data(2000, 8, 4, seed=8)
    l1 = l2 = 1e-4
    result, _ = fit(LogisticRegression(LogRegParams(l1=l1, l2=l2, tol=1e-8, max_iter=150), inputs(tmp_path, X=X, y=y)))
    assert result.attrs["converged"]
    reference = saga(X, y, l1, l2)
    np.testing.assert_allclose(result.arrays["coef"], reference.coef_, atol=1e-6)
    np.testing.assert_array_equal(result.arrays["coef"] == 0, reference.coef_ == 0)
    assert result.attrs["objective"] == pytest.approx(
        softmax_objective(X, y, reference.coef_, reference.intercept_, l1, l2), rel=1e-10)


def test_sparse_logreg_with_l1_matches_saga(tmp_path):
    X, y = sparse_logreg_data(1000, 30, seed=5)
    l1, l2 = 5e-3, 1e-3
    result, _ = fit(LogisticRegression(LogRegParams(l1=l1, l2=l2, tol=1e-9, max_iter=1000), inputs(tmp_path, X=X, y=y)))
    reference = saga(X, y, l1, l2)
    np.testing.assert_array_equal(result.arrays["coef"] == 0, reference.coef_[0] == 0)
    np.testing.assert_allclose(result.arrays["coef"], reference.coef_[0], atol=1e-6)
    assert result.attrs["objective"] == pytest.approx(
        binary_objective(X, y, reference.coef_[0], reference.intercept_[0], l1, l2), rel=1e-10)


