"""Spark MLlib, the peer a team running batch ML on a cluster uses today (issue 28), at its best
on one machine: ``local[2]``, the data read from Parquet written from the same arrays arrayjob
reads, assembled into vectors, cached and counted before any fit; few shuffle partitions; no UI;
the driver's memory sized to the data; native BLAS where the JVM finds it.

    python benchmarks/spark_peer.py fits DIR --out FILE.json [--init C0.npy] [--repeat 3] [--driver-memory 4g]
    python benchmarks/spark_peer.py job DIR --out FILE.json [--driver-memory 4g]

``fits`` times, in one Spark session: the read (Parquet → vectors → cache → count), logistic
regression (L-BFGS, the same objective as arrayjob's logreg: mean log loss + (l2/2)‖w‖²,
``standardization=False``), linear regression (``solver="normal"``, no penalty) and KMeans
(Lloyd, ``tol = 0``; the start is given, see ``kmeans_start``), and writes the times, the
passes over the data each fit made (Spark jobs in the fit's job group: one ``treeAggregate`` per
L-BFGS evaluation), the coefficients and centres as JSON. ``job`` is the whole logistic
regression job from a cold process, as spark-submit would run it: start Spark, read, fit, write
the coefficients. Both run in a process of their own so the benchmark can read the peak memory of
its process tree (Python and the JVM).

pyspark and Java >= 17 are needed (``make bench`` installs them); ``missing()`` says what is not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

FEATURES = "features"
LABEL = "label"
JAVA_MIN = 17
DRIVER_MEMORY_CAP = 6 * 2**30  # the machine is shared: ARRAYJOB_SPARK_DRIVER_MEMORY overrides


def java_major() -> int | None:
    """The major version of ``java`` on PATH (or JAVA_HOME's), None when there is none."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8" is Java 8


def missing() -> str | None:
    """Why the Spark peer cannot run here (one line), or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install -e '.[bench]')"
    major = java_major()
    if major is None:
        return "no java on PATH (Debian: apt-get install openjdk-17-jre-headless)"
    if major < JAVA_MIN:
        return f"java {major} is older than Spark 4 needs ({JAVA_MIN})"
    return None


def driver_memory(data_bytes: int) -> str:
    """Four times the data (the cached vectors, the Parquet pages being decoded, each fit's
    per-partition buffers) and 2 GiB for the JVM's own (with less, a 0.26 GB X spent two thirds
    of its CPU time in GC), at most ``DRIVER_MEMORY_CAP``; ARRAYJOB_SPARK_DRIVER_MEMORY wins."""
    if os.environ.get("ARRAYJOB_SPARK_DRIVER_MEMORY"):
        return os.environ["ARRAYJOB_SPARK_DRIVER_MEMORY"]
    want = min(DRIVER_MEMORY_CAP, 4 * data_bytes + 2 * 2**30)
    return f"{-(-want // 2**20)}m"


# -- the data --------------------------------------------------------------------------------


def _written(where: Path, want: dict[str, Any]) -> bool:
    """True when ``where`` already holds these files (its marker says so); else empties it."""
    marker = where / "_written.json"
    if marker.exists() and json.loads(marker.read_text()) == want:
        return True
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    return False


def _mark(where: Path, want: dict[str, Any]) -> Path:
    (where / "_written.json").write_text(json.dumps(want))
    return where


def write_parquet(X: Any, y: Any, where: Path, rows_per_file: int) -> Path:
    """X's columns (x0 … x{d-1}) and y (``label``; none when y is None) as Parquet files of
    ``rows_per_file`` rows, float64, from any arrays that slice (zarr arrays: one file's rows read
    at a time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    want = {"shape": list(X.shape), "rows_per_file": rows_per_file, "label": y is not None}
    if _written(where, want):
        return where
    n, d = X.shape
    for i, start in enumerate(range(0, n, rows_per_file)):
        block = np.asarray(X[start:start + rows_per_file], dtype=np.float64)
        columns = [pa.array(block[:, j]) for j in range(d)]
        names = [f"x{j}" for j in range(d)]
        if y is not None:
            columns.append(pa.array(np.asarray(y[start:start + rows_per_file], dtype=np.float64).reshape(-1)))
            names.append(LABEL)
        pq.write_table(pa.Table.from_arrays(columns, names=names), where / f"part-{i:05d}.parquet",
                       compression="snappy")
    return _mark(where, want)


def write_sparse_parquet(X: Any, y: Any, where: Path, rows_per_file: int) -> Path:
    """A CSR matrix (``scipy.sparse.csr_matrix``) and y as Parquet whose ``features`` column is
    already Spark's sparse vector: Spark stores a VectorUDT as the struct (type: int8 = 0 for
    sparse, size: int32, indices: list<int32>, values: list<float64>), so each file's struct is
    built from the CSR arrays themselves (indptr, rebased to the file's first row, is the offsets
    of both lists; no row is densified or visited in Python) and ``read_sparse`` reads it back as
    SparseVectors by naming VectorUDT in the schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    want = {"shape": list(X.shape), "nnz": int(X.nnz), "rows_per_file": rows_per_file, "sparse": True}
    if _written(where, want):
        return where
    if not X.has_sorted_indices:  # Spark's SparseVector wants each row's indices increasing
        X = X.sorted_indices()
    n, d = X.shape
    for i, start in enumerate(range(0, n, rows_per_file)):
        stop = min(n, start + rows_per_file)
        lo, hi = int(X.indptr[start]), int(X.indptr[stop])
        offsets = pa.array((X.indptr[start:stop + 1] - lo).astype(np.int32))
        features = pa.StructArray.from_arrays(
            [pa.array(np.zeros(stop - start, np.int8)), pa.array(np.full(stop - start, d, np.int32)),
             pa.ListArray.from_arrays(offsets, pa.array(X.indices[lo:hi].astype(np.int32, copy=False))),
             pa.ListArray.from_arrays(offsets, pa.array(X.data[lo:hi].astype(np.float64, copy=False)))],
            names=["type", "size", "indices", "values"])
        labels = pa.array(np.asarray(y[start:stop], dtype=np.float64).reshape(-1))
        pq.write_table(pa.table({FEATURES: features, LABEL: labels}), where / f"part-{i:05d}.parquet",
                       compression="snappy")
    return _mark(where, want)


def write_ratings_parquet(R: Any, where: Path, rows_per_file: int) -> Path:
    """A ratings matrix (CSR, users × items) as the (user, item, rating) table MLlib's ALS reads:
    users from indptr, items from indices, ratings from data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    want = {"shape": list(R.shape), "nnz": int(R.nnz), "rows_per_file": rows_per_file, "ratings": True}
    if _written(where, want):
        return where
    for i, start in enumerate(range(0, R.shape[0], rows_per_file)):
        stop = min(R.shape[0], start + rows_per_file)
        lo, hi = int(R.indptr[start]), int(R.indptr[stop])
        users = np.repeat(np.arange(start, stop, dtype=np.int32), np.diff(R.indptr[start:stop + 1]))
        table = pa.table({"user": users, "item": R.indices[lo:hi].astype(np.int32, copy=False),
                          "rating": R.data[lo:hi].astype(np.float64, copy=False)})
        pq.write_table(table, where / f"part-{i:05d}.parquet", compression="snappy")
    return _mark(where, want)


# -- the session -----------------------------------------------------------------------------


def session(memory: str, threads: int = 2) -> Any:
    """A local SparkSession at its best for one machine's batch fits."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(f"local[{threads}]").appName("arrayjob-bench-spark-peer")
               .config("spark.driver.memory", memory)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(threads))
               .config("spark.default.parallelism", str(threads))
               .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
               .config("spark.sql.files.minPartitionNum", str(threads))
               .config("spark.driver.extraJavaOptions", "-XX:+UseParallelGC"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def native_blas(spark: Any) -> str:
    """Which BLAS MLlib's dev.ludovic.netlib picked: JNIBLAS is the native library (libblas.so.3,
    OpenBLAS where Debian's libopenblas0 provides it); VectorBLAS/JavaBLAS are the JVM's own."""
    try:
        return str(spark._jvm.dev.ludovic.netlib.blas.BLAS.getInstance().getClass().getSimpleName())
    except Exception as error:  # py4j raises its own errors for a class it cannot find
        return f"unknown ({type(error).__name__})"


def read(spark: Any, parquet: Path, partitions: int | None = None) -> tuple[Any, float]:
    """Parquet → one vector column → cached → counted; the DataFrame and the seconds it took.
    Without a label column (PCA, mixtures) the DataFrame is the vectors alone."""
    from pyspark.ml.feature import VectorAssembler

    start = time.perf_counter()
    raw = spark.read.parquet(str(parquet))
    columns = [c for c in raw.columns if c != LABEL]
    df = VectorAssembler(inputCols=columns, outputCol=FEATURES).transform(raw)
    df = df.select(FEATURES, LABEL) if LABEL in raw.columns else df.select(FEATURES)
    return cached(df, start, partitions)


def read_sparse(spark: Any, parquet: Path, partitions: int | None = None) -> tuple[Any, float]:
    """``write_sparse_parquet``'s files as (SparseVector, label) rows, cached and counted."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import DoubleType, StructField, StructType

    start = time.perf_counter()
    schema = StructType([StructField(FEATURES, VectorUDT()), StructField(LABEL, DoubleType())])
    return cached(spark.read.schema(schema).parquet(str(parquet)), start, partitions)


def cached(df: Any, start: float, partitions: int | None = None) -> tuple[Any, float]:
    """``df`` (repartitioned if asked) cached and counted; the seconds since ``start``."""
    if partitions:
        df = df.repartition(partitions)
    df = df.cache()
    df.count()
    return df, time.perf_counter() - start


class Passes:
    """The Spark jobs a fit starts (one per pass over the cached data), counted by job group."""

    def __init__(self, spark: Any, name: str) -> None:
        self.sc, self.name = spark.sparkContext, name

    def __enter__(self) -> Passes:
        self.sc.setJobGroup(self.name, self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        self.count = len(self.sc.statusTracker().getJobIdsForGroup(self.name))
        self.sc.setLocalProperty("spark.jobGroup.id", None)


def fit(spark: Any, estimator: Any, df: Any, name: str) -> tuple[Any, float, int]:
    with Passes(spark, name) as passes:
        start = time.perf_counter()
        model = estimator.fit(df)
        seconds = time.perf_counter() - start
    return model, seconds, passes.count


def logreg(spark: Any, df: Any, l2: float, max_iter: int, tol: float, run: int = 0) -> dict[str, Any]:
    """MLlib's LogisticRegression with arrayjob's objective; its tol is L-BFGS's relative
    decrease of the objective (arrayjob's is the gradient norm), so both are run to convergence
    and compared at their optima."""
    from pyspark.ml.classification import LogisticRegression

    estimator = LogisticRegression(featuresCol=FEATURES, labelCol=LABEL, family="binomial", regParam=l2,
                                   elasticNetParam=0.0, standardization=False, fitIntercept=True, maxIter=max_iter,
                                   tol=tol)
    model, seconds, passes = fit(spark, estimator, df, f"logreg-{run}")
    summary = model.summary
    return {"seconds": seconds, "passes": passes, "iterations": int(summary.totalIterations),
            "objective": float(summary.objectiveHistory[-1]), "coef": model.coefficients.toArray().tolist(),
            "intercept": float(model.intercept)}


def linreg(spark: Any, df: Any, run: int = 0) -> dict[str, Any]:
    """MLlib's LinearRegression by the normal equations (WeightedLeastSquares: one pass for the
    Gram matrix), unpenalised, as arrayjob's linreg with ``method = "normal"``."""
    from pyspark.ml.regression import LinearRegression

    estimator = LinearRegression(featuresCol=FEATURES, labelCol=LABEL, solver="normal", regParam=0.0,
                                 standardization=False, fitIntercept=True)
    model, seconds, passes = fit(spark, estimator, df, f"linreg-{run}")
    return {"seconds": seconds, "passes": passes, "coef": model.coefficients.toArray().tolist(),
            "intercept": float(model.intercept)}


def _kmeans(k: int, max_iter: int, seed: int) -> Any:
    from pyspark.ml.clustering import KMeans

    return KMeans(featuresCol=FEATURES, k=k, maxIter=max_iter, tol=0.0, seed=seed, initMode="random")


def kmeans_start(spark: Any, df: Any, k: int, seed: int) -> tuple[np.ndarray, float]:
    """The centres MLlib starts from (a ``maxIter = 0`` fit: its random init, seeded), and its
    seconds. pyspark's KMeans takes no initial model, so arrayjob is given these (``init``)."""
    model, seconds, _ = fit(spark, _kmeans(k, 0, seed), df, "kmeans-start")
    return np.array([c for c in model.clusterCenters()]), seconds


def kmeans(spark: Any, df: Any, k: int, max_iter: int, seed: int, run: int = 0) -> dict[str, Any]:
    """Lloyd from ``kmeans_start``'s centres (same seed), ``tol = 0``: all ``max_iter`` iterations
    unless a fixed point comes first."""
    model, seconds, passes = fit(spark, _kmeans(k, max_iter, seed), df, f"kmeans-{run}")
    summary = model.summary
    return {"seconds": seconds, "passes": passes, "iterations": int(summary.numIter),
            "training_cost": float(summary.trainingCost), "centres": [c.tolist() for c in model.clusterCenters()]}


# -- the two commands ------------------------------------------------------------------------


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] spark peer: {message}", file=sys.stderr, flush=True)


def fits(a: argparse.Namespace) -> dict[str, Any]:
    spark = session(a.driver_memory)
    out: dict[str, Any] = {"blas": native_blas(spark), "driver_memory": a.driver_memory,
                           "spark": spark.version, "read_runs": [], "logreg": [], "linreg": [], "kmeans": []}
    df = None
    for _ in range(a.repeat + 1):  # the first read warms the JVM and the page cache
        if df is not None:
            df.unpersist(blocking=True)
        df, seconds = read(spark, a.parquet)
        out["read_runs"].append(seconds)
        say(f"read + cache {seconds:.3g} s")
    assert df is not None
    out["rows"], out["partitions"] = int(df.count()), int(df.rdd.getNumPartitions())
    for run in range(a.repeat + 1):  # run 0 is the warm-up (the JIT compiles the kernels)
        out["logreg"].append(logreg(spark, df, a.l2, a.max_iter, a.tol, run))
        out["linreg"].append(linreg(spark, df, run))
        say(f"logreg {out['logreg'][-1]['seconds']:.3g} s ({out['logreg'][-1]['passes']} passes), "
            f"linreg {out['linreg'][-1]['seconds']:.3g} s")
    start, out["kmeans_start_seconds"] = kmeans_start(spark, df, a.k, a.seed)
    out["kmeans_start"] = start.tolist()
    for run in range(a.repeat + 1):
        out["kmeans"].append(kmeans(spark, df, a.k, a.kmeans_iter, a.seed, run))
        say(f"kmeans {out['kmeans'][-1]['seconds']:.3g} s ({out['kmeans'][-1]['iterations']} iterations)")
    spark.stop()
    return out


def job(a: argparse.Namespace) -> dict[str, Any]:
    """The whole logistic regression job, as one spark-submit would run it."""
    start = time.perf_counter()
    spark = session(a.driver_memory)
    started = time.perf_counter() - start
    df, read_s = read(spark, a.parquet)
    fit = logreg(spark, df, a.l2, a.max_iter, a.tol)
    coef = spark.createDataFrame([(fit["coef"], fit["intercept"])], ["coef", "intercept"])
    coef.write.mode("overwrite").parquet(str(Path(a.out).with_suffix(".model")))
    spark.stop()
    return {"start_seconds": started, "read_seconds": read_s, **fit, "seconds_inside": time.perf_counter() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["fits", "job"])
    parser.add_argument("parquet", type=Path)
    parser.add_argument("--out", required=True)
    parser.add_argument("--driver-memory", required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--l2", type=float, default=1e-4)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--tol", type=float, default=1e-10)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--kmeans-iter", type=int, default=10)
    parser.add_argument("--seed", type=int, default=2)
    a = parser.parse_args()
    result = fits(a) if a.what == "fits" else job(a)
    Path(a.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
