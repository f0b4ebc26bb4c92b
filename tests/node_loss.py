"""Kill a Ray node under every algorithm, at every stage, and compare with an undisturbed run.

    python tests/node_loss.py --workdir DIR --out FILE [--cases logreg:load,logreg:compute,...]

Starts a local 3-node ``ray.cluster_utils.Cluster`` (a head and two workers, one CPU each,
real raylets on this host) and connects to it. For each algorithm it first runs the job
undisturbed, then once per case with a worker node killed (``remove_node(node,
allow_graceful=False)``: its raylet, object store and workers die at once) while the named
stage runs: ``load`` (blocks being read), ``compute`` (the job's fit/factor/compute
stage, tasks in flight) or ``write`` (outputs written). ``comeback`` kills a node mid-fit
and starts a new one at once. After each case a fresh worker is added, so every case
starts on three nodes.

Writes one JSON document to FILE: per case, whether the run succeeded, the largest difference of
its published arrays (opened with plain zarr) from the undisturbed run's, and its report's
``faults``. ``tests/test_node_loss.py`` runs this in its own process: a process talks to
one Ray at a time, and the test session's Ray is another.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.pop("RAY_ADDRESS", None)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

# Faster failure detection than Ray's defaults (seconds to notice a dead node), as Ray's own
# reconstruction tests configure it; task retries after a short delay.
SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 200,
    "health_check_failure_threshold": 5,
    "task_retry_delay_ms": 100,
    "object_timeout_milliseconds": 200,
}
NODE = {"num_cpus": 1, "object_store_memory": 150 * 2**20}

# algorithm -> (config, datagen arguments, spec overrides); small data, a few dozen blocks
JOBS: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "logreg": ("logreg", {"rows": 24000, "cols": 8, "chunk_rows": 1000}, ["params.max_iter=15"]),
    "logreg-newton": ("logreg", {"rows": 24000, "cols": 8, "chunk_rows": 1000},
                      ["params.solver=\"newton\"", "params.max_iter=6"]),
    "linreg": ("linreg", {"rows": 24000, "cols": 8, "chunk_rows": 1000}, []),
    "kmeans": ("kmeans", {"rows": 24000, "cols": 4, "chunk_rows": 1000, "k": 4}, ["params.k=4", "params.max_iter=10"]),
    "pagerank": ("pagerank", {"rows": 3000, "cols": 2, "chunk_rows": 1000, "edges": 24000}, ["params.max_iter=15"]),
    "tsqr": ("tsqr", {"rows": 24000, "cols": 8, "chunk_rows": 1000}, []),
    "mttkrp": ("mttkrp", {"rows": 48, "cols": 16, "chunk_rows": 4, "rank": 4, "shape": "48,16,16"}, []),
    "cp_als": ("cp_als", {"rows": 48, "cols": 16, "chunk_rows": 4, "rank": 3, "shape": "48,16,16"},
               ["params.rank=3", "params.max_iter=10"]),
}
STAGES = ("load", "compute", "write", "comeback")
DELAY = {"load": 0.05, "compute": 0.3, "write": 0.0, "comeback": 0.3}
SETUP_STAGES = {"validate", "connect", "load", "write"}
# every algorithm at every stage; a node that comes back under a driver-side and a
# worker-written result
DEFAULT_CASES = [f"{j}:{s}" for j in JOBS for s in ("load", "compute", "write")] + ["logreg:comeback", "kmeans:comeback"]


def make_data(bucket: Path) -> None:
    """Each algorithm's inputs where its config in configs/ expects them under ``bucket``."""
    from arrayjob.datagen import DatagenRequest, generate
    from arrayjob.io.locations import StorageOptions, parse_uri

    for name, (algorithm, args, _) in JOBS.items():
        if name != algorithm:
            continue  # shares its algorithm's data
        args = dict(args)
        shape = tuple(int(s) for s in args.pop("shape", "").split(",") if s)
        request = DatagenRequest(parse_uri(str(bucket / "demo" / algorithm)), args.pop("rows"), args.pop("cols"),
                                 args.pop("chunk_rows"), 0, StorageOptions(), shape=shape, **args)
        generate(algorithm, request)


