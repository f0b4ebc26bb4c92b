"""The Gaussian mixture (``gmm``) against scikit-learn's ``GaussianMixture`` run from the same
initial parameters (means, weights 1/k, precisions of X's covariance): the same iterations,
weights and means to 1e-6, the lower bound to 1e-8 relative, the same labels; in process
and once end to end on Ray."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.mixture import GaussianMixture as SkGaussianMixture

from arrayjob.algorithms.kmeans import seed_centres
from arrayjob.errors import InputError
from arrayjob.io.locations import StorageOptions
from tests.harness.helpers import (
    run_cli,
    sparse_logreg_data,
    without_progress,
    write_csr_group,
    write_spec,
)
from tests.unit.api.test_catalog import run_job

REG_COVAR = 1e-6


def blobs(n: int = 3000, d: int = 4, seed: int = 1) -> np.ndarray:
    """Three blobs of different spreads, sheared and moved far from the origin (the shift the
    job applies inside its kernels is then needed)."""
    X, _ = make_blobs(n, d, centers=3, cluster_std=[1.0, 2.0, 0.5], random_state=seed)
    return X @ np.random.default_rng(seed).standard_normal((d, d)) + 50.0


def reference(X: np.ndarray, means: np.ndarray, covariance: str, tol: float, max_iter: int = 100,
              reg_covar: float = REG_COVAR) -> SkGaussianMixture:
    """scikit-learn from the initial parameters the job takes: ``means``, weights 1/k, and
    every covariance X's (divided by n) plus ``reg_covar`` on the diagonal."""
    k, d = means.shape
    cov = np.cov(X.T, bias=True).reshape(d, d) + reg_covar * np.eye(d)
    precisions = np.linalg.inv(cov) if covariance == "full" else 1.0 / np.diag(cov)
    return SkGaussianMixture(k, covariance_type=covariance, reg_covar=reg_covar, tol=tol, max_iter=max_iter,
                             means_init=means, weights_init=np.full(k, 1.0 / k),
                             precisions_init=np.repeat(precisions[None], k, axis=0)).fit(X)


def assert_matches(result, ref: SkGaussianMixture, X: np.ndarray) -> None:
    assert result.attrs["iterations"] == ref.n_iter_
    assert result.attrs["converged"] == ref.converged_
    assert result.attrs["lower_bound"] == pytest.approx(ref.lower_bound_, rel=1e-8)
    np.testing.assert_allclose(result.arrays["weights"], ref.weights_, rtol=0, atol=1e-6)
    np.testing.assert_allclose(result.arrays["means"], ref.means_, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(result.arrays["covariances"], ref.covariances_, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(result.arrays["labels"], ref.predict(X))


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_gmm_from_means_by_uri_matches_sklearn(put, tmp_path, covariance):
    X = blobs()
    means = X[np.random.default_rng(3).choice(len(X), 3, replace=False)]
    put("init", means, means.shape)
    r = run_job("gmm", {"X": put("X", X, (500, 4))}, k=3, covariance=covariance, init=str(tmp_path / "init.zarr"),
                tol=1e-6)
    ref = reference(X, means, covariance, tol=1e-6)
    assert ref.converged_ and ref.n_iter_ > 3  # EM had work to do
    assert_matches(r, ref, X)
    assert r.arrays["covariances"].shape == ((3, 4, 4) if covariance == "full" else (3, 4))
    assert r.arrays["weights"].sum() == pytest.approx(1.0, abs=1e-12)


def test_one_component_is_the_mean_and_covariance_of_x(put):
    """k = 1 from k-means++ (one row of a seeded sample, ``kmeans.seed_centres``): scikit-learn from
    that row agrees, and one M-step gives X's mean and covariance (plus reg_covar)."""
    X = blobs(1200, 3, seed=4)
    info = put("X", X, (300, 3))
    r = run_job("gmm", {"X": info}, k=1, seed=7)
    start = seed_centres(info, "k-means++", 1, 7, StorageOptions())
    assert_matches(r, reference(X, start, "full", tol=1e-3), X)
    np.testing.assert_allclose(r.arrays["means"][0], X.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(r.arrays["covariances"][0], np.cov(X.T, bias=True) + REG_COVAR * np.eye(3),
                               rtol=1e-10)
    assert r.arrays["weights"].tolist() == [1.0] and not r.arrays["labels"].any()


def test_gmm_stops_at_max_iter_as_sklearn_does(put, tmp_path):
    X = blobs(seed=5)
    means = X[:3].copy()
    put("init", means, means.shape)
    r = run_job("gmm", {"X": put("X", X, (700, 4))}, k=3, covariance="diag", init=str(tmp_path / "init.zarr"),
                tol=0.0, max_iter=4)
    ref = SkGaussianMixture(3, covariance_type="diag", tol=0.0, max_iter=4, means_init=means,
                            weights_init=np.full(3, 1 / 3),
                            precisions_init=np.repeat(1.0 / (X.var(axis=0) + REG_COVAR)[None], 3, axis=0))
    with pytest.warns(Warning, match="Best performing initialization did not converge"):
        ref.fit(X)
    assert_matches(r, ref, X)
    assert not r.attrs["converged"] and "did NOT converge in 4 iterations" in r.summary[0]


def test_a_covariance_that_is_not_positive_definite_is_one_line(put, tmp_path):
    X = np.random.default_rng(6).standard_normal((400, 3))
    X[:, 2] = 1.0  # a constant column: X's covariance is singular and reg_covar = 0 adds nothing
    with pytest.raises(InputError) as raised:
        run_job("gmm", {"X": put("X", X, (100, 3))}, k=2, reg_covar=0.0)
    assert str(raised.value) == ("params.reg_covar: the covariance of component 0 at the start is not positive "
                                 "definite (it collapsed onto too few distinct rows); lower params.k or raise "
                                 "params.reg_covar")


def test_init_of_the_wrong_shape_and_a_sparse_x_are_refused_in_one_line(put, tmp_path, workdir, capsys):
    put("init", np.ones((2, 3)), (2, 3))
    with pytest.raises(InputError, match=r"^params.init: expected a \(3, 4\) array of means, got \(2, 3\)$"):
        run_job("gmm", {"X": put("X", np.ones((50, 4)), (50, 4))}, k=3, init=str(tmp_path / "init.zarr"))
    X, _ = sparse_logreg_data(200, 30, seed=8)
    write_csr_group(str(workdir / "S"), X)
    spec = write_spec(workdir / "spec.toml", inputs={"X": str(workdir / "S")}, output=str(workdir / "out"),
                      algorithm="gmm", params="k = 2\n")
    code, out, err = run_cli(["run", str(spec)], capsys)
    assert code == 2 and out == ""
    assert without_progress(err).strip().startswith(f"arrayjob: error: inputs.X: {workdir / 'S'} is a sparse matrix")


