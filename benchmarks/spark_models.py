"""Spark MLlib's side of the sparse rows (issue 24) and the models rows (issue 26), in a process
of its own as benchmarks/spark_peer.py runs the dense ones, with its session, reading and
counting helpers: ``local[2]``, the data cached and counted before any fit, native BLAS where the
JVM finds it.

    python benchmarks/spark_models.py WORKLOAD PARQUET --out FILE.json --driver-memory 4g
                                      [--repeat 3] [--params JSON]

WORKLOAD is one of ``FITS``; PARQUET was written by spark_peer's ``write_parquet`` (dense),
``write_sparse_parquet`` (sparse vectors) or ``write_ratings_parquet`` (ALS). The fit runs
``--repeat`` + 1 times in one session (the first is the JIT's warm-up); FILE.json holds each
run's seconds, passes (Spark jobs in the fit's job group) and iterations, and FILE.npz the last
run's fitted arrays, for benchmarks/bench_spark_models.py to compare with arrayjob's.

How arrayjob's parameters map to MLlib's (``penalty``): arrayjob's penalty l1‖w‖₁ + (l2/2)‖w‖²
is MLlib's regParam·(α‖w‖₁ + (1 − α)/2·‖w‖²) with regParam = l1 + l2 and elasticNetParam
α = l1/(l1 + l2), ``standardization=False`` so that it applies to w itself, intercepts
unpenalised on both sides. MLlib's LinearRegression minimises on y/σ_y (σ_y: the label's
sample standard deviation) and scales regParam by 1/σ_y, which leaves the L1 term as it is but
divides the L2 term by σ_y, so its regParam·(1 − α) is l2·σ_y there (``linreg_penalty``).

Where the DataFrame API takes no start, the RDD API beneath it does: KMeans and GaussianMixture
run ``mllib.clustering`` (what ``ml.clustering.KMeans`` itself calls) on the cached vectors
(``DatasetUtils.columnToOldVector``, cached and counted) from the given start. ALS takes no
start in either API (its factors are drawn from its seed): its result is compared by objective
and RMSE, not factors.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import spark_peer
from spark_peer import FEATURES, LABEL, fit


def penalty(l1: float, l2: float) -> tuple[float, float]:
    """(regParam, elasticNetParam) for arrayjob's l1‖w‖₁ + (l2/2)‖w‖²."""
    total = l1 + l2
    return total, (l1 / total if total else 0.0)


def linreg_penalty(l1: float, l2: float, label_std: float) -> tuple[float, float]:
    """(regParam, elasticNetParam) for LinearRegression, whose L2 term is divided by σ_y."""
    total = l1 + l2 * label_std
    return total, (l1 / total if total else 0.0)


Fitted = tuple[dict[str, Any], dict[str, np.ndarray]]


def logreg(spark: Any, df: Any, p: dict[str, Any], run: int) -> Fitted:
    """LogisticRegression (binomial or multinomial, L2 or elastic net: OWL-QN when l1 > 0)."""
    from pyspark.ml.classification import LogisticRegression

    reg, alpha = penalty(p.get("l1", 0.0), p["l2"])
    estimator = LogisticRegression(featuresCol=FEATURES, labelCol=LABEL, family=p.get("family", "binomial"),
                                   regParam=reg, elasticNetParam=alpha, standardization=False, fitIntercept=True,
                                   maxIter=p["max_iter"], tol=p["tol"])
    model, seconds, passes = fit(spark, estimator, df, f"logreg-{run}")
    summary = model.summary
    multinomial = p.get("family") == "multinomial"
    coef = model.coefficientMatrix.toArray() if multinomial else model.coefficients.toArray()
    intercept = model.interceptVector.toArray() if multinomial else np.array([model.intercept])
    return ({"seconds": seconds, "passes": passes, "iterations": int(summary.totalIterations),
             "objective": float(summary.objectiveHistory[-1]), "regParam": reg, "elasticNetParam": alpha},
            {"coef": coef, "intercept": intercept})


def linreg(spark: Any, df: Any, p: dict[str, Any], run: int) -> Fitted:
    """LinearRegression with an elastic net (OWL-QN), arrayjob's penalty by ``linreg_penalty``."""
    from pyspark.ml.regression import LinearRegression
    from pyspark.sql import functions as F

    label_std = float(df.agg(F.stddev(LABEL)).first()[0])
    reg, alpha = linreg_penalty(p["l1"], p["l2"], label_std)
    estimator = LinearRegression(featuresCol=FEATURES, labelCol=LABEL, solver="l-bfgs", regParam=reg,
                                 elasticNetParam=alpha, standardization=False, fitIntercept=True,
                                 maxIter=p["max_iter"], tol=p["tol"])
    model, seconds, passes = fit(spark, estimator, df, f"linreg-{run}")
    return ({"seconds": seconds, "passes": passes, "iterations": int(model.summary.totalIterations),
             "regParam": reg, "elasticNetParam": alpha, "label_std": label_std},
            {"coef": model.coefficients.toArray(), "intercept": np.array([model.intercept])})


