"""Sparse X (issue 24): arrayjob on CSR groups against scikit-learn on the same CSR matrix in
memory, and against one read of the CSR bytes, side by side in one run.

(Named bench_sparse, not sparse: bench.py puts this directory first on sys.path, and a
``sparse.py`` here shadowed pydata's ``sparse``, which ``dask.array`` imports: ``make bench``
stopped at its first dask row. tests/system/benchmarks/test_bench.py runs bench.py's harness to catch the next.)

    .venv/bin/python benchmarks/bench_sparse.py [--size full|quick|tiny] [--only logreg,kmeans] [--repeat 3]
                                          [--workdir DIR] [--json FILE] [--markdown FILE]
    make bench                          # the same, full size, after bench.py and outofcore.py

Data are written once by ``arrayjob datagen ... --nnz-per-row 30`` into ``--workdir``
(default .arrayjob/bench/sparse/SIZE; a ``datagen.json`` beside them says they are complete)
and reused. Sizes: ``full`` (the issue's: logreg X 10,000,000 × 2²⁰, 30 non-zeros a row, 3.6
GB of CSR; kmeans X 2,000,000 × 2¹⁶, 30 a row, 0.72 GB, k = 16), ``quick`` (1,000,000 and
200,000 rows) and ``tiny`` (5,000 rows each: tests/system/benchmarks/test_bench_sparse.py runs it).

Rows (each written to ``--json`` and ``--markdown`` as it finishes, so a crash keeps the rows
before it):

- ``sparse logreg, per evaluation``: one loss-and-gradient pass of L2 logistic regression.
  *arrayjob*: one ``arrayjob run`` of the logreg job (L-BFGS, ``max_iter`` fixed, ``tol`` tiny so
  it makes them all), its own process with its own local Ray (as benchmarks/outofcore.py runs
  cases); seconds = the report's fit stage / the result's ``evaluations``; load = its load stage.
  *scikit-learn*: what ``LogisticRegression(solver="lbfgs")`` calls once per evaluation,
  ``LinearModelLoss(HalfBinomialLoss(), fit_intercept=True).loss_gradient`` with the same
  objective (``l2_reg_strength`` = the job's ``l2``), at arrayjob's fitted coefficients, on
  the group's three arrays read with zarr into a ``scipy.sparse.csr_matrix`` (load = that read);
  OpenMP threads as sklearn chooses; the median of ``--repeat`` calls after a warm-up. If that
  private API is missing, ``LogisticRegression(...).fit`` over the evaluations SciPy's L-BFGS-B
  made; the note says which. Its loss at arrayjob's coefficients is set beside arrayjob's
  objective in the note (they agree to rounding).
  *one read of the CSR bytes*: ``data.sum()``, ``indices.sum()`` and ``indptr.sum()`` in memory,
  the best of 1 and 2 threads (median of ``--repeat`` after a warm-up): the memory-read floor.
  Targets (reported, never asserted): arrayjob >= 2× faster than scikit-learn, and within 2× of
  the read.
- ``sparse KMeans, per iteration``: Lloyd, k = 16, from the same initial centroids (k rows of X,
  drawn with seed 2, written once as a (k, d) Zarr array and passed as ``params.init``), ``tol``
  0. *arrayjob*: fit stage / ``iterations`` (the fit stage ends with the labels-and-inertia
  pass); *scikit-learn*: ``KMeans(init=C0, n_init=1, algorithm="lloyd", max_iter=m, tol=0).fit``
  / ``n_iter_`` (fit validates X and ends with an E-step); the read of its CSR bytes as above.
  Target: arrayjob >= 2× faster than scikit-learn (the issue's "the same for KMeans").
- ``peak memory per node``, one per arrayjob run: the most bytes each node's object store held
  (the report's ``memory.store_peak_bytes_per_node``, read from the raylets) over the CSR
  blocks it holds (``memory.input_block_bytes_per_node``); the replayed peak
  (``memory.peak_bytes_per_node``) beside it. Target: <= 1.3×. The raylets see the object store,
  not a task's heap; a densified block would not fit in memory at these widths (n × 2²⁰ × 8
  bytes), so a run that finishes made none.

*Spark MLlib* (issue 28), the issue's third system, for both rows (benchmarks/bench_spark_models.py
beside benchmarks/spark_models.py, a process of its own with spark_peer.py's session): the same
CSR written as Parquet whose ``features`` column is Spark's SparseVector struct, built from the
CSR arrays (no row densified), read back as SparseVectors, cached and counted. logreg:
``LogisticRegression(regParam = l2, standardization = False)``, the same objective, L-BFGS for
the same iterations (``tol = 0``); seconds = fit / its passes (Spark jobs); its coefficients set
beside arrayjob's after the same iterations, its objective beside the objective at its
coefficients computed here. KMeans: mllib ``KMeans`` (what ``ml.KMeans`` runs; the DataFrame API
takes no start) from the same initial centroids, ``epsilon = 0``; fit / iterations; centroids
compared. Median of ``--repeat`` fits after a warm-up in one session. Not at the tiny size (the
test suite starts no JVM) nor without pyspark and Java >= 17: the row says why.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import bench_spark_models  # noqa: E402
from bench_harness import (  # noqa: E402
    Row,
    Timing,
    commit,
    machine_line,
    markdown,
    script_arguments,
    timed,
    versions,
)


@dataclass(frozen=True)
class Shape:
    rows: int
    cols: int
    nnz_per_row: int
    chunk_rows: int

    def describe(self) -> str:
        cols = f"2^{self.cols.bit_length() - 1}" if self.cols & (self.cols - 1) == 0 else f"{self.cols:,}"
        nbytes = self.rows * self.nnz_per_row * 12 + (self.rows + 1) * 4  # float64 data, int32 indices and indptr
        csr = f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"
        return f"X {self.rows:,} × {cols}, {self.nnz_per_row} nnz/row ({csr} CSR)"


SIZES = {
    "full": {"logreg": Shape(10_000_000, 2**20, 30, 250_000), "kmeans": Shape(2_000_000, 2**16, 30, 100_000),
             "lbfgs_iter": 10, "kmeans_iter": 10},
    "quick": {"logreg": Shape(1_000_000, 2**20, 30, 100_000), "kmeans": Shape(200_000, 2**16, 30, 25_000),
              "lbfgs_iter": 10, "kmeans_iter": 10},
    "tiny": {"logreg": Shape(5_000, 2**20, 30, 1_000), "kmeans": Shape(5_000, 2**16, 30, 1_000),
             "lbfgs_iter": 3, "kmeans_iter": 3},
}
K = 16
L2 = 1e-4  # the logreg job's default, and sklearn's l2_reg_strength
CASE_TIMEOUT = 3600  # seconds for one arrayjob run


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def arrayjob(*args: str, cwd: Path | None = None, timeout: float = CASE_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """The arrayjob command of this interpreter (this checkout when it is on PYTHONPATH), with
    a local Ray of its own."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return subprocess.run([sys.executable, "-m", "arrayjob.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# -- data ------------------------------------------------------------------------------------


