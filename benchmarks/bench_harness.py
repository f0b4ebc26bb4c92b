"""What every benchmark row is made of: timings (median after a warm-up), rows, targets, the table.

A ``Row`` is one system on one workload: its load seconds (storage to memory) and its
compute seconds (per evaluation, per iteration, per factorisation …, as ``unit`` says),
both the median of ``repeat`` runs after a warm-up run. The table adds, per workload,
the ratio to the best peer and to the limit measured in the same run.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Timing:
    """The median of the timed runs, and every run (warm-ups excluded)."""

    median: float
    runs: list[float]


def repeat_timed(run_once: Callable[[], float], repeat: int, warmup: int = 1) -> Timing:
    """``run_once`` returns the seconds it measured (so it may leave its setup untimed)."""
    for _ in range(warmup):
        run_once()
    runs = []
    for _ in range(repeat):
        gc.collect()
        runs.append(run_once())
    return Timing(statistics.median(runs), runs)


def stopwatch(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed(fn: Callable[[], Any], repeat: int, warmup: int = 1) -> Timing:
    return repeat_timed(lambda: stopwatch(fn), repeat, warmup)


@contextmanager
def dask_threads(workers: int = 2) -> Iterator[None]:
    """dask at its best on this machine: the threaded scheduler, one thread per core, and one
    BLAS thread per dask thread (dask's docs: oversubscribed BLAS threads slow it down)."""
    import dask
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1), dask.config.set(scheduler="threads", num_workers=workers):
        yield


@dataclass
class Row:
    workload: str
    size: str
    system: str
    unit: str  # what compute_s is the time of
    load_s: float | None = None
    compute_s: float | None = None
    peer: bool = True  # counts for "best peer" (arrayjob's rows never do)
    arrayjob: bool = False
    limit_s: float | None = None  # the physical limit for compute_s, measured this run
    note: str = ""
    load_runs: list[float] = field(default_factory=list)
    compute_runs: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    ratio_best_peer: float | None = None
    ratio_limit: float | None = None
    target: str = ""
    target_met: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _peer(rows: list[Row], system_prefix: str) -> Row | None:
    return next((r for r in rows if r.system.startswith(system_prefix) and r.compute_s), None)


def _best_peer(rows: list[Row]) -> float | None:
    times = [r.compute_s for r in rows if r.peer and not r.arrayjob and r.compute_s]
    return min(times) if times else None


def _at_most(system: str, factor: float) -> Callable[[Row, list[Row]], bool | None]:
    """arrayjob's time <= factor × that peer's."""
    def test(aj: Row, rows: list[Row]) -> bool | None:
        peer = _peer(rows, system)
        return None if peer is None or aj.compute_s is None else aj.compute_s <= factor * peer.compute_s  # type: ignore[operator]
    return test


def _faster_than_best(factor: float) -> Callable[[Row, list[Row]], bool | None]:
    def test(aj: Row, rows: list[Row]) -> bool | None:
        best = _best_peer(rows)
        return None if best is None or aj.compute_s is None else aj.compute_s * factor <= best
    return test


def _logreg_eval(aj: Row, rows: list[Row]) -> bool | None:
    if aj.compute_s is None or aj.limit_s is None:
        return None
    return aj.compute_s <= 1.4 * aj.limit_s and bool(_faster_than_best(1.0)(aj, rows))


# the targets for arrayjob: workload -> (what, test(arrayjob's row, the workload's rows))
TARGETS: dict[str, tuple[str, Callable[[Row, list[Row]], bool | None]]] = {
    "logreg loss+grad": ("<= 1.4× one read of X, and faster than every peer", _logreg_eval),
    "logreg L-BFGS": ("<= 0.5× NumPy+SciPy per iteration", _at_most("NumPy", 0.5)),
    "TSQR": (">= 3× faster than the best peer", _faster_than_best(3.0)),
    "linreg": ("default method (refined) <= 2× method normal", _at_most("arrayjob, method normal", 2.0)),
    "KMeans": (">= 1.5× faster than scikit-learn", _at_most("scikit-learn", 1 / 1.5)),
    "PageRank": ("faster than SciPy per iteration", _at_most("SciPy", 1.0)),
    "MTTKRP": (">= 1.2× faster than the best peer", _faster_than_best(1.2)),
    "S3 load": (">= 90% of raw parallel GET throughput",
                lambda aj, rows: None if not aj.limit_s or not aj.compute_s else aj.limit_s / aj.compute_s >= 0.9),
    "end-to-end demo job": ("< 15 s wall", lambda aj, rows: None if aj.compute_s is None else aj.compute_s < 15.0),
    # issue 26's models (benchmarks/models.py): faster than every peer measured beside them
    **{workload: ("faster than every peer", _faster_than_best(1.0))
       for workload in ("multinomial logreg", "elastic-net logreg", "elastic-net linreg", "PCA", "GMM", "ALS",
                        "predict")},
    # benchmarks/parquet.py: the limit is arrayjob's own load of the same data from Zarr
    "Parquet load": ("<= one pyarrow process's to_table, and <= 1.2× arrayjob's Zarr load",
                     lambda aj, rows: None if aj.ratio_best_peer is None or aj.ratio_limit is None
                     else aj.ratio_best_peer <= 1.0 and aj.ratio_limit <= 1.2),
    # issue 28: Spark MLlib on the same data (benchmarks/bench_spark.py)
    "vs Spark: logreg per pass": (">= 3× faster than Spark MLlib", _at_most("Spark MLlib", 1 / 3)),
    "vs Spark: linreg (normal equations)": (">= 3× faster than Spark MLlib", _at_most("Spark MLlib", 1 / 3)),
    "vs Spark: KMeans per iteration": (">= 3× faster than Spark MLlib", _at_most("Spark MLlib", 1 / 3)),
    "vs Spark: whole logreg job": (">= 3× faster than Spark MLlib", _at_most("Spark MLlib", 1 / 3)),
    "vs Spark: peak memory": ("<= half Spark MLlib's", _at_most("Spark MLlib", 0.5)),
}