def _old_vectors(spark: Any, df: Any, p: dict[str, Any]) -> Any:
    """The cached DataFrame's vectors as the RDD the mllib API takes, cached and counted once (so
    each fit reads cached vectors, as the DataFrame API's fits do)."""
    if "_rdd" in p:
        return p["_rdd"]
    rdd = p["_rdd"] = spark._jvm.org.apache.spark.ml.util.DatasetUtils.columnToOldVector(df._jdf, FEATURES)
    rdd.cache()
    rdd.count()
    return rdd


def kmeans(spark: Any, df: Any, p: dict[str, Any], run: int) -> Fitted:
    """mllib KMeans (Lloyd, epsilon 0) from the centres in ``p["init"]`` (a .npy of (k, d))."""
    from pyspark.mllib.common import _java2py, _py2java
    from pyspark.mllib.linalg import DenseVector

    sc, jvm = spark.sparkContext, spark._jvm
    rdd = _old_vectors(spark, df, p)
    start = _py2java(sc, [DenseVector(c) for c in np.load(p["init"])])
    algorithm = (jvm.org.apache.spark.mllib.clustering.KMeans().setK(p["k"]).setMaxIterations(p["max_iter"])
                 .setEpsilon(0.0).setInitialModel(jvm.org.apache.spark.mllib.clustering.KMeansModel(start)))
    with spark_peer.Passes(spark, f"kmeans-{run}") as passes:
        began = time.perf_counter()
        model = algorithm.run(rdd)
        seconds = time.perf_counter() - began
    centres = np.array([c.toArray() for c in _java2py(sc, model.clusterCenters())])
    return ({"seconds": seconds, "passes": passes.count, "iterations": int(model.numIter()),
             "training_cost": float(model.trainingCost())}, {"centres": centres})


def gmm(spark: Any, df: Any, p: dict[str, Any], run: int) -> Fitted:
    """mllib GaussianMixture (full covariances, EM, convergenceTol 0) from the weights, means and
    covariances in ``p["init"]`` (a .npz)."""
    from pyspark.mllib.clustering import GaussianMixtureModel
    from pyspark.mllib.common import _py2java
    from pyspark.mllib.linalg import DenseMatrix, DenseVector

    sc = spark.sparkContext
    rdd = _old_vectors(spark, df, p)
    start = np.load(p["init"])
    d = start["means"].shape[1]
    weights = _py2java(sc, [float(w) for w in start["weights"]])
    means = _py2java(sc, [DenseVector(m) for m in start["means"]])
    covariances = _py2java(sc, [DenseMatrix(d, d, c.ravel(order="F")) for c in start["covariances"]])
    api = sc._jvm.org.apache.spark.mllib.api.python.PythonMLLibAPI()
    with spark_peer.Passes(spark, f"gmm-{run}") as passes:
        began = time.perf_counter()
        wrapper = api.trainGaussianMixtureModel(rdd.toJavaRDD(), len(start["weights"]), 0.0, p["max_iter"],
                                                p.get("seed", 0), weights, means, covariances)
        seconds = time.perf_counter() - began
    model = GaussianMixtureModel(wrapper)
    return ({"seconds": seconds, "passes": passes.count, "iterations": p["max_iter"]},
            {"weights": np.asarray(model.weights), "means": np.array([g.mu.toArray() for g in model.gaussians]),
             "covariances": np.array([g.sigma.toArray() for g in model.gaussians])})


def pca(spark: Any, df: Any, p: dict[str, Any], run: int) -> Fitted:
    """ml.feature.PCA (RowMatrix.computePrincipalComponentsAndExplainedVariance: the covariance
    matrix in one pass, then its eigendecomposition on the driver); centred, as arrayjob's."""
    from pyspark.ml.feature import PCA

    model, seconds, passes = fit(spark, PCA(k=p["k"], inputCol=FEATURES, outputCol="scores"), df, f"pca-{run}")
    return ({"seconds": seconds, "passes": passes},
            {"components": model.pc.toArray().T, "explained_variance_ratio": model.explainedVariance.toArray()})


