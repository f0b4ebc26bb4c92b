"""Run ``arrayjob run --nodes 2`` on a local Ray cluster whose nodes change under the job:
a worker node added during the fit ("added"), then, in a second run, one removed ("removed"),
then a node added during a PageRank, whose graph is kept between iterations ("kept").

    python tests/nodes_change_run.py WORKDIR

Starts a ``ray.cluster_utils.Cluster`` (a head and one worker, two CPUs each; node death
noticed within about 2 s), writes logistic-regression demo data, and for each case runs the
job and, once its tasks are running, changes the cluster. Writes WORKDIR/outcome.json: per
case the exit code, the report (or None), the stderr tail and the node id changed.
Everything it started is stopped before it exits (the cluster's processes by pid).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.pop("RAY_ADDRESS", None)

SPEC = """
[job]
name = "nodes-change"
algorithm = "{algorithm}"

[inputs]
{inputs}

[params]
{params}

[output]
uri = "{root}/{out}"

[cluster]
address = "{address}"
scale_timeout = "30s"
"""


def _report(stdout: str) -> dict[str, object] | None:
    start = stdout.find("\n{") + 1 if not stdout.startswith("{") else 0
    try:
        return json.JSONDecoder().raw_decode(stdout[start:])[0]  # type: ignore[no-any-return]
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--rows", type=int, default=400_000)  # a fit of a few seconds: time for a node to join
    parser.add_argument("--cols", type=int, default=16)
    parser.add_argument("--chunk-rows", type=int, default=10_000)
    parser.add_argument("--max-iter", type=int, default=60)
    parser.add_argument("--change-after", type=float, default=1.0, help="seconds into the run a node is removed")
    parser.add_argument("--add-after", type=float, default=0.0,
                        help="seconds into the run a node is added (starting one takes seconds itself)")
    parser.add_argument("--timeout", type=float, default=240)
    args = parser.parse_args(argv)

    import ray
    from ray.cluster_utils import Cluster

    root = args.workdir.resolve()
    arrayjob = [sys.executable, "-m", "arrayjob.cli.main"]
    subprocess.run([*arrayjob, "datagen", "logreg", str(root / "data"), "--rows", str(args.rows), "--cols",
                    str(args.cols), "--chunk-rows", str(args.chunk_rows)], check=True, capture_output=True)
    subprocess.run([*arrayjob, "datagen", "pagerank", str(root / "graph"), "--rows", "100000", "--edges", "2000000",
                    "--chunk-rows", "250000"], check=True, capture_output=True)
    jobs = {
        "logreg": (f'X = "{root}/data/X.zarr"\ny = "{root}/data/y.zarr"',
                   f'solver = "lbfgs"\nmax_iter = {args.max_iter}\ntol = 1e-12'),
        "pagerank": (f'edges = "{root}/graph/edges.zarr"', "damping = 0.99\ntol = 1e-300\nmax_iter = 400"),
    }
    # two CPUs a node: PageRank blocks its graph by workers, two blocks a node here, so a third
    # node takes some of the kept blocks (moved once, not fetched by every iteration)
    node_args = {"num_cpus": 2, "object_store_memory": 80 * 2**20}
    health = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_timeout_ms": 500}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False,
                                                            "_system_config": health})
    outcome: dict[str, object] = {}
    job = None
    try:
        workers = [cluster.add_node(**node_args)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
        for case, algorithm in (("added", "logreg"), ("removed", "logreg"), ("kept", "pagerank")):
            inputs, params = jobs[algorithm]
            spec = root / f"{case}.toml"
            spec.write_text(SPEC.format(root=root, out=case, algorithm=algorithm, inputs=inputs, params=params,
                                        address=cluster.address))
            cpus = ray.cluster_resources().get("CPU", 0)
            while ray.available_resources().get("CPU", 0) < cpus:  # the last run's workers are gone
                time.sleep(0.1)
            nodes = sum(1 for n in ray.nodes() if n["Alive"])
            job = subprocess.Popen([*arrayjob, "run", str(spec), "--json", "--nodes", str(nodes)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            streams: dict[str, list[str]] = {"stdout": [], "stderr": []}
            fitting = threading.Event()  # its progress lines say the fit has begun (the graph is kept)

            def pump(name: str, stream: IO[str], into: dict[str, list[str]] = streams,
                     fitting: threading.Event = fitting) -> None:
                for line in stream:
                    into[name].append(line)
                    if "fit: iteration" in line:
                        fitting.set()
                fitting.set()  # the end of the stream: nothing more to wait for

            readers = [threading.Thread(target=pump, args=(name, getattr(job, name)), daemon=True)
                       for name in streams]
            for reader in readers:
                reader.start()
            changed, started = None, time.monotonic()
            deadline = started + args.timeout
            while job.poll() is None and time.monotonic() < deadline:
                running = ray.available_resources().get("CPU", cpus) < cpus  # the job's tasks are running
                if (fitting.is_set() if case == "kept" else running):
                    time.sleep({"added": args.add_after, "removed": args.change_after, "kept": 0.0}[case])
                    if job.poll() is not None:
                        break
                    if case != "removed":
                        workers.append(cluster.add_node(**node_args))
                        changed = workers[-1].node_id
                    else:
                        changed = workers[-1].node_id
                        cluster.remove_node(workers.pop(), allow_graceful=False)
                    break
                time.sleep(0.05)
            job.wait(timeout=max(1.0, deadline - time.monotonic()))
            for reader in readers:
                reader.join(timeout=30)
            out, err = "".join(streams["stdout"]), "".join(streams["stderr"])
            outcome[case] = {"exit": job.returncode, "changed": changed, "report": _report(out),
                             "stderr": err[-3000:]}
            job = None
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait()
        (root / "outcome.json").write_text(json.dumps(outcome))
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
