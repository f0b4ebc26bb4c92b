"""Kill a Ray node under every algorithm, at every stage, and compare with an undisturbed run.

Runs in the session's multi-node cluster harness (``tests/harness/cluster_harness.py``), which
calls ``run_matrix``: three worker nodes (one CPU each) are added, and for each algorithm
the job first runs undisturbed, then once per case with a worker node killed
(``remove_node(node, allow_graceful=False)``: its raylet, object store and workers die at
once) at a named point of the run (``arrayjob.runtime.supervision.pause``), the run held there until
the GCS has marked the node dead:

- ``load``: the load stage starts; once a task runs on the victim (its raylet's workers, read
  from ``/proc``) it is killed, blocks being read; at the latest when the load's work is done;
- ``compute``: the compute stage (``fit``, ``factor``, ``compute``) holds loaded blocks on
  the victim: after its first iteration, or as it starts for a one-pass job;
- ``write``: the outputs are being written;
- ``comeback``: as ``compute``, and a new node is started at once.

A replacement worker, started as soon as the victim is dead while the run goes on, brings
the cluster back to three workers for the next case. ``run_matrix`` returns, per case, whether
the run succeeded, the largest difference of its published arrays (opened with plain zarr)
from the undisturbed run's, and its report's ``faults``, ``tasks`` and traffic.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from tests.harness.cluster_harness import WORKER, children

REPO = Path(__file__).resolve().parents[2]
NODE = WORKER
WORKERS = 3

# algorithm -> (config, datagen arguments, spec overrides, the compute point); small data, a
# few dozen blocks
JOBS: dict[str, tuple[str, dict[str, Any], list[str], str]] = {
    "logreg": ("logreg", {"rows": 24000, "cols": 8, "chunk_rows": 1000}, ["params.max_iter=15"], "fit:1"),
    "logreg-newton": ("logreg", {"rows": 24000, "cols": 8, "chunk_rows": 1000},
                      ["params.solver=\"newton\"", "params.max_iter=6"], "fit:1"),
    # a sparse X (CSR, 5 non-zeros a row): its row blocks rebuilt after a loss like dense ones
    "logreg-sparse": ("logreg", {"rows": 24000, "cols": 400, "chunk_rows": 1000, "nnz_per_row": 5},
                      ["params.max_iter=15"], "fit:1"),
    "linreg": ("linreg", {"rows": 24000, "cols": 8, "chunk_rows": 1000}, [], "fit"),
    "kmeans": ("kmeans", {"rows": 24000, "cols": 4, "chunk_rows": 1000, "k": 4}, ["params.k=4", "params.max_iter=10"],
               "fit:1"),
    "pagerank": ("pagerank", {"rows": 3000, "cols": 2, "chunk_rows": 1000, "edges": 24000}, ["params.max_iter=15"],
                 "fit:1"),
    "tsqr": ("tsqr", {"rows": 24000, "cols": 8, "chunk_rows": 1000}, [], "factor"),
    "mttkrp": ("mttkrp", {"rows": 48, "cols": 16, "chunk_rows": 4, "rank": 4, "shape": "48,16,16"}, [], "compute"),
    "cp_als": ("cp_als", {"rows": 48, "cols": 16, "chunk_rows": 4, "rank": 3, "shape": "48,16,16"},
               ["params.rank=3", "params.max_iter=10"], "fit:1"),
}
STAGES = ("load", "compute", "write", "comeback")
# Every algorithm's compute, and its load where its reads differ: logreg's stands for Newton's
# and linreg's (the same X and y, read by the same load). The write stage is the driver's
# for every algorithm: under a result the driver writes and one whose big array the workers
# wrote (TSQR's Q). A node that comes back under a driver-side and a worker-written result.
SAME_LOAD_AS_LOGREG = ("logreg-newton", "logreg-sparse", "linreg")
WRITES = ("logreg", "tsqr")
DEFAULT_CASES = [c for j in JOBS for c in (
    *([f"{j}:load"] if j not in SAME_LOAD_AS_LOGREG else []), f"{j}:compute",
    *([f"{j}:write"] if j in WRITES else []), *([f"{j}:comeback"] if j in ("logreg", "kmeans") else []))]
IDLE_TITLES = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def make_data(bucket: Path) -> None:
    """Each algorithm's inputs where its config in configs/ expects them under ``bucket``."""
    from arrayjob.datagen import DatagenRequest, generate
    from arrayjob.io.locations import StorageOptions, parse_uri

    for name, (algorithm, args, _, _) in JOBS.items():
        if name != algorithm and not _own_data(name):
            continue  # shares its algorithm's data
        args = dict(args)
        shape = tuple(int(s) for s in args.pop("shape", "").split(",") if s)
        request = DatagenRequest(parse_uri(str(bucket / "demo" / name)), args.pop("rows"), args.pop("cols"),
                                 args.pop("chunk_rows"), 0, StorageOptions(), shape=shape, **args)
        generate(algorithm, request)


