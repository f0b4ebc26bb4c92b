"""Connecting to Ray: a quiet local instance by default, an existing cluster by address."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from arrayjob.errors import ClusterError
from arrayjob.planner.plan import ClusterShape


@dataclass(frozen=True)
class ClusterOptions:
    """The ``[cluster]`` section: where Ray runs."""

    address: str = field(default="local", metadata={"check": bool, "expect": "'local', 'auto' or a Ray address"})
    num_cpus: int | None = field(default=None, metadata={"check": lambda v: v > 0, "expect": "a positive integer"})


@dataclass(frozen=True)
class ClusterInfo:
    address: str
    node_ids: tuple[str, ...]  # alive nodes, in a stable order; the planner's node indices
    cpus: int  # in all
    started_here: bool
    memory_per_node: int = 0  # the smallest node's memory for tasks, in bytes


def _describe() -> ClusterInfo:
    import ray

    # Nodes without CPUs (a head that only schedules) cannot run block tasks: not placed on.
    nodes = sorted((n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0),
                   key=lambda n: n["NodeID"])
    cpus = int(sum(n.get("Resources", {}).get("CPU", 0) for n in nodes))
    memory = int(min((n.get("Resources", {}).get("memory", 0) for n in nodes), default=0))
    address = ray.get_runtime_context().gcs_address
    return ClusterInfo(address, tuple(n["NodeID"] for n in nodes), max(1, cpus), False, memory)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a dead ``host:port``: Ray itself would retry the connection for minutes."""
    if address == "auto":
        return  # Ray finds the local cluster's address itself and fails at once if there is none
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"cluster.address: expected 'local', 'auto' or HOST:PORT, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ClusterError(f"cluster.address: cannot connect to Ray at {address!r}: {exc.strerror or exc}") from None


@contextmanager
def ray_cluster(options: ClusterOptions) -> Iterator[ClusterInfo]:
    """Connect to (or start) Ray for one job; a Ray already initialised in-process is reused."""
    import ray

    # Every task's failure reaches the driver through the results it feeds (load errors
    # through their stats), so Ray's log line for an unread failed block is only noise.
    os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
    if ray.is_initialized():
        yield _describe()
        return
    # A local instance is private to this job: no dashboard, no usage stats, no log spam.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, object] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.ERROR,
        "configure_logging": True,
    }
    if options.address == "local":
        kwargs["address"] = "local"
        if options.num_cpus:
            kwargs["num_cpus"] = options.num_cpus
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    else:
        _check_reachable(options.address)
        kwargs["address"] = options.address
        kwargs.pop("include_dashboard")
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterError(f"cluster.address: cannot connect to Ray at {options.address!r}: {message}") from None
    try:
        info = _describe()
        yield dataclasses.replace(info, started_here=True)
    finally:
        ray.shutdown()


def cluster_shape(info: ClusterInfo) -> ClusterShape:
    """What the planner needs to know of a running cluster."""
    nodes = max(1, len(info.node_ids))
    shape = ClusterShape(nodes=nodes, workers_per_node=max(1, info.cpus // nodes))
    return dataclasses.replace(shape, memory_per_node=info.memory_per_node) if info.memory_per_node else shape
