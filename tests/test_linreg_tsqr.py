"""linreg's default method for a dense X: the R factor of [X 1 y], one pass, Q never formed
(``tsqr.r_of_rows``: a sketch-preconditioned Cholesky QR, Householder when its check fails),
against NumPy's lstsq, scikit-learn and Householder QR."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression as SkLinearRegression

from arrayjob.jobs import tsqr
from tests.test_catalog import conditioned, run_job

ROWS, COLS, CHUNK = 24_000, 8, 6_000  # blocks of 6,000 rows: above the size tsqr.r_of_rows sketches


def _householder_tsqr_solution(X, y):
    """w from the R of [X y] by the Householder TSQR linreg used before (``tsqr.qr_block`` of
    each chunk, Q formed, and of the stacked R factors)."""
    A = np.column_stack([X, y])
    r = tsqr.qr_block(np.concatenate([tsqr.qr_block(A[i: i + CHUNK])[1] for i in range(0, len(A), CHUNK)]))[1]
    k = X.shape[1]
    return np.linalg.solve(r[:k, :k], r[:k, k])


def test_default_method_is_tsqr_and_matches_sklearn(put):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((ROWS, COLS)) + 1.5
    y = X @ rng.standard_normal(COLS) + 0.5 + 0.1 * rng.standard_normal(ROWS)
    r = run_job("linreg", {"X": put("X", X, (CHUNK, COLS)), "y": put("y", y, (CHUNK,))})
    assert r.attrs["method"] == "tsqr"
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
