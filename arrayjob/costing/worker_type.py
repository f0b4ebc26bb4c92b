"""The node type a sized run plans for, from the cluster's own node types.

The cluster says what its workers are (``runtime.node_types``: CPUs, memory, object store,
``max_workers``); the price table only adds dollars. A type the table does not list is
priced at $0, said in one line. A request no type of the cluster can hold is refused before
anything is asked of the autoscaler, naming what was asked and what the types offer.
"""

from __future__ import annotations

from dataclasses import dataclass

from arrayjob.costing.prices import Instance, PriceTable
from arrayjob.errors import CapacityError
from arrayjob.runtime.node_types import ClusterTypes, NodeType
from arrayjob.units import size

GIB = 2**30


@dataclass(frozen=True)
class WorkerType:
    """The instance a run sizes for, the cluster's type behind it (None: the price table's
    alone), and what to tell the user (``note``: empty, or one line)."""

    instance: Instance
    node_type: NodeType | None
    note: str = ""

    @property
    def max_workers(self) -> int | None:
        return None if self.node_type is None else self.node_type.max_workers


def largest(types: ClusterTypes) -> NodeType:
    """The type a run without ``node_type`` sizes for: the most CPUs, then the largest store."""
    return max(types.types, key=lambda t: (t.cpus, t.object_store_bytes or 0, t.memory_bytes or 0))


def instance_of(node_type: NodeType, prices: PriceTable) -> tuple[Instance, str]:
    """``node_type`` as an ``Instance``: its CPUs, memory and store from the cluster, its
    dollars (and start-up time) from the price table, or $0 with a note when the table has none."""
    listed = prices.instances.get(node_type.name)
    memory_gib = (node_type.memory_bytes / GIB if node_type.memory_bytes
                  else listed.memory_gib if listed else (node_type.object_store_bytes or 0) / GIB / 0.3)
    store_gib = node_type.object_store_bytes / GIB if node_type.object_store_bytes else \
        (listed.object_store_gib if listed else None)
    instance = Instance(node_type.name, listed.usd_per_hour if listed else 0.0, max(1, int(node_type.cpus)),
                        memory_gib, store_gib, listed.node_startup_seconds if listed else None)
    note = "" if listed else (f"node type {node_type.name} is not in price table {prices.version}: "
                              "priced at $0 an hour")
    return instance, note


def worker_type(types: ClusterTypes, prices: PriceTable, named: str | None) -> WorkerType:
    """What a sized run plans for: the cluster's type ``named`` (``cluster.node_type`` or
    ``--instance-type``), else its largest; without the cluster's types, the price table's
    ``named`` (default ``local``) as before. A named type the cluster lacks is the price
    table's (and a request of its shape is checked against the cluster's types: ``check``)."""
    if types.types:
        chosen = types.named(named) if named else largest(types)
        if chosen is not None:
            instance, note = instance_of(chosen, prices)
            return WorkerType(instance, chosen, note)
    return WorkerType(prices.instance(named or "local"), None)


def check(types: ClusterTypes, *, count: int, cpus: int, object_store_bytes: int, node_type: str) -> None:
    """``CapacityError`` (exit 7) at once when no worker type of the cluster can hold one
    node's bundle of the request (``cpus`` and ``object_store_bytes``): Ray's autoscaler would
    find it infeasible and start nothing, and the job would wait out ``scale_timeout``."""
    if not types.types or any(t.holds(cpus, object_store_bytes) for t in types.types):
        return
    asked = f"{count} × {node_type} node(s) of {cpus} CPU{'s' if cpus != 1 else ''}"
    if object_store_bytes:
        asked += f" and a {size(object_store_bytes)} object store"
    raise CapacityError(f"the job asks the autoscaler for {asked}, which no worker type of the cluster can hold: "
                        f"{types.offer()} (from {types.source})")