def _own_data(name: str) -> bool:
    """A case with data of its own (a sparse X), not its algorithm's."""
    return "nnz_per_row" in JOBS[name][1]


def spec_for(workdir: Path, name: str, output: str, address: str) -> Any:
    from arrayjob.spec import load_spec

    algorithm, _, overrides, _ = JOBS[name]
    env = {**os.environ, "ARRAYJOB_BUCKET": str(workdir / "data-root")}
    if _own_data(name):  # its inputs where make_data wrote them, not its config's
        data = workdir / "data-root" / "demo" / name
        overrides = [*overrides, *(f"inputs.{a}={json.dumps(str(data / f'{a}.zarr'))}" for a in ("X", "y"))]
    return load_spec(REPO / "configs" / f"{algorithm}.toml", [
        *overrides, f"output.uri={json.dumps(str(workdir / 'out' / output))}",
        f"cluster.address={json.dumps(address)}",
    ], env=env)


def published_arrays(spec: Any) -> dict[str, np.ndarray]:
    """Every array of the published result.zarr, read with plain zarr."""
    import zarr

    from arrayjob.io.output import published

    where = published(spec.output, spec.storage)
    assert where is not None, f"nothing published at {spec.output}"
    group = zarr.open_group(str(where.join("result.zarr")), mode="r")
    return {name: np.asarray(array[...]) for name, array in group.arrays()}


def running_task(raylet_pid: int) -> bool:
    """Whether a worker of this raylet runs a task (its title is the task's name)."""
    return any(args and args[0].startswith("ray::") and not args[0].startswith(IDLE_TITLES)
               for _, args in children(raylet_pid))


class NodeKiller:
    """Kills a worker node at the case's point of a run (``runtime.pause.hold``).

    The run goes on in a thread of its own: Ray starts a node only from the main thread, so
    the kill and the replacement node are done there (``serve``), the run held until the
    victim is dead and let go while the replacement starts."""

    def __init__(self, harness: Any, name: str, stage: str) -> None:
        self.harness, self.stage = harness, stage
        self.point = {"load": "load:end", "write": "write"}.get(stage, JOBS[name][3])
        self.victim = harness.workers[0]
        self.killed_in: str | None = None
        self.mid_task = False  # a task of the run was running on the victim when it died
        self._requests: queue.Queue[tuple[str, bool]] = queue.Queue()
        self._lock = threading.Lock()
        self._requested = False
        self._killed = threading.Event()

    def hold(self, metrics: Any) -> None:
        from arrayjob.runtime.supervision.pause import hold

        points = [self.point, "load"] if self.stage == "load" else [self.point]
        hold(metrics, points, lambda point: self.watch() if point == "load" else self.request(metrics.current_stage))

    def request(self, stage: str | None, mid_task: bool = False, wait: bool = True) -> None:
        """Ask for the kill (once); with ``wait``, return when the victim is dead."""
        with self._lock:
            if not self._requested:
                self._requested = True
                self._requests.put((stage or "", mid_task))
        if wait:
            self._killed.wait()

    def watch(self) -> None:
        """Ask for the kill as soon as one of the victim's workers runs a task."""
        raylet = self.victim.all_processes["raylet"][0].process.pid

        def watch() -> None:
            while not self._requested:
                if running_task(raylet):
                    self.request("load", mid_task=True, wait=False)
                    return
                time.sleep(0.005)

        threading.Thread(target=watch, daemon=True).start()

    def serve(self, run: threading.Thread) -> None:
        """In the main thread while ``run`` goes on: the kill, then the replacement node."""
        while run.is_alive():
            try:
                stage, mid_task = self._requests.get(timeout=0.05)
            except queue.Empty:
                continue
            self.harness.kill(self.victim)
            self.killed_in, self.mid_task = stage, mid_task
            if self.stage == "comeback":
                self.harness.add_node(**NODE)
            self._killed.set()
            if self.stage != "comeback":  # the run places no work on it (its nodes were fixed at connect)
                self.harness.add_node(**NODE)
        self._requested = True  # a watcher still waiting stops