def finish(rows: list[Row]) -> list[Row]:
    """Fill in ratios and targets, workload by workload."""
    by_workload: dict[str, list[Row]] = {}
    for r in rows:
        by_workload.setdefault(r.workload, []).append(r)
    for workload, group in by_workload.items():
        best = _best_peer(group)
        for r in group:
            if r.compute_s and best:
                r.ratio_best_peer = r.compute_s / best
            if r.compute_s and r.limit_s:
                r.ratio_limit = r.compute_s / r.limit_s
            if r.arrayjob and workload in TARGETS:
                r.target, test = TARGETS[workload]
                r.target_met = test(r, group)
    return rows


def seconds(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def markdown(rows: list[Row]) -> str:
    """The table as Markdown, one line per row; the target only on arrayjob's rows."""
    head = "| workload | size | system | load s | compute s | compute is | × best peer | × limit | limit s | target | note |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        target = ""
        if r.arrayjob and r.target:
            verdict = {True: "**met**", False: "**missed**", None: "n/a"}[r.target_met]
            target = f"{verdict}: {r.target}"
        system = f"**{r.system}**" if r.arrayjob else r.system
        lines.append(f"| {r.workload} | {r.size} | {system} | {seconds(r.load_s)} | {seconds(r.compute_s)} | {r.unit} "
                     f"| {_ratio(r.ratio_best_peer)} | {_ratio(r.ratio_limit)} | {seconds(r.limit_s)} | {target} "
                     f"| {r.note} |")
    return "\n".join(lines)


def commit() -> str:
    """The commit measured, with "+changes" when the work tree differs from it."""
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def machine_line() -> str:
    import platform

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores, {memory:.0f} GiB, Python {platform.python_version()}; "
            f"load average {os.getloadavg()[0]:.2f}")


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("arrayjob", "numpy", "scipy", "ray", "zarr", "dask", "dask-ml", "dask-glm", "scikit-learn",
                 "tensorly", "networkx", "moto", "boto3", "numexpr", "pyspark"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


class ProcessTreePeak:
    """The peak memory of a process and all its descendants (a JVM, Ray's raylet and workers),
    sampled every ``interval`` seconds: the sum of each process's PSS (shared pages, such as
    Ray's object store, counted once across the processes that map them; RSS where PSS cannot
    be read)."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        import threading

        self.pid, self.interval = pid, interval
        self.peak_bytes, self.most_processes = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        total = 0
        for p in procs:
            try:
                total += p.memory_full_info().pss
            except (psutil.Error, AttributeError):
                with suppress(psutil.Error):
                    total += p.memory_info().rss
        self.peak_bytes = max(self.peak_bytes, total)
        self.most_processes = max(self.most_processes, len(procs))

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak_bytes


def run_measured(command: list[str], **kwargs: Any) -> tuple[float, int, int, str]:
    """Run ``command`` to its end: wall seconds, the peak memory of its process tree, the most
    processes it had at once, and its stdout. Raises CalledProcessError (stderr's last lines)
    when it fails."""
    import subprocess

    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    peak = ProcessTreePeak(child.pid)
    out, err = child.communicate()
    seconds = time.perf_counter() - start
    peak.stop()
    if child.returncode != 0:
        raise subprocess.CalledProcessError(child.returncode, command, out, "\n".join(err.splitlines()[-20:]))
    return seconds, peak.peak_bytes, peak.most_processes, out


def script_arguments(description: str, sizes: Any, workloads: Any, workdir: Path) -> tuple[argparse.Namespace, list[str]]:
    """The options every side benchmark script takes (``bench_sparse.py``, ``models.py``): its
    size, the workloads to run (``--only``, checked against ``workloads``), the timed runs, where
    its data go, and where its JSON and Markdown go; returns them and the workloads chosen."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", choices=list(sizes), default="quick")
    parser.add_argument("--only", default=",".join(workloads), help=f"comma-separated, of: {', '.join(workloads)}")
    parser.add_argument("--repeat", type=int, default=3, help="timed in-process runs after one warm-up (median)")
    parser.add_argument("--workdir", type=Path, default=workdir)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    if unknown := sorted(set(only) - set(workloads)):
        parser.error(f"--only: unknown workload(s) {', '.join(unknown)} (expected: {', '.join(workloads)})")
    return args, only
