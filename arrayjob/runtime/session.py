"""A session runs lazy array programs: capture the graph, plan it (its planner caches the
plans for the session's lifetime), execute, assemble."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from arrayjob.lazy import BlockArray, bound_values, cached, capture
from arrayjob.planner.lower import assemble_outputs
from arrayjob.planner.ops import Cached, Value
from arrayjob.planner.physical import PhysicalPlan, SourceBlock
from arrayjob.planner.pipeline import Planner
from arrayjob.planner.plan import Plan, PlanOptions
from arrayjob.planner.residency import (
    Residency,
    StreamRates,
    demotions,
    intermediate_peak,
    plan_residency,
    task_order,
)
from arrayjob.runtime.executor import Executor

if TYPE_CHECKING:
    from arrayjob.planner.ir import Graph

_handles = itertools.count()


@dataclass(frozen=True)
class MemoryBudget:
    """What the session's block cache may hold: ``bytes`` per node for input blocks and
    intermediates, for programs run ``repeats`` times (an iterative job's ``max_iter``), and
    where streamed blocks come back from (``planner.residency``)."""

    bytes: int
    repeats: int = 1
    rates: StreamRates | None = None


class Session:
    """Plans and runs programs on one executor, with one set of planner options.

    With a ``budget``, each ``load`` asks the planner which of the program's blocks stay
    resident (``planner.residency``); the rest are streamed by the executor, and every later
    program submits its tasks in the order the planner gives for what is streamed. Without
    one, or when everything fits, programs run as planned.
    """

    def __init__(self, executor: Executor, options: PlanOptions | None = None,
                 planner: Planner | None = None, on_run: Callable[[str, Graph], None] | None = None,
                 budget: MemoryBudget | None = None) -> None:
        self.executor = executor
        self.options = options or PlanOptions()
        self.planner = planner or Planner()
        self.planning_seconds: list[float] = []
        # told of every program as it runs: ("load" | "persist" | "compute", its graph);
        # tests check a job's runs against its declared stages with it
        self.on_run = on_run
        self.budget = budget
        self.residencies: list[Residency] = []  # one per load, in order
        # (array URI, block) kept in the store -> (node, bytes), in the order admitted
        self._resident: dict[tuple[str, SourceBlock], tuple[int, int]] = {}
        self._streamed: set[tuple[str, SourceBlock]] = set()
        self._resident_bytes = [0] * max(1, self.options.cluster.nodes)
        self._orders: dict[int, tuple[PhysicalPlan, tuple[int, ...] | None]] = {}
        self._peaks: dict[int, tuple[PhysicalPlan, tuple[int, ...]]] = {}

    def residency(self, physical: PhysicalPlan) -> Residency | None:
        """The planner's split of ``physical``'s blocks under the budget, given what earlier
        loads keep resident (``None`` without a budget). Raises ``BudgetError`` if a block
        cannot fit even streamed."""
        if self.budget is None:
            return None
        cluster = self.options.cluster
        left = self.budget.bytes - max(self._resident_bytes)
        return plan_residency(physical, cluster.nodes, max(0, left), repeats=self.budget.repeats,
                              rates=self.budget.rates, workers_per_node=cluster.workers_per_node)

    def _key(self, physical: PhysicalPlan, block: SourceBlock) -> tuple[str, SourceBlock]:
        return physical.source(block.array).array.uri, block

    def _make_room(self, physical: PhysicalPlan) -> None:
        """Stream resident blocks from now on where this program's intermediates would not
        fit beside them (``planner.residency.demotions``)."""
        if self.budget is None or not self._resident:
            return
        cached = self._peaks.get(id(physical))
        if cached is None or cached[0] is not physical:  # one replay per plan, not per iteration
            if len(self._peaks) > 64:
                self._peaks.clear()
            cached = self._peaks[id(physical)] = (physical, intermediate_peak(physical, len(self._resident_bytes)))
        peaks = cached[1]
        dropped = demotions([(k, n, b) for k, (n, b) in self._resident.items()], self.budget.bytes, peaks)
        for key in dropped:
            node, nbytes = self._resident.pop(key)  # type: ignore[call-overload]
            self._resident_bytes[node] -= nbytes
            self._streamed.add(key)  # type: ignore[arg-type]
        if dropped:
            self._orders.clear()
            self.executor.demote(set(dropped))  # type: ignore[arg-type]

    def _order(self, physical: PhysicalPlan) -> tuple[int, ...] | None:
        """The submission order of a program over blocks some of which are streamed."""
        self._make_room(physical)
        if not self._streamed:
            return None
        cached = self._orders.get(id(physical))
        if cached is None or cached[0] is not physical:
            streamed = frozenset(a for t in physical.tasks for a in t.args if isinstance(a, SourceBlock)
                                 and self._key(physical, a) not in self._resident)
            cluster = self.options.cluster
            order = task_order(physical, streamed, cluster.nodes, max(1, cluster.workers_per_node - 1)) \
                if streamed else None
            if len(self._orders) > 64:
                self._orders.clear()
            cached = self._orders[id(physical)] = (physical, order)
        return cached[1]

    def _follow_nodes(self) -> None:
        """Plan on the nodes there are now, if the executor follows them (a sized cluster):
        placement over the new count, tiling as the inputs were read (``tiling_workers``)."""
        live = self.executor.nodes_now()
        cluster = self.options.cluster
        if live is None or live == cluster.nodes:
            return
        self.options = dataclasses.replace(self.options, cluster=dataclasses.replace(cluster, nodes=live),
                                           tiling_workers=self.options.workers_for_tiling)

    def plan(self, outputs: Mapping[str, BlockArray]) -> Plan:
        self._follow_nodes()
        start = time.perf_counter()
        plan = self.planner.plan(capture(list(outputs.values())), self.options)
        self.planning_seconds.append(time.perf_counter() - start)
        return plan

    def load(self, outputs: Mapping[str, BlockArray]) -> None:
        """Read the stored blocks the program uses now (they stay for later computes)."""
        plan = self.plan(outputs)
        assert plan.physical is not None
        residency = self.residency(plan.physical)  # refuses a block over the budget before reading any
        if self.on_run:
            self.on_run("load", plan.graph)
        if residency is None:
            self.executor.load(plan.physical)
            return
        self._admit(plan.physical, residency)
        # everything fits: the plan runs as it always did
        self.executor.load(plan.physical, residency if residency.streams else None)

    def _admit(self, physical: PhysicalPlan, residency: Residency) -> None:
        """Record the planner's split of ``physical``'s blocks (what is resident, by node)."""
        self.residencies.append(residency)
        nodes = len(self._resident_bytes)
        homes = {a: (t.node if t.node is not None else i) % nodes
                 for i, t in enumerate(physical.tasks) for a in t.args if isinstance(a, SourceBlock)}
        for block in sorted(residency.resident, key=lambda b: (b.array, b.index)):
            if self._key(physical, block) not in self._resident:
                self._resident[self._key(physical, block)] = (homes[block], residency.block_bytes[block])
                self._resident_bytes[homes[block]] += residency.block_bytes[block]
        self._streamed |= {self._key(physical, b) for b in residency.streamed} - set(self._resident)

    def _decide(self, physical: PhysicalPlan) -> None:
        """Under a budget, split the stored blocks of a program no load has decided (PageRank
        reads its edges in its first programs) before it runs; when nothing streams, the
        executor reads them on first use, as without a budget."""
        if self.budget is None:
            return
        keys = {self._key(physical, a) for t in physical.tasks for a in t.args if isinstance(a, SourceBlock)}
        if not keys - set(self._resident) - self._streamed:
            return
        residency = self.residency(physical)
        assert residency is not None
        self._admit(physical, residency)
        if residency.streams or self._streamed:
            self._orders.clear()
            self.executor.load(physical, residency)

    def persist(self, outputs: Mapping[str, BlockArray], values: Mapping[str, Any] | None = None,
                handle: str | None = None) -> dict[str, BlockArray]:
        """Compute ``outputs`` and keep their blocks where they are; returns lazy arrays of them,
        named ``<handle>:<output>`` (a fresh handle unless given: a job that declares the
        programs reading them names it).

        Later programs use the kept blocks without recomputing them (e.g. PageRank's graph,
        built once and multiplied every iteration). ``release`` frees them.
        """
        plan = self.plan(outputs)
        assert plan.physical is not None
        handle = handle or f"persist-{next(_handles)}"
        if self.on_run:
            self.on_run("persist", plan.graph)
        values = {**bound_values(list(outputs.values())), **(values or {})}
        self._decide(plan.physical)
        self.executor.keep(plan.physical, self._bind(plan, values), handle, order=self._order(plan.physical))
        kept: dict[str, BlockArray] = {}
        position = 0
        for name, out in zip(outputs, plan.assembly, strict=True):
            node = plan.graph.nodes[out.node]
            array_handle = f"{handle}:{name}"
            self.executor.alias(array_handle, handle, range(position, position + len(out.blocks)))
            position += len(out.blocks)
            kept[name] = cached(array_handle, node.shape, node.dtype, plan.grid(out.node).block_shape)
        self.executor.release(handle)  # the per-array names hold the blocks now
        return kept

    def release(self, arrays: Mapping[str, BlockArray]) -> None:
        for array in arrays.values():
            assert isinstance(array.attrs, Cached)
            self.executor.release(array.attrs.handle)

    def _bind(self, plan: Plan, values: Mapping[str, Any] | None) -> dict[str, Any]:
        bound = dict(values or {})
        for node in plan.graph.nodes:
            if isinstance(node.attrs, Value):
                name = node.attrs.name
                if name not in bound:
                    raise ValueError(f"compute: no value bound for {name!r}")
                array = np.asarray(bound[name], dtype=node.dtype)
                if array.shape != node.shape:
                    raise ValueError(f"compute: value {name!r} has shape {array.shape}, expected {node.shape}")
                bound[name] = array
        return bound

    def compute(self, outputs: Mapping[str, BlockArray], values: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Run the program that yields ``outputs``; returns them as NumPy arrays."""
        plan = self.plan(outputs)
        assert plan.physical is not None
        values = {**bound_values(list(outputs.values())), **(values or {})}
        if self.on_run:
            self.on_run("compute", plan.graph)
        self._decide(plan.physical)
        results = self.executor.run(plan.physical, self._bind(plan, values), order=self._order(plan.physical))
        return dict(zip(outputs, assemble_outputs(plan, results), strict=True))
