"""``algorithm = "predict"``: a published model scores new rows as scikit-learn's estimator with
the same fitted arrays does (logreg binary and multinomial, linreg, kmeans; dense and sparse X),
the outputs are written by the workers chunked like X, and a model that cannot score X is one
line, exit 2, before X is read and with nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse
import zarr
from sklearn.cluster import KMeans as SkKMeans
from sklearn.datasets import make_blobs
from sklearn.linear_model import LogisticRegression as SkLogisticRegression
from sklearn.linear_model import Ridge

from arrayjob.algorithms.predict import Predict, PredictParams
from arrayjob.api.job import JobContext
from arrayjob.io.arrays import ResultGroup, open_array_info
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.io.model import open_model
from arrayjob.io.sparse import open_sparse_info
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from tests.harness.helpers import publish_model, run_cli, write_array, write_csr_group, write_spec

CHUNK = 300


def _x(tmp_path, X, sparse):
    """X stored under ``tmp_path``: a dense Zarr array, or a CSR group (AnnData's layout)."""
    options = StorageOptions()
    if sparse:
        write_csr_group(str(tmp_path / "X"), scipy.sparse.csr_matrix(X), (400, 400, 300))
        return open_sparse_info("X", parse_uri(str(tmp_path / "X")), options).info
    write_array(str(tmp_path / "X.zarr"), X, (CHUNK, X.shape[1]))
    return open_array_info("X", parse_uri(str(tmp_path / "X.zarr")), options)


def score(tmp_path, model_uri, X, sparse=False, params=None):
    """Run predict in process (LocalExecutor); returns its result and the result.zarr the workers wrote.
    An (n,) X (an ALS model's user ids) is stored as a vector."""
    if X.ndim == 1:
        write_array(str(tmp_path / "X.zarr"), X, (CHUNK,))
        info = open_array_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions())
    else:
        info = _x(tmp_path, X, sparse)
    job = Predict(params or PredictParams(), {"X": info},
                  models={"model": open_model("model", parse_uri(model_uri), StorageOptions())})
    group = ResultGroup(parse_uri(str(tmp_path / "result.zarr")), StorageOptions())
    executor = LocalExecutor(StorageOptions())
    session = Session(executor, PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2)))
    result = job.run(JobContext(session, executor.metrics, StorageOptions(), group))
    written = zarr.open_group(str(tmp_path / "result.zarr"), mode="r")
    for name in written.array_keys():  # chunked like X's rows (a sparse X's as the planner cuts them)
        assert written[name].chunks[0] == job.arrays["X"].chunks[0]
    return result, written


