"""Batch scoring with a published model: ``algorithm = "predict"``.

Inputs: ``model``, the URI of a published arrayjob output (``io.model``: its ``_SUCCESS``
names the run; that run's report gives the algorithm and parameters, its result.zarr the
fitted arrays), and ``X`` (n × d), dense Zarr or a sparse CSR group, whose d must be the
model's feature count: checked from metadata as soon as X's shape is known, before anything
of X is read (``Job.check_shape``). The outputs are per row, written by the workers into the
run's result.zarr chunked like X's rows:

- ``logreg``, binary (coef (d,), intercept (1,)): ``label`` = [x·w + b > 0] (int64) and
  ``probability`` = σ(x·w + b), P(y = 1): scikit-learn's ``predict`` and
  ``predict_proba(X)[:, 1]``.
- ``logreg``, multinomial (coef (K, d), intercept (K,), scikit-learn's layout): ``label`` =
  argmax of z = Wx + b, ``probability`` (n, K) = softmax(z) (``predict_proba``).
- ``linreg``: ``prediction`` = x·w + b.
- ``kmeans``: ``label``, the nearest centroid, by k-means' own assignment
  (``algorithms.kmeans.nearest_centroid``: argmin ‖c‖² − 2x·c), so a model scores its training rows
  exactly as its fit labelled them.
- ``pca``: ``scores`` (n, k) = (X − mean) · componentsᵀ, as XVₖ − 1(μᵀVₖ) so a sparse X
  stays sparse (scikit-learn's ``transform``).
- ``gmm``: ``label``, the component of highest posterior, by the mixture's own pass
  (``algorithms.gmm.gmm_program``; scikit-learn's ``predict``).
- ``als``: X is an (n,) vector of user ids (integers 0..users − 1 of the model), not
  features; ``items`` (n, ``top_n``) are each user's ``top_n`` items by xᵤ·yᵢ, best first,
  and ``ratings`` (n, ``top_n``) those scores: Spark MLlib's ``recommendForUserSubset`` (and,
  with X every user id, ``recommendForAllUsers``), which, like this, does not leave out the
  items a user has rated (the model holds factors, not ratings). Ties come in any order.

A model of any other algorithm is refused in one line (exit 2) before X is read. Scoring
another algorithm is one entry in ``SCORERS``: the fitted arrays it reads, the feature count
they imply, the lazy program from X and those arrays (``la.value`` of each, by name), and what
the driver binds to those names (e.g. PCA: ``scores`` = (X − μ)Vᵀ, from ``mean`` and
``components``). Every program is one pass over X in one fused kernel per row block, and
keeps a sparse X sparse (the products visit its non-zeros only).

Cost: one pass over X (8nd bytes; sparse: its non-zeros), 2ndK flops (K: classes or
clusters; 1 for binary logreg and linreg), 8n bytes written per per-row output (8nK for
multinomial probabilities); the model's arrays (K × d floats) read once, whole, on the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from arrayjob import api as la
from arrayjob.algorithms.als.scoring import TopItems, TopItemsWork, UserIds
from arrayjob.algorithms.gmm import Mixture, gmm_program
from arrayjob.algorithms.kmeans import centroid_values, nearest_centroid
from arrayjob.api import (
    ArrayInfo,
    InputError,
    Job,
    JobContext,
    JobResult,
    Kernel,
    Pass,
    PublishedModel,
    StagePlan,
    Written,
    require,
    require_numeric,
)

Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class Scorer:
    """How ``predict`` scores with a model of one algorithm.

    ``arrays``: the fitted arrays it reads from the model's result.zarr. ``features``: the
    feature count their shapes imply (a ``ValueError`` saying what is wrong for a layout it
    cannot score). ``program``: the per-row outputs from X and ``la.value`` arrays named as
    ``values`` binds them. ``values``: what the driver binds, from the arrays as read.
    ``ids``: X is not features but an (n,) vector of ids of the model's rows (ALS's users),
    checked where each block is read by ``check(count)``, ``count`` from the shapes.
    """

    arrays: tuple[str, ...]
    features: Callable[[Shapes], int]
    program: Callable[[la.BlockArray, Shapes, ScoreOptions], dict[str, la.BlockArray]]
    values: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    ids: Callable[[Shapes], int] | None = None


@dataclass(frozen=True)
class ScoreOptions:
    """What a program takes beyond X and the model: X's rows per block, and ``params.top_n``."""

    rows: int
    top_n: int


