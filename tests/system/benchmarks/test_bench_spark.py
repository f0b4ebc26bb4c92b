"""The Spark MLlib peer of ``make bench`` (benchmarks/spark_peer.py, issue 28) at a tiny size:
its fits on Parquet written from the same arrays agree with arrayjob's jobs (run on the
in-process executor) — logistic regression to its optimum, the normal equations exactly, and
KMeans from MLlib's own start to the same centres after the same iterations. Skipped when
pyspark or Java >= 17 is missing (``make test`` does not need them). About 20 s on a quiet
machine, nearly all of it the JVM's start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from arrayjob.algorithms.kmeans import KMeans, KMeansParams
from arrayjob.algorithms.linreg import LinearRegression, LinRegParams
from arrayjob.algorithms.logreg import LogisticRegression, LogRegParams
from tests.harness.linear_models import fit, inputs

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))
import spark_peer  # noqa: E402

pytestmark = pytest.mark.skipif(spark_peer.missing() is not None, reason=f"Spark peer: {spark_peer.missing()}")

L2, K, ITERATIONS = 1e-3, 3, 4


@pytest.mark.timeout(660)  # a JVM on a loaded machine: minutes
def test_spark_mllib_and_arrayjob_agree_on_the_same_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n, d = 3_000, 5
    X = rng.standard_normal((n, d)) + np.repeat(3.0 * rng.standard_normal((K, d)), n // K, axis=0)
    y = (X @ rng.standard_normal(d) + rng.standard_normal(n) > 0).astype(np.float64)
    arrays = inputs(tmp_path, rows=500, X=X, y=y)
    where = spark_peer.write_parquet(X, y, tmp_path / "parquet", 1_000)
    assert len(list(where.glob("*.parquet"))) == 3

    out = tmp_path / "spark.json"
    done = subprocess.run([sys.executable, str(BENCH / "spark_peer.py"), "fits", str(where), "--out", str(out),
                           "--driver-memory", "1g", "--repeat", "0", "--l2", str(L2), "--tol", "1e-12",
                           "--k", str(K), "--kmeans-iter", str(ITERATIONS)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    spark = json.loads(out.read_text())
    assert spark["rows"] == n and spark["partitions"] >= 2

    # logistic regression: the same objective, so the same optimum
    logreg = spark["logreg"][0]
    result, _ = fit(LogisticRegression(LogRegParams(l2=L2, tol=1e-10, max_iter=200), arrays))
    assert logreg["passes"] >= logreg["iterations"] >= 1
    np.testing.assert_allclose(logreg["coef"], result.arrays["coef"].ravel(), rtol=1e-4, atol=1e-6)
    assert logreg["intercept"] == pytest.approx(float(result.arrays["intercept"][0]), rel=1e-4, abs=1e-6)
    assert logreg["objective"] == pytest.approx(result.attrs["objective"], rel=1e-8)

    # least squares by the normal equations: exact on both sides
    linreg = spark["linreg"][0]
    result, _ = fit(LinearRegression(LinRegParams(method="normal"), arrays))
    np.testing.assert_allclose(linreg["coef"], result.arrays["coef"].ravel(), rtol=1e-9, atol=1e-12)
    assert linreg["intercept"] == pytest.approx(float(result.arrays["intercept"][0]), rel=1e-9)

    # KMeans from MLlib's start: the same Lloyd iterations
    start = np.array(spark["kmeans_start"])
    assert start.shape == (K, d)
    zarr.create_array(str(tmp_path / "init"), shape=start.shape, chunks=start.shape, dtype="float64")[...] = start
    kmeans = spark["kmeans"][0]
    result, _ = fit(KMeans(KMeansParams(k=K, init=str(tmp_path / "init"), max_iter=ITERATIONS, tol=0.0),
                           {"X": arrays["X"]}))
    assert kmeans["iterations"] == result.attrs["iterations"]
    np.testing.assert_allclose(np.array(kmeans["centres"]), result.arrays["centroids"], rtol=1e-9, atol=1e-9)