def prepare(work: Path, algorithm: str, shape: Shape) -> Path:
    """X (and y) written once by arrayjob datagen; kmeans also its initial centroids."""
    data = work / algorithm
    marker = data / "datagen.json"
    wanted = {"algorithm": algorithm, **shape.__dict__, "k": K}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return data
    marker.unlink(missing_ok=True)  # until the new data are complete
    log(f"{algorithm}: arrayjob datagen {shape.describe()} into {data}")
    done = arrayjob("datagen", algorithm, str(data), "--rows", str(shape.rows), "--cols", str(shape.cols),
                    "--nnz-per-row", str(shape.nnz_per_row), "--chunk-rows", str(shape.chunk_rows), "--k", str(K))
    if done.returncode != 0:
        raise SystemExit(f"datagen failed: {done.stderr.strip()}")
    if algorithm == "kmeans":
        write_centroids(data)
    marker.write_text(json.dumps(wanted))
    return data


def write_centroids(data: Path) -> None:
    """K rows of X (seed 2), dense, as the (K, d) array ``init.zarr``."""
    import zarr

    group = zarr.open_group(str(data / "X.zarr"), mode="r")
    n, d = group.attrs["shape"]
    indptr = group["indptr"][:]
    C = np.zeros((K, d))
    for i, r in enumerate(np.sort(np.random.default_rng(2).choice(n, size=K, replace=False))):
        a, b = int(indptr[r]), int(indptr[r + 1])
        C[i, group["indices"][a:b]] = group["data"][a:b]
    zarr.create_array(store=str(data / "init.zarr"), shape=C.shape, chunks=C.shape, dtype="float64",
                      overwrite=True)[...] = C