def _sparse_rows(n, d, seed):
    """Rows with about a third of their entries non-zero (some rows empty)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.35)
    X[::97] = 0.0
    return X


@pytest.mark.parametrize("sparse", [False, True])
def test_logreg_binary_scores_as_sklearn(tmp_path, sparse):
    rng = np.random.default_rng(0)
    X = _sparse_rows(1500, 6, 1) if sparse else rng.standard_normal((1500, 6))
    y = (X @ rng.standard_normal(6) + 0.3 + rng.standard_normal(1500) > 0).astype(float)
    ref = SkLogisticRegression(C=10.0).fit(X, y)
    model = publish_model(tmp_path / "model", "logreg", {"coef": ref.coef_[0], "intercept": ref.intercept_},
                          params={"l2": 1 / (10.0 * len(y))})
    new = _sparse_rows(2000, 6, 2) if sparse else rng.standard_normal((2000, 6))
    result, group = score(tmp_path, model, new, sparse)
    assert set(group.array_keys()) == {"label", "probability"}
    assert group["label"].dtype == np.int64
    np.testing.assert_array_equal(group["label"][:], ref.predict(new))
    np.testing.assert_allclose(group["probability"][:], ref.predict_proba(new)[:, 1], rtol=1e-12, atol=1e-15)
    assert result.attrs["rows"] == 2000 and result.attrs["classes"] == 2
    assert result.attrs["model_run_id"] == "20250101T000000Z-handmade"


@pytest.mark.parametrize("sparse", [False, True])
def test_logreg_multinomial_scores_as_sklearn(tmp_path, sparse):
    """The (K, d) coef and (K,) intercept of scikit-learn's multinomial layout, published by hand
    (the multinomial fit is not arrayjob's yet)."""
    X, y = make_blobs(1200, 5, centers=4, cluster_std=3.0, random_state=3)
    ref = SkLogisticRegression(C=0.5, max_iter=1000).fit(X, y)
    assert ref.coef_.shape == (4, 5)
    model = publish_model(tmp_path / "model", "logreg", {"coef": ref.coef_, "intercept": ref.intercept_})
    new = _sparse_rows(1000, 5, 4) * 4 if sparse else make_blobs(1000, 5, centers=4, cluster_std=3.0,
                                                                   random_state=5)[0]
    result, group = score(tmp_path, model, new, sparse)
    assert group["probability"].shape == (1000, 4) and group["probability"].chunks[1] == 4
    np.testing.assert_array_equal(group["label"][:], ref.predict(new))
    np.testing.assert_allclose(group["probability"][:], ref.predict_proba(new), rtol=1e-12, atol=1e-15)
    assert result.attrs["classes"] == 4


@pytest.mark.parametrize("sparse", [False, True])
def test_linreg_scores_as_sklearn(tmp_path, sparse):
    rng = np.random.default_rng(6)
    X = rng.standard_normal((800, 7))
    y = X @ rng.standard_normal(7) + 2.5 + 0.1 * rng.standard_normal(800)
    ref = Ridge(alpha=3.0).fit(X, y)
    model = publish_model(tmp_path / "model", "linreg", {"coef": ref.coef_, "intercept": np.array([ref.intercept_])})
    new = _sparse_rows(1300, 7, 7) if sparse else rng.standard_normal((1300, 7))
    _, group = score(tmp_path, model, new, sparse)
    assert set(group.array_keys()) == {"prediction"}
    np.testing.assert_allclose(group["prediction"][:], ref.predict(new), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
def test_kmeans_labels_the_nearest_centroid_as_sklearn(tmp_path, sparse):
    X, _ = make_blobs(1500, 4, centers=5, cluster_std=2.0, random_state=8)
    ref = SkKMeans(5, n_init=1, random_state=0).fit(X)
    model = publish_model(tmp_path / "model", "kmeans", {"centroids": ref.cluster_centers_}, params={"k": 5})
    new = _sparse_rows(1100, 4, 9) * 5 if sparse else make_blobs(1100, 4, centers=5, cluster_std=2.0,
                                                                   random_state=10)[0]
    _, group = score(tmp_path, model, new, sparse)
    assert set(group.array_keys()) == {"label"}
    np.testing.assert_array_equal(group["label"][:], ref.predict(new))


def _spec(tmp_path, model, X, output="scores"):
    return str(write_spec(tmp_path / "predict.toml", algorithm="predict", inputs={"model": str(model), "X": str(X)},
                          output=str(tmp_path / output)))


def _fails(tmp_path, capsys, spec, message):
    code, out, err = run_cli(["run", spec], capsys)
    assert (code, out) == (2, "")
    assert err == f"arrayjob: error: {message}\n"
    assert not (tmp_path / "scores").exists()  # nothing written


def test_x_of_another_feature_count_is_refused_before_anything_is_read(tmp_path, capsys):
    model = publish_model(tmp_path / "model", "linreg", {"coef": np.ones(3), "intercept": np.zeros(1)})
    write_array(str(tmp_path / "X.zarr"), np.ones((10, 4)), (5, 4))
    _fails(tmp_path, capsys, _spec(tmp_path, model, tmp_path / "X.zarr"),
           f"inputs.X: 4 features (columns) but the linreg model of run 20250101T000000Z-handmade at "
           f"{tmp_path / 'model'} was fitted on 3")
    # a sparse X: refused from its shape attribute, before its indptr is read (here it is gone)
    write_csr_group(str(tmp_path / "S"), scipy.sparse.random(10, 5, density=0.3, format="csr", random_state=1))
    for key in (tmp_path / "S" / "indptr").iterdir():
        if key.name != "zarr.json":
            import shutil

            shutil.rmtree(key) if key.is_dir() else key.unlink()
    _fails(tmp_path, capsys, _spec(tmp_path, model, tmp_path / "S"),
           f"inputs.X: 5 features (columns) but the linreg model of run 20250101T000000Z-handmade at "
           f"{tmp_path / 'model'} was fitted on 3")


def test_a_model_uri_with_nothing_published_is_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    write_array(str(tmp_path / "X.zarr"), np.ones((10, 3)), (5, 3))
    _fails(tmp_path, capsys, _spec(tmp_path, tmp_path / "empty", tmp_path / "X.zarr"),
           f"inputs.model: {tmp_path / 'empty'}: nothing published there (no _SUCCESS; a run publishes it last)")


def test_a_model_predict_cannot_score_is_exit_2(tmp_path, capsys):
    model = publish_model(tmp_path / "model", "tsqr", {"R": np.eye(3)})
    write_array(str(tmp_path / "X.zarr"), np.ones((10, 3)), (5, 3))
    _fails(tmp_path, capsys, _spec(tmp_path, model, tmp_path / "X.zarr"),
           f"inputs.model: the tsqr model of run 20250101T000000Z-handmade at {tmp_path / 'model'} cannot be "
           "scored by predict (it scores models of: als, gmm, kmeans, linreg, logreg, pca)")


def test_a_model_of_a_layout_predict_cannot_score_is_exit_2(tmp_path, capsys):
    model = publish_model(tmp_path / "model", "logreg", {"coef": np.ones((3, 4)), "intercept": np.zeros(2)})
    write_array(str(tmp_path / "X.zarr"), np.ones((10, 4)), (5, 4))
    _fails(tmp_path, capsys, _spec(tmp_path, model, tmp_path / "X.zarr"),
           f"inputs.model: the logreg model of run 20250101T000000Z-handmade at {tmp_path / 'model'} has "
           "coef (3, 4) and intercept (2,): expected (d,) and (1,), or (K, d) and (K,)")


def test_the_estimate_prices_the_model_read_the_pass_and_the_writes(tmp_path, capsys):
    """The scoring run's estimate, like any job's: the model's arrays read whole on the driver in
    load, one pass over X in ``score``, and the per-row outputs written chunked like X."""
    model = publish_model(tmp_path / "model", "logreg", {"coef": np.ones((3, 4)), "intercept": np.zeros(3)})
    write_array(str(tmp_path / "X.zarr"), np.ones((1000, 4)), (250, 4))
    code, out, err = run_cli(["estimate", _spec(tmp_path, model, tmp_path / "X.zarr"), "--format", "json"], capsys)
    assert code == 0, err
    stages = {s["name"]: s for s in json.loads(out)["stages"]}
    assert list(stages) == ["connect", "load", "score", "write", "shutdown"]
    # X (32 kB) and the model's coef and intercept (3 × 4 + 3 floats, one chunk each)
    assert stages["load"]["storage.bytes_read"] == 1000 * 4 * 8 + 15 * 8
    assert stages["score"]["tasks.count"] >= 4  # a task per row block of X at least
    # label (n,) int64 and probability (n, 3), 4 chunks each
    assert stages["write"]["storage.bytes_written"] >= 1000 * 8 * 4
    code, out, err = run_cli(["plan", _spec(tmp_path, model, tmp_path / "X.zarr")], capsys)
    assert code == 0 and "scoring with the logreg model of run 20250101T000000Z-handmade" in out


@pytest.mark.parametrize("sparse", [False, True])
def test_pca_scores_as_sklearn_transform(tmp_path, sparse):
    from sklearn.decomposition import PCA as SkPCA

    rng = np.random.default_rng(20)
    X = _sparse_rows(1500, 8, 21) + (0.0 if sparse else 3.0)
    ref = SkPCA(3, svd_solver="full").fit(X)
    model = publish_model(tmp_path / "model", "pca", {"components": ref.components_, "mean": ref.mean_,
                                                      "singular_values": ref.singular_values_}, params={"k": 3})
    new = _sparse_rows(1200, 8, 22) + (0.0 if sparse else rng.standard_normal((1200, 8)))
    _, group = score(tmp_path, model, new, sparse)
    assert set(group.array_keys()) == {"scores"}
    np.testing.assert_allclose(group["scores"][:], ref.transform(new), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_gmm_labels_as_sklearn_predict(tmp_path, covariance):
    from sklearn.mixture import GaussianMixture as SkGaussianMixture

    X, _ = make_blobs(2000, 3, centers=3, cluster_std=[1.0, 2.0, 0.5], random_state=23)
    ref = SkGaussianMixture(3, covariance_type=covariance, random_state=0).fit(X)
    model = publish_model(tmp_path / "model", "gmm", {"weights": ref.weights_, "means": ref.means_,
                                                      "covariances": ref.covariances_},
                          params={"k": 3, "covariance": covariance})
    new, _ = make_blobs(1500, 3, centers=3, cluster_std=[1.0, 2.0, 0.5], random_state=24)
    _, group = score(tmp_path, model, new)
    np.testing.assert_array_equal(group["label"][:], ref.predict(new))
