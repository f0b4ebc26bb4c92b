"""Run the logistic-regression iteration on a local multi-node Ray cluster and print what
the runtime measured, per (placement, fusion) configuration, as JSON.

    python benchmarks/multinode.py --nodes 3 --configs lshs:none,ray:none

Starts its own ``ray.cluster_utils.Cluster`` (one process can be connected to one Ray at
a time, so tests run this in a subprocess) and shuts it down. Every node is a set of
processes on this machine reading the same local Zarr arrays.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.pop("RAY_ADDRESS", None)


def logreg_iteration(X: Any, y: Any, w: Any) -> dict[str, Any]:
    """One evaluation of logistic regression: margins, loss, gradient (labels in {0, 1})."""
    import arrayjob.lazy as la

    z = X @ w
    return {"loss": la.sum(la.logaddexp(0.0, -((2 * y - 1) * z))), "grad": X.T @ (la.sigmoid(z) - y)}


def write_data(root: Path, rows: int, cols: int, chunk_rows: int) -> tuple[np.ndarray, np.ndarray]:
    import zarr

    rng = np.random.default_rng(0)
    X = rng.standard_normal((rows, cols))
    y = (rng.random(rows) > 0.5).astype(np.float64)
    for name, a, chunks in (("X", X, (chunk_rows, cols)), ("y", y, (chunk_rows,))):
        z = zarr.create_array(str(root / f"{name}.zarr"), shape=a.shape, chunks=chunks, dtype=a.dtype)
        z[...] = a
    return X, y


def run_config(placement: str, fusion: str, tiling: str, node_ids: tuple[str, ...], root: Path,
               X_np: np.ndarray, y_np: np.ndarray, iterations: int, workers_per_node: int) -> dict[str, Any]:
    import arrayjob.lazy as la
    from arrayjob.io.arrays import open_array_info
    from arrayjob.io.locations import StorageOptions, parse_uri
    from arrayjob.planner.plan import ClusterShape, PlanOptions
    from arrayjob.runtime.ray_executor import RayExecutor
    from arrayjob.runtime.session import Session

    opts = StorageOptions()
    X = la.from_zarr(open_array_info("X", parse_uri(str(root / "X.zarr")), opts))
    y = la.from_zarr(open_array_info("y", parse_uri(str(root / "y.zarr")), opts))
    program = logreg_iteration(X, y, la.value("w", (X_np.shape[1],)))
    executor = RayExecutor(opts, node_ids)
    shape = ClusterShape(nodes=len(node_ids), workers_per_node=workers_per_node)
    session = Session(executor, PlanOptions(tiling=tiling, fusion=fusion, placement=placement, cluster=shape))
    plan = session.plan(program)
    start = time.perf_counter()
    session.load(program)
    rng = np.random.default_rng(1)
    for _ in range(iterations):
        w = rng.standard_normal(X_np.shape[1])
        out = session.compute(program, {"w": w})
        z = X_np @ w
        assert np.allclose(out["loss"], np.logaddexp(0.0, -(2 * y_np - 1) * z).sum())
        assert np.allclose(out["grad"], X_np.T @ (1 / (1 + np.exp(-z)) - y_np))
    m = executor.metrics
    order = executor.node_order
    return {
        "placement": placement, "fusion": fusion, "tiling": tiling, "iterations": iterations,
        "wall_seconds": round(time.perf_counter() - start, 3),
        "tasks": m.tasks,
        "bytes_between_nodes": m.bytes_between_nodes,
        "bytes_touched": m.bytes_touched,
        "tasks_per_node": [m.tasks_by_node.get(n, 0) for n in order],
        "network_in_per_node": [m.network_in_by_node.get(n, 0) for n in order],
        "network_out_per_node": [m.network_out_by_node.get(n, 0) for n in order],
        "peak_object_store_bytes_per_node": [m.peak_object_store_bytes_per_node.get(n, 0) for n in order],
        "block_bytes_per_node": [m.block_bytes_by_node.get(n, 0) for n in order],
        "planned": plan.cost.as_dict() if plan.cost is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--cols", type=int, default=16)
    parser.add_argument("--chunk-rows", type=int, default=5_000)
    parser.add_argument("--tiling", default="naive")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--configs", default="lshs:none,ray:none", help="PLACEMENT:FUSION,...")
    parser.add_argument("--object-store-mb", type=int, default=80)
    parser.add_argument("--workers-per-node", type=int, default=2,
                        help="what the planner assumes (about two row blocks per worker)")
    args = parser.parse_args(argv)

    import ray
    from ray.cluster_utils import Cluster

    started = time.perf_counter()
    node_args = {"num_cpus": 1, "object_store_memory": args.object_store_mb * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
        node_ids = tuple(sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]))
        cluster_seconds = time.perf_counter() - started
        with tempfile.TemporaryDirectory() as tmp:
            X, y = write_data(Path(tmp), args.rows, args.cols, args.chunk_rows)
            runs = [run_config(*config.split(":"), args.tiling, node_ids, Path(tmp), X, y, args.iterations,
                               args.workers_per_node) for config in args.configs.split(",")]
    finally:
        ray.shutdown()
        cluster.shutdown()
    json.dump({"nodes": args.nodes, "cluster_start_seconds": round(cluster_seconds, 2),
               "total_seconds": round(time.perf_counter() - started, 2), "runs": runs}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