def load_csr(path: Path) -> tuple[Any, float]:
    """The group's three arrays read with zarr into a csr_matrix (no copy); the seconds it took."""
    import scipy.sparse
    import zarr

    start = time.perf_counter()
    group = zarr.open_group(str(path), mode="r")
    X = scipy.sparse.csr_matrix((group["data"][:], group["indices"][:], group["indptr"][:]),
                                shape=tuple(group.attrs["shape"]))
    return X, time.perf_counter() - start


def csr_read(X: Any, repeat: int) -> tuple[Timing, str]:
    """One pass over the CSR bytes in memory (sums: SIMD, no writes), the best of 1 and 2 threads."""
    arrays = (X.data, X.indices, X.indptr)
    halves = [h for a in arrays for h in np.array_split(a, 2)]
    one = timed(lambda: [a.sum() for a in arrays], repeat)
    with ThreadPoolExecutor(2) as pool:
        two = timed(lambda: list(pool.map(lambda hs: [h.sum() for h in hs], (halves[0::2], halves[1::2]))), repeat)
    best, threads = min((one, 1), (two, 2), key=lambda t: t[0].median)
    nbytes = sum(a.nbytes for a in arrays)
    return best, (f"data.sum() + indices.sum() + indptr.sum(), {nbytes / 1e6:,.0f} MB, best of 1 and 2 threads "
                  f"({threads}: {nbytes / best.median / 1e9:.1f} GB/s; 1 thread {one.median:.3g} s, "
                  f"2 threads {two.median:.3g} s)")


# -- arrayjob runs ---------------------------------------------------------------------------


def run_job(work: Path, algorithm: str, inputs: dict[str, Path], params: str) -> dict[str, Any]:
    """One ``arrayjob run`` with its own local Ray: its report, plus the published result's
    arrays, or {"error": ...}."""
    runs = work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    output = runs / f"{algorithm}-out"
    body = "".join(f'{name} = "{path}"\n' for name, path in inputs.items())
    spec = runs / f"{algorithm}.toml"
    spec.write_text(f'[job]\nname = "sparse-{algorithm}"\nalgorithm = "{algorithm}"\n\n[inputs]\n{body}\n'
                    f'[params]\n{params}\n[output]\nuri = "{output}"\n\n[cluster]\nnum_cpus = 2\n\n'
                    "[run]\ncheckpoint_every = 3600\n")
    start = time.perf_counter()
    try:
        done = arrayjob("run", str(spec), "--json", "--overwrite", cwd=runs)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {CASE_TIMEOUT} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:500]}
    report = json.loads(done.stdout)
    report["process_seconds"] = time.perf_counter() - start
    import zarr

    prefix = json.loads((output / "_SUCCESS").read_text())["prefix"]
    group = zarr.open_group(str(output / prefix / "result.zarr"), mode="r")
    report["arrays"] = {name: np.asarray(group[name][...]) for name in group.array_keys()}
    return report


def stage(report: dict[str, Any], name: str) -> float:
    return float(next(s["wall_seconds"] for s in report["stages"] if s["name"] == name))


def job_row(workload: str, size: str, unit: str, report: dict[str, Any], passes_key: str, what: str) -> Row:
    if "error" in report:
        return Row(workload, size, "arrayjob", unit, arrayjob=True, peer=False, note=f"failed: {report['error']}")
    passes = int(report["result"][passes_key])
    fit = stage(report, "fit")
    extra = {k: report["result"][k] for k in ("iterations", "evaluations", "objective", "inertia")
             if k in report["result"]}
    estimate = next(s for s in report["estimate"]["stages"] if s["name"] == "fit")  # the run's own estimate
    extra.update(fit_seconds=fit, connect_seconds=stage(report, "connect"), process_seconds=report["process_seconds"],
                 wall_seconds=report["wall_seconds"], tasks=report["tasks"]["count"],
                 estimate_seconds_per_pass=estimate["wall_seconds"] / max(1, estimate["runs"]))
    return Row(workload, size, "arrayjob", unit, stage(report, "load"), fit / max(1, passes), arrayjob=True,
               peer=False, extra=extra,
               note=f"{what}: fit stage {fit:.3g} s / {passes} {passes_key} (estimate: "
                    f"{extra['estimate_seconds_per_pass']:.3g} s each); its own process and local Ray "
                    f"({report['process_seconds']:.1f} s in all, of it starting Ray {stage(report, 'connect'):.1f} s); "
                    f"{report['tasks']['count']} tasks")


