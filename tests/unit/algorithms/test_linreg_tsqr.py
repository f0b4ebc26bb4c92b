"""linreg on a dense X by TSQR (the R factor of [X 1 y], one pass, Q never formed:
``tsqr.r_of_rows``, a sketch-preconditioned Cholesky QR, Householder when its check fails) and
by the default, the normal equations refined against X (TSQR where X is too ill-conditioned
for them), against NumPy's lstsq, scikit-learn and Householder QR."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg
from sklearn.linear_model import LinearRegression as SkLinearRegression

from arrayjob.algorithms import tsqr
from tests.unit.api.test_catalog import conditioned, run_job

ROWS, COLS, CHUNK = 24_000, 8, 6_000  # blocks of 6,000 rows: above the size tsqr.r_of_rows sketches


def _householder_tsqr_solution(X, y):
    """w from the R of [X y] by the Householder TSQR linreg used before (``tsqr.qr_block`` of
    each chunk, Q formed, and of the stacked R factors)."""
    A = np.column_stack([X, y])
    r = tsqr.qr_block(np.concatenate([tsqr.qr_block(A[i: i + CHUNK])[1] for i in range(0, len(A), CHUNK)]))[1]
    k = X.shape[1]
    return np.linalg.solve(r[:k, :k], r[:k, k])


@pytest.mark.parametrize("method", ["auto", "tsqr"])
def test_both_methods_match_sklearn(put, method):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((ROWS, COLS)) + 1.5
    y = X @ rng.standard_normal(COLS) + 0.5 + 0.1 * rng.standard_normal(ROWS)
    r = run_job("linreg", {"X": put("X", X, (CHUNK, COLS)), "y": put("y", y, (CHUNK,))}, method=method)
    assert r.attrs["method"] == ("refined" if method == "auto" else "tsqr")
    if method == "auto":  # well conditioned: one refinement pass, then done
        assert r.attrs["refinement"]["steps"] == 1 and r.attrs["refinement"]["condition_estimate"] < 100
    ref = SkLinearRegression().fit(X, y)
    np.testing.assert_allclose(r.arrays["coef"], ref.coef_, rtol=1e-10)
    assert r.arrays["intercept"][0] == pytest.approx(ref.intercept_, rel=1e-10)
    rss = np.sum((X @ ref.coef_ + ref.intercept_ - y) ** 2)
    assert r.attrs["objective"] == pytest.approx(rss / (2 * ROWS), rel=1e-10)


def test_ill_conditioned_x_is_solved_as_accurately_as_householder_qr(put):
    """cond(X) = 10¹⁰ and y in its range: the normal equations lose everything (u·cond² ≫ 1);
    the R-only TSQR keeps lstsq's accuracy (about u·cond), within a factor of 10 of the
    Householder TSQR's error."""
    X = conditioned((ROWS, COLS), 1e10, seed=4)
    w = np.random.default_rng(5).standard_normal(COLS)
    y = X @ w
    arrays = {"X": put("X", X, (CHUNK, COLS)), "y": put("y", y, (CHUNK,))}
    r = run_job("linreg", arrays, method="tsqr", fit_intercept=False)
    ref = np.linalg.lstsq(X, y, rcond=None)[0]
    error, floor = np.linalg.norm(r.arrays["coef"] - ref), np.linalg.norm(_householder_tsqr_solution(X, y) - ref)
    assert error <= max(10 * floor, 1e-12 * np.linalg.norm(ref)), (error, floor)
    assert error <= 1e-4 * np.linalg.norm(ref)  # u·cond ≈ 2·10⁻⁶: what a backward-stable solver reaches
    assert r.attrs["objective"] <= 1e-20 * np.mean(y**2)  # the residual is rounding
    normal = run_job("linreg", arrays, method="normal", fit_intercept=False)
    assert np.linalg.norm(normal.arrays["coef"] - ref) > 1e3 * error  # what TSQR is for


