"""A session runs lazy array programs: capture the graph, plan it (its planner caches the
plans for the session's lifetime), execute, assemble."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from arrayjob.lazy import BlockArray, bound_values, cached, capture
from arrayjob.planner.lower import assemble_outputs
from arrayjob.planner.memory import MemoryBudget, MemoryModel, ProgramMemory
from arrayjob.planner.ops import Blockwise, Cached, Value
from arrayjob.planner.physical import PhysicalPlan
from arrayjob.planner.pipeline import Planner
from arrayjob.planner.plan import Plan, PlanOptions
from arrayjob.planner.residency import Residency
from arrayjob.runtime.executor import Executor

if TYPE_CHECKING:
    from arrayjob.planner.ir import Graph

__all__ = ["MemoryBudget", "Session"]  # MemoryBudget is the planner's; runs name it from here too

_handles = itertools.count()


class Session:
    """Plans and runs programs on one executor, with one set of planner options.

    Under a ``budget``, what stays in memory, streams, goes to the spill or comes back from
    it is decided for each program by one model (``planner.memory.MemoryModel``, which the
    estimate prices too); the session applies its decisions to the executor before the
    program runs. Without one, or when everything fits, programs run as planned.
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
        self.memory = MemoryModel(budget, self.options.cluster, spills=executor.spills_kept)

    @property
    def residencies(self) -> list[Residency]:
        """The planner's splits of the stored blocks, one per program that read new ones."""
        return self.memory.residencies

    def _apply(self, physical: PhysicalPlan, decided: ProgramMemory) -> None:
        """What the executor must know before the program runs: the split of blocks it reads
        first, and the blocks that leave memory to make room for it."""
        if decided.read_now and decided.residency is not None:
            self.executor.load(physical, decided.residency)
        for name, positions in decided.demoted_kept.items():
            self.executor.demote_kept(name, list(positions))
        if decided.demoted:
            self.executor.demote(set(decided.demoted))

    def _admit_kept(self, admitted: Mapping[str, tuple[int, ...]]) -> None:
        for name, positions in admitted.items():
            self.executor.admit_kept(name, list(positions))

    def _follow_nodes(self) -> None:
        """Plan on the nodes there are now, if the executor follows them (a sized cluster):
        placement over the new count, tiling as the inputs were read (``tiling_workers``)."""
        live = self.executor.nodes_now()
        cluster = self.options.cluster
        if live is None or live == cluster.nodes:
            return
        self.options = dataclasses.replace(self.options, cluster=dataclasses.replace(cluster, nodes=live),
                                           tiling_workers=self.options.workers_for_tiling)
        self.memory.follow(self.options.cluster)

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
        decided = self.memory.load(plan.physical)  # refuses a block over the budget before reading any
        if self.on_run:
            self.on_run("load", plan.graph)
        residency = decided.residency
        # everything fits: the plan runs as it always did
        self.executor.load(plan.physical, residency if residency is not None and residency.streams else None)

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
        decided = self.memory.run(plan.physical, keeps=True)
        self._apply(plan.physical, decided)
        self.executor.keep(plan.physical, self._bind(plan, values), handle, order=decided.order,
                           spill=decided.kept_to_spill, spill_results=decided.spilled_results)
        kept: dict[str, BlockArray] = {}
        blocks: list[tuple[str, int]] = []
        position = 0
        for name, out in zip(outputs, plan.assembly, strict=True):
            node = plan.graph.nodes[out.node]
            array_handle = f"{handle}:{name}"
            self.executor.alias(array_handle, handle, range(position, position + len(out.blocks)))
            position += len(out.blocks)
            blocks.append((array_handle, len(out.blocks)))
            declared = node.attrs.out_block_bytes if isinstance(node.attrs, Blockwise) else None
            kept[name] = cached(array_handle, node.shape, node.dtype, plan.grid(out.node).block_shape, declared)
        self.executor.release(handle)  # the per-array names hold the blocks now
        measured = {name: self.executor.kept_sizes(name) for name, _ in blocks} if decided.kept_to_spill else None
        self._admit_kept(self.memory.keep(plan.physical, blocks, decided, measured))
        return kept

    def release(self, arrays: Mapping[str, BlockArray]) -> None:
        names = []
        for array in arrays.values():
            assert isinstance(array.attrs, Cached)
            self.executor.release(array.attrs.handle)
            names.append(array.attrs.handle)
        self._admit_kept(self.memory.release(names))  # the room they leave

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
        decided = self.memory.run(plan.physical)
        self._apply(plan.physical, decided)
        results = self.executor.run(plan.physical, self._bind(plan, values), order=decided.order,
                                    spill_results=decided.spilled_results)
        return dict(zip(outputs, assemble_outputs(plan, results), strict=True))