def memory_row(workload: str, report: dict[str, Any]) -> dict[str, Any]:
    if "error" in report:
        return {"workload": workload, "error": report["error"]}
    m = report["memory"]
    held = m["input_block_bytes_per_node"]
    store, replayed = m["store_peak_bytes_per_node"], m["peak_bytes_per_node"]
    ratios = [s / h if h else float("nan") for s, h in zip(store, held, strict=True)]
    worst = max(ratios)
    return {"workload": workload, "nodes": len(held), "input_block_bytes_per_node": held,
            "store_peak_bytes_per_node": store, "replayed_peak_bytes_per_node": replayed,
            "ratio": worst, "replayed_ratio": max(r / h if h else float("nan") for r, h in zip(replayed, held, strict=True)),
            "ray_spilled_bytes": m["ray_spilled_bytes"], "target": "<= 1.3× the CSR blocks held",
            "target_met": bool(worst <= 1.3)}


# -- scikit-learn ----------------------------------------------------------------------------


def sklearn_evaluation(X: Any, y: np.ndarray, theta: np.ndarray, repeat: int, max_iter: int) -> tuple[Timing, float, str]:
    """Seconds of one loss-and-gradient evaluation as sklearn's lbfgs makes it, its loss at
    ``theta``, and which way it was timed."""
    try:
        from sklearn._loss.loss import HalfBinomialLoss
        from sklearn.linear_model._linear_loss import LinearModelLoss
        from sklearn.utils._openmp_helpers import _openmp_effective_n_threads

        loss = LinearModelLoss(base_loss=HalfBinomialLoss(), fit_intercept=True)
        threads = _openmp_effective_n_threads()
        values: list[float] = []
        t = timed(lambda: values.append(loss.loss_gradient(theta, X, y, l2_reg_strength=L2, n_threads=threads)[0]),
                  repeat)
        return t, values[-1], (f"LinearModelLoss(HalfBinomialLoss(), fit_intercept=True).loss_gradient, what "
                               f"LogisticRegression(solver='lbfgs') calls per evaluation; {threads} OpenMP threads")
    except (ImportError, TypeError) as missing:
        return sklearn_fit_evaluation(X, y, repeat, max_iter, f"{type(missing).__name__}: {missing}")


def sklearn_fit_evaluation(X: Any, y: np.ndarray, repeat: int, max_iter: int, why: str) -> tuple[Timing, float, str]:
    """The fallback: ``LogisticRegression(solver="lbfgs").fit`` over the evaluations its L-BFGS-B made."""
    from unittest import mock

    import scipy.optimize
    from sklearn.linear_model import LogisticRegression

    original, made = scipy.optimize.minimize, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        made.append(result.nfev)
        return result

    fits: list[Any] = []
    with mock.patch.object(scipy.optimize, "minimize", counted):
        t = timed(lambda: fits.append(LogisticRegression(C=1 / (L2 * X.shape[0]), solver="lbfgs", max_iter=max_iter,
                                                         tol=1e-300).fit(X, y)), repeat)
    evaluations = made[-1] if made else int(fits[-1].n_iter_[0])
    per = Timing(t.median / evaluations, [r / evaluations for r in t.runs])
    return per, float("nan"), (f"private loss API unavailable ({why}): LogisticRegression(solver='lbfgs', "
                               f"max_iter={max_iter}).fit / {evaluations} {'evaluations' if made else 'iterations'}")


def sklearn_kmeans(X: Any, C0: np.ndarray, iterations: int, repeat: int) -> tuple[Timing, Any]:
    from sklearn.cluster import KMeans

    fits: list[Any] = []
    t = timed(lambda: fits.append(KMeans(n_clusters=K, init=C0, n_init=1, algorithm="lloyd", max_iter=iterations,
                                         tol=0.0).fit(X)), repeat)
    n_iter = fits[-1].n_iter_
    return Timing(t.median / n_iter, [r / n_iter for r in t.runs]), fits[-1]


# -- the run ---------------------------------------------------------------------------------