@pytest.mark.parametrize("cond,offset,l2,weighted", [(1e5, 0.0, 0.0, False), (1e5, 0.0, 0.0, True),
                                                      (1e2, 1.0, 0.0, False), (1e2, 1.0, 1e-6, True)])
def test_the_default_refines_the_normal_equations_to_a_backward_stable_solvers_accuracy(put, cond, offset, l2,
                                                                                       weighted):
    """Where u·κ² is far from 1 but not from u·κ, the plain normal equations lose digits that
    refinement against X gets back: within a small factor of Householder QR's error (of
    lstsq's solution), with an intercept, column scales of 10⁻³ to 10³, a mean 150 times the
    spread (centring from sums loses 4 to 6 digits, which refinement recovers), a ridge term,
    weighted or not."""
    rng = np.random.default_rng(7)
    scales = np.logspace(-3, 3, COLS)
    X = conditioned((ROWS, COLS), cond, seed=8) * scales + offset * scales
    y = X @ rng.standard_normal(COLS) + 2.0 + 1e-3 * rng.standard_normal(ROWS)
    weights = rng.uniform(0.5, 2.0, ROWS) if weighted else np.ones(ROWS)
    arrays = {"X": put("X", X, (CHUNK, COLS)), "y": put("y", y, (CHUNK,))}
    if weighted:
        arrays["weights"] = put("weights", weights, (CHUNK,))
    r = run_job("linreg", arrays, l2=l2)
    assert r.attrs["method"] == "refined", r.attrs["refinement"]
    # the same problem as one least-squares system: [√w X, √w; √(Σw·l2) I, 0] θ = [√w y; 0]
    root = np.sqrt(weights)
    A = np.vstack([np.column_stack([X, np.ones(ROWS)]) * root[:, None],
                   np.column_stack([np.sqrt(weights.sum() * l2) * np.eye(COLS), np.zeros(COLS)])])
    b = np.concatenate([y * root, np.zeros(COLS)])
    ref = np.linalg.lstsq(A, b, rcond=None)[0]
    theta = np.append(r.arrays["coef"], r.arrays["intercept"])
    q, rr = np.linalg.qr(A)
    householder = scipy.linalg.solve_triangular(rr, q.T @ b)
    floor = np.linalg.norm(householder - ref)
    error = np.linalg.norm(theta - ref)
    assert error <= max(10 * floor, 1e-13 * np.linalg.norm(ref)), (error, floor, r.attrs)
    with warnings.catch_warnings():  # SciPy says the plain normal equations are ill-conditioned: they are
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        normal = run_job("linreg", arrays, l2=l2, method="normal")
    plain = np.linalg.norm(np.append(normal.arrays["coef"], normal.arrays["intercept"]) - ref)
    if cond >= 1e5:
        assert plain > 100 * error, (plain, error)  # what the refinement is for
    rss = np.sum(weights * (X @ r.arrays["coef"] + r.arrays["intercept"] - y) ** 2)
    objective = rss / (2 * weights.sum()) + 0.5 * l2 * r.arrays["coef"] @ r.arrays["coef"]
    assert r.attrs["objective"] == pytest.approx(objective, rel=1e-8)


def test_the_default_runs_tsqr_where_x_is_too_ill_conditioned_to_refine(put):
    """cond(X) = 10¹⁰: the normal equations' Cholesky fails or its condition estimate refuses
    it, and the default gives TSQR's solution, bit for bit, and says why."""
    X = conditioned((ROWS, COLS), 1e10, seed=4)
    y = X @ np.random.default_rng(5).standard_normal(COLS)
    arrays = {"X": put("X", X, (CHUNK, COLS)), "y": put("y", y, (CHUNK,))}
    r = run_job("linreg", arrays, fit_intercept=False)
    assert r.attrs["method"] == "tsqr" and r.attrs["refinement"]["steps"] == 0, r.attrs
    assert r.summary[0].startswith("least squares by TSQR (") and r.attrs["refinement"]["instead"] in r.summary[0]
    tsqr_run = run_job("linreg", arrays, method="tsqr", fit_intercept=False)
    np.testing.assert_array_equal(r.arrays["coef"], tsqr_run.arrays["coef"])


