"""The cost report: what a run did, in the stable keys of docs/report.md.

Every figure is counted where it happens: storage by the Zarr stores of the processes
that did the I/O, tasks and bytes between nodes by the executor from where each task
really ran, per-node memory by replaying the run with the real nodes and sizes. Beside
them, under ``estimate``, the prediction made for this run before it started, and under
``estimate_error`` how far off each figure was: (actual − estimate) / estimate.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from arrayjob import __version__
from arrayjob.runtime.metrics import RunMetrics, driver_peak_rss_bytes

if TYPE_CHECKING:
    from arrayjob.api.job import JobResult
    from arrayjob.costing.prices import Instance, PriceTable
    from arrayjob.runtime.cluster import ClusterInfo
    from arrayjob.spec import JobSpec

COMPARED = ("wall_seconds", "storage.bytes_read", "storage.get_requests", "storage.bytes_reread", "storage.bytes_written",
            "storage.put_requests", "network.bytes_between_nodes", "memory.peak_bytes_per_node", "tasks.count",
            "nodes.node_seconds", "dollars.total")


def lookup(doc: Mapping[str, Any], key: str) -> Any:
    """``doc['a']['b']`` for ``key = 'a.b'``, or None."""
    node: Any = doc
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def estimate_errors(report: dict[str, Any], estimate: dict[str, Any]) -> dict[str, float | None]:
    """(actual − estimate) / estimate for each compared figure (max over nodes for lists)."""
    errors: dict[str, float | None] = {}
    for key in COMPARED:
        actual, predicted = lookup(report, key), lookup(estimate, key)
        if isinstance(actual, list):
            actual, predicted = max(actual, default=0), max(predicted or [0], default=0)
        if actual is None or predicted is None:
            errors[key] = None
        elif predicted == 0:
            errors[key] = 0.0 if actual == 0 else None
        else:
            errors[key] = round((actual - predicted) / predicted, 4)
    return errors


def build_report(
    spec: JobSpec,
    metrics: RunMetrics,
    *,
    wall_seconds: float,
    cluster: ClusterInfo,
    result: JobResult,
    instance: Instance | None = None,
    prices: PriceTable | None = None,
    estimate: dict[str, Any] | None = None,
    estimate_rescaled: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report of one run. ``estimate`` is the prediction made before it started;
    ``estimate_rescaled``, for an iterative job that ran another number of iterations than
    that prediction assumed, the same prediction for the iterations it really ran."""
    nodes = list(cluster.node_ids)
    peak = metrics.peak_object_store_bytes_per_node
    node_seconds = wall_seconds * max(1, len(nodes))
    used: dict[str, Any] = {"count": len(nodes)}
    if metrics.nodes is not None:  # a sized cluster: each node from its first use to its release
        used = cast(dict[str, Any], metrics.nodes.as_dict())
        node_seconds = float(used["node_seconds"])
        # nodes that joined while the job ran follow the first ones in the per-node figures
        nodes += [str(p["node_id"]) for p in used["per_node"] if p["node_id"] not in nodes]
    dollars: dict[str, float] = {}
    if instance is not None and prices is not None:
        compute = node_seconds / 3600 * instance.usd_per_hour
        gets = metrics.storage.get_requests / 1000 * prices.get_per_1000
        puts = metrics.storage.put_requests / 1000 * prices.put_per_1000
        dollars = {"compute": round(compute, 6), "get_requests": round(gets, 6), "put_requests": round(puts, 6),
                   "total": round(compute + gets + puts, 6)}
    report: dict[str, Any] = {
        "job": spec.name,
        "algorithm": spec.algorithm,
        "arrayjob_version": __version__,
        "wall_seconds": round(wall_seconds, 4),
        "stages": [
            {
                "name": s.name,
                "start_seconds": round(s.start_seconds, 4),
                "wall_seconds": round(s.wall_seconds, 4),
                "tasks": s.tasks,
                **{f"storage.{k}": v for k, v in s.storage.as_dict().items()},
            }
            for s in metrics.stages
        ],
        # bytes_read grows with re-reads of streamed blocks; bytes_reread is that growth
        "storage": {**metrics.storage.as_dict(), "bytes_reread": metrics.streaming.bytes_reread,
                    "reread_requests": metrics.streaming.reread_requests},
        "network": {
            "bytes_between_nodes": metrics.bytes_between_nodes,
            "bytes_in_per_node": [metrics.network_in_by_node.get(n, 0) for n in nodes],
            "bytes_out_per_node": [metrics.network_out_by_node.get(n, 0) for n in nodes],
        },
        "tasks": {
            "count": metrics.tasks,
            "retries": metrics.faults.task_retries,  # executions Ray repeated, by attempt number
            "per_node": [metrics.tasks_by_node.get(n, 0) for n in nodes],
        },
        "memory": {
            # the most bytes a run held in each node's object store (input blocks, values,
            # results until their last consumer), in the order of `cluster.node_ids`
            "peak_bytes_per_node": [peak.get(n, 0) for n in nodes],
            # what the stores really held, read from each node's raylet every 0.25 s (everything
            # in the store, a shared cluster's other jobs included), and Ray's own spilling to
            # local disk when a store overflowed: bytes spilled and restored during the run
            "store_peak_bytes_per_node": [metrics.stores.peak_bytes.get(n, 0) for n in nodes],
            "ray_spilled_bytes": sum(metrics.stores.spilled_bytes.values()),
            "ray_restored_bytes": sum(metrics.stores.restored_bytes.values()),
            "input_block_bytes_per_node": [metrics.block_bytes_by_node.get(n, 0) for n in nodes],
            "bytes_touched": metrics.bytes_touched,
            "driver_peak_rss_bytes": driver_peak_rss_bytes(),
            # the block cache under [cluster] memory_budget (planner.residency)
            "budget_bytes": metrics.streaming.budget_bytes,
            "resident_fraction": round(metrics.streaming.resident_fraction, 6),
            "streamed_from": metrics.streaming.source,
            "spill_bytes_read": metrics.streaming.spill_bytes_read,
            "spill_bytes_written": metrics.streaming.spill_bytes_written,
        },
        "nodes": {**used, "node_seconds": round(node_seconds, 3), "instance_type": instance.name if instance else None},
        "dollars": dollars,
        "cluster": {
            "address": cluster.address,
            "nodes": len(cluster.node_ids),
            "node_ids": nodes,
            "nodes_lost": len(metrics.faults.nodes_lost),
            "cpus": cluster.cpus,
            "started_for_job": cluster.started_here,
        },
        # survived faults: nodes lost, blocks Ray rebuilt, retries; each marked on the timeline
        "faults": metrics.faults.as_dict(),
        "result": result.attrs,
        "timeline": metrics.timeline,
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "spec": spec.redacted(),
    }
    if estimate is not None:
        report["estimate"] = estimate
        report["estimate_error"] = estimate_errors(report, estimate)
    if estimate_rescaled is not None:
        report["estimate_rescaled"] = estimate_rescaled
        report["estimate_rescaled_error"] = estimate_errors(report, estimate_rescaled)
    return report