class Table:
    """The rows so far, written out whole after every row (a crash keeps what finished)."""

    def __init__(self, args: argparse.Namespace, size: dict[str, Any]) -> None:
        self.args = args
        self.rows: list[Row] = []
        self.memory: list[dict[str, Any]] = []
        self.doc: dict[str, Any] = {"size": args.size, "sizes": {k: (v.__dict__ if isinstance(v, Shape) else v) for k, v in size.items()},
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": commit(), "machine": machine_line(),
                    "versions": versions(), "repeat": args.repeat, "load_average_start": os.getloadavg(),
                    "complete": False}

    def add(self, row: Row | None = None, memory: dict[str, Any] | None = None) -> None:
        if row is not None:
            row.extra.setdefault("load_average", os.getloadavg()[0])
            self.rows.append(row)
            log(f"{row.workload}: {row.system}: " + (f"{row.compute_s:.4g} s {row.unit}" if row.compute_s else row.note))
        if memory is not None:
            self.memory.append(memory)
            log(f"{memory['workload']}: peak memory " + (f"{memory['ratio']:.2f}× the CSR blocks held"
                                                          if "ratio" in memory else memory["error"]))
        self.write()

    def write(self, complete: bool = False) -> None:
        judge(self.rows)
        doc = {**self.doc, "complete": complete, "load_average_end": os.getloadavg(),
               "rows": [r.as_dict() for r in self.rows], "memory": self.memory}
        if self.args.json:
            self.args.json.parent.mkdir(parents=True, exist_ok=True)
            self.args.json.write_text(json.dumps(doc, indent=1, default=str))
        if self.args.markdown:
            self.args.markdown.parent.mkdir(parents=True, exist_ok=True)
            self.args.markdown.write_text(self.markdown())

    def markdown(self) -> str:
        load = ", ".join(f"{x:.1f}" for x in self.doc["load_average_start"])
        lines = [f"{self.args.size} size, {self.doc['date']}, commit {self.doc['commit']}; {machine_line()} "
                 f"(at the start: {load})", "", markdown(self.rows), ""]
        if self.memory:
            lines += ["| workload | arrayjob run's peak per node (raylets) | CSR blocks held per node | × held "
                      "| replayed peak (× held) | target |", "|---|---|---|---|---|---|"]
            for m in self.memory:
                if "error" in m:
                    lines.append(f"| {m['workload']} | failed: {m['error']} | | | | |")
                    continue
                verdict = "**met**" if m["target_met"] else "**missed**"
                lines.append(f"| {m['workload']} | {mb(max(m['store_peak_bytes_per_node']))} "
                             f"| {mb(max(m['input_block_bytes_per_node']))} | {m['ratio']:.2f}× "
                             f"| {mb(max(m['replayed_peak_bytes_per_node']))} ({m['replayed_ratio']:.2f}×) "
                             f"| {verdict}: {m['target']} |")
        return "\n".join(lines) + "\n"


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


# the targets on arrayjob's rows: workload -> (what, test(arrayjob s, scikit-learn s, read s))
TARGETS = {
    "sparse logreg": (">= 2× faster than scikit-learn, and <= 2× one read of the CSR bytes",
                      lambda aj, sk, read: aj * 2 <= sk and aj <= 2 * read),
    "sparse KMeans": (">= 2× faster than scikit-learn", lambda aj, sk, read: aj * 2 <= sk),
}


def judge(rows: list[Row]) -> None:
    """Ratios to scikit-learn (the best peer) and to the read of the CSR bytes (the limit), and
    arrayjob's targets, from the rows present so far."""
    for workload, (what, test) in TARGETS.items():
        group = [r for r in rows if r.workload.startswith(workload)]
        sk = next((r.compute_s for r in group if r.system.startswith("scikit-learn") and r.compute_s), None)
        read = next((r.compute_s for r in group if r.system.startswith("one read") and r.compute_s), None)
        for r in group:
            r.limit_s = read
            r.ratio_best_peer = r.compute_s / sk if r.compute_s and sk else None
            r.ratio_limit = r.compute_s / read if r.compute_s and read else None
            if r.arrayjob:
                r.target = what
                r.target_met = None if not (r.compute_s and sk and read) else bool(test(r.compute_s, sk, read))



