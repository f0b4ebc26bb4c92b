"""arrayjob against Spark MLlib (issue 28) on the same X (n × d float64) and y: the logreg demo
data, as Zarr for arrayjob and as Parquet written from the same arrays for Spark
(benchmarks/spark_peer.py runs Spark, in a process of its own).

Rows, each pair measured in one run with both sides' results compared (coefficients to a
tolerance, KMeans centres and the inertia of each side's centres on X computed by NumPy):

- ``vs Spark: read``: arrayjob's load (storage to worker memory) against Parquet → vectors →
  cache → count.
- ``vs Spark: logreg per pass`` and ``per fit``: a fit to convergence (arrayjob: L-BFGS to a
  gradient norm <= TOL; Spark: L-BFGS to a relative decrease <= SPARK_TOL), its seconds over
  the passes it made over X (arrayjob's evaluations; Spark's jobs in the fit), and the fit.
- ``vs Spark: linreg (normal equations)``: one fit, unpenalised.
- ``vs Spark: KMeans per iteration``: Lloyd from MLlib's own start (a ``maxIter = 0`` fit given
  to arrayjob's ``init``), ``tol = 0``; fit seconds over iterations.
- ``vs Spark: whole logreg job`` and ``peak memory``: each side's whole job from a cold process
  (``arrayjob run`` against ``spark_peer.py job``, as spark-submit runs it), before this process
  starts Ray; the memory is the peak PSS summed over each process tree (JVM, Ray's workers).

Without pyspark or Java >= 17 the rows are one line saying so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import spark_peer
from bench_context import Context
from bench_data import Size
from bench_harness import Row, repeat_timed, run_measured

from arrayjob.algorithms.kmeans import KMeans, KMeansParams
from arrayjob.algorithms.linreg import LinearRegression, LinRegParams
from arrayjob.algorithms.logreg import LogisticRegression, LogRegParams
from arrayjob.api.job import JobContext
from arrayjob.runtime.metrics import RunMetrics

HERE = Path(__file__).resolve().parent
L2 = 1e-4  # the demo spec's
TOL = 1e-6  # arrayjob: the gradient's 2-norm (the demo spec's)
SPARK_TOL = 1e-10  # Spark: L-BFGS's relative decrease of the objective, tight enough to meet arrayjob's optimum
MAX_ITER = 100
SEED = 2
COEF_RTOL = {"logreg": 1e-3, "linreg": 1e-8}  # of the largest coefficient
PARQUET_FILE_BYTES = 64 * 2**20
RAY_START_ATTEMPTS = 3  # `arrayjob run` tries, when its local Ray does not start in time (a loaded host)


def skipped(size: Size) -> list[Row]:
    """One row saying why there is no Spark comparison here, or none."""
    reason = spark_peer.missing()
    if reason is None:
        return []
    print(f"Spark MLlib rows skipped: {reason}", file=sys.stderr, flush=True)
    return [Row("vs Spark MLlib", f"X {size.rows:,} × {size.cols}", "Spark MLlib", "—", note=f"skipped: {reason}")]


def parquet(data: Path, size: Size) -> Path:
    """X and y as Parquet beside the Zarr arrays they are written from (once)."""
    import zarr

    X = zarr.open_array(str(data / "X.zarr"), mode="r")
    y = zarr.open_array(str(data / "y.zarr"), mode="r")
    per_file = max(size.chunk_rows, PARQUET_FILE_BYTES // (8 * (size.cols + 1)) // size.chunk_rows * size.chunk_rows)
    return spark_peer.write_parquet(X, y, data.parent / "logreg-parquet", per_file)


def _label(size: Size) -> str:
    return f"X {size.rows:,} × {size.cols}"


def _driver_memory(size: Size) -> str:
    return spark_peer.driver_memory(size.rows * (size.cols + 1) * 8)


def _spark(what: str, where: Path, size: Size, out: Path, *more: str) -> tuple[float, int, int, dict[str, Any]]:
    seconds, peak, processes, _ = run_measured(
        [sys.executable, str(HERE / "spark_peer.py"), what, str(where), "--out", str(out), "--driver-memory",
         _driver_memory(size), "--l2", str(L2), "--max-iter", str(MAX_ITER), "--tol", str(SPARK_TOL), *more])
    return seconds, peak, processes, json.loads(out.read_text())


# -- the whole job from a cold process, and its memory (before this process starts Ray) -------


def cold_jobs(data: Path, size: Size, repeat: int, work: Path) -> list[Row]:
    if rows := skipped(size):
        return rows
    where = parquet(data, size)
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "logreg-job.toml"
    spec.write_text(f'[job]\nname = "bench-vs-spark"\nalgorithm = "logreg"\n\n[inputs]\nX = "{data / "X.zarr"}"\n'
                    f'y = "{data / "y.zarr"}"\n\n[params]\nsolver = "lbfgs"\nl2 = {L2}\nmax_iter = {MAX_ITER}\n'
                    f'tol = {TOL}\n\n[output]\nuri = "{work / "logreg-out"}"\n\n[cluster]\nnum_cpus = 2\n')
    import os

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    aj: list[tuple[float, int, int, dict[str, Any]]] = []
    sp: list[tuple[float, int, int, dict[str, Any]]] = []

    retried = [0]

    def arrayjob_once() -> float:
        command = [sys.executable, "-m", "arrayjob.cli.main", "run", str(spec), "--overwrite", "--json"]
        for attempt in range(RAY_START_ATTEMPTS):
            try:
                seconds, peak, processes, out = run_measured(command, cwd=work, env=env)
                break
            except subprocess.CalledProcessError as failed:  # Ray's start times out on an overloaded host
                if "cannot start a local Ray" not in (failed.stderr or "") or attempt + 1 == RAY_START_ATTEMPTS:
                    raise
                retried[0] += 1
        aj.append((seconds, peak, processes, json.loads(out)))
        return seconds

    def spark_once() -> float:
        sp.append(_spark("job", where, size, work / "spark-job.json"))
        return sp[-1][0]

    label = _label(size)
    what = "wall, process start to exit"
    memory = "GiB, peak PSS summed over the process tree"
    rows: list[Row] = []
    try:
        a = repeat_timed(arrayjob_once, repeat)
        report = aj[-1][3]
        stages = ", ".join(f"{st['name']} {st['wall_seconds']:.2f}" for st in report["stages"])
        rows += [
            Row("vs Spark: whole logreg job", label, "arrayjob", what, None, a.median, arrayjob=True, peer=False,
                compute_runs=a.runs, note=f"`arrayjob run` (its own local Ray); report: {stages} s; "
                                          f"{report['result']['iterations']} iterations, "
                                          f"{report['result']['evaluations']} evaluations"
                                          + (f"; Ray's start timed out {retried[0]} times and was tried again "
                                             f"(the failed tries are not counted)" if retried[0] else "")),
            Row("vs Spark: peak memory", label, "arrayjob", memory, None,
                float(np.median([r[1] for r in aj[1:]])) / 2**30, arrayjob=True, peer=False,
                compute_runs=[r[1] / 2**30 for r in aj[1:]],
                note=f"the whole logreg job's `arrayjob run`: up to {max(r[2] for r in aj)} processes (driver, "
                     f"Ray's raylet, GCS and workers); X and y are {size.rows * (size.cols + 1) * 8 / 2**30:.2f} GiB")]
    except subprocess.CalledProcessError as failed:
        rows.append(_failed(failed, size))
    try:
        s = repeat_timed(spark_once, repeat)
        spark = sp[-1][3]
        rows += [
            Row("vs Spark: whole logreg job", label, "Spark MLlib", what, None, s.median, compute_runs=s.runs,
                note=f"`python spark_peer.py job` (local[2]): Spark start {spark['start_seconds']:.2f} s, read + "
                     f"cache {spark['read_seconds']:.2f} s, fit {spark['seconds']:.2f} s ({spark['iterations']} "
                     f"iterations, {spark['passes']} passes), the rest writing the model and stopping"),
            Row("vs Spark: peak memory", label, "Spark MLlib", memory, None,
                float(np.median([r[1] for r in sp[1:]])) / 2**30, compute_runs=[r[1] / 2**30 for r in sp[1:]],
                note=f"the whole job's Python and JVM (up to {max(r[2] for r in sp)} processes), driver memory "
                     f"{_driver_memory(size)}")]
    except subprocess.CalledProcessError as failed:
        rows.append(_failed(failed, size))
    return rows


def _failed(failed: subprocess.CalledProcessError, size: Size) -> Row:
    """A one-line row for the side whose whole job failed (the other side and workloads go on)."""
    last = (failed.stderr or "").strip().splitlines()[-1:] or [f"exit {failed.returncode}"]
    system = "arrayjob" if "arrayjob.cli.main" in failed.cmd else "Spark MLlib"
    return Row("vs Spark: whole logreg job", _label(size), system, "—", arrayjob=system == "arrayjob",
               peer=system != "arrayjob", note=f"failed: {last[0][:300]}")


# -- in this process's Ray: read, logreg, linreg, KMeans --------------------------------------


def _stages_seconds(metrics: RunMetrics) -> float:
    return sum(st.wall_seconds for st in metrics.stages if st.name != "load")


def _fits(ctx: Context, make_job: Any) -> list[tuple[float, Any]]:
    """The job run ``repeat`` + 1 times on a fresh session each (the first a warm-up): seconds
    past its load stage, and its result."""
    out = []
    for _ in range(ctx.repeat + 1):
        metrics = RunMetrics()
        result = make_job().run(JobContext(ctx.session(), metrics))
        out.append((_stages_seconds(metrics), result))
    return out[1:]


def _median(values: list[float]) -> float:
    return float(np.median(values))


def _agree(name: str, ours: np.ndarray, theirs: np.ndarray) -> tuple[bool, str]:
    scale = float(np.abs(ours).max()) or 1.0
    diff = float(np.abs(ours - theirs).max()) / scale
    ok = diff <= COEF_RTOL[name]
    return ok, f"coefficients {'agree' if ok else 'DIFFER'}: max difference {diff:.1e} of the largest"


def inertia(X: Any, centres: np.ndarray, step: int = 262_144) -> float:
    total = 0.0
    sq = (centres**2).sum(1)
    for start in range(0, X.shape[0], step):
        block = np.asarray(X[start:start + step])
        scores = sq - 2.0 * block @ centres.T
        total += float((scores.min(axis=1) + (block**2).sum(1)).sum())
    return total


def versus_spark(ctx: Context) -> list[Row]:
    s = ctx.size
    if rows := skipped(s):
        return rows
    data = ctx.data["logreg"]
    where = parquet(data, s)
    work = data.parent / "vs-spark"
    work.mkdir(parents=True, exist_ok=True)
    label = _label(s)
    info = {"X": ctx.info("logreg", "X"), "y": ctx.info("logreg", "y")}

    seconds, peak, _, spark = _spark("fits", where, s, work / "spark-fits.json", "--repeat", str(ctx.repeat),
                                     "--k", str(s.k), "--kmeans-iter", str(s.iterations), "--seed", str(SEED))
    blas = spark["blas"]
    spark_note = (f"Spark {spark['spark']} local[2], driver memory {spark['driver_memory']}, BLAS {blas}, "
                  f"{spark['partitions']} cached partitions")
    rows: list[Row] = []

    # read
    job = LogisticRegression(LogRegParams(max_iter=MAX_ITER, tol=TOL), info)
    load, _session = ctx.loaded_session(job.program(ctx.workers))
    del _session
    spark_read = spark["read_runs"][1:]
    rows += [Row("vs Spark: read", label, "arrayjob", "storage to memory", None, load.median, arrayjob=True,
                 peer=False, compute_runs=load.runs, note="Session.load of the logreg program: Zarr blocks into "
                                                          "the workers' object store"),
             Row("vs Spark: read", label, "Spark MLlib", "storage to memory", None, _median(spark_read),
                 compute_runs=spark_read, note=f"read.parquet → VectorAssembler → cache → count; {spark_note}")]

    # logreg
    fits = _fits(ctx, lambda: LogisticRegression(LogRegParams(max_iter=MAX_ITER, tol=TOL), info))
    result = fits[-1][1]
    ours = np.append(result.arrays["coef"].ravel(), result.arrays["intercept"].ravel())
    sl = spark["logreg"][1:]
    theirs = np.append(sl[-1]["coef"], sl[-1]["intercept"])
    ok, agree = _agree("logreg", ours, theirs)
    evaluations, iterations = result.attrs["evaluations"], result.attrs["iterations"]
    ours_note = f"{iterations} iterations, {evaluations} evaluations, objective {result.attrs['objective']:.12g}"
    theirs_note = (f"{sl[-1]['iterations']} iterations, {sl[-1]['passes']} passes (Spark jobs), objective "
                   f"{sl[-1]['objective']:.12g}; {agree}")
    per_pass = [f[0] / f[1].attrs["evaluations"] for f in fits]
    spark_pass = [r["seconds"] / r["passes"] for r in sl]
    extra = {"coef_agree": ok}
    rows += [Row("vs Spark: logreg per pass", label, "arrayjob", "per pass over X (fit / passes)", None,
                 _median(per_pass), arrayjob=True, peer=False, compute_runs=per_pass, note=ours_note, extra=extra),
             Row("vs Spark: logreg per pass", label, "Spark MLlib", "per pass over X (fit / passes)", None,
                 _median(spark_pass), compute_runs=spark_pass, note=f"{theirs_note}; {spark_note}", extra=extra),
             Row("vs Spark: logreg per fit", label, "arrayjob", "one fit to convergence", None,
                 _median([f[0] for f in fits]), arrayjob=True, peer=False, compute_runs=[f[0] for f in fits],
                 note=f"L-BFGS to gradient norm <= {TOL:g}; {ours_note}", extra=extra),
             Row("vs Spark: logreg per fit", label, "Spark MLlib", "one fit to convergence", None,
                 _median([r["seconds"] for r in sl]), compute_runs=[r["seconds"] for r in sl],
                 note=f"L-BFGS to relative decrease <= {SPARK_TOL:g}; {theirs_note}", extra=extra)]

    # linreg, the normal equations
    fits = _fits(ctx, lambda: LinearRegression(LinRegParams(method="normal"), info))
    result = fits[-1][1]
    ours = np.append(result.arrays["coef"].ravel(), result.arrays["intercept"].ravel())
    sl = spark["linreg"][1:]
    ok, agree = _agree("linreg", ours, np.append(sl[-1]["coef"], sl[-1]["intercept"]))
    rows += [Row("vs Spark: linreg (normal equations)", label, "arrayjob", "one fit", None,
                 _median([f[0] for f in fits]), arrayjob=True, peer=False, compute_runs=[f[0] for f in fits],
                 note="method = \"normal\": XᵀX, Xᵀy and the sums in one pass", extra={"coef_agree": ok}),
             Row("vs Spark: linreg (normal equations)", label, "Spark MLlib", "one fit", None,
                 _median([r["seconds"] for r in sl]), compute_runs=[r["seconds"] for r in sl],
                 note=f"solver = \"normal\", {sl[-1]['passes']} passes; {agree}", extra={"coef_agree": ok})]

    # KMeans from MLlib's own start
    C0 = np.array(spark["kmeans_start"])
    import zarr

    init = work / "kmeans-init.zarr"
    zarr.create_array(store=str(init), shape=C0.shape, chunks=C0.shape, dtype="float64", overwrite=True)[...] = C0
    fits = _fits(ctx, lambda: KMeans(KMeansParams(k=s.k, init=str(init), max_iter=s.iterations, tol=0.0),
                                     {"X": info["X"]}))
    result = fits[-1][1]
    sk = spark["kmeans"][1:]
    X = zarr.open_array(str(data / "X.zarr"), mode="r")
    ours_c, theirs_c = np.asarray(result.arrays["centroids"]), np.array(sk[-1]["centres"])
    ours_i, theirs_i = inertia(X, ours_c), inertia(X, theirs_c)
    same = abs(ours_i - theirs_i) <= 1e-9 * abs(theirs_i) + 1e-9 and result.attrs["iterations"] == sk[-1]["iterations"]
    diff = float(np.abs(ours_c - theirs_c).max())
    agree = (f"centres {'agree' if same else 'DIFFER'} (max difference {diff:.1e}); inertia on X of arrayjob's "
             f"{ours_i:.10g}, of Spark's {theirs_i:.10g}")
    per_iter = [f[0] / f[1].attrs["iterations"] for f in fits]
    spark_iter = [r["seconds"] / r["iterations"] for r in sk]
    rows += [Row("vs Spark: KMeans per iteration", label + f", k = {s.k}", "arrayjob", "per iteration (fit / iterations)",
                 None, _median(per_iter), arrayjob=True, peer=False, compute_runs=per_iter,
                 note=f"the kmeans job from Spark's start (init), {result.attrs['iterations']} iterations; the fit "
                      f"ends with the labels-and-inertia pass", extra={"inertia": ours_i, "agree": same}),
             Row("vs Spark: KMeans per iteration", label + f", k = {s.k}", "Spark MLlib",
                 "per iteration (fit / iterations)", None, _median(spark_iter), compute_runs=spark_iter,
                 note=f"{sk[-1]['iterations']} iterations, {sk[-1]['passes']} passes, the fit ends with its summary; "
                      f"{agree}", extra={"inertia": theirs_i, "agree": same})]
    for r in rows:
        r.extra.setdefault("spark_process", {"seconds": seconds, "peak_bytes": peak, "blas": blas})
    return rows


def run_cold(data: Path, size: Size, repeat: int) -> list[Row]:
    """``cold_jobs`` in ``data``'s ``vs-spark`` directory."""
    return cold_jobs(data, size, repeat, data.parent / "vs-spark")
