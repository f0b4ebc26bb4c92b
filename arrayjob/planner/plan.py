"""The plan and its passes: ``tile -> fuse -> place -> cost``, each ``Plan -> Plan``.

A ``Plan`` starts as a graph and options; each pass fills in its part. Strategies for a
pass are registered by name with one signature, so every optimisation can be switched
off and compared (``--tiling naive``, ``--fusion none``, ``--placement ray``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arrayjob.errors import SpecError
from arrayjob.planner.ir import Graph
from arrayjob.planner.physical import BlockGrid, PhysicalPlan

GiB = 2**30
PASSES = ("tile", "fuse", "place", "cost")


@dataclass(frozen=True)
class ClusterShape:
    """The planner's view of the cluster: how many nodes, workers each, and their memory."""

    nodes: int = 1
    workers_per_node: int = 2
    memory_per_node: int = 16 * GiB

    @property
    def workers(self) -> int:
        return self.nodes * self.workers_per_node


# Largest block the tiling makes of a stored array (it aims at ~2 blocks per worker). Measured
# on 2 cores, X 4,000,000 × 64 (2 GB) logistic loss+gradient: 64 / 128 / 256 / 512 MiB blocks
# 0.456 / 0.342 / 0.285 / 0.271 s per evaluation — with small blocks Ray's per-task cost and
# idle workers between waves dominate; past 256 MiB the gain is small and memory per task grows.
TARGET_BLOCK_BYTES = 256 * 2**20


@dataclass(frozen=True)
class PlanOptions:
    tiling: str = "greedy"
    fusion: str = "cost"
    placement: str = "lshs"
    cluster: ClusterShape = ClusterShape()
    target_block_bytes: int = TARGET_BLOCK_BYTES


@dataclass(frozen=True)
class Tiling:
    """Which axes of an array are cut into blocks; ``()`` means one whole block."""

    axes: tuple[int, ...] = ()

    def describe(self, ndim: int) -> str:
        if not self.axes:
            return "whole"
        if ndim == 2 and self.axes == (0,):
            return "row"
        if ndim == 2 and self.axes == (1,):
            return "column"
        return "block" if len(self.axes) > 1 else f"axis {self.axes[0]}"


@dataclass(frozen=True)
class FusedKernel:
    """Graph nodes computed together, block by block, in one task per block."""

    name: str
    nodes: tuple[int, ...]  # topological order
    outputs: tuple[int, ...]  # the nodes it materialises


@dataclass(frozen=True)
class Plan:
    graph: Graph
    options: PlanOptions
    tilings: tuple[Tiling, ...] | None = None  # per node, after `tile`
    block_lengths: tuple[tuple[int, int], ...] = ()  # (axis class, block length), after `tile`
    kernels: tuple[FusedKernel, ...] | None = None  # after `fuse`
    physical: PhysicalPlan | None = None  # tasks with nodes, after `place`
    assembly: tuple[Any, ...] = ()  # how program outputs are assembled from task results
    cost: Any = None  # PlanCost, after `cost`
    stats: dict[str, float] = field(default_factory=dict, compare=False, hash=False)

    @functools.cached_property
    def _lengths(self) -> dict[int, int]:
        return dict(self.block_lengths)

    def grid(self, node: int) -> BlockGrid:
        """The block grid of ``node`` under its tiling."""
        assert self.tilings is not None, "grid() needs a tiled plan"
        n = self.graph.nodes[node]
        classes = self.graph.axis_classes.of_node(node, n.ndim)
        axes = self.tilings[node].axes
        block = tuple(
            min(self._lengths.get(c, s), s) if a in axes and s > 0 else max(s, 1)
            for a, (c, s) in enumerate(zip(classes, n.shape, strict=True))
        )
        return BlockGrid(n.shape, block)


Pass = Callable[[Plan], Plan]
STRATEGIES: dict[str, dict[str, Pass]] = {"tiling": {}, "fusion": {}, "placement": {}}


def register(kind: str, name: str) -> Callable[[Pass], Pass]:
    def decorate(fn: Pass) -> Pass:
        STRATEGIES[kind][name] = fn
        return fn

    return decorate


def strategy(kind: str, name: str) -> Pass:
    _load_strategies()
    try:
        return STRATEGIES[kind][name]
    except KeyError:
        raise SpecError(f"--{kind}: unknown strategy {name!r} (expected one of: {', '.join(sorted(STRATEGIES[kind]))})") from None


def _load_strategies() -> None:
    # Importing the pass modules registers their strategies.
    from arrayjob.planner import cost, fusion, placement, tiling  # noqa: F401


def tile(plan: Plan) -> Plan:
    """The strategy's tilings, keeping what the program fixes itself (``map_blocks``, ``store``)."""
    from arrayjob.planner.fixed import fixed_blocking

    tiled = strategy("tiling", plan.options.tiling)(plan)
    fixed, lengths = fixed_blocking(plan.graph)
    if not fixed:
        return tiled
    assert tiled.tilings is not None
    tilings = tuple(fixed.get(i, t) for i, t in enumerate(tiled.tilings))
    merged = {**dict(tiled.block_lengths), **lengths}
    return dataclasses.replace(tiled, tilings=tilings, block_lengths=tuple(sorted(merged.items())))


def fuse(plan: Plan) -> Plan:
    return strategy("fusion", plan.options.fusion)(plan)


def place(plan: Plan) -> Plan:
    from arrayjob.planner.lower import lower

    return strategy("placement", plan.options.placement)(lower(plan))


def estimate(plan: Plan) -> Plan:
    from arrayjob.planner.cost import plan_cost

    return dataclasses.replace(plan, cost=plan_cost(plan))


PIPELINE: tuple[tuple[str, Pass], ...] = (("tile", tile), ("fuse", fuse), ("place", place), ("cost", estimate))


def make_plan(graph: Graph, options: PlanOptions, stop_after: str = "cost") -> Plan:
    """Run the passes in order, stopping after ``stop_after``."""
    if stop_after not in PASSES:
        raise SpecError(f"--stop-after: expected one of {', '.join(PASSES)}, got {stop_after!r}")
    plan = Plan(graph, options)
    for name, run_pass in PIPELINE:
        plan = run_pass(plan)
        if name == stop_after:
            break
    return plan


@functools.lru_cache(maxsize=128)
def cached_plan(graph: Graph, options: PlanOptions) -> Plan:
    """Plans by structure: an iterative job builds the same graph and plans it once."""
    return make_plan(graph, options)
