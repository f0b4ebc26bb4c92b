"""``arrayjob export``: a model a real arrayjob run fitted and published, exported as a
scikit-learn estimator (skops) and as ONNX, loads back and predicts what ``arrayjob run`` of a
predict spec wrote for the same rows; train → publish → score → export end to end on Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse
import skops.io
import zarr
from sklearn.datasets import make_blobs
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

from arrayjob.export import ONNX_EXTRA
from tests.harness.helpers import publish_model, read_result, run_cli, write_spec
from tests.unit.algorithms.test_predict import score

try:
    import onnxruntime
except ImportError:  # the ONNX file is then checked by onnx.checker alone
    onnxruntime = None

TRAIN = {  # algorithm -> datagen options, the spec's params
    "logreg": (["--rows", "2000", "--cols", "4", "--chunk-rows", "500"], 'l2 = 1e-3\n'),
    "linreg": (["--rows", "2000", "--cols", "4", "--chunk-rows", "500"], 'l2 = 1e-2\n'),
    "kmeans": (["--rows", "2000", "--cols", "4", "--chunk-rows", "500", "--k", "3"], 'k = 3\n'),
    "pca": (["--rows", "2000", "--cols", "6", "--chunk-rows", "500", "--rank", "3"], 'k = 3\nscores = true\n'),
    "gmm": (["--rows", "2000", "--cols", "3", "--chunk-rows", "500", "--k", "3"], 'k = 3\n'),
}
# what predict writes for each algorithm, and how scikit-learn says it
OUTPUTS = {"logreg": {"label", "probability"}, "linreg": {"prediction"}, "kmeans": {"label"}, "pca": {"scores"},
           "gmm": {"label"}}
FEATURES_ONLY = ("kmeans", "pca", "gmm")  # fitted on X alone


def load_skops(path):
    """The estimator in a skops file, loaded trusting the types skops lists as untrusted there
    (checked here: scikit-learn's and NumPy's own)."""
    untrusted = skops.io.get_untrusted_types(file=path)
    assert all(t.startswith(("sklearn.", "numpy.")) for t in untrusted), untrusted
    return skops.io.load(path, trusted=untrusted)


def onnx_outputs(path, X):
    """The ONNX file's outputs on dense float64 rows X, by output name (onnxruntime), or None
    where onnxruntime is not installed: then the file is only checked to be a valid model."""
    import onnx

    onnx.checker.check_model(onnx.load(str(path)))
    if onnxruntime is None:
        return None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"X": X}), strict=True))


def assert_scores_as_predict(estimator, onnx, X, dense, written):
    """The exported estimator's (and the ONNX model's) predictions equal predict's output."""
    if "scores" in written:
        np.testing.assert_allclose(estimator.transform(X), written["scores"], rtol=1e-10, atol=1e-10)
        if onnx is not None:
            np.testing.assert_allclose(onnx["variable"], written["scores"], rtol=1e-10, atol=1e-10)
        return
    if "prediction" in written:
        np.testing.assert_allclose(estimator.predict(X), written["prediction"], rtol=1e-12, atol=1e-12)
        if onnx is not None:
            np.testing.assert_allclose(onnx["variable"].ravel(), written["prediction"], rtol=1e-12, atol=1e-12)
        return
    np.testing.assert_array_equal(estimator.predict(X), written["label"])
    if onnx is not None:
        np.testing.assert_array_equal(onnx["label"].ravel(), written["label"])  # a mixture's: (n, 1)
    if "probability" in written:
        p = written["probability"]
        proba = estimator.predict_proba(X)
        np.testing.assert_allclose(proba[:, 1] if p.ndim == 1 else proba, p, rtol=1e-12, atol=1e-15)
        if onnx is not None:
            np.testing.assert_allclose(onnx["probabilities"][:, 1] if p.ndim == 1 else onnx["probabilities"], p,
                                       rtol=1e-10, atol=1e-15)


def _read_x(uri):
    """The rows predict scored: a dense array, or a CSR group as a SciPy matrix."""
    node = zarr.open(uri, mode="r")
    if isinstance(node, zarr.Array):
        return node[:]
    return scipy.sparse.csr_matrix((node["data"][:], node["indices"][:], node["indptr"][:]),
                                   shape=tuple(node.attrs["shape"]))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("algorithm", sorted(TRAIN))
