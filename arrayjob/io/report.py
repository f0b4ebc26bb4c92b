"""The cost report: what a run did, in stable keys (see docs/report.md)."""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any

from arrayjob import __version__
from arrayjob.runtime.metrics import RunMetrics, driver_peak_rss_bytes

if TYPE_CHECKING:
    from arrayjob.jobs.base import JobResult
    from arrayjob.runtime.cluster import ClusterInfo
    from arrayjob.spec import JobSpec


def build_report(
    spec: JobSpec,
    metrics: RunMetrics,
    *,
    wall_seconds: float,
    cluster: ClusterInfo,
    result: JobResult,
) -> dict[str, Any]:
    by_node = dict(metrics.block_bytes_by_node)
    return {
        "job": spec.name,
        "algorithm": spec.algorithm,
        "arrayjob_version": __version__,
        "wall_seconds": round(wall_seconds, 4),
        "stages": [
            {
                "name": s.name,
                "wall_seconds": round(s.wall_seconds, 4),
                "tasks": s.tasks,
                **{f"storage.{k}": v for k, v in s.storage.as_dict().items()},
            }
            for s in metrics.stages
        ],
        "storage": metrics.storage.as_dict(),
        "tasks": {"count": metrics.tasks},
        "memory": {
            # input blocks held in the object store, per node (the node order of `cluster.node_ids`)
            "peak_bytes_per_node": [by_node.get(n, 0) for n in cluster.node_ids] or list(by_node.values()),
            "driver_peak_rss_bytes": driver_peak_rss_bytes(),
        },
        "cluster": {
            "address": cluster.address,
            "nodes": len(cluster.node_ids),
            "cpus": cluster.cpus,
            "started_for_job": cluster.started_here,
        },
        "result": result.attrs,
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "spec": spec.redacted(),
    }
