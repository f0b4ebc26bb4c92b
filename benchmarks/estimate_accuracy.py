"""Estimate vs actual for every algorithm, at a small and a large size.

    .venv/bin/python benchmarks/estimate_accuracy.py [--sizes small,large] [--json FILE]
    .venv/bin/python benchmarks/estimate_accuracy.py --nodes 3 [--sizes small]

For each algorithm: write demo data into a local bucket, run the job as a process
(`arrayjob run --json`, its own local Ray), then estimate the same spec with the
iteration count the run used (`arrayjob estimate --iterations N --format json`) and
compare. Run `arrayjob calibrate` first so the estimate uses this machine's profile.
Targets (issue 5): storage bytes exact, requests within 5 %, peak memory per node
within 20 %, wall time within ±30 %.

With ``--nodes N`` (N > 1) it starts a local N-node Ray cluster (``ray.cluster_utils``,
one CPU per node, every node a set of processes on this machine), runs each job on it
(``--set cluster.address=...``) and compares bytes between nodes with
``arrayjob estimate --nodes N`` for nodes of one CPU (target: within 10 %).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARRAYJOB = str(Path(sys.executable).parent / "arrayjob")

# algorithm -> size -> datagen arguments (large: >= 1 GB of input)
SIZES = {
    "logreg": {"small": "--rows 200000 --cols 32 --chunk-rows 25000", "large": "--rows 2100000 --cols 64 --chunk-rows 50000"},
    "linreg": {"small": "--rows 200000 --cols 32 --chunk-rows 25000", "large": "--rows 2100000 --cols 64 --chunk-rows 50000"},
    "kmeans": {"small": "--rows 200000 --cols 16 --chunk-rows 25000 --k 8",
               "large": "--rows 4200000 --cols 32 --chunk-rows 100000 --k 8"},
    "tsqr": {"small": "--rows 200000 --cols 32 --chunk-rows 25000", "large": "--rows 2100000 --cols 64 --chunk-rows 50000"},
    "mttkrp": {"small": "--shape 100,100,100 --chunk-rows 10 --rank 16", "large": "--shape 520,520,520 --chunk-rows 20 --rank 32"},
    "cp_als": {"small": "--shape 100,100,100 --chunk-rows 10 --rank 8", "large": "--shape 520,520,520 --chunk-rows 20 --rank 8"},
    "pagerank": {"small": "--rows 100000 --edges 1000000 --chunk-rows 250000",
                 "large": "--rows 4000000 --edges 70000000 --chunk-rows 2500000"},
}
SET = {"cp_als": ["--set", "params.max_iter=10"], "kmeans": ["--set", "params.max_iter=20"],
       "pagerank": ["--set", "params.max_iter=20"]}
PAUSE_SECONDS = 5
CONFIG_NAME = {"cp_als": "cp-als"}


def _run(args: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run(args, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def _figures(doc: dict) -> dict[str, float]:
    return {
        "wall_seconds": doc["wall_seconds"],
        "storage.bytes_read": doc["storage"]["bytes_read"],
        "storage.get_requests": doc["storage"]["get_requests"],
        "storage.put_requests": doc["storage"]["put_requests"],
        "network.bytes_between_nodes": doc["network"]["bytes_between_nodes"],
        "memory.peak (max node)": max(doc["memory"]["peak_bytes_per_node"] or [0]),
        "tasks.count": doc["tasks"]["count"],
    }


def one_cpu_prices(directory: Path) -> Path:
    """The shipped price table plus a free one-CPU node, the shape of the local cluster's nodes."""
    from arrayjob.costing.prices import DEFAULT

    path = directory / "prices.toml"
    path.write_text(DEFAULT.read_text().replace(
        "[instances]\n", '[instances]\n"local-1cpu" = { usd_per_hour = 0.0, vcpus = 1, memory_gib = 24 }\n', 1))
    return path