def _classes(shapes: Shapes) -> int:
    """K of a logistic-regression model: 2 for the binary layout (coef (d,) or (1, d))."""
    coef = shapes["coef"]
    return coef[0] if len(coef) == 2 and coef[0] > 1 else 2


def _logreg_features(shapes: Shapes) -> int:
    coef, intercept = shapes["coef"], shapes["intercept"]
    if (len(coef) == 1 and intercept == (1,)) or (len(coef) == 2 and intercept == (coef[0],)):
        return coef[-1]
    raise ValueError(f"coef {coef} and intercept {intercept}: expected (d,) and (1,), or (K, d) and (K,)")


def _logreg_program(X: la.BlockArray, shapes: Shapes, options: ScoreOptions) -> dict[str, la.BlockArray]:
    k, d = _classes(shapes), shapes["coef"][-1]
    if k == 2:
        z = X @ la.value("coef", (d,)) + la.value("intercept", ())
        return {"label": (z > 0.0) * 1, "probability": la.sigmoid(z)}
    z = X @ la.value("coef", (k, d)).T + la.value("intercept", (k,))
    e = la.exp(z - z.max(axis=1, keepdims=True))
    return {"label": z.argmax(axis=1, keepdims=True).sum(axis=1),  # (n, 1) -> (n,)
            "probability": e / e.sum(axis=1, keepdims=True)}