def test_a_mean_too_far_from_the_spread_goes_to_tsqr_before_refining(put):
    """Columns whose mean is 10⁷ times their spread: centring the sums loses 14 digits, too
    many for refinement to win back quickly, so the default runs TSQR without trying."""
    rng = np.random.default_rng(10)
    X = rng.standard_normal((ROWS, COLS)) + 1e7
    y = X @ rng.standard_normal(COLS) + 0.01 * rng.standard_normal(ROWS)
    arrays = {"X": put("X", X, (CHUNK, COLS)), "y": put("y", y, (CHUNK,))}
    r = run_job("linreg", arrays)
    assert r.attrs["method"] == "tsqr" and r.attrs["refinement"]["steps"] == 0, r.attrs
    assert "centring lost 14 digits" in r.attrs["refinement"]["instead"], r.attrs["refinement"]
    ref = SkLinearRegression().fit(X, y)
    np.testing.assert_allclose(r.arrays["coef"], ref.coef_, rtol=1e-6)


def test_a_singular_system_falls_back_to_tsqr(put):
    """A constant column beside the intercept: the centred normal equations are singular; TSQR
    fits as well as lstsq does."""
    rng = np.random.default_rng(9)
    X = rng.standard_normal((ROWS, COLS))
    X[:, 3] = 2.0
    y = X @ rng.standard_normal(COLS) + 0.01 * rng.standard_normal(ROWS)
    arrays = {"X": put("X", X, (CHUNK, COLS)), "y": put("y", y, (CHUNK,))}
    r = run_job("linreg", arrays)
    assert r.attrs["method"] == "tsqr" and r.attrs["refinement"]["instead"] == "the normal equations are singular"
    A = np.column_stack([X, np.ones(ROWS)])
    rss = np.sum((A @ np.linalg.lstsq(A, y, rcond=None)[0] - y) ** 2)
    # TSQR's residual of an exactly rank-deficient X is good to about 1e-5 (method = "tsqr" alike)
    assert r.attrs["objective"] == pytest.approx(rss / (2 * ROWS), rel=1e-4)


def _orthogonality(A, R):
    """‖QᵀQ − I‖ for Q = A R⁻¹: how far R is from the R of a QR of A (u·cond(A) for Householder's)."""
    import scipy.linalg

    Q = scipy.linalg.solve_triangular(R, A.T, trans="T").T
    return np.linalg.norm(Q.T @ Q - np.eye(A.shape[1]))


@pytest.mark.parametrize("cond", [1.0, 1e5, 1e10])
def test_r_of_block_is_as_good_an_r_as_householder(cond):
    A = conditioned((20_000, 12), cond, seed=7)
    R, H = tsqr.r_of_block(A), np.linalg.qr(A, mode="r")
    np.testing.assert_array_equal(R, np.triu(R))
    assert np.linalg.norm(R.T @ R - A.T @ A) <= 1e-14 * np.linalg.norm(A) ** 2
    assert _orthogonality(A, R) <= max(10 * _orthogonality(A, H), 1e-13)
    np.testing.assert_array_equal(R, tsqr.r_of_block(A))  # deterministic, bit for bit (the sketch's seed)


def test_r_of_block_falls_back_to_householder_for_a_rank_deficient_block():
    A = conditioned((20_000, 12), 1.0, seed=8)
    A[:, 3] = A[:, 5]
    R = tsqr.r_of_block(A)
    assert np.all(np.isfinite(R)) and abs(R[5, 5]) <= 1e-12 * np.abs(R).max()
    np.testing.assert_allclose(R.T @ R, A.T @ A, rtol=0, atol=1e-11 * np.abs(A.T @ A).max())
