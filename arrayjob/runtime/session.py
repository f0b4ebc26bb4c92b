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
from arrayjob.planner.ops import Cached, Value
from arrayjob.planner.pipeline import Planner
from arrayjob.planner.plan import Plan, PlanOptions
from arrayjob.runtime.executor import Executor

if TYPE_CHECKING:
    from arrayjob.planner.ir import Graph

_handles = itertools.count()


class Session:
    """Plans and runs programs on one executor, with one set of planner options."""

    def __init__(self, executor: Executor, options: PlanOptions | None = None,
                 planner: Planner | None = None, on_run: Callable[[str, Graph], None] | None = None) -> None:
        self.executor = executor
        self.options = options or PlanOptions()
        self.planner = planner or Planner()
        self.planning_seconds: list[float] = []
        # told of every program as it runs: ("load" | "persist" | "compute", its graph);
        # tests check a job's runs against its declared stages with it
        self.on_run = on_run

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
        if self.on_run:
            self.on_run("load", plan.graph)
        self.executor.load(plan.physical)

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
        self.executor.keep(plan.physical, self._bind(plan, values), handle)
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
        results = self.executor.run(plan.physical, self._bind(plan, values))
        return dict(zip(outputs, assemble_outputs(plan, results), strict=True))