def measure(algorithm: str, size: str, bucket: Path, cluster: tuple[str, int, Path] | None = None) -> dict:
    env = {**os.environ, "ARRAYJOB_BUCKET": str(bucket)}
    on_cluster: list[str] = []
    estimate_on: list[str] = []
    if cluster is not None:  # (address, nodes, price table with a one-CPU node)
        address, nodes, prices = cluster
        on_cluster = ["--set", f"cluster.address={address}"]
        estimate_on = ["--nodes", str(nodes), "--instance-type", "local-1cpu", "--prices", str(prices)]
    data = bucket / "demo" / algorithm
    if not (data / ".done").exists():
        subprocess.run([ARRAYJOB, "datagen", algorithm, str(data), *SIZES[algorithm][size].split()], env=env,
                       check=True, capture_output=True)
        (data / ".done").write_text("")
    spec = str(REPO / "configs" / f"{algorithm}.toml")
    if algorithm == "pagerank":  # the node count, as a user who knows the graph states it: without
        # it the estimate must plan for as many nodes as edges (the run finds it in a pass over the edges)
        rows = SIZES[algorithm][size].split()
        on_cluster = [*on_cluster, "--set", f"params.n_nodes={rows[rows.index('--rows') + 1]}"]
        estimate_on = [*estimate_on, "--set", f"params.n_nodes={rows[rows.index('--rows') + 1]}"]
    time.sleep(PAUSE_SECONDS)  # the previous job's Ray is still exiting: let it, as on an idle machine
    actual = _run([ARRAYJOB, "run", spec, "--overwrite", "--json", *SET.get(algorithm, []), *on_cluster], env)
    iterations = int(actual["result"].get("iterations", 1))
    estimate = _run([ARRAYJOB, "estimate", spec, "--format", "json", "--iterations", str(max(1, iterations)),
                     *SET.get(algorithm, []), *estimate_on], env)
    a, e = _figures(actual), _figures(estimate)
    return {"algorithm": algorithm, "size": size, "iterations": iterations,
            "input_bytes": estimate["storage"]["bytes_read"], "actual": a, "estimate": e,
            "error": {k: (a[k] - e[k]) / e[k] if e[k] else None for k in a}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="small")
    parser.add_argument("--algorithms", default=",".join(SIZES))
    parser.add_argument("--bucket", default=None, help="where demo data go [default: a temporary directory]")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--nodes", type=int, default=1, help="run on a local cluster of this many one-CPU nodes")
    parser.add_argument("--object-store-mb", type=int, default=2048, help="object store per node (--nodes > 1)")
    args = parser.parse_args()
    bucket = Path(args.bucket or tempfile.mkdtemp(prefix="arrayjob-accuracy-"))
    with local_cluster(args.nodes, args.object_store_mb) as address:
        cluster = (address, args.nodes, one_cpu_prices(Path(tempfile.mkdtemp()))) if address else None
        rows = run_all(args, bucket, cluster)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2))


@contextlib.contextmanager
def local_cluster(nodes: int, object_store_mb: int) -> Iterator[str | None]:
    """A local ``nodes``-node Ray cluster of one CPU per node (as benchmarks/multinode.py
    starts one), or nothing for one node: each job then starts its own local Ray."""
    if nodes <= 1:
        yield None
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.cluster_utils import Cluster

    node_args = {"num_cpus": 1, "object_store_memory": object_store_mb * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def run_all(args: argparse.Namespace, bucket: Path, cluster: tuple[str, int, Path] | None) -> list[dict]:
    rows = []
    for size in args.sizes.split(","):
        for algorithm in args.algorithms.split(","):
            row = measure(algorithm, size, bucket / size, cluster)
            rows.append(row)
            err = row["error"]
            print(f"{algorithm:9} {size:6} {row['input_bytes'] / 1e9:6.2f} GB  it={row['iterations']:<4}"
                  + "  ".join(f"{k}: {row['actual'][k]:.4g} vs {row['estimate'][k]:.4g} "
                              f"({'n/a' if err[k] is None else f'{err[k]:+.0%}'})" for k in row["actual"]),
                  flush=True)
    return rows


if __name__ == "__main__":
    main()
