"""The worker node types of a cluster, read from the cluster itself.

A job that sizes its cluster asks the autoscaler for nodes of some shape; that shape must be
one the cluster can start. Ray keeps the autoscaler's node types in two places a driver can
read without ``ray.init``, tried in this order:

1. the GCS's cluster config (``ray._private.state.GlobalState.get_cluster_config``: the key
   ``__autoscaler_cluster_config`` in the ``__autoscaler`` namespace, an
   ``autoscaler_pb2.ClusterConfig`` of ``node_group_configs``: name, resources, max_count),
   which autoscalers that report their config write (KubeRay, autoscaler v2 in later Rays);
2. the cluster config file the autoscaler v1's monitor was started with
   (``--autoscaling-config=``), when this host runs that monitor: the head node, where a
   job submitted with ``arrayjob submit`` runs, and where Ray's fake cluster lives. Ray 2.60's
   v1 monitor reports its node types nowhere else (its status in the GCS lists only the
   nodes that are up).

Nothing found: an empty ``ClusterTypes``, and the price table's node type is used as before.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arrayjob.units import size

CONFIG_NAMESPACE = b"__autoscaler"  # ray._raylet.GCS_AUTOSCALER_STATE_NAMESPACE
CONFIG_KEY = b"__autoscaler_cluster_config"  # ray._raylet.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY


@dataclass(frozen=True)
class NodeType:
    """A worker node type the cluster's autoscaler can start; None where it does not say."""

    name: str
    cpus: float
    memory_bytes: int | None
    object_store_bytes: int | None
    max_workers: int | None  # None: no limit

    def describe(self) -> str:
        parts = [f"{self.cpus:g} CPU{'s' if self.cpus != 1 else ''}"]
        if self.memory_bytes:
            parts.append(f"{size(self.memory_bytes)} memory")
        if self.object_store_bytes:
            parts.append(f"{size(self.object_store_bytes)} object store")
        parts.append("no limit" if self.max_workers is None else f"up to {self.max_workers}")
        return f"{self.name} ({', '.join(parts)})"

    def holds(self, cpus: float, object_store_bytes: int) -> bool:
        """Whether one node of this type can hold a bundle of ``cpus`` and store bytes."""
        store_ok = self.object_store_bytes is None or self.object_store_bytes >= object_store_bytes
        return self.cpus >= cpus and store_ok and self.max_workers != 0


@dataclass(frozen=True)
class ClusterTypes:
    """The cluster's worker node types and where they were read (empty: not found)."""

    types: tuple[NodeType, ...] = ()
    source: str = ""

    def named(self, name: str) -> NodeType | None:
        return next((t for t in self.types if t.name == name), None)

    def offer(self) -> str:
        return "; ".join(t.describe() for t in self.types)


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def types_from_config(config: dict[str, Any]) -> tuple[NodeType, ...]:
    """Worker node types of a Ray cluster launcher config (``available_node_types``; the head
    type and types without CPUs, which run no block task, left out)."""
    head = config.get("head_node_type")
    found = []
    for name, entry in (config.get("available_node_types") or {}).items():
        resources = entry.get("resources") or {}
        cpus = _number(resources.get("CPU")) or 0.0
        if name == head or cpus <= 0:
            continue
        memory, store = _number(resources.get("memory")), _number(resources.get("object_store_memory"))
        limit = entry.get("max_workers", config.get("max_workers"))
        found.append(NodeType(str(name), cpus, int(memory) if memory else None, int(store) if store else None,
                              None if limit is None else int(limit)))
    return tuple(found)


def types_from_cluster_config(serialized: bytes) -> tuple[NodeType, ...]:
    """Worker node types of the GCS's ``autoscaler_pb2.ClusterConfig`` (max_count -1: no limit)."""
    from ray.core.generated import autoscaler_pb2

    config = autoscaler_pb2.ClusterConfig.FromString(serialized)  # type: ignore[attr-defined]  # generated
    found = []
    for group in config.node_group_configs:
        resources = dict(group.resources)
        cpus = float(resources.get("CPU", 0))
        if cpus <= 0 or group.max_count == 0:
            continue
        found.append(NodeType(group.name, cpus, int(resources["memory"]) if resources.get("memory") else None,
                              int(resources["object_store_memory"]) if resources.get("object_store_memory") else None,
                              None if group.max_count < 0 else int(group.max_count)))
    return tuple(found)


def monitor_config_path(gcs_address: str, proc: Path = Path("/proc")) -> Path | None:
    """The ``--autoscaling-config`` of the autoscaler monitor on this host serving the GCS at
    ``gcs_address`` (matched by its ``--gcs-address``'s port), if there is one."""
    port = gcs_address.rpartition(":")[2]
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if not any(a.endswith("monitor.py") for a in args):
            continue
        gcs = next((a.split("=", 1)[1] for a in args if a.startswith("--gcs-address=")), "")
        config = next((a.split("=", 1)[1] for a in args if a.startswith("--autoscaling-config=")), "")
        if config and gcs.rpartition(":")[2] == port:
            path = Path(config).expanduser()
            if not path.is_absolute():  # relative to the monitor's own working directory
                try:
                    path = Path(os.readlink(entry / "cwd")) / path
                except OSError:
                    continue
            return path if path.is_file() else None
    return None


def gcs_address_of(address: str) -> str | None:
    """The GCS address of ``cluster.address`` (``auto``: the cluster this host last started);
    None for a Ray Client address (``ray://``), whose GCS a driver does not reach."""
    if address.startswith("ray://") or address == "local":
        return None
    if address == "auto":  # RAY_ADDRESS, else the cluster `ray start` last started here, as ray.init finds it
        from ray._private.services import canonicalize_bootstrap_address

        try:
            return canonicalize_bootstrap_address("auto")
        except Exception:  # no cluster here: connecting says so, in its own words
            return None
    return address


def _answers(gcs: str, timeout: float = 2.0) -> bool:
    host, _, port = gcs.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def read_node_types(address: str) -> ClusterTypes:
    """The worker node types of the cluster at ``address``, from the GCS's cluster config,
    else the autoscaler monitor's config file on this host; empty when neither says."""
    gcs = gcs_address_of(address)
    if gcs is None or not _answers(gcs):  # connecting says what is wrong, in one line (Ray's client
        return ClusterTypes()  # would retry for half a minute, logging as it goes)
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # compiled, no stubs

        serialized = GcsClient(address=gcs).internal_kv_get(CONFIG_KEY, CONFIG_NAMESPACE, timeout=5)
    except Exception:  # an older GCS, or one that does not answer: the next source, or none
        serialized = None
    if serialized:
        types = types_from_cluster_config(serialized)
        if types:
            return ClusterTypes(types, "the cluster's autoscaler config in the GCS")
    path = monitor_config_path(gcs)
    if path is not None:
        import yaml

        try:
            types = types_from_config(yaml.safe_load(path.read_text()) or {})
        except (OSError, yaml.YAMLError, AttributeError, TypeError, ValueError):
            types = ()
        if types:
            return ClusterTypes(types, f"the autoscaler's config {path}")
    return ClusterTypes()
