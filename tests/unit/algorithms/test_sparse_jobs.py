"""Jobs on a sparse X (AnnData's CSR group): logreg, linreg and kmeans against scikit-learn and
SciPy on the same matrix, in process and end to end on Ray; plans and estimates from the
non-zeros; a job that takes dense input only refuses a sparse one in one line."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.linalg
from sklearn.cluster import KMeans as SkKMeans
from sklearn.linear_model import LogisticRegression as SkLogisticRegression
from sklearn.linear_model import Ridge

from arrayjob.algorithms.kmeans import KMeans, KMeansParams
from arrayjob.algorithms.linreg import LinearRegression, LinRegParams
from arrayjob.algorithms.logreg import LogisticRegression, LogRegParams
from arrayjob.api.job import JobContext
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.io.sparse import open_sparse_info
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from tests.harness.helpers import (
    run_cli,
    sparse_logreg_data,
    without_progress,
    write_array,
    write_csr_group,
    write_spec,
)


def _arrays(tmp_path, X, y=None, chunks=(700, 500, 300)):
    write_csr_group(str(tmp_path / "X"), X, chunks)
    options = StorageOptions()
    arrays = {"X": open_sparse_info("X", parse_uri(str(tmp_path / "X")), options).info}
    if y is not None:
        write_array(str(tmp_path / "y.zarr"), y, (450,))
        arrays["y"] = open_array_info("y", parse_uri(str(tmp_path / "y.zarr")), options)
    return arrays


def _run(job, **planner):
    executor = LocalExecutor(StorageOptions())
    options = PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2), **planner)
    session = Session(executor, options)
    return job.run(JobContext(session, executor.metrics)), executor.metrics


@pytest.mark.parametrize("held", ["scipy", "csr loop", "csc loop"])
@pytest.mark.parametrize("solver", ["lbfgs", "newton"])
def test_logreg_on_sparse_x_matches_sklearn(tmp_path, solver, held, monkeypatch):
    """With SciPy's products (blocks this small), and with the row loop over the non-zeros,
    the blocks held as CSR (one pass) or, as a wide matrix's are, by columns (two sweeps)."""
    from arrayjob.io import locations
    from arrayjob.kernels import compiler

    if held != "scipy":
        monkeypatch.setattr(compiler, "SPARSE_LOOP_MIN_BYTES", 0)
    if held == "csc loop":
        monkeypatch.setattr(locations, "HELD_BY_COLUMNS_ABOVE", 100)
    X, y = sparse_logreg_data(3000, 120, seed=1)
    l2 = 1e-3
    job = LogisticRegression(LogRegParams(solver=solver, l2=l2, tol=1e-10, max_iter=500), _arrays(tmp_path, X, y))
    result, _ = _run(job)
    model = SkLogisticRegression(C=1 / (l2 * X.shape[0]), tol=1e-12, max_iter=10_000).fit(X, y)
    assert_close(result.arrays["coef"], model.coef_[0])
    assert result.arrays["intercept"][0] == pytest.approx(model.intercept_[0], rel=1e-6)


def assert_close(found, reference, rel=1e-6):
    """Relative to the reference's norm (scikit-learn's lbfgs stops at a gradient norm of about
    1e-9: single coefficients near 0 differ by more than 1e-6 of themselves)."""
    assert np.linalg.norm(found - reference) <= rel * np.linalg.norm(reference)


def test_the_plan_cuts_a_sparse_x_into_row_blocks_sized_by_its_non_zeros(tmp_path):
    X, y = sparse_logreg_data(6000, 500, nnz_per_row=20, seed=2)
    job = LogisticRegression(LogRegParams(), _arrays(tmp_path, X, y))
    executor = LocalExecutor(StorageOptions())
    session = Session(executor, PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2)))
    plan = session.plan(job.program())
    info = job.arrays["X"]
    (source,) = [s for s in plan.physical.sources if s.array.name == "X"]
    assert source.grid.block_shape[1] == X.shape[1]  # rows only: a CSR block holds whole rows
    blocks = _blocks(plan.physical, "X")
    assert len(blocks) == source.grid.num_blocks > 1
    # each block: its values (float64), their columns and its own row offsets (int32, as SciPy wrote them)
    per_value, per_row = 8 + X.indices.itemsize, X.indptr.itemsize
    total = sum(plan.physical.block_bytes(b) for b in blocks)
    assert total == X.nnz * per_value + (X.shape[0] + len(blocks)) * per_row
    assert info.nbytes == X.nnz * per_value + (X.shape[0] + 1) * per_row  # by its non-zeros, not n × d


def _blocks(physical, name):
    from arrayjob.planner.physical import SourceBlock

    return {a for t in physical.tasks for a in t.args if isinstance(a, SourceBlock) and a.array == name}


@pytest.mark.parametrize("method", ["normal", "cg"])
def test_linreg_on_sparse_x_matches_lsqr(tmp_path, method):
    X, _ = sparse_logreg_data(2500, 80, seed=3)
    rng = np.random.default_rng(3)
    y = X @ rng.standard_normal(80) + 0.7 + 0.01 * rng.standard_normal(2500)
    job = LinearRegression(LinRegParams(method=method), _arrays(tmp_path, X, y))
    result, _ = _run(job)
    with_ones = scipy.sparse.hstack([X, np.ones((X.shape[0], 1))], format="csr")
    reference = scipy.sparse.linalg.lsqr(with_ones, y, atol=1e-14, btol=1e-14, iter_lim=10_000)[0]
    np.testing.assert_allclose(result.arrays["coef"], reference[:-1], rtol=1e-6, atol=1e-8)
    assert result.arrays["intercept"][0] == pytest.approx(reference[-1], rel=1e-6)
    assert result.attrs["method"] == method


