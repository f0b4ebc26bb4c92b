"""The Spark MLlib column of the sparse rows (bench_sparse.py, issue 24) and of the models rows
(models.py, issue 26): Spark's input written from the same arrays arrayjob read, Spark's fit run
by benchmarks/spark_models.py in a process of its own, and one row per workload whose note says
how Spark's result agrees with arrayjob's (coefficients, centres, explained variance, objective,
RMSE), as bench_spark.py does for the dense rows.

Spark runs only where it can and should: not at the ``tiny`` size (the test suite's, which must
not start a JVM) and not without pyspark and Java >= 17; the row then says why in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import spark_peer
from bench_harness import Row, run_measured

HERE = Path(__file__).resolve().parent
SYSTEM = "Spark MLlib"
FILE_BYTES = 64 * 2**20  # Parquet files of about this many bytes of values


def unavailable(size: str) -> str | None:
    """Why there is no Spark run at this size here (one line), or None."""
    if size == "tiny":
        return "skipped at tiny size (the test suite starts no JVM)"
    return spark_peer.missing()


def skipped_row(workload: str, label: str, unit: str, why: str) -> Row:
    return Row(workload, label, SYSTEM, unit, note=why)


def fit(workload: str, parquet: Path, work: Path, data_bytes: int, repeat: int,
        params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]] | str:
    """``spark_models.py WORKLOAD`` on ``parquet``: its JSON (with the process's wall seconds and
    peak memory) and its arrays, or the failure's last line."""
    out = work / f"spark-{workload}.json"
    memory = spark_peer.driver_memory(data_bytes)
    try:
        seconds, peak, _, _ = run_measured(
            [sys.executable, str(HERE / "spark_models.py"), workload, str(parquet), "--out", str(out),
             "--driver-memory", memory, "--repeat", str(repeat), "--params", json.dumps(params)])
    except subprocess.CalledProcessError as failed:
        return "failed: " + ((failed.stderr or "").strip().splitlines()[-1:] or [f"exit {failed.returncode}"])[0][:300]
    result = json.loads(out.read_text())
    result |= {"process_seconds": seconds, "process_peak_bytes": peak}
    with np.load(out.with_suffix(".npz")) as arrays:
        return result, dict(arrays)


def row(workload: str, label: str, unit: str, spark: dict[str, Any], per: str, note: str, **extra: Any) -> Row:
    """The Spark row: seconds per ``per`` ("passes" or "iterations") of each timed run, or per fit
    (``per = ""``), the warm-up run left out."""
    runs = spark["runs"][1:] or spark["runs"]
    times = [r["seconds"] / max(1, r[per]) if per else r["seconds"] for r in runs]
    last = runs[-1]
    how = (f"Spark {spark['spark']} local[2], driver memory {spark['driver_memory']}, BLAS {spark['blas']}, "
           f"{spark['partitions']} cached partitions; fit {last['seconds']:.3g} s, {last['passes']} passes"
           + (f", {last['iterations']} iterations" if "iterations" in last else ""))
    return Row(workload, label, SYSTEM, unit, spark["read_seconds"], float(np.median(times)), compute_runs=times,
               note=f"{note}; {how}", extra={"blas": spark["blas"], "process_seconds": spark["process_seconds"],
                                              "process_peak_bytes": spark["process_peak_bytes"], **extra})


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """max |a − b| / max |b|."""
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(float(np.abs(b).max()), 1e-300))


