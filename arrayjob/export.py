"""A published model as a file other systems score with: a scikit-learn estimator (skops) or ONNX.

``arrayjob export MODEL_URI --format sklearn -o model.skops`` opens the model as ``predict``
does (``io.model``: ``_SUCCESS``, the run it names, its algorithm and parameters from that
run's report, never from the user), reads its fitted arrays whole (small: coefficients,
centroids), and builds the scikit-learn estimator with the fitted attributes set, so that its
``predict`` (and ``predict_proba``) give what ``predict`` writes for the same rows:

- ``logreg``: ``LogisticRegression`` (``coef_`` (1, d) for a binary model, (K, d) for a
  multinomial one, as scikit-learn lays them out; ``classes_`` 0..K−1), its hyperparameters
  mapped from the model's: ``C = 1/(n·(l1 + l2))`` (∞ without a penalty), ``l1_ratio =
  l1/(l1 + l2)`` with solver saga when ``l1`` > 0.
- ``linreg``: ``LinearRegression`` (l2 = 0), ``Ridge(alpha = l2·n)``, or, with an ``l1``
  penalty, ``ElasticNet(alpha = l1 + l2, l1_ratio = l1/(l1 + l2))``.
- ``kmeans``: ``KMeans`` (``cluster_centers_``, ``inertia_``, ``n_iter_``; the per-row
  ``labels_`` stay in result.zarr).

The estimator is saved with skops (``skops.io.dumps``), which loads without unpickling code:
``skops.io.load(path)`` (its types are scikit-learn's and NumPy's, trusted by default;
``skops.io.get_untrusted_types`` lists any other). ``--format onnx`` converts the
same estimator with skl2onnx (input ``X``: float64, n × d; outputs ``label`` and
``probabilities`` for a classifier, ``variable`` for a regressor, ``label`` and ``scores`` for
k-means), which needs the ``onnx`` extra (``pip install 'arrayjob[onnx]'``). The file is
written whole or not at all (a temporary file renamed into place).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from arrayjob.errors import InputError, SpecError, StorageError
from arrayjob.io.arrays import read_whole
from arrayjob.io.locations import Location, StorageOptions
from arrayjob.io.model import PublishedModel, open_model
from arrayjob.jobs import JOBS
from arrayjob.jobs.predict import model_arrays

FORMATS = ("sklearn", "onnx")
ONNX_EXTRA = "--format onnx: needs skl2onnx and onnx, the onnx extra: pip install 'arrayjob[onnx]'"


def _param(model: PublishedModel, name: str, default: Any = None) -> Any:
    """The model's parameter ``name``: as its spec set it, else its algorithm's default."""
    if name in model.params:
        return model.params[name]
    fields = {f.name: f for f in dataclasses.fields(JOBS[model.algorithm].Params)}
    f = fields.get(name)
    return f.default if f is not None and f.default is not dataclasses.MISSING else default


def _samples(model: PublishedModel) -> int | None:
    n = model.attrs.get("n_samples")
    return int(n) if isinstance(n, int) and n > 0 else None


def _logistic(model: PublishedModel, arrays: Mapping[str, np.ndarray], features: int) -> Any:
    from sklearn.linear_model import LogisticRegression

    coef = np.atleast_2d(arrays["coef"]).astype(np.float64)
    l1, l2, n = float(_param(model, "l1", 0.0)), float(_param(model, "l2", 0.0)), _samples(model)
    penalty = l1 + l2
    # C = ∞ without a penalty; scikit-learn's default 1 when the sample count is unknown
    c = np.inf if penalty == 0 else (1.0 / (n * penalty) if n else 1.0)
    estimator = LogisticRegression(C=c, fit_intercept=bool(_param(model, "fit_intercept", True)),
                                   tol=float(_param(model, "tol", 1e-4)), max_iter=int(_param(model, "max_iter", 100)))
    if l1 > 0:
        estimator.set_params(l1_ratio=l1 / penalty, solver="saga")
    estimator.coef_ = coef
    estimator.intercept_ = arrays["intercept"].astype(np.float64).reshape(coef.shape[0])
    estimator.classes_ = np.arange(max(2, coef.shape[0]))
    estimator.n_features_in_ = features
    estimator.n_iter_ = np.array([int(model.attrs.get("iterations", 0))], dtype=np.int32)
    return estimator


def _linear(model: PublishedModel, arrays: Mapping[str, np.ndarray], features: int) -> Any:
    from sklearn.linear_model import ElasticNet, LinearRegression, Ridge

    l1, l2, n = float(_param(model, "l1", 0.0)), float(_param(model, "l2", 0.0)), _samples(model)
    fit_intercept = bool(_param(model, "fit_intercept", True))
    estimator: Any
    if l1 > 0:
        estimator = ElasticNet(alpha=l1 + l2, l1_ratio=l1 / (l1 + l2), fit_intercept=fit_intercept)
    elif l2 > 0:
        estimator = Ridge(alpha=l2 * n if n else 1.0, fit_intercept=fit_intercept)
    else:
        estimator = LinearRegression(fit_intercept=fit_intercept)
    estimator.coef_ = arrays["coef"].astype(np.float64)
    estimator.intercept_ = np.float64(arrays["intercept"][0])  # as fit sets it (skl2onnx reshapes it)
    estimator.n_features_in_ = features
    return estimator


def _kmeans(model: PublishedModel, arrays: Mapping[str, np.ndarray], features: int) -> Any:
    from sklearn.cluster import KMeans
    from sklearn.utils._openmp_helpers import _openmp_effective_n_threads

    centroids = arrays["centroids"].astype(np.float64)
    init = _param(model, "init", "k-means++")
    estimator = KMeans(n_clusters=centroids.shape[0], init=init if init in ("k-means++", "random") else centroids,
                       n_init=1, max_iter=int(_param(model, "max_iter", 300)), tol=float(_param(model, "tol", 1e-4)),
                       random_state=int(_param(model, "seed", 0)))
    estimator.cluster_centers_ = centroids
    estimator.n_features_in_ = features
    estimator._n_features_out = centroids.shape[0]
    estimator.inertia_ = float(model.attrs.get("inertia", np.nan))
    estimator.n_iter_ = int(model.attrs.get("iterations", 0))
    estimator._n_threads = _openmp_effective_n_threads()  # what fit sets; predict reads it
    return estimator


# algorithm -> the scikit-learn estimator of its published models
ESTIMATORS: dict[str, Callable[[PublishedModel, Mapping[str, np.ndarray], int], Any]] = {
    "logreg": _logistic,
    "linreg": _linear,
    "kmeans": _kmeans,
}


def estimator_of(model: PublishedModel) -> Any:
    """The scikit-learn estimator of ``model``, its fitted attributes read from the model."""
    build = ESTIMATORS.get(model.algorithm)
    if build is None:
        raise InputError(f"{model.key}: {model.describe()} cannot be exported (export writes models of: "
                         f"{', '.join(sorted(ESTIMATORS))})")
    _, infos, features = model_arrays(model)  # the layout predict scores, checked from metadata
    arrays = {name: read_whole(info, model.options) for name, info in infos.items()}
    return build(model, arrays, features)


def _onnx(estimator: Any) -> bytes:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import DoubleTensorType

    options = {id(estimator): {"zipmap": False}} if hasattr(estimator, "predict_proba") else None
    onx = convert_sklearn(estimator, initial_types=[("X", DoubleTensorType([None, estimator.n_features_in_]))],
                          options=options)
    return onx.SerializeToString()


def _skops(estimator: Any) -> bytes:
    import skops.io

    return skops.io.dumps(estimator)


def export_model(location: Location, options: StorageOptions, fmt: str, path: str | Path) -> str:
    """Write the model published at ``location`` to the file ``path`` as ``fmt`` ("sklearn": a
    skops file, "onnx"); returns the line saying what was written."""
    if fmt not in FORMATS:
        raise SpecError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "onnx":
        try:  # checked before anything is read
            import onnx  # noqa: F401
            import skl2onnx  # noqa: F401
        except ImportError:
            raise SpecError(ONNX_EXTRA) from None
    model = open_model("model", location, options, key="MODEL_URI")
    estimator = estimator_of(model)
    data = _onnx(estimator) if fmt == "onnx" else _skops(estimator)
    _write(Path(path), data)
    return (f"wrote {path}: {type(estimator).__name__} ({fmt}, {len(data):,} bytes) from {model.describe()}")


def _write(path: Path, data: bytes) -> None:
    """``data`` into ``path`` whole: a temporary file beside it, renamed into place."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    except OSError as exc:
        raise StorageError(f"--output: cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise StorageError(f"--output: cannot write {path}: {exc.strerror or exc}") from None
