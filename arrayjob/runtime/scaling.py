"""Asking the cluster's autoscaler for the nodes a job's plan needs, and giving them back.

``requested_nodes`` asks Ray's autoscaler (``ray.autoscaler.sdk.request_resources``) for one
bundle per node — the node type's CPUs and the object-store bytes the plan puts on a
node — waits for them with a progress line, and always clears the request when the job
ends, however it ends, so idle nodes scale back down (``runtime.request_guard`` clears it
for a job killed outright). The autoscaler adds nodes (never fewer than the request fits,
whatever else is queued) and removes them once idle for its ``idle_timeout_minutes``; Ray's
own scheduler places nothing here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from arrayjob.errors import CapacityError
from arrayjob.runtime.cluster import ClusterInfo, describe
from arrayjob.runtime.metrics import NodeLog
from arrayjob.runtime.supervision import request_guard
from arrayjob.units import duration, size

PROGRESS_EVERY = 10.0  # seconds between progress lines while nothing changes
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class NodeRequest:
    """What a job asks the autoscaler for: ``count`` nodes of ``cpus`` CPUs holding
    ``object_store_bytes`` each, going on with no fewer than ``enough``."""

    count: int
    cpus: int
    object_store_bytes: int
    enough: int
    node_type: str
    timeout: float

    def bundles(self) -> list[dict[str, float]]:
        bundle: dict[str, float] = {"CPU": float(self.cpus)}
        if self.object_store_bytes:
            bundle["object_store_memory"] = float(self.object_store_bytes)
        return [bundle] * self.count


def worker_ids(nodes: list[dict[str, object]]) -> set[str]:
    """Alive Ray nodes with CPUs (those block tasks can run on), from ``ray.nodes()``."""
    def cpus(node: dict[str, object]) -> float:
        resources = node.get("Resources")
        return float(resources.get("CPU", 0)) if isinstance(resources, dict) else 0.0

    return {str(n["NodeID"]) for n in nodes if n.get("Alive") and cpus(n) > 0}


def clear_request() -> None:
    """Withdraw this job's request: the autoscaler may remove idle nodes again."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[])


@contextmanager
def requested_nodes(request: NodeRequest, log: NodeLog, notify: Callable[[str], None] = lambda line: None,
                    clock: Callable[[], float] = time.monotonic) -> Iterator[ClusterInfo]:
    """Ask for ``request``'s nodes, wait up to its timeout, and yield the cluster as it is then.

    Fewer nodes than asked for, but at least ``request.enough``: the job goes on with them
    (told to ``notify``). Fewer than that: ``CapacityError`` (exit 7), before any data is
    read. The request is cleared on every way out.
    """
    import ray
    from ray.autoscaler.sdk import request_resources

    log.start(worker_ids(ray.nodes()))
    guard = request_guard.start(ray.get_runtime_context().gcs_address)  # for a job killed outright
    request_resources(bundles=request.bundles())
    try:
        start = clock()
        said = (-1, -PROGRESS_EVERY)
        while True:
            alive = worker_ids(ray.nodes())
            log.observe(alive)
            waited = clock() - start
            if len(alive) >= request.count or waited >= request.timeout:
                break
            if len(alive) != said[0] or waited - said[1] >= PROGRESS_EVERY:
                notify(f"waiting for nodes: {len(alive)} of {request.count} × {request.node_type} up "
                       f"({duration(waited)} of {duration(request.timeout)})")
                said = (len(alive), waited)
            time.sleep(POLL_SECONDS)
        log.up()
        info = describe()
        up = len(info.node_ids)
        if up < request.enough:
            raise CapacityError(
                f"only {up} of {request.count} × {request.node_type} nodes arrived within cluster.scale_timeout "
                f"({duration(request.timeout)}); the plan needs {request.enough} to hold "
                f"{size(request.object_store_bytes)} per node; nothing was read")
        if up < request.count:
            notify(f"going on with {up} of {request.count} nodes after {duration(request.timeout)}: "
                   f"they hold the plan")
        else:
            notify(f"{up} nodes up after {duration(clock() - start)}")
        yield info
    finally:
        cleared = False
        with suppress(Exception):  # the job is ending; a Ray gone away has no request left to clear
            clear_request()
            cleared = True
        request_guard.done(guard, cleared=cleared)
        log.release()
