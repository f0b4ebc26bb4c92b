"""The cluster's nodes as an executor sees them: which are alive, which are lost, and where a
task planned on a node runs.

The executor watches the cluster's nodes (``ray.nodes()``, at most once a second, and at
once when a task reports a retry or ran away from its planned node): a node alive when the
executor started, or seen since, that is no longer alive is lost, counted once in
``faults.nodes_lost``; a worker node seen for the first time is told as ``node_joined``.
A task planned on a lost node is pinned (softly) to the node holding most of its held blocks'
bytes now (``BlockCache.home``), or left to Ray's scheduler if none is known: Ray's own fallback
for a dead node ignores where the arguments are, and moved a whole block every iteration.

A held block (source or kept) whose home was a lost node is looked up again
(``ray.experimental.get_object_locations``) after the next run, when Ray has rebuilt it from
its lineage: it is re-homed there (so the replay counts what moves from where the block is,
not from a dead node) and counted in ``faults.blocks_reconstructed``. A kept block in a spill
has no lineage: it is not looked for (its users fail with ``KeptBlockLost``).

Planner node 0 is the driver's node (driver values are put in its object store); the other
planner nodes are the remaining Ray nodes, in the order given.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from arrayjob.runtime import kept_spill
from arrayjob.runtime.metrics import RunMetrics
from arrayjob.runtime.scaling import worker_ids


def least_memory(nodes: list[dict[str, Any]]) -> float:
    """The smallest ``memory`` resource among alive nodes with CPUs (0 if one has none)."""
    amounts = [float((n.get("Resources") or {}).get("memory", 0)) for n in nodes
               if n.get("Alive") and (n.get("Resources") or {}).get("CPU", 0) > 0]
    return min(amounts, default=0.0)


class NodeWatch:
    """The nodes seen alive and lost, the worker nodes alive now, and the planner's binding of
    its node indices to Ray node ids (``order``)."""

    def __init__(self, metrics: RunMetrics, node_ids: tuple[str, ...] = ()) -> None:
        self.metrics = metrics
        self.node_ids = node_ids
        self.seen: set[str] = set(node_ids)  # alive at the start or since
        self.lost: set[str] = set()
        self.workers: set[str] = set(node_ids)  # the worker nodes (with CPUs) alive at the last check
        self.memory_cap: float | None = None  # the least ``memory`` resource of a worker node
        self._order: list[str] | None = None
        self._watched = 0.0
        # held blocks whose home was lost; those found again since the last replay: every node with a copy
        self._orphans: set[Any] = set()
        self._rebuilt: dict[Any, set[str]] = {}

    @property
    def order(self) -> list[str]:
        """Ray node ids by planner node index: the driver's node first."""
        if self._order is None:
            driver = ray.get_runtime_context().get_node_id()
            ids = list(self.node_ids)
            self._order = [driver, *(n for n in ids if n != driver)] if driver in ids or not ids else ids
        return self._order

    def node_of(self, node: int) -> str:
        """The Ray node id of planner node ``node``."""
        order = self.order
        return order[node % len(order)]

    def follow(self) -> bool:
        """Bind planner nodes to the worker nodes alive now, keeping the order of those that
        stay (their blocks' homes keep their indices) and adding those that joined after them;
        whether the binding changed. Call ``check`` first."""
        live = self.workers
        order = [n for n in self.order if n in live] + sorted(live - set(self.order))
        if order and order != self.order:
            self._order, self.node_ids = order, tuple(order)
            return True
        return False

    def check(self, every: float = 0.0) -> list[str]:
        """Count the nodes lost since the last check (at most one check per ``every`` seconds);
        returns them."""
        now = time.monotonic()
        if now - self._watched < every:
            return []
        self._watched = now
        nodes = ray.nodes()
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        self.workers = worker_ids(nodes)
        self.memory_cap = least_memory(nodes)
        if self.metrics.nodes is not None:
            self.metrics.nodes.observe(self.workers)
        lost = sorted(self.seen - alive - self.lost)
        for node in sorted((alive - self.seen) & self.workers):  # a head without CPUs runs no block
            self.metrics.emit("node_joined", node=node)
        self.seen |= alive
        for node in lost:
            self.lost.add(node)
            self.metrics.fault("node_lost", node=node)
        return lost

    def placement(self, node: int | None, home: str | None = None) -> dict[str, Any]:
        """Where a task planned on ``node`` runs: there, or, if that node is lost, on ``home``
        (where most of its held blocks are now), else where Ray's scheduler puts it."""
        if node is None or not self.node_ids:
            return {}
        target = self.node_of(node)
        if target in self.lost:
            if home is None or home in self.lost:
                return {}
            target = home
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(target, soft=True)}

    def memory_cap_now(self) -> float:
        """The least ``memory`` resource of a worker node, asked of Ray once if not known yet."""
        if self.memory_cap is None:
            self.memory_cap = least_memory(ray.nodes())
        return self.memory_cap

    # -- held blocks on lost nodes ------------------------------------------------------------
    # ``block_home`` and ``kept_home`` are the block cache's homes (node id and bytes) of its
    # source blocks (by key) and kept blocks (by ref); ``blocks`` its refs of source blocks.
    def orphan(self, block_home: Mapping[Any, tuple[str, int]], kept_home: Mapping[Any, tuple[str, int]]) -> None:
        """Mark the held blocks whose home is a lost node, to find again after the next run."""
        self._orphans |= {key for key, (home, _) in block_home.items() if home in self.lost}
        self._orphans |= {ref for ref, (home, _) in kept_home.items()
                          if home in self.lost and not isinstance(ref, kept_spill.KeptFile)}

    def rehome(self, block_home: dict[Any, tuple[str, int]], kept_home: dict[Any, tuple[str, int]],
               blocks: Mapping[Any, ray.ObjectRef]) -> None:
        """Find where Ray rebuilt the held blocks that lived on a lost node, and home them there."""
        if not self._orphans:
            return
        keys = [k for k in self._orphans if k in block_home or k in kept_home]
        refs = [blocks[k] if k in block_home else k for k in keys]
        from ray.experimental import get_object_locations

        try:
            where = get_object_locations(refs, timeout_ms=10_000)
        except Exception:  # noqa: BLE001 - not known yet: looked up after the next run
            return
        rebuilt = 0
        for key, ref in zip(keys, refs, strict=True):
            nodes = [n for n in (where.get(ref) or {}).get("node_ids") or [] if n not in self.lost]
            if not nodes:
                continue  # not rebuilt yet (Ray does it when a task needs it)
            homes = block_home if key in block_home else kept_home
            self._rebuilt[key] = {homes[key][0], *nodes}
            homes[key] = (nodes[0], homes[key][1])
            self._orphans.discard(key)
            rebuilt += 1
        self._orphans &= set(keys)  # forget blocks no longer held
        self.metrics.fault("block_reconstructed", rebuilt)

    def take_rebuilt(self) -> dict[Any, set[str]]:
        """The blocks found rebuilt since the last call, and every node with a copy."""
        rebuilt, self._rebuilt = self._rebuilt, {}
        return rebuilt