def test_train_publish_score_export(algorithm, workdir, capsys):
    """A model fitted by `arrayjob run`, scored by a predict run (logreg: on a sparse X), exported
    both ways; each export predicts what the predict run wrote."""
    args, params = TRAIN[algorithm]
    assert run_cli(["datagen", algorithm, "data/train", *args], capsys)[0] == 0
    new = ["--seed", "7", *args] + (["--nnz-per-row", "2"] if algorithm == "logreg" else [])
    assert run_cli(["datagen", algorithm, "data/new", *new], capsys)[0] == 0
    inputs = {"X": "data/train/X.zarr"} | ({} if algorithm in FEATURES_ONLY else {"y": "data/train/y.zarr"})
    train = write_spec(workdir / "train.toml", algorithm=algorithm, inputs=inputs, output="out/model", params=params)
    code, _, err = run_cli(["run", str(train), "-q"], capsys)
    assert code == 0, err

    spec = write_spec(workdir / "score.toml", algorithm="predict",
                      inputs={"model": "out/model", "X": "data/new/X.zarr"}, output="out/scores")
    code, out, err = run_cli(["run", str(spec), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["result"]["rows"] == 2000 and report["result"]["model_algorithm"] == algorithm
    assert [s["name"] for s in report["stages"]][1:] == ["connect", "load", "score", "write"]
    assert report["dollars"]["total"] >= 0 and report["estimate"]["wall_seconds"] > 0
    group = read_result("out/scores")
    written = {name: group[name][:] for name in group.array_keys()}
    assert set(written) == OUTPUTS[algorithm]

    X = _read_x(str(workdir / "data/new/X.zarr"))
    dense = X.toarray() if scipy.sparse.issparse(X) else X
    for fmt, path in (("sklearn", "model.skops"), ("onnx", "model.onnx")):
        code, out, err = run_cli(["export", "out/model", "--format", fmt, "-o", path], capsys)
        assert code == 0, err
        assert out.startswith(f"wrote {path}: ") and f"the {algorithm} model of run " in out
    estimator = load_skops(workdir / "model.skops")
    assert_scores_as_predict(estimator, onnx_outputs(workdir / "model.onnx", dense), X, dense, written)


@pytest.mark.parametrize("multinomial", [False, True])
def test_a_hand_made_logreg_model_exports_as_predict_scores(tmp_path, capsys, multinomial):
    """scikit-learn's layouts, binary and multinomial (coef (K, d)): published by hand, scored by
    predict in process, exported; the exports load back and predict what predict wrote."""
    X, y = make_blobs(900, 5, centers=4 if multinomial else 2, cluster_std=3.0, random_state=2)
    ref = SkLogisticRegression(C=0.5, max_iter=1000).fit(X, y)
    coef = ref.coef_ if multinomial else ref.coef_[0]
    model = publish_model(tmp_path / "model", "logreg", {"coef": coef, "intercept": ref.intercept_},
                          params={"l2": 2.0 / len(y)}, attrs={"n_samples": len(y), "iterations": 9})
    new = make_blobs(700, 5, centers=4, cluster_std=3.0, random_state=3)[0]
    _, group = score(tmp_path, model, new)
    written = {name: group[name][:] for name in group.array_keys()}
    for fmt, path in (("sklearn", tmp_path / "m.skops"), ("onnx", tmp_path / "m.onnx")):
        code, out, err = run_cli(["export", model, "--format", fmt, "-o", str(path)], capsys)
        assert code == 0, err
    estimator = load_skops(tmp_path / "m.skops")
    assert pytest.approx(1 / (2.0 / len(y) * len(y))) == estimator.C and estimator.n_iter_[0] == 9
    np.testing.assert_array_equal(estimator.coef_, np.atleast_2d(coef))
    assert_scores_as_predict(estimator, onnx_outputs(tmp_path / "m.onnx", new), new, new, written)


def test_export_errors_are_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    code, out, err = run_cli(["export", str(tmp_path / "empty"), "-o", str(tmp_path / "m.skops")], capsys)
    assert (code, out) == (2, "")
    assert err == (f"arrayjob: error: MODEL_URI: {tmp_path / 'empty'}: nothing published there "
                   "(no _SUCCESS; a run publishes it last)\n")
    model = publish_model(tmp_path / "tsqr", "tsqr", {"R": np.eye(2)})
    code, out, err = run_cli(["export", model, "-o", str(tmp_path / "m.skops")], capsys)
    assert (code, out) == (2, "")
    assert err == (f"arrayjob: error: MODEL_URI: the tsqr model of run 20250101T000000Z-handmade at {model} "
                   "cannot be exported (export writes models of: gmm, kmeans, linreg, logreg, pca)\n")
    # without the onnx extra: refused before anything is read
    import builtins

    real_import = builtins.__import__

    def no_skl2onnx(name, *args, **kwargs):
        if name.partition(".")[0] == "skl2onnx":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_skl2onnx)
    code, out, err = run_cli(["export", str(tmp_path / "empty"), "--format", "onnx", "-o", "m.onnx"], capsys)
    assert (code, err) == (2, f"arrayjob: error: {ONNX_EXTRA}\n")
    assert not list(tmp_path.glob("*.skops")) and not list(tmp_path.glob("*.onnx"))  # nothing written