def run_case(harness: Any, workdir: Path, name: str, stage: str | None, reference: dict[str, np.ndarray] | None,
             ) -> dict[str, Any]:
    from arrayjob import runner
    from arrayjob.runtime.metrics import RunMetrics

    label = f"{name}:{stage or 'undisturbed'}"
    spec = spec_for(workdir, name, label.replace(":", "-"), harness.address)
    metrics = RunMetrics()
    killer = NodeKiller(harness, name, stage) if stage else None
    started = time.perf_counter()
    case: dict[str, Any] = {"case": label}
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["outcome"] = runner.run(spec, metrics=metrics)
        except BaseException as exc:  # noqa: BLE001 - reported, the matrix goes on
            done["error"] = f"{type(exc).__name__}: {exc}"
            done["traceback"] = traceback.format_exc()[-2000:]

    if killer is None:
        run()
    else:
        killer.hold(metrics)
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        killer.serve(thread)
        thread.join()
        case.update(killed_in=killer.killed_in, mid_task=killer.mid_task)
    case["seconds"] = round(time.perf_counter() - started, 2)
    restore(harness)
    print(f"node loss: {label} {case['seconds']} s (with the restore {time.perf_counter() - started:.2f} s)"
          f"{'; killed mid-task' if case.get('mid_task') else ''}", file=sys.stderr, flush=True)
    if "outcome" not in done:
        case.update(ok=False, error=done.get("error"), traceback=done.get("traceback"))
        return case
    outcome = done["outcome"]
    arrays = published_arrays(spec)
    report = outcome.report
    case.update(ok=True, faults=report.get("faults"), nodes=report.get("nodes"), tasks=report.get("tasks"),
                cluster_nodes_lost=report["cluster"].get("nodes_lost"),
                bytes_between_nodes=report["network"]["bytes_between_nodes"],
                input_bytes=sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                                for a in runner.open_inputs(spec).values()),
                arrays=sorted(arrays))
    case["attrs"] = {k: v for k, v in outcome.result.attrs.items() if isinstance(v, int | float | bool | str)}
    if reference is not None:
        case["max_rel_diff"] = max_rel_diff(arrays, reference)
    case["_arrays"] = arrays
    return case


def max_rel_diff(arrays: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    if sorted(arrays) != sorted(reference):
        return float("inf")
    worst = 0.0
    for name, ref in reference.items():
        got = arrays[name]
        if got.shape != ref.shape:
            return float("inf")
        if got.dtype.kind in "fc":
            scale = max(float(np.abs(ref).max(initial=0.0)), 1e-300)
            worst = max(worst, float(np.abs(got - ref).max(initial=0.0)) / scale)
        elif not np.array_equal(got, ref):
            return float("inf")
    return worst


def restore(harness: Any) -> None:
    """Back to three workers, none of them busy."""
    harness.use_workers(WORKERS, **NODE)


def run_matrix(harness: Any, workdir: str, cases: list[str] | None = None) -> list[dict[str, Any]]:
    """Every case of ``cases`` (``DEFAULT_CASES``), each algorithm's undisturbed run first."""
    root = Path(workdir)
    make_data(root / "data-root")
    restore(harness)
    references: dict[str, dict[str, np.ndarray]] = {}
    results: list[dict[str, Any]] = []
    for name, stage in (c.split(":") for c in cases or DEFAULT_CASES):
        if name not in references:
            undisturbed = run_case(harness, root, name, None, None)
            references[name] = undisturbed.pop("_arrays", {})
            results.append(undisturbed)
        case = run_case(harness, root, name, stage, references[name])
        case.pop("_arrays", None)
        results.append(case)
    return results


def main() -> None:
    """``python -m tests.harness.node_loss --workdir DIR --out FILE [--cases logreg:load,...]``: the
    matrix on a cluster harness of its own, its cases as one JSON document in FILE."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="where the JSON document goes")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES))
    args = parser.parse_args()
    from tests.harness.cluster_harness import started

    args.workdir.mkdir(parents=True, exist_ok=True)
    with started(args.workdir) as cluster:
        cases = cluster.call("tests.harness.node_loss:run_matrix", timeout=3600, workdir=str(args.workdir),
                             cases=args.cases.split(","))
    args.out.write_text(json.dumps({"cases": cases}, indent=1, default=str))


if __name__ == "__main__":
    main()