def als(spark: Any, df: Any, p: dict[str, Any], run: int) -> Fitted:
    """ml ALS, explicit, weighted-λ (regParam scaled by each user's and item's ratings, as
    arrayjob's l2), its own start from ``seed``; the factors indexed by user and item id."""
    from pyspark.ml.recommendation import ALS

    estimator = ALS(rank=p["rank"], maxIter=p["max_iter"], regParam=p["l2"], implicitPrefs=False, nonnegative=False,
                    userCol="user", itemCol="item", ratingCol="rating", seed=p.get("seed", 0),
                    numUserBlocks=2, numItemBlocks=2, intermediateStorageLevel="MEMORY_ONLY",
                    finalStorageLevel="MEMORY_ONLY")
    model, seconds, passes = fit(spark, estimator, df, f"als-{run}")
    arrays = {}
    for name, factors, count in (("user_factors", model.userFactors, p["users"]),
                                 ("item_factors", model.itemFactors, p["items"])):
        table = factors.toPandas()
        out = np.zeros((count, p["rank"]))
        out[table["id"].to_numpy()] = np.stack(table["features"].to_numpy())
        arrays[name] = out
    return {"seconds": seconds, "passes": passes, "iterations": p["max_iter"]}, arrays


# workload -> (how its Parquet is read, the fit)
_SCORER: dict[str, Any] = {}  # score's model, fitted once a process (not timed)


def score(spark: Any, df: Any, p: dict[str, Any], run: int) -> Fitted:
    """A fitted multinomial LogisticRegressionModel scoring X: ``transform`` to (prediction,
    probability), written as Parquet under ``p["out"]``, as arrayjob's predict writes its label and
    probability. MLlib's model cannot be given arrayjob's coefficients, so it is fitted here once
    with the same objective (not timed) and the labels are compared by their counts per class."""
    from pyspark.ml.classification import LogisticRegression

    if "model" not in _SCORER:
        estimator = LogisticRegression(featuresCol=FEATURES, labelCol=LABEL, family="multinomial", regParam=p["l2"],
                                       elasticNetParam=0.0, standardization=False, fitIntercept=True,
                                       maxIter=p["max_iter"], tol=p["tol"])
        _SCORER["model"] = estimator.fit(df)
    model = _SCORER["model"]
    target = Path(p["out"]) / f"scores-{run}"
    with spark_peer.Passes(spark, f"score-{run}") as passes:
        start = time.perf_counter()
        model.transform(df).select("prediction", "probability").write.mode("overwrite").parquet(str(target))
        seconds = time.perf_counter() - start
    counted = spark.read.parquet(str(target)).groupBy("prediction").count().collect()
    counts = {int(r["prediction"]): int(r["count"]) for r in counted}
    labels = np.array([counts.get(k, 0) for k in range(int(p["classes"]))])
    return ({"seconds": seconds, "passes": passes.count},
            {"coef": model.coefficientMatrix.toArray(), "label_counts": labels})


FITS: dict[str, tuple[str, Callable[[Any, Any, dict[str, Any], int], Fitted]]] = {
    "sparse-logreg": ("sparse", logreg), "sparse-kmeans": ("sparse", kmeans), "logreg": ("dense", logreg),
    "linreg": ("dense", linreg), "pca": ("dense", pca), "gmm": ("dense", gmm), "als": ("ratings", als),
    "score": ("dense", score),
}


def load(spark: Any, how: str, parquet: Path) -> tuple[Any, float]:
    if how == "sparse":
        return spark_peer.read_sparse(spark, parquet)
    if how == "ratings":
        start = time.perf_counter()
        return spark_peer.cached(spark.read.parquet(str(parquet)), start)
    return spark_peer.read(spark, parquet)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted(FITS))
    parser.add_argument("parquet", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--driver-memory", required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--params", type=json.loads, default={})
    a = parser.parse_args()
    how, fitter = FITS[a.workload]
    spark = spark_peer.session(a.driver_memory)
    df, read_seconds = load(spark, how, a.parquet)
    spark_peer.say(f"{a.workload}: read + cache {read_seconds:.3g} s")
    out: dict[str, Any] = {"blas": spark_peer.native_blas(spark), "driver_memory": a.driver_memory,
                           "spark": spark.version, "read_seconds": read_seconds, "rows": int(df.count()),
                           "partitions": int(df.rdd.getNumPartitions()), "runs": []}
    params = dict(a.params)
    arrays: dict[str, np.ndarray] = {}
    for run in range(a.repeat + 1):  # run 0 is the warm-up (the JIT compiles the kernels)
        result, arrays = fitter(spark, df, params, run)
        out["runs"].append(result)
        spark_peer.say(f"{a.workload}: fit {result['seconds']:.3g} s ({result['passes']} passes)")
    spark.stop()
    np.savez(a.out.with_suffix(".npz"), **arrays)
    a.out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
