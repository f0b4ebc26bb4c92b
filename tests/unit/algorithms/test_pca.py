"""PCA against scikit-learn and an exact SVD: the exact method (TSQR's R) to rounding, the
randomized one within the bound subspace iteration guarantees on data with a spectral gap,
dense and sparse, centred and not; the scores written by the workers chunked like X."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
from sklearn.decomposition import PCA as SkPCA
from sklearn.decomposition import TruncatedSVD

from arrayjob.algorithms.pca import PCA, PCAParams
from arrayjob.api.job import JobContext
from arrayjob.errors import InputError, SpecError
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.io.sparse import open_sparse_info
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from arrayjob.spec import table_to_dataclass
from tests.harness.helpers import (
    sparse_logreg_data,
    write_csr_group,
)

# tan of the angle between a Gaussian start's span and the top singular vectors: about
# sqrt(d · l) / p (Halko, Martinsson & Tropp 2011, §10); this is well above it for the sizes here
START = 100.0


def _run(params: PCAParams, arrays):
    job = PCA(params, arrays)
    session = Session(LocalExecutor(StorageOptions()), PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2)))
    return job.run(JobContext(session, session.executor.metrics)), job


def low_rank_plus_noise(n, d, k, noise, seed=0, offset=0.0):
    """``k`` orthonormal directions with scales 10 · 2^(−j/2) above Gaussian noise: singular
    values σ_{k+1} ≈ noise (√n + √d) well under σ_k ≈ 10 · 2^(−(k−1)/2) √n."""
    rng = np.random.default_rng(seed)
    directions = np.linalg.qr(rng.standard_normal((d, k)))[0].T
    scales = 10.0 * 2.0 ** (-np.arange(k) / 2)
    return offset + (rng.standard_normal((n, k)) * scales) @ directions + noise * rng.standard_normal((n, d))


def _sparse(tmp_path, X, chunks=(700, 900, 400)):
    write_csr_group(str(tmp_path / "X"), X, chunks)
    return {"X": open_sparse_info("X", parse_uri(str(tmp_path / "X")), StorageOptions()).info}


def _svd(X, center):
    """The exact reference: singular values and right singular vectors of X − 1μᵀ (or X)."""
    X = X.toarray() if scipy.sparse.issparse(X) else X
    _, s, vt = np.linalg.svd(X - X.mean(axis=0) if center else X, full_matrices=False)
    return s, vt


def _sines(found, reference):
    """sin of the angle between each found component and the reference one (unit vectors):
    the norm of what is left of it off the reference, accurate to rounding for small angles."""
    cosines = np.sum(found * reference, axis=1)
    return np.linalg.norm(found - cosines[:, None] * reference, axis=1)


def assert_within_subspace_iteration_bound(result, s, vt, columns, q):
    """With a basis of l = ``columns`` after q iterations, Ritz vector i within an angle
    START · (σ_{l+1}/σ_i)^{2q} of the i-th right singular vector (its distance from the basis
    shrinks so: Saad, Numerical Methods for Large Eigenvalue Problems, Thm 5.2, on XᵀX; START
    also covers the gaps among the top k), its Ritz value within σ₁² tan² of that angle of σ_i²
    (plus rounding, u · σ₁²/σ_i² with room)."""
    k = result.arrays["components"].shape[0]
    angle = START * (s[columns] / s[:k]) ** (2 * q)
    assert np.all(angle < 0.1), f"no clear gap: the bound {angle} says nothing"
    assert np.all(_sines(result.arrays["components"], vt[:k]) <= angle + 1e-9)
    squares = result.arrays["singular_values"] ** 2
    rounding = 1e-12 * (s[0] / s[:k]) ** 2
    assert np.all(np.abs(squares - s[:k] ** 2) / s[:k] ** 2 <= (s[0] / s[:k]) ** 2 * angle**2 + rounding)
    return angle


@pytest.mark.parametrize("offset", [0.0, 1e3])
@pytest.mark.parametrize("rows,chunk", [(2100, 400), (300, 300)])
def test_exact_matches_sklearn_full(put, offset, rows, chunk):
    X = low_rank_plus_noise(rows, 12, 5, 0.3, seed=1, offset=offset)
    result, job = _run(PCAParams(k=4, method="exact", scores=True), {"X": put("X", X, (chunk, 12))})
    assert job.method == "exact" and result.attrs["method"] == "exact"
    ref = SkPCA(4, svd_solver="full").fit(X)
    for name in ("explained_variance", "explained_variance_ratio", "singular_values"):
        np.testing.assert_allclose(result.arrays[name], getattr(ref, f"{name}_"), rtol=1e-8, err_msg=name)
    # the same sign convention (svd_flip on the components): no sign to fix
    np.testing.assert_allclose(result.arrays["components"], ref.components_, atol=1e-8)
    np.testing.assert_allclose(result.arrays["mean"], ref.mean_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.arrays["scores"], ref.transform(X), atol=1e-8 * np.abs(X - ref.mean_).max())
    components = result.arrays["components"]
    np.testing.assert_allclose(components @ components.T, np.eye(4), atol=1e-12)
    assert result.attrs["total_variance"] == pytest.approx(np.var(X, axis=0, ddof=1).sum(), rel=1e-10)


def test_exact_uncentred_is_the_truncated_svd(put):
    X = low_rank_plus_noise(1500, 10, 3, 0.2, seed=2, offset=0.5)
    result, _ = _run(PCAParams(k=3, method="exact", center=False, scores=True), {"X": put("X", X, (400, 10))})
    s, vt = _svd(X, center=False)
    np.testing.assert_allclose(result.arrays["singular_values"], s[:3], rtol=1e-10)
    np.testing.assert_allclose(np.abs(np.sum(result.arrays["components"] * vt[:3], axis=1)), 1.0, atol=1e-12)
    np.testing.assert_array_equal(result.arrays["mean"], np.zeros(10))
    np.testing.assert_allclose(result.arrays["explained_variance_ratio"], s[:3] ** 2 / (s**2).sum(), rtol=1e-10)
    np.testing.assert_allclose(result.arrays["scores"], X @ result.arrays["components"].T, atol=1e-10)
    # TruncatedSVD fits the same components (its explained variance is another quantity: the
    # variance of the scores)
    ref = TruncatedSVD(3, algorithm="arpack", tol=0.0).fit(X)
    np.testing.assert_allclose(result.arrays["singular_values"], ref.singular_values_, rtol=1e-10)
    np.testing.assert_allclose(np.abs(np.sum(result.arrays["components"] * ref.components_, axis=1)), 1.0, atol=1e-10)


@pytest.mark.parametrize("n_iter", [2, 4])
def test_randomized_is_within_the_subspace_iteration_bound_and_agrees_with_sklearn(put, n_iter):
    X = low_rank_plus_noise(2000, 100, 5, 0.1, seed=3, offset=2.0)
    k = 5
    result, job = _run(PCAParams(k=k, method="randomized", n_iter=n_iter, scores=True), {"X": put("X", X, (500, 100))})
    assert result.attrs["iterations"] == n_iter and job.basis_columns == k + 10
    s, vt = _svd(X, center=True)
    angle = assert_within_subspace_iteration_bound(result, s, vt, k + 10, n_iter)
    ref = SkPCA(k, svd_solver="randomized", random_state=0).fit(X)
    np.testing.assert_allclose(result.arrays["components"], ref.components_, atol=2 * angle.max() + 1e-9)
    np.testing.assert_allclose(result.arrays["explained_variance"], ref.explained_variance_, rtol=1e-6)
    np.testing.assert_allclose(result.arrays["explained_variance_ratio"], ref.explained_variance_ratio_, rtol=1e-6)
    np.testing.assert_allclose(result.arrays["mean"], X.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(result.arrays["scores"], (X - X.mean(axis=0)) @ result.arrays["components"].T,
                               atol=1e-10 * np.abs(X).max())


def _gapped_sparse(seed):
    """A CSR X whose first four columns carry most of its energy (scaled 30, 20, 12, 8): a clear
    gap after the third singular value, X still sparse."""
    X, _ = sparse_logreg_data(3000, 80, nnz_per_row=8, seed=seed)
    weights = np.ones(80)
    weights[:4] = [30.0, 20.0, 12.0, 8.0]
    return scipy.sparse.csr_matrix(X @ scipy.sparse.diags(weights))


@pytest.mark.parametrize("center", [True, False])
def test_randomized_on_a_sparse_x_is_within_the_bound(tmp_path, center):
    X = _gapped_sparse(4)
    result, job = _run(PCAParams(k=3, center=center, scores=True), _sparse(tmp_path, X))
    assert job.method == "randomized" and "randomized" in job.describe() and "sparse" in job.describe()
    s, vt = _svd(X, center)
    assert_within_subspace_iteration_bound(result, s, vt, 13, 4)
    dense = X.toarray()
    mean = dense.mean(axis=0) if center else np.zeros(80)
    np.testing.assert_allclose(result.arrays["mean"], mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(result.arrays["scores"], (dense - mean) @ result.arrays["components"].T,
                               atol=1e-10 * np.abs(dense).max())
    total = ((dense - mean) ** 2).sum()
    np.testing.assert_allclose(result.arrays["explained_variance_ratio"], result.arrays["singular_values"] ** 2 / total,
                               rtol=1e-10)
    if center:
        ref = SkPCA(3, svd_solver="full").fit(dense)
        np.testing.assert_allclose(result.arrays["explained_variance"], ref.explained_variance_, rtol=1e-8)
    else:
        ref = TruncatedSVD(3, algorithm="arpack", tol=0.0).fit(X)
        np.testing.assert_allclose(result.arrays["singular_values"], ref.singular_values_, rtol=1e-8)


def test_auto_is_exact_on_a_narrow_dense_x_and_randomized_otherwise(put, tmp_path):
    narrow = PCA(PCAParams(k=2), {"X": put("narrow", np.ones((4, 2048)), (4, 2048))})
    wide = PCA(PCAParams(k=2), {"X": put("wide", np.ones((4, 2049)), (4, 2049))})
    sparse = PCA(PCAParams(k=2), _sparse(tmp_path, sparse_logreg_data(50, 20, nnz_per_row=3, seed=5)[0], (20, 50, 20)))
    assert [j.method for j in (narrow, wide, sparse)] == ["exact", "randomized", "randomized"]
    assert "exact: SVD of TSQR's R" in narrow.describe()
    assert "randomized: 4 power iterations on a basis of 12" in wide.describe()
    # the plan shows the fit's pass: R's for exact, an iteration's for randomized
    assert [type(x.attrs).__name__ for x in narrow.program().values()] == ["Blockwise", "Blockwise"]
    assert set(wide.program()) == {"xty", "sum_y"}


BAD = [
    ({"k": 6}, (5, 8), InputError, "params.k: 6 components but inputs.X 5 × 8 has at most 5"),
    ({"k": 0}, (5, 8), SpecError, "params.k: expected an integer >= 1, got 0"),
    ({"k": 2, "n_iter": 0}, (5, 8), SpecError, "params.n_iter: expected an integer >= 1, got 0"),
    ({"k": 2, "method": "svd"}, (5, 8), SpecError,
     "params.method: expected one of 'auto', 'exact', 'randomized', got 'svd'"),
    ({"k": 2, "method": "exact"}, (5, 8193), InputError,
     "params.method: exact returns a d × d R from every block (d = 8,193: 537.0 MB per block); "
     "use randomized above 8,192 features"),
]


@pytest.mark.parametrize("params,shape,error,message", BAD, ids=range(len(BAD)))
def test_invalid_params_are_one_clear_line(put, params, shape, error, message):
    info = put("X", np.zeros(shape), shape)
    with pytest.raises(error) as raised:
        PCA(table_to_dataclass(PCAParams, params, "params"), {"X": info})
    assert str(raised.value) == message


def test_exact_refuses_a_sparse_x(tmp_path):
    arrays = _sparse(tmp_path, sparse_logreg_data(50, 20, nnz_per_row=3, seed=6)[0], (20, 50, 20))
    with pytest.raises(InputError, match=r"params.method: exact factors dense blocks and inputs.X is sparse"):
        PCA(PCAParams(k=2, method="exact"), arrays)