def _rows_per_file(row_bytes: float) -> int:
    return max(1_000, int(FILE_BYTES // max(row_bytes, 1.0)))


# -- bench_sparse.py's rows ------------------------------------------------------------------


def sparse_logreg(work: Path, size: str, label: str, unit: str, X: Any, y: np.ndarray, l2: float, iterations: int,
                  report: dict[str, Any], repeat: int) -> Row:
    """LogisticRegression on SparseVectors, the same objective (mean log loss + (l2/2)‖w‖²,
    intercept unpenalised, ``standardization=False``), L-BFGS for the same ``iterations`` with
    ``tol = 0``; seconds per pass. Spark's coefficients are set beside arrayjob's after the same
    iterations, and Spark's reported objective beside the objective at its coefficients
    computed here (the same objective on both sides)."""
    workload = "sparse logreg loss+grad"
    if why := unavailable(size):
        return skipped_row(workload, label, unit, why)
    parquet = spark_peer.write_sparse_parquet(X, y, work / "spark-parquet", _rows_per_file(12 * X.nnz / X.shape[0]))
    got = fit("sparse-logreg", parquet, work, X.data.nbytes + X.indices.nbytes + X.indptr.nbytes,
              repeat, {"l2": l2, "max_iter": iterations, "tol": 0.0})
    if isinstance(got, str):
        return skipped_row(workload, label, unit, got)
    spark, arrays = got
    coef, intercept = arrays["coef"].ravel(), float(arrays["intercept"][0])
    z = X @ coef + intercept
    objective = float(np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * l2 * coef @ coef)
    last = spark["runs"][-1]
    note = (f"LogisticRegression(regParam = l2, standardization = False), SparseVector features written from the "
            f"CSR arrays; objective {last['objective']:.12g} (here, at its coefficients: {objective:.12g})")
    if "error" not in report:
        ours = np.append(report["arrays"]["coef"].ravel(), report["arrays"]["intercept"].ravel())
        note += (f"; after the same {iterations} iterations arrayjob's objective is "
                 f"{report['result']['objective']:.12g} and its coefficients differ from Spark's by "
                 f"{agreement(ours, np.append(coef, intercept)):.1e} of the largest")
    return row(workload, label, unit, spark, "passes", note, objective=last["objective"],
               objective_at_coef=objective)


def sparse_kmeans(work: Path, size: str, label: str, unit: str, X: Any, C0: np.ndarray, iterations: int,
                  report: dict[str, Any], repeat: int) -> Row:
    """mllib KMeans on SparseVectors from arrayjob's initial centroids, ``epsilon = 0``; seconds
    per iteration; the centres compared with arrayjob's."""
    workload = "sparse KMeans"
    if why := unavailable(size):
        return skipped_row(workload, label, unit, why)
    parquet = spark_peer.write_sparse_parquet(X, np.zeros(X.shape[0]), work / "spark-parquet",
                                              _rows_per_file(12 * X.nnz / X.shape[0]))
    np.save(work / "spark-init.npy", C0)
    got = fit("sparse-kmeans", parquet, work, X.data.nbytes + X.indices.nbytes + X.indptr.nbytes, repeat,
              {"k": len(C0), "max_iter": iterations, "init": str(work / "spark-init.npy")})
    if isinstance(got, str):
        return skipped_row(workload, label, unit, got)
    spark, arrays = got
    last = spark["runs"][-1]
    note = (f"mllib KMeans (what ml.KMeans runs) from the same centroids, epsilon 0: {last['iterations']} "
            f"iterations, training cost {last['training_cost']:.10g}")
    if "error" not in report:
        same = last["iterations"] == report["result"]["iterations"]
        note += (f"; centroids {'match' if same else 'after different iteration counts differ from'} "
                 f"arrayjob's to {float(np.abs(arrays['centres'] - report['arrays']['centroids']).max()):.1e}")
    return row(workload, label, unit, spark, "iterations", note, training_cost=last["training_cost"])


# -- models.py's rows ------------------------------------------------------------------------


def _dense(work: Path, name: str, X: np.ndarray, y: np.ndarray | None) -> tuple[Path, int]:
    bytes_per_row = 8 * (X.shape[1] + (y is not None))
    return (spark_peer.write_parquet(X, y, work / name / "spark-parquet", _rows_per_file(bytes_per_row)),
            X.shape[0] * bytes_per_row)


def model_row(name: str, workload: str, label: str, unit: str, work: Path, size: str, repeat: int,
              state: dict[str, Any]) -> Row:
    """The Spark row of models.py's workload ``name``, from what its arrayjob and scikit-learn
    runs left in ``state["spark"][name]`` (the data in memory, arrayjob's report, the parameters)."""
    if name not in MODELS:
        return skipped_row(workload, label, unit, f"not measured: {name} has no Spark column")
    if why := unavailable(size):
        return skipped_row(workload, label, unit, why)
    s = state.get("spark", {}).get(name)
    if s is None:
        return skipped_row(workload, label, unit, "not measured: the arrayjob and scikit-learn rows did not run")
    spark_name, per, params, compare = MODELS[name]
    parquet, nbytes = (_ratings(work, s["R"]) if name == "als" else _dense(work, name, s["X"], s.get("y")))
    got = fit(spark_name, parquet, work / name, nbytes, repeat, params(s))
    if isinstance(got, str):
        return skipped_row(workload, label, unit, got)
    spark, arrays = got
    return row(workload, label, unit, spark, per, compare(s, spark["runs"][-1], arrays))


def _ratings(work: Path, R: Any) -> tuple[Path, int]:
    return spark_peer.write_ratings_parquet(R, work / "als" / "spark-parquet", _rows_per_file(16)), 16 * R.nnz


def _ours(s: dict[str, Any], key: str) -> np.ndarray | None:
    report = s["report"]
    return None if "error" in report else report["arrays"][key]


def _multinomial(s: dict[str, Any], last: dict[str, Any], a: dict[str, np.ndarray]) -> str:
    note = (f"LogisticRegression(family = 'multinomial', regParam = l2, standardization = False), to tol "
            f"{s['tol']:g}: objective {last['objective']:.12g}")
    if (coef := _ours(s, "coef")) is not None:
        note += (f"; arrayjob's coef agrees to {agreement(coef, a['coef']):.1e} of its largest (objective "
                 f"{s['report']['result']['objective']:.12g})")
    return note


def _elastic_logreg(s: dict[str, Any], last: dict[str, Any], a: dict[str, np.ndarray]) -> str:
    note = (f"LogisticRegression(regParam = l1 + l2 = {last['regParam']:g}, elasticNetParam = l1/(l1 + l2) = "
            f"{last['elasticNetParam']:g}, standardization = False), OWL-QN: {last['iterations']} iterations, "
            f"objective {last['objective']:.12g}")
    if (coef := _ours(s, "coef")) is not None:
        zeros = int((coef == 0).sum()), int((a["coef"] == 0).sum())
        note += f"; coef agrees to {agreement(coef, a['coef']):.1e}, exact zeros {zeros[0]} (Spark {zeros[1]})"
    return note


def _elastic_linreg(s: dict[str, Any], last: dict[str, Any], a: dict[str, np.ndarray]) -> str:
    note = (f"LinearRegression(l-bfgs, regParam = l1 + l2·σ_y = {last['regParam']:.6g}, elasticNetParam = "
            f"l1/regParam = {last['elasticNetParam']:.6g}, σ_y = {last['label_std']:.6g}, standardization = False), "
            f"OWL-QN: {last['iterations']} iterations")
    if (coef := _ours(s, "coef")) is not None:
        note += f"; coef agrees to {agreement(coef, a['coef']):.1e}"
    return note


def _pca(s: dict[str, Any], last: dict[str, Any], a: dict[str, np.ndarray]) -> str:
    note = "ml.feature.PCA (the covariance matrix in one pass, its eigenvectors on the driver)"
    if (ratio := _ours(s, "explained_variance_ratio")) is not None:
        cosines = np.abs(np.einsum("ij,ij->i", _ours(s, "components"), a["components"]))
        note += (f"; explained variance ratio agrees to {agreement(ratio, a['explained_variance_ratio']):.1e}, "
                 f"components to 1 − {abs(1 - cosines.min()):.1e} (|cos|)")
    return note


def _gmm_start(s: dict[str, Any]) -> Path:
    """arrayjob's start as a .npz: the given means, weights 1/k, each covariance that of the whole
    data (plus 1e-6 on the diagonal, as scikit-learn's row is given)."""
    X, means = s["X"], s["means"]
    d, k = X.shape[1], len(means)
    covariance = np.cov(X.T, bias=True).reshape(d, d) + 1e-6 * np.eye(d)
    where = s["data"] / "spark-init.npz"
    np.savez(where, weights=np.full(k, 1 / k), means=means, covariances=np.repeat(covariance[None], k, 0))
    return where


def _gmm(s: dict[str, Any], last: dict[str, Any], a: dict[str, np.ndarray]) -> str:
    note = (f"mllib GaussianMixture (full covariances, no reg_covar) from the same means, weights and covariances: "
            f"{last['iterations']} EM iterations")
    if (means := _ours(s, "means")) is not None:
        note += (f"; means agree to {agreement(means, a['means']):.1e}, weights to "
                 f"{agreement(_ours(s, 'weights'), a['weights']):.1e} (arrayjob adds reg_covar 1e-6)")
    return note


def _als(s: dict[str, Any], last: dict[str, Any], a: dict[str, np.ndarray]) -> str:
    R, l2 = s["R"], s["l2"]
    rows, columns = R.tocsr(), R.tocsc()
    X, Y = a["user_factors"], a["item_factors"]
    coo = rows.tocoo()
    residual = coo.data - np.einsum("ij,ij->i", X[coo.row], Y[coo.col])
    objective = float(residual @ residual + l2 * (np.diff(rows.indptr) @ np.sum(X**2, axis=1)
                                                  + np.diff(columns.indptr) @ np.sum(Y**2, axis=1)))
    note = (f"ml ALS (explicit, weighted-λ regParam = l2, {last['iterations']} iterations, its own seeded start: "
            f"MLlib takes no initial factors, so objective and RMSE are compared, not factors): objective "
            f"{objective:.10g}, training RMSE {float(np.sqrt(np.mean(residual**2))):.6g}")
    if "error" not in s["report"]:
        ours = s["report"]["result"]["objective"]
        ours = float(ours[-1] if isinstance(ours, list) else ours)
        Xa, Ya = s["report"]["arrays"]["user_factors"], s["report"]["arrays"]["item_factors"]
        rmse = float(np.sqrt(np.mean((coo.data - np.einsum("ij,ij->i", Xa[coo.row], Ya[coo.col]))**2)))
        note += f" (arrayjob's from its start: {ours:.10g}, RMSE {rmse:.6g})"
    return note


def _predict(s: dict[str, Any], last: dict[str, Any], a: dict[str, np.ndarray]) -> str:
    note = ("its own multinomial LogisticRegressionModel (the same objective, fitted once, not timed; MLlib takes "
            "no given coefficients): transform to (prediction, probability), written as Parquet")
    note += f"; its coef agrees with arrayjob's model to {agreement(s['coef'], a['coef']):.1e}"
    if (labels := _ours(s, "label")) is not None:
        ours = np.bincount(labels.astype(np.int64), minlength=len(a["label_counts"]))
        moved = int(np.abs(ours - a["label_counts"]).sum()) // 2
        note += f"; labels per class {a['label_counts'].tolist()} (arrayjob's {ours.tolist()}: {moved} rows differ at most)"
    return note


# name -> (spark_models workload, the unit's divisor, its parameters from the state, the comparison)
MODELS: dict[str, tuple[str, str, Any, Any]] = {
    "multinomial": ("logreg", "iterations", lambda s: {"family": "multinomial", "l2": s["l2"], "max_iter": 100,
                                                       "tol": s["tol"]}, _multinomial),
    "elastic-logreg": ("logreg", "", lambda s: {"l1": s["l1"], "l2": s["l2"], "max_iter": 500, "tol": s["tol"]},
                       _elastic_logreg),
    "elastic-linreg": ("linreg", "", lambda s: {"l1": s["l1"], "l2": s["l2"], "max_iter": 1000, "tol": s["tol"]},
                       _elastic_linreg),
    "pca": ("pca", "", lambda s: {"k": s["k"]}, _pca),
    "gmm": ("gmm", "iterations", lambda s: {"init": str(_gmm_start(s)), "max_iter": s["max_iter"]}, _gmm),
    "als": ("als", "iterations", lambda s: {"rank": s["rank"], "l2": s["l2"], "max_iter": s["max_iter"],
                                            "users": s["R"].shape[0], "items": s["R"].shape[1]}, _als),
    "predict": ("score", "passes", lambda s: {"l2": s["l2"], "max_iter": 100, "tol": s["tol"],
                                              "classes": s["classes"], "out": s["out"]}, _predict),
}
