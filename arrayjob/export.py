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
- ``pca``: ``PCA`` (``components_``, ``mean_`` — zeros for ``center = false``, whose scores
  are then the truncated SVD's —, ``singular_values_``, ``explained_variance_`` and its ratio,
  ``noise_variance_`` from the model's ``total_variance``), so ``transform`` gives predict's
  ``scores``.
- ``gmm``: ``GaussianMixture`` (``weights_``, ``means_``, ``covariances_`` and the precisions
  scikit-learn derives from them, ``lower_bound_``, ``n_iter_``, ``converged_``), so
  ``predict`` gives predict's ``label`` and ``predict_proba`` the posteriors.

The estimator is saved with skops (``skops.io.dumps``), which loads without unpickling code:
``skops.io.load(path)`` (its types are scikit-learn's and NumPy's, trusted by default;
``skops.io.get_untrusted_types`` lists any other). ``--format onnx`` converts the
same estimator with skl2onnx (input ``X``: float64, n × d; outputs ``label`` and
``probabilities`` for a classifier and for a mixture, ``variable`` for a regressor and for PCA's
scores, ``label`` and ``scores`` for k-means), which needs the ``onnx`` extra (``pip install 'arrayjob[onnx]'``). The file is
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

from arrayjob.algorithms import JOBS
from arrayjob.algorithms.predict import model_arrays
from arrayjob.errors import InputError, SpecError, StorageError
from arrayjob.io.arrays import read_whole
from arrayjob.io.locations import Location, StorageOptions
from arrayjob.io.model import PublishedModel, open_model

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


def _pca(model: PublishedModel, arrays: Mapping[str, np.ndarray], features: int) -> Any:
    from sklearn.decomposition import PCA

    components = arrays["components"].astype(np.float64)
    k = components.shape[0]
    exact = model.attrs.get("method", "exact") == "exact"
    estimator = PCA(n_components=k, svd_solver="full" if exact else "randomized",
                    iterated_power=int(_param(model, "n_iter", 4)), n_oversamples=int(_param(model, "n_oversamples", 10)),
                    random_state=int(_param(model, "seed", 0)))
    estimator.components_ = components
    estimator.mean_ = arrays["mean"].astype(np.float64)
    estimator.n_components_ = k
    estimator.n_features_in_ = features
    estimator.singular_values_ = arrays["singular_values"].astype(np.float64)
    variance = arrays["explained_variance"].astype(np.float64)
    estimator.explained_variance_ = variance
    estimator.explained_variance_ratio_ = arrays["explained_variance_ratio"].astype(np.float64)
    n = _samples(model)
    estimator.n_samples_ = n or 0
    # scikit-learn's: the mean of the variances of the components left out (0 when none is)
    rest = min(n or features, features) - k
    total = float(model.attrs.get("total_variance", variance.sum()))
    estimator.noise_variance_ = max(total - float(variance.sum()), 0.0) / rest if rest > 0 else 0.0
    return estimator


def _gmm(model: PublishedModel, arrays: Mapping[str, np.ndarray], features: int) -> Any:
    from scipy.linalg import cholesky, solve_triangular
    from sklearn.mixture import GaussianMixture

    weights, means = arrays["weights"].astype(np.float64), arrays["means"].astype(np.float64)
    covariances = arrays["covariances"].astype(np.float64)
    full = covariances.ndim == 3
    init = _param(model, "init", "k-means++")
    estimator = GaussianMixture(n_components=means.shape[0], covariance_type="full" if full else "diag",
                                reg_covar=float(_param(model, "reg_covar", 1e-6)), tol=float(_param(model, "tol", 1e-3)),
                                max_iter=int(_param(model, "max_iter", 100)), random_state=int(_param(model, "seed", 0)),
                                init_params=init if init in ("k-means++", "random") else "kmeans")
    if full:  # scikit-learn's _compute_precision_cholesky: Lᵀ⁻¹ of each covariance's Cholesky L
        chol = np.stack([solve_triangular(cholesky(c, lower=True), np.eye(features), lower=True).T
                         for c in covariances])
        precisions = chol @ chol.transpose(0, 2, 1)
    else:
        chol = 1.0 / np.sqrt(covariances)
        precisions = chol**2
    estimator.weights_, estimator.means_, estimator.covariances_ = weights, means, covariances
    estimator.precisions_cholesky_, estimator.precisions_ = chol, precisions
    estimator.n_features_in_ = features
    estimator.lower_bound_ = float(model.attrs.get("lower_bound", -np.inf))
    estimator.lower_bounds_ = [estimator.lower_bound_]
    estimator.n_iter_ = int(model.attrs.get("iterations", 0))
    estimator.converged_ = bool(model.attrs.get("converged", False))
    return estimator


# algorithm -> the scikit-learn estimator of its published models, and the fitted arrays it
# reads beside those predict scores with
ESTIMATORS: dict[str, tuple[Callable[[PublishedModel, Mapping[str, np.ndarray], int], Any], tuple[str, ...]]] = {
    "logreg": (_logistic, ()),
    "linreg": (_linear, ()),
    "kmeans": (_kmeans, ()),
    "pca": (_pca, ("singular_values", "explained_variance", "explained_variance_ratio")),
    "gmm": (_gmm, ()),
}


def estimator_of(model: PublishedModel) -> Any:
    """The scikit-learn estimator of ``model``, its fitted attributes read from the model."""
    if model.algorithm not in ESTIMATORS:
        raise InputError(f"{model.key}: {model.describe()} cannot be exported (export writes models of: "
                         f"{', '.join(sorted(ESTIMATORS))})")
    build, more = ESTIMATORS[model.algorithm]
    _, infos, features = model_arrays(model)  # the layout predict scores, checked from metadata
    infos |= {name: model.array(name) for name in more}
    arrays = {name: read_whole(info, model.options) for name, info in infos.items()}
    return build(model, arrays, features)


def _onnx(estimator: Any) -> bytes:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import DoubleTensorType
    from sklearn.base import is_classifier

    # a classifier's probabilities as one (n, K) tensor, not ONNX-ML's list of maps
    options = {id(estimator): {"zipmap": False}} if is_classifier(estimator) else None
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