def spec_for(workdir: Path, name: str, output: str, address: str) -> Any:
    from arrayjob.spec import load_spec

    algorithm, _, overrides = JOBS[name]
    env = {**os.environ, "ARRAYJOB_BUCKET": str(workdir / "data-root")}
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


class NodeKiller:
    """Kills a worker node while one stage of a run is in progress (see ``RunMetrics.stage``)."""

    def __init__(self, cluster: Any, stage: str) -> None:
        self.cluster, self.stage = cluster, stage
        self.killed_in: str | None = None

    def metrics(self) -> Any:
        from arrayjob.runtime.metrics import RunMetrics

        killer = self

        class Watched(RunMetrics):
            @contextmanager
            def stage(self, name: str) -> Iterator[Any]:
                target = killer.stage in ("compute", "comeback") and name not in SETUP_STAGES
                thread = None
                if killer.killed_in is None and (name == killer.stage or target):
                    thread = threading.Thread(target=killer.kill, args=(name,), daemon=True)
                    thread.start()
                with super().stage(name) as s:
                    yield s
                    if thread is not None:
                        thread.join()  # the node is dead before the stage ends

        return Watched()

    def kill(self, stage: str) -> None:
        import ray

        time.sleep(DELAY[self.stage])
        victim = next(iter(self.cluster.worker_nodes))
        self.cluster.remove_node(victim, allow_graceful=False)
        self.killed_in = stage
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # dead as Ray's GCS sees it (its health checks)
            if not any(n["NodeID"] == victim.node_id and n["Alive"] for n in ray.nodes()):
                break
            time.sleep(0.1)
        if self.stage == "comeback":
            self.cluster.add_node(**NODE)


def run_case(cluster: Any, workdir: Path, name: str, stage: str | None, reference: dict[str, np.ndarray] | None,
             ) -> dict[str, Any]:
    from arrayjob import runner

    label = f"{name}:{stage or 'undisturbed'}"
    spec = spec_for(workdir, name, label.replace(":", "-"), cluster.address)
    killer = NodeKiller(cluster, stage) if stage else None
    started = time.perf_counter()
    case: dict[str, Any] = {"case": label}
    try:
        outcome = runner.run(spec, metrics=killer.metrics() if killer else None)
    except BaseException as exc:  # noqa: BLE001 - reported, the matrix goes on
        case.update(ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-2000:])
        return case
    finally:
        case["seconds"] = round(time.perf_counter() - started, 2)
        if killer is not None:
            case["killed_in"] = killer.killed_in
            restore(cluster)
    arrays = published_arrays(spec)
    case.update(ok=True, faults=outcome.report.get("faults"), nodes=outcome.report.get("nodes"),
                tasks=outcome.report.get("tasks"), arrays=sorted(arrays))
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


def restore(cluster: Any) -> None:
    """Back to a head and two workers."""
    while len(cluster.worker_nodes) < 2:
        cluster.add_node(**NODE)
    cluster.wait_for_nodes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="where the JSON document goes")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES))
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    cases = [c.split(":") for c in args.cases.split(",")]
    make_data(args.workdir / "data-root")
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "_system_config": SYSTEM_CONFIG})
    results: list[dict[str, Any]] = []
    try:
        restore(cluster)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        references: dict[str, dict[str, np.ndarray]] = {}
        for name, stage in cases:
            if name not in references:
                undisturbed = run_case(cluster, args.workdir, name, None, None)
                references[name] = undisturbed.pop("_arrays", {})
                results.append(undisturbed)
            case = run_case(cluster, args.workdir, name, stage, references[name])
            case.pop("_arrays", None)
            results.append(case)
    finally:
        ray.shutdown()
        cluster.shutdown()
    args.out.write_text(json.dumps({"cases": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
