"""A session runs lazy array programs: capture the graph, plan it (its planner caches the
plans for the session's lifetime), execute, assemble."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from arrayjob.lazy import BlockArray, bound_values, cached, capture
from arrayjob.planner.lower import assemble_outputs
from arrayjob.planner.ops import Blockwise, Cached, Value
from arrayjob.planner.physical import PhysicalPlan, SourceBlock, TaskResult
from arrayjob.planner.pipeline import Planner
from arrayjob.planner.plan import Plan, PlanOptions
from arrayjob.planner.residency import (
    SPILL_RESULT_MIN_BYTES,
    Residency,
    StreamRates,
    demotions,
    intermediate_peak,
    plan_residency,
    spilled_results,
    task_order,
)
from arrayjob.runtime.executor import Executor

if TYPE_CHECKING:
    from arrayjob.planner.ir import Graph

_handles = itertools.count()


@dataclass(frozen=True)
class _Kept:
    """Block ``position`` of the kept array ``name``, as the block cache counts it."""

    name: str
    position: int


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

    Kept blocks (``persist``) share the budget. When a persisted program's results would not
    fit beside what is resident, each is written to its node's spill by the task that makes
    it, and as many as fit are read back into memory, the first positions first (every
    later program reads them all, in a cyclic scan: any fixed set is as good as another,
    and better than churning). A program whose intermediates need room streams resident
    blocks again, the last admitted first (``planner.residency.demotions``); a release
    makes room that spilled kept blocks take.
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
        # (array URI, block), or a kept block, in memory -> (node, bytes), in the order admitted
        self._resident: dict[tuple[str, SourceBlock] | _Kept, tuple[int, int]] = {}
        # kept arrays in a spill: per block, (node, bytes)
        self._kept_spilled: dict[str, list[tuple[int, int]]] = {}
        # kept arrays held in memory from the start (by the plan's sizes, they fit): bytes per node
        self._kept_held: dict[str, list[int]] = {}
        self._reserve = [0] * max(1, self.options.cluster.nodes)  # the most intermediates seen, per node
        self._streamed: set[tuple[str, SourceBlock]] = set()
        self._resident_bytes = [0] * max(1, self.options.cluster.nodes)
        self._orders: dict[int, tuple[PhysicalPlan, tuple[int, ...] | None]] = {}
        # per program (and how it keeps its outputs): its intermediates' peak per node, with its
        # outputs and without, and the results it writes to the spill
        self._peaks: dict[int, tuple[PhysicalPlan, tuple[bool, bool], tuple[int, ...], tuple[int, ...],
                                     frozenset[TaskResult]]] = {}

    @property
    def _spills(self) -> bool:
        """Whether kept blocks and results may go to the nodes' spill: the executor can put
        them there, and the budget's rates leave room on the nodes' disks (no rates: tests)."""
        rates = self.budget.rates if self.budget is not None else None
        return getattr(self.executor, "spills_kept", False) and (rates is None or rates.spill_capacity > 0)

    def residency(self, physical: PhysicalPlan, keeps: bool = False) -> Residency | None:
        """The planner's split of ``physical``'s blocks under the budget, given what earlier
        loads keep resident (``None`` without a budget). Raises ``BudgetError`` if a block
        cannot fit even streamed. With ``keeps`` (``persist``), the program's results are
        counted as the executor keeps them under a budget: in the spill, not in memory."""
        if self.budget is None:
            return None
        cluster = self.options.cluster
        left = self.budget.bytes - max(self._resident_bytes)
        spilled = frozenset(physical.outputs) if keeps and self._spills \
            else frozenset()
        return plan_residency(physical, cluster.nodes, max(0, left), repeats=self.budget.repeats,
                              rates=self.budget.rates, workers_per_node=cluster.workers_per_node, spilled=spilled)

    def _key(self, physical: PhysicalPlan, block: SourceBlock) -> tuple[str, SourceBlock]:
        return physical.source(block.array).array.uri, block

    def _make_room(self, physical: PhysicalPlan, keeps: bool = False, kept_spilled: bool = False,
                   ) -> frozenset[TaskResult]:
        """Under a budget: the results of this program to write to the spill so that its
        intermediates fit beside what is resident (``planner.residency.spilled_results``);
        and resident blocks to stream from now on where they still do not
        (``planner.residency.demotions``). With ``keeps`` (``persist``), the program's outputs
        are kept: in the spill with ``kept_spilled`` (taking no memory), else in memory (and
        counted as kept afterwards, not in the room later programs' intermediates need)."""
        if self.budget is None or not (self._resident or self._kept_spilled or self._streamed):
            return frozenset()
        cached = self._peaks.get(id(physical))
        if cached is None or cached[0] is not physical or cached[1] != (keeps, kept_spilled):
            if len(self._peaks) > 64:
                self._peaks.clear()
            nodes = len(self._resident_bytes)
            # results go to the spill where they would not fit beside what is resident: a
            # result is written and read once, where a resident block streamed instead would
            # come back at every later program that reads it; but not results under a 16th of
            # the budget (or 1 MiB), whose files would cost more than the room they free
            spilled: frozenset[TaskResult] = frozenset()
            if self._spills:
                room = [max(0, self.budget.bytes - held) for held in self._resident_bytes]
                spilled = spilled_results(physical, nodes, room,
                                          min_bytes=min(SPILL_RESULT_MIN_BYTES, self.budget.bytes // 16))
            outputs = frozenset(physical.outputs)
            peaks = intermediate_peak(physical, nodes, spilled=spilled | outputs if kept_spilled else spilled)
            alone = intermediate_peak(physical, nodes, spilled=spilled | outputs) if keeps and not kept_spilled \
                else peaks
            cached = self._peaks[id(physical)] = (physical, (keeps, kept_spilled), peaks, alone, spilled)
        _, _, peaks, alone, spilled = cached
        self._reserve = [max(r, p) for r, p in zip(self._reserve, alone, strict=False)]
        dropped = demotions([(k, n, b) for k, (n, b) in self._resident.items()], self.budget.bytes, peaks)
        kept: dict[str, list[int]] = {}
        for key in dropped:
            node, nbytes = self._resident.pop(key)  # type: ignore[call-overload]
            self._resident_bytes[node] -= nbytes
            if isinstance(key, _Kept):
                kept.setdefault(key.name, []).append(key.position)
            else:
                self._streamed.add(key)  # type: ignore[arg-type]
        for name, positions in kept.items():
            self.executor.demote_kept(name, positions)
        if len(kept) < len(dropped):
            self._orders.clear()
            self.executor.demote({k for k in dropped if not isinstance(k, _Kept)})  # type: ignore[misc]
        return spilled

    def _bytes_by_node(self, physical: PhysicalPlan, results: Iterable[TaskResult]) -> list[int]:
        """The plan's bytes of ``results``, on the nodes that make them."""
        nodes = len(self._resident_bytes)
        made = {t.id: ((t.node if t.node is not None else i) % nodes, t.out_bytes) for i, t in enumerate(physical.tasks)}
        held = [0] * nodes
        for result in results:
            node, sizes = made[result.task]
            held[node] += sizes[result.output] if result.output < len(sizes) else 0
        return held

    def _spills_kept(self, physical: PhysicalPlan) -> bool:
        """Under a budget: whether ``physical``'s results, kept, go to the spill first. They do
        when the budget already streams inputs (it has no room to spare, and a job's size of
        an object block is its own estimate), or when by the plan's sizes of them they would
        not fit beside what is resident on some node."""
        if self.budget is None or not self._spills:
            return False
        if self._streamed or self._kept_spilled:
            return True
        need = self._bytes_by_node(physical, physical.outputs)
        return any(held + reserve + n > self.budget.bytes
                   for held, reserve, n in zip(self._resident_bytes, self._reserve, need, strict=True))

    def _admit_kept(self) -> None:
        """Bring spilled kept blocks into memory where the budget has room for them beside what
        is resident and the most intermediates seen on their node."""
        assert self.budget is not None
        nodes = len(self._resident_bytes)
        for name, blocks in self._kept_spilled.items():
            admitted = []
            for position, (node, nbytes) in enumerate(blocks):
                node %= nodes
                key = _Kept(name, position)
                if key in self._resident or nbytes == 0:
                    continue
                if self._resident_bytes[node] + self._reserve[node] + nbytes <= self.budget.bytes:
                    self._resident[key] = (node, nbytes)
                    self._resident_bytes[node] += nbytes
                    admitted.append(position)
            if admitted:
                self.executor.admit_kept(name, admitted)

    def _order(self, physical: PhysicalPlan) -> tuple[int, ...] | None:
        """The submission order of a program over blocks some of which are streamed."""
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

    def _decide(self, physical: PhysicalPlan, keeps: bool = False) -> None:
        """Under a budget, split the stored blocks of a program no load has decided (PageRank
        reads its edges in its first programs) before it runs; when nothing streams, the
        executor reads them on first use, as without a budget."""
        if self.budget is None:
            return
        keys = {self._key(physical, a) for t in physical.tasks for a in t.args if isinstance(a, SourceBlock)}
        if not keys - set(self._resident) - self._streamed:
            return
        residency = self.residency(physical, keeps)
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
        self._decide(plan.physical, keeps=True)
        spill = self._spills_kept(plan.physical)
        results = self._make_room(plan.physical, keeps=True, kept_spilled=spill)
        order = self._order(plan.physical)
        self.executor.keep(plan.physical, self._bind(plan, values), handle, order=order, spill=spill,
                           spill_results=results)
        kept: dict[str, BlockArray] = {}
        position = 0
        for name, out in zip(outputs, plan.assembly, strict=True):
            node = plan.graph.nodes[out.node]
            array_handle = f"{handle}:{name}"
            self.executor.alias(array_handle, handle, range(position, position + len(out.blocks)))
            position += len(out.blocks)
            declared = node.attrs.out_block_bytes if isinstance(node.attrs, Blockwise) else None
            kept[name] = cached(array_handle, node.shape, node.dtype, plan.grid(out.node).block_shape, declared)
        self.executor.release(handle)  # the per-array names hold the blocks now
        if spill:
            for array in kept.values():
                name = array.attrs.handle  # type: ignore[union-attr]
                self._kept_spilled[name] = [s or (0, 0) for s in self.executor.kept_sizes(name)]
            self._admit_kept()
        elif self.budget is not None:  # in memory, as the plan sizes them: they take the budget's room
            results = iter(plan.physical.outputs)  # the blocks of each kept array, in turn
            for array, out in zip(kept.values(), plan.assembly, strict=True):
                held = self._bytes_by_node(plan.physical, itertools.islice(results, len(out.blocks)))
                self._kept_held[array.attrs.handle] = held  # type: ignore[union-attr]
                self._resident_bytes = [a + b for a, b in zip(self._resident_bytes, held, strict=True)]
        return kept

    def release(self, arrays: Mapping[str, BlockArray]) -> None:
        freed = False
        for array in arrays.values():
            assert isinstance(array.attrs, Cached)
            name = array.attrs.handle
            self.executor.release(name)
            held = self._kept_held.pop(name, None)
            if held is not None:
                self._resident_bytes = [a - b for a, b in zip(self._resident_bytes, held, strict=True)]
                freed = True
            if self._kept_spilled.pop(name, None) is not None:
                for key in [k for k in self._resident if isinstance(k, _Kept) and k.name == name]:
                    node, nbytes = self._resident.pop(key)
                    self._resident_bytes[node] -= nbytes
                freed = True
        if freed and self._kept_spilled:
            self._admit_kept()  # the room they leave

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
        spilled = self._make_room(plan.physical)
        results = self.executor.run(plan.physical, self._bind(plan, values), order=self._order(plan.physical),
                                    spill_results=spilled)
        return dict(zip(outputs, assemble_outputs(plan, results), strict=True))
