"""The passes in order, ``tile -> fuse -> place -> cost``, and the planner that caches plans.

Each pass is ``Plan -> Plan`` and runs the strategy the options name; ``make_plan`` can
stop after any pass (``arrayjob plan --stop-after fuse``). A ``Planner`` owns a plan cache
for its lifetime (a job's session, an estimate): an iterative job builds the same graph
every iteration and plans it once. The cache key is the graph and the options, and a
graph's identity includes every kernel's function and constants (``physical.Kernel``).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence

from arrayjob.errors import SpecError
from arrayjob.planner import fusion, placement, tiling  # noqa: F401  (they register their strategies)
from arrayjob.planner.cost import plan_cost
from arrayjob.planner.fixed import fixed_blocking
from arrayjob.planner.ir import Graph
from arrayjob.planner.lower import lower
from arrayjob.planner.physical import SourceBlock
from arrayjob.planner.plan import Plan, PlanOptions
from arrayjob.planner.registry import KINDS, STRATEGIES, Pass, lookup
from arrayjob.planner.residency import (
    BUDGET_BLOCKS,
    BudgetError,
    StreamRates,
    block_target,
    plan_residency,
)

PASSES = ("tile", "fuse", "place", "cost")


def strategy(kind: str, name: str) -> Pass:
    """The registered strategy ``name`` for ``kind``; an unknown name is a one-line error."""
    return lookup(kind, name)


def strategies(kind: str) -> tuple[str, ...]:
    """The names registered for ``kind`` (``tiling``, ``fusion``, ``placement``), sorted."""
    if kind not in KINDS:
        raise ValueError(f"unknown strategy kind {kind!r}")
    return tuple(sorted(STRATEGIES[kind]))


def tile(plan: Plan) -> Plan:
    """The strategy's tilings, keeping what the program fixes itself (``map_blocks``, ``store``)."""
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
    return strategy("placement", plan.options.placement)(lower(plan))


def estimate(plan: Plan) -> Plan:
    return dataclasses.replace(plan, cost=plan_cost(plan))


PIPELINE: tuple[tuple[str, Callable[[Plan], Plan]], ...] = (
    ("tile", tile), ("fuse", fuse), ("place", place), ("cost", estimate))


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


# blocks per budget tried when the inputs exceed it, finest first (``budget_block_target``)
BLOCKS_PER_BUDGET = (BUDGET_BLOCKS, 6, 4, 3, 2)


def budget_block_target(programs: Sequence[tuple[Graph, int]], options: PlanOptions, budget: int,
                        input_bytes: int, *, repeats: int, rates: StreamRates,
                        planner: Planner | None = None) -> int:
    """The tiling's target block size for a job whose inputs exceed ``budget`` bytes per node,
    from the plans of its ``programs`` (each with the times it runs) with blocks of an eighth
    of the budget up to a half: the one whose runs cost least, the bytes they stream at their
    rate plus their tasks' overhead (``rates.task_seconds`` each, over the workers). Finer
    blocks fill the budget more closely; coarser ones make fewer tasks, and a task costs
    about 3 ms of a worker on a 2-core node, where mapping a block of the spill from the page
    cache costs next to nothing. Programs that read no stored blocks are not weighed; blocks
    some program could not fit even streamed are not chosen. ``options.target_block_bytes``
    when the inputs fit. ``planner``: the plans are made through it, so that the caller's own
    plan of the chosen size is not made again."""
    plan_of = (planner or Planner()).plan
    default = options.target_block_bytes
    if input_bytes <= budget:
        return default
    nodes, workers = max(1, options.cluster.nodes), max(1, options.cluster.workers)
    best: tuple[float, int] | None = None
    tried: set[int] = set()
    for per_budget in BLOCKS_PER_BUDGET:
        target = max(2**20, min(default, budget // per_budget))
        if target in tried:
            continue
        tried.add(target)
        seconds = 0.0
        try:
            for graph, runs in programs:
                physical = plan_of(graph, dataclasses.replace(options, target_block_bytes=target)).physical
                assert physical is not None
                if not any(isinstance(a, SourceBlock) for t in physical.tasks for a in t.args):
                    continue
                r = plan_residency(physical, nodes, budget, repeats=repeats, rates=rates,
                                   workers_per_node=options.cluster.workers_per_node)
                rate = rates.spill_bytes_per_s if r.source == "spill" else rates.bucket_bytes_per_s
                seconds += runs * (r.streamed_bytes / max(rate, 1.0) / nodes
                                   + len(physical.tasks) * rates.task_seconds / workers)
        except BudgetError:
            continue  # blocks too big for the budget beside some program's intermediates
        if best is None or seconds < best[0]:
            best = (seconds, target)
    return best[1] if best is not None else block_target(budget, input_bytes, default)


class Planner:
    """Plans graphs, caching whole plans by (graph, options) for its own lifetime."""

    def __init__(self, capacity: int = 128) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[tuple[Graph, PlanOptions], Plan] = OrderedDict()

    def plan(self, graph: Graph, options: PlanOptions) -> Plan:
        key = (graph, options)
        plan = self._plans.pop(key, None)
        if plan is None:
            plan = make_plan(graph, options)
        self._plans[key] = plan
        while len(self._plans) > self.capacity:
            self._plans.popitem(last=False)
        return plan

    def __len__(self) -> int:
        return len(self._plans)