def test_linreg_auto_picks_cg_for_a_wide_sparse_x_and_matches_ridge(tmp_path):
    X, _ = sparse_logreg_data(1500, 5000, nnz_per_row=6, seed=4)
    y = X @ np.random.default_rng(4).standard_normal(5000) - 0.3
    l2 = 1e-3
    job = LinearRegression(LinRegParams(l2=l2), _arrays(tmp_path, X, y))
    assert job.method == "cg" and "cg" in job.describe() and "sparse" in job.describe()
    result, _ = _run(job)
    model = Ridge(alpha=l2 * X.shape[0], tol=1e-12, solver="sparse_cg", max_iter=100_000).fit(X, y)
    np.testing.assert_allclose(result.arrays["coef"], model.coef_, rtol=1e-5, atol=1e-7)
    assert result.attrs["converged"] is True


@pytest.mark.parametrize("loops", [False, True], ids=["scipy", "csr loop"])
def test_kmeans_on_sparse_x_matches_sklearn_from_the_same_centroids(tmp_path, loops, monkeypatch):
    """With SciPy's products (blocks this small) and with the loop over the non-zeros
    (``loops.nearest_group_sums_csr``, taken by blocks of any size here)."""
    from arrayjob.kernels import compiler

    if loops:
        monkeypatch.setattr(compiler, "SPARSE_LOOP_MIN_BYTES", 0)
    X, _ = sparse_logreg_data(3000, 60, nnz_per_row=10, seed=5)
    centroids = X[:4].toarray() + 0.01
    write_array(str(tmp_path / "init.zarr"), centroids, centroids.shape)
    job = KMeans(KMeansParams(k=4, init=str(tmp_path / "init.zarr"), tol=0.0, max_iter=50), _arrays(tmp_path, X))
    result, _ = _run(job)
    model = SkKMeans(4, init=centroids, n_init=1, max_iter=50, tol=0.0, algorithm="lloyd").fit(X)
    assert result.attrs["inertia"] == pytest.approx(model.inertia_, rel=1e-9)
    np.testing.assert_allclose(result.arrays["centroids"], model.cluster_centers_, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(result.arrays["labels"], model.labels_)


def test_kmeans_plus_plus_seeds_from_sparse_rows(tmp_path):
    X, _ = sparse_logreg_data(2000, 40, nnz_per_row=6, seed=6)
    job = KMeans(KMeansParams(k=5, max_iter=100), _arrays(tmp_path, X))
    result, _ = _run(job)
    distances = ((X.toarray()[:, None, :] - result.arrays["centroids"][None]) ** 2).sum(2)
    assert result.attrs["inertia"] == pytest.approx(distances.min(1).sum(), rel=1e-9)
    np.testing.assert_array_equal(result.arrays["labels"], distances.argmin(1))


def _reference(algorithm, X, y, l2, centroids):
    """What scikit-learn (or SciPy) fits on the same sparse matrix: {result array: values}."""
    if algorithm == "logreg":
        model = SkLogisticRegression(C=1 / (l2 * X.shape[0]), tol=1e-12, max_iter=10_000).fit(X, y)
        return {"coef": model.coef_[0]}
    if algorithm == "linreg":
        with_ones = scipy.sparse.hstack([X, np.ones((X.shape[0], 1))], format="csr")
        return {"coef": scipy.sparse.linalg.lsqr(with_ones, y, atol=1e-14, btol=1e-14, iter_lim=10_000)[0][:-1]}
    model = SkKMeans(len(centroids), init=centroids, n_init=1, max_iter=300, tol=1e-4, algorithm="lloyd").fit(X)
    return {"centroids": model.cluster_centers_, "labels": model.labels_}


def test_a_job_without_sparse_support_refuses_a_sparse_input_in_one_line(workdir, capsys):
    X, _ = sparse_logreg_data(200, 30, seed=8)
    write_csr_group(str(workdir / "A"), X)
    spec = write_spec(workdir / "spec.toml", inputs={"A": str(workdir / "A")}, output=str(workdir / "out"),
                      algorithm="tsqr")
    code, out, err = run_cli(["run", str(spec)], capsys)
    assert code == 2 and out == ""
    line = without_progress(err).strip()
    assert "\n" not in line
    assert line == (f"arrayjob: error: inputs.A: {workdir / 'A'} is a sparse matrix (csr_matrix); tsqr takes a "
                    f"dense array here (sparse input: als, kmeans, linreg, logreg, pagerank, pca, predict)")
    assert not (workdir / "out").exists()


def test_linreg_tsqr_refuses_a_sparse_x(tmp_path):
    X, y = sparse_logreg_data(300, 20, seed=9)
    with pytest.raises(Exception, match="params.method: tsqr factors dense blocks and inputs.X is sparse"):
        LinearRegression(LinRegParams(method="tsqr"), _arrays(tmp_path, X, y))


def _bad(member, position, value):
    def change(group):
        group[member][position] = value
    return change