def _logreg_values(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    coef, intercept = arrays["coef"].astype(np.float64), arrays["intercept"].astype(np.float64)
    if _classes({"coef": coef.shape}) == 2:
        return {"coef": coef.reshape(-1), "intercept": np.asarray(intercept[0])}
    return {"coef": coef, "intercept": intercept}


def _linreg_features(shapes: Shapes) -> int:
    coef, intercept = shapes["coef"], shapes["intercept"]
    if len(coef) == 1 and intercept == (1,):
        return coef[0]
    raise ValueError(f"coef {coef} and intercept {intercept}: expected (d,) and (1,)")


def _linreg_program(X: la.BlockArray, shapes: Shapes, options: ScoreOptions) -> dict[str, la.BlockArray]:
    return {"prediction": X @ la.value("coef", shapes["coef"]) + la.value("intercept", ())}


def _linreg_values(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"coef": arrays["coef"].astype(np.float64), "intercept": np.asarray(float(arrays["intercept"][0]))}


def _kmeans_features(shapes: Shapes) -> int:
    centroids = shapes["centroids"]
    if len(centroids) == 2 and centroids[0] >= 1:
        return centroids[1]
    raise ValueError(f"centroids {centroids}: expected (k, d)")


def _kmeans_program(X: la.BlockArray, shapes: Shapes, options: ScoreOptions) -> dict[str, la.BlockArray]:
    _, _, labels = nearest_centroid(X, shapes["centroids"][0])
    return {"label": labels.sum(axis=1)}  # (n, 1) -> (n,)


def _kmeans_values(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return centroid_values(arrays["centroids"].astype(np.float64))


def _pca_features(shapes: Shapes) -> int:
    components, mean = shapes["components"], shapes["mean"]
    if len(components) == 2 and mean == (components[1],):
        return components[1]
    raise ValueError(f"components {components} and mean {mean}: expected (k, d) and (d,)")


def _pca_program(X: la.BlockArray, shapes: Shapes, options: ScoreOptions) -> dict[str, la.BlockArray]:
    k, d = shapes["components"]
    # X Vₖ − 1(μᵀVₖ): the centring applied to the product, so a sparse X stays sparse
    return {"scores": X @ la.value("basis", (d, k)) - la.value("shift", (k,))}


def _pca_values(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    components, mean = arrays["components"].astype(np.float64), arrays["mean"].astype(np.float64)
    return {"basis": np.ascontiguousarray(components.T), "shift": mean @ components.T}


def _gmm_features(shapes: Shapes) -> int:
    weights, means, covariances = shapes["weights"], shapes["means"], shapes["covariances"]
    if len(means) == 2 and weights == (means[0],) and covariances in (means, (*means, means[1])):
        return means[1]
    raise ValueError(f"weights {weights}, means {means} and covariances {covariances}: "
                     "expected (k,), (k, d) and (k, d, d) or (k, d)")


def _gmm_program(X: la.BlockArray, shapes: Shapes, options: ScoreOptions) -> dict[str, la.BlockArray]:
    k, _ = shapes["means"]
    covariance = "full" if len(shapes["covariances"]) == 3 else "diag"
    return {"label": gmm_program(X, k, covariance, final=True)["labels"]}


def _gmm_values(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    mixture = Mixture(*(arrays[name].astype(np.float64) for name in ("weights", "means", "covariances")))
    return mixture.pass_values(np.zeros(mixture.means.shape[1]), "of the model")


def _als_features(shapes: Shapes) -> int:
    users, items = shapes["user_factors"], shapes["item_factors"]
    if len(users) == 2 and len(items) == 2 and users[1] == items[1]:
        return users[1]
    raise ValueError(f"user_factors {users} and item_factors {items}: expected (users, rank) and (items, rank)")


def _als_program(X: la.BlockArray, shapes: Shapes, options: ScoreOptions) -> dict[str, la.BlockArray]:
    (n,), (users, rank), (items, _) = X.shape, shapes["user_factors"], shapes["item_factors"]
    top = TopItems(options.top_n)
    items_out, ratings = la.map_blocks(
        Kernel("als_top_items", top), X, la.value("user_factors", (users, rank)),
        la.value("item_factors", (items, rank)),
        outputs=[((n, options.top_n), "int64", options.rows), ((n, options.top_n), "float64", options.rows)],
        block_rows=[options.rows, None, None], cost=TopItemsWork(items, rank, options.top_n))
    return {"items": items_out, "ratings": ratings}


def _als_values(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: arrays[name].astype(np.float64) for name in ("user_factors", "item_factors")}


# algorithm -> how its published models score new rows
SCORERS: dict[str, Scorer] = {
    "logreg": Scorer(("coef", "intercept"), _logreg_features, _logreg_program, _logreg_values),
    "linreg": Scorer(("coef", "intercept"), _linreg_features, _linreg_program, _linreg_values),
    "kmeans": Scorer(("centroids",), _kmeans_features, _kmeans_program, _kmeans_values),
    "pca": Scorer(("components", "mean"), _pca_features, _pca_program, _pca_values),
    "gmm": Scorer(("weights", "means", "covariances"), _gmm_features, _gmm_program, _gmm_values),
    "als": Scorer(("user_factors", "item_factors"), _als_features, _als_program, _als_values,
                  ids=lambda shapes: shapes["user_factors"][0]),
}


def scorer_for(model: PublishedModel) -> Scorer:
    """The scorer of ``model``'s algorithm; ``InputError`` (exit 2) if predict cannot score it."""
    try:
        return SCORERS[model.algorithm]
    except KeyError:
        raise InputError(f"{model.key}: {model.describe()} cannot be scored by predict "
                         f"(it scores models of: {', '.join(sorted(SCORERS))})") from None


def model_arrays(model: PublishedModel) -> tuple[Scorer, dict[str, ArrayInfo], int]:
    """The scorer of ``model``, the metadata of the arrays it reads, and the model's feature
    count (metadata only)."""
    scorer = scorer_for(model)
    infos = {name: model.array(name) for name in scorer.arrays}
    try:
        features = scorer.features({name: info.shape for name, info in infos.items()})
    except ValueError as exc:
        raise InputError(f"{model.key}: {model.describe()} has {exc}") from None
    return scorer, infos, features


@dataclass(frozen=True)
class PredictParams:
    """How to score comes from the model; of an ALS model, how many items each user gets."""

    top_n: int = field(default=10, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})


class Predict(Job):
    name = "predict"
    title = "scoring"
    inputs = ("model", "X")
    model_inputs = ("model",)
    sparse_inputs = ("X",)
    row_input = "X"  # scores, one (or a row of them) per row of X
    Params = PredictParams
    params: PredictParams

    @classmethod
    def check_shape(cls, name: str, shape: tuple[int, ...], models: Mapping[str, PublishedModel]) -> None:
        if name != "X" or "model" not in models:
            return
        model = models["model"]
        scorer, _, features = model_arrays(model)
        if scorer.ids is not None:
            require(len(shape) == 1, f"inputs.X: {model.describe()} scores users: expected an (n,) vector of their "
                                     f"ids, got shape {shape}")
            return
        if len(shape) != 2:
            return
        require(shape[1] == features, f"inputs.X: {shape[1]:,} features (columns) but {model.describe()} "
                                      f"was fitted on {features:,}")

    def check_inputs(self) -> None:
        require("model" in self.models, "inputs.model: required input of predict is missing")
        X = self.arrays["X"]
        self.model = self.models["model"]
        self.scorer, infos, self.features = model_arrays(self.model)
        if self.scorer.ids is None:
            require(X.ndim == 2, f"inputs.X: expected a 2-D array (rows × features), got shape {X.shape}")
        require(X.shape[0] > 0, f"inputs.X: expected at least one row, got shape {X.shape}")
        require_numeric(X)
        self.check_shape("X", X.shape, self.models)
        if self.scorer.ids is not None:
            items = infos["item_factors"].shape[0]
            require(self.params.top_n <= items, f"params.top_n: {self.params.top_n:,} items a user, but "
                                                f"{self.model.describe()} has {items:,} items")
        # read whole on the driver in "load" (and so priced there by the estimate)
        self.arrays.update({info.name: info for info in infos.values()})

    def _model_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: self.arrays[f"model.{name}"].shape for name in self.scorer.arrays}

    def describe(self) -> str:
        X = self.arrays["X"]
        kind = ", sparse" if X.sparse is not None else ""
        what = f"{X.shape[0]:,} user ids, top {self.params.top_n}" if self.scorer.ids is not None else \
            f"{X.shape[0]:,} × {X.shape[1]:,}{kind}"
        return f"{self.title} with the {self.model.algorithm} model of run {self.model.run_id} on X {what}"

    def stages(self, workers: int) -> StagePlan:
        """One pass over X computing every per-row output, which the workers write."""
        shapes = self._model_shapes()
        ids = self.scorer.ids
        check = Kernel("predict_user_ids", UserIds(ids(shapes))) if ids is not None else None
        X = la.from_input(self.arrays["X"], check)
        rows = self.arrays["X"].chunks[0]
        program = self.scorer.program(X, shapes, ScoreOptions(rows, self.params.top_n))
        writes = {name: Written(x.shape, (rows, *x.shape[1:]), x.dtype, self.arrays["X"]) for name, x in program.items()}
        return StagePlan((Pass("score", "score", program, writes=writes),))

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        p = self.stages(1).pass_named("score")
        return [(w.shape, w.dtype, w.chunks[0]) for w in p.writes.values()]

    def _values(self, ctx: JobContext) -> dict[str, np.ndarray]:
        """The model's arrays, read whole on the driver (counted), as the program binds them."""
        read = {name: ctx.read_whole(self.arrays[f"model.{name}"])
                for name in self.scorer.arrays}
        for name, value in read.items():
            if np.dtype(value.dtype).kind not in "biuf" or not np.isfinite(value).all():
                raise InputError(f"{self.model.key}: {self.model.describe()}: {name} holds NaN, infinite or "
                                 "non-numeric values")
        return self.scorer.values(read)

    def run(self, ctx: JobContext) -> JobResult:
        n, d = self.arrays["X"].shape[0], self.features
        plan = self.stages(ctx.workers)
        score = plan.pass_named("score")
        # per-row outputs (8n bytes each) are written by the workers: X's blocks are loaded for
        # the program that writes them (whose results are the writes' counts, not the outputs),
        # as the estimate prices it
        program = ctx.writing(score) if ctx.writes_result else plan["score"]
        with ctx.stage("load"):
            values = self._values(ctx)
            ctx.load(program)
        arrays: dict[str, np.ndarray] = {}
        with ctx.stage(score.stage):
            if ctx.writes_result:
                r = ctx.compute(program, values)
                ctx.count_writes(score, r)
            else:
                arrays = ctx.compute(plan["score"], values)
        model = self.model
        attrs = {"rows": n, "n_features": d, "model": str(model.location), "model_run_id": model.run_id,
                 "model_algorithm": model.algorithm, "outputs": list(score.writes)}
        if model.algorithm == "logreg":
            attrs["classes"] = _classes(self._model_shapes())
        if self.scorer.ids is not None:
            attrs["top_n"] = self.params.top_n
        summary = [f"scored {n:,} rows with {model.describe()}: {', '.join(score.writes)}"]
        return JobResult(arrays, attrs, summary)