def logreg(work: Path, size: dict[str, Any], table: Table, repeat: int) -> None:
    shape, iters = size["logreg"], size["lbfgs_iter"]
    data = prepare(work, "logreg", shape)
    label, unit = shape.describe(), "per evaluation"
    workload = "sparse logreg loss+grad"
    log(f"logreg: arrayjob run, L-BFGS, max_iter {iters}")
    report = run_job(work, "logreg", {"X": data / "X.zarr", "y": data / "y.zarr"},
                     f'solver = "lbfgs"\nl2 = {L2}\nfit_intercept = true\nmax_iter = {iters}\ntol = 1e-300\n')
    table.add(job_row(workload, label, unit, report, "evaluations", "the logreg job's L-BFGS"),
              memory_row("sparse logreg", report))

    log("logreg: X into memory (zarr -> csr_matrix), one read of its bytes, scikit-learn")
    X, load_s = load_csr(data / "X.zarr")
    import zarr

    y = np.asarray(zarr.open_array(str(data / "y.zarr"), mode="r")[:])
    read, note = csr_read(X, repeat)
    table.add(Row(workload, label, "one read of the CSR bytes (the floor)", unit, load_s, read.median, peer=False,
                  compute_runs=read.runs, note=note))
    if "error" in report:  # no coefficients to evaluate at: sklearn's own start
        theta = np.zeros(shape.cols + 1)
    else:
        theta = np.concatenate([report["arrays"]["coef"].ravel(), report["arrays"]["intercept"].ravel()])
    t, loss, how = sklearn_evaluation(X, y, theta, repeat, iters)
    if "error" not in report and np.isfinite(loss):
        objective = report["result"]["objective"]
        how += (f"; its loss at arrayjob's coefficients {loss:.12g}, arrayjob's objective {objective:.12g} "
                f"(relative difference {abs(loss - objective) / abs(objective):.1e})")
    table.add(Row(workload, label, "scikit-learn", unit, load_s, t.median, compute_runs=t.runs, note=how,
                  extra={"loss_at_arrayjob_coef": loss}))
    table.add(bench_spark_models.sparse_logreg(data, table.args.size, label, unit, X, y, L2, iters, report, repeat))


def kmeans(work: Path, size: dict[str, Any], table: Table, repeat: int) -> None:
    shape, iters = size["kmeans"], size["kmeans_iter"]
    data = prepare(work, "kmeans", shape)
    label, unit = f"{shape.describe()}, k = {K}", "per iteration"
    workload = "sparse KMeans"
    log(f"kmeans: arrayjob run, k {K}, max_iter {iters}")
    report = run_job(work, "kmeans", {"X": data / "X.zarr"},
                     f'k = {K}\ninit = "{data / "init.zarr"}"\nmax_iter = {iters}\ntol = 0\n')
    table.add(job_row(workload, label, unit, report, "iterations", "the kmeans job's Lloyd loop"),
              memory_row("sparse KMeans", report))

    log("kmeans: X into memory, one read of its bytes, scikit-learn")
    import zarr

    X, load_s = load_csr(data / "X.zarr")
    read, note = csr_read(X, repeat)
    table.add(Row(workload, label, "one read of the CSR bytes (the floor)", unit, load_s, read.median, peer=False,
                  compute_runs=read.runs, note=note))
    C0 = np.asarray(zarr.open_array(str(data / "init.zarr"), mode="r")[...])
    t, fit = sklearn_kmeans(X, C0, iters, repeat)
    note = f"lloyd, {fit.n_iter_} iterations, OpenMP threads as sklearn chooses; fit() also validates X and ends with an E-step"
    if "error" not in report:
        same = fit.n_iter_ == report["result"]["iterations"]
        diff = float(np.abs(fit.cluster_centers_ - report["arrays"]["centroids"]).max())
        note += (f"; centroids {'match' if same else 'after different iteration counts differ from'} arrayjob's "
                 f"to {diff:.1e}, inertia {fit.inertia_:.10g} (arrayjob's {report['result']['inertia']:.10g})")
    table.add(Row(workload, label, "scikit-learn", unit, load_s, t.median, compute_runs=t.runs, note=note,
                  extra={"n_iter": int(fit.n_iter_), "inertia": float(fit.inertia_)}))
    table.add(bench_spark_models.sparse_kmeans(data, table.args.size, label, unit, X, C0, iters, report, repeat))


WORKLOADS = {"logreg": logreg, "kmeans": kmeans}


def main() -> int:
    args, only = script_arguments(__doc__.splitlines()[0], SIZES, WORKLOADS, REPO / ".arrayjob" / "bench" / "sparse")
    size = SIZES[args.size]
    work = args.workdir.resolve() / args.size
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    log(f"size {args.size}; {machine_line()}")
    table = Table(args, size)
    for name in only:
        WORKLOADS[name](work, size, table, args.repeat)
    table.doc["seconds"] = time.perf_counter() - started
    table.write(complete=True)
    print(table.markdown())
    log(f"{time.perf_counter() - started:.0f} s in all; load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
