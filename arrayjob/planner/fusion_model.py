"""Candidate kernels: what lowering would make of a group of nodes, and what it would cost.

``Fuser.group(nodes)`` checks a group against the rules of ``lower._Lowering.kernel``:

- the iteration space is the axis classes cut in the group's nodes, plus classes cut in its
  inputs that a node sums away; a node (or input) with two axes of one cut class can't be cut;
- a node that sums away a cut class is a *partial* result: it must be an ``einsum`` or a
  ``sum``/``max``/``min`` reduction, must be an output (the partials are combined by a
  reduction tree), no node of the group may consume it, and it must depend on every class
  of the space it isn't cut on (lowering combines every task's copy of it);
- every output must be cut on each class of the space it has, so that each task writes its
  own block (internal nodes are never materialised: their tilings don't matter).

and prices it (``KernelCost.seconds``) at the rates of the plan's ``ClusterShape``, the
rates placement and the estimate use (the calibrated machine profile's, when the caller
passes it: ``MachineProfile.placement_rates``)::

    bytes_touched / memory_bytes_per_s + Σ work[kind] / work_rates[kind] + tasks * task_seconds

``bytes_touched`` is what ``cost.plan_cost`` counts for the group's tasks: each input block
every task receives (an input the space doesn't slice is received whole by every task), each
output block it returns, the ``Assemble`` tasks that re-cut inputs, and the reduction trees
that combine partial outputs. ``flops`` is each node's work times the number of tasks that
compute it: a node that does not depend on a class of the space is recomputed in each of
that class's blocks, counted by kind (``planner.work``: an ``exp`` is priced at the
transcendental rate, a matrix × vector product by its operand bytes). That is the price of fusing a loop-invariant or multi-consumer
intermediate instead of materialising it once.

``Fuser.merge(a, b)`` analyses the union of two analysed groups incrementally when their
spaces agree (the common case): only the nodes downstream of the new internal edges are
revisited, so greedy fusion of long chains stays near linear.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from arrayjob.planner.legality import doubled_axis_problem, partial_problem
from arrayjob.planner.ops import ELEMENTWISE, Einsum, Map, Op, Reduce, combine_of
from arrayjob.planner.plan import ClusterShape, Plan
from arrayjob.planner.reduction import tree_size
from arrayjob.planner.work import einsum_work, map_work

WorkAmounts = tuple[tuple[str, int], ...]  # (kind, amount), sorted by kind, no zero amounts: hashable


def _work(*parts: Iterable[tuple[str, int]]) -> WorkAmounts:
    total: dict[str, int] = {}
    for part in parts:
        for kind, amount in part:
            total[kind] = total.get(kind, 0) + amount
    return tuple(sorted((k, a) for k, a in total.items() if a))


@dataclass(frozen=True)
class KernelCost:
    """What a kernel costs: its tasks (with re-cut and combine tasks), bytes touched, and its
    work by kind (``cost.WORK_KINDS``), recomputation included."""

    tasks: int
    bytes_touched: int
    work: WorkAmounts = ()

    def seconds(self, shape: ClusterShape) -> float:
        """One worker's time for the kernel at ``shape``'s rates."""
        rates = shape.work_rates
        return (self.bytes_touched / shape.memory_bytes_per_s + self.tasks * shape.task_seconds
                + sum(amount / rates.rate(kind) for kind, amount in self.work))

    def __add__(self, other: KernelCost) -> KernelCost:
        return KernelCost(self.tasks + other.tasks, self.bytes_touched + other.bytes_touched,
                          _work(self.work, other.work))


ZERO = KernelCost(0, 0)


@dataclass(frozen=True, eq=False)
class Group:
    """A candidate kernel and what lowering would make of it."""

    nodes: frozenset[int]
    external: tuple[int, ...]
    outputs: tuple[int, ...]
    space: dict[int, int]  # cut axis class -> blocks
    problem: str | None
    cost: KernelCost
    # for incremental merges
    dep: dict[int, frozenset[int]] = field(repr=False)  # classes of the space each node depends on
    cut_space: dict[int, int] = field(repr=False)  # classes cut by the nodes themselves
    contrib: dict[int, dict[int, int]] = field(repr=False)  # input -> cut classes its consumers sum away


@dataclass(frozen=True)
class _Facts:
    """What the analysis needs of one node, computed once."""

    own: tuple[int, ...]  # axis class of each axis
    own_set: frozenset[int]
    cut: dict[int, int]  # cut class -> blocks along it
    doubled: frozenset[int]  # classes of two or more of its axes
    inputs: tuple[int, ...]  # non-const inputs, once each
    kind: str  # the kind of its work (``planner.work``)
    work: int
    nbytes: int
    combinable: bool  # may hold a partial result


class Fuser:
    """Analyses candidate groups of a tiled plan."""

    def __init__(self, plan: Plan) -> None:
        assert plan.tilings is not None, "fuse needs a tiled plan"
        self.plan = plan
        self.graph = g = plan.graph
        self.grids = [plan.grid(i) for i in range(len(g))]
        self.program_outputs = set(g.outputs)
        self.opaque = {i for i, n in enumerate(g.nodes) if n.op.is_opaque}
        classes = g.axis_classes
        facts = []
        for i, n in enumerate(g.nodes):
            own = classes.of_node(i, n.ndim)
            grid = self.grids[i].grid_shape
            cut = {classes.of_axis(i, a): grid[a] for a in plan.tilings[i].axes if n.shape[a] > 0}
            facts.append(_Facts(
                own, frozenset(own), cut, frozenset(c for c in own if own.count(c) > 1),
                tuple(dict.fromkeys(u for u in n.inputs if g.nodes[u].op is not Op.CONST)), *_node_work(plan, i), n.nbytes,
                combine_of(n.op, n.attrs) is not None))
        self.facts = facts

    # -- analysis ----------------------------------------------------------------------------
    def group(self, nodes: Iterable[int]) -> Group:
        """Analyse ``nodes`` as one kernel, from scratch."""
        nodes = frozenset(nodes)
        g, facts = self.graph, self.facts
        ordered = sorted(nodes)
        external = tuple(dict.fromkeys(u for v in ordered for u in facts[v].inputs if u not in nodes))
        outputs = self._outputs(nodes, ordered)
        if nodes & self.opaque:  # a job's block function or a store: lowered on its own
            v = ordered[0]
            problem = f"{g.nodes[v].op} is never fused" if len(nodes) > 1 else None
            touched = sum(facts[u].nbytes for u in external) + facts[v].nbytes
            cost = KernelCost(max(1, self.grids[v].num_blocks), touched)
            return Group(nodes, external, outputs, {}, problem, cost, {}, {}, {})
        cut_space: dict[int, int] = {}
        for v in ordered:
            cut_space.update(facts[v].cut)
        contrib: dict[int, dict[int, int]] = {}
        for v in ordered:
            for u in facts[v].inputs:
                if u not in nodes:
                    adds = contrib.setdefault(u, {})
                    for c, b in facts[u].cut.items():
                        if c not in facts[v].own_set:
                            adds.setdefault(c, b)
        space = _space(cut_space, contrib)
        keys = frozenset(space)
        dep = {u: keys & facts[u].own_set for u in external}
        for v in ordered:
            dep[v] = frozenset().union(*(dep[u] for u in facts[v].inputs))
        problem = self._problem(ordered, external, outputs, space, dep)
        cost = ZERO if problem else self._io_cost(external, outputs, space, dep) + KernelCost(
            0, 0, _work((facts[v].kind, facts[v].work * _copies(space, dep[v])) for v in ordered))
        return Group(nodes, external, outputs, space, problem, cost, dep, cut_space, contrib)

    def merge(self, a: Group, b: Group) -> Group:
        """Analyse ``a | b``: incrementally if the spaces agree, else from scratch."""
        nodes = a.nodes | b.nodes
        if a.problem or b.problem or not a.dep or not b.dep:
            return self.group(nodes)
        contrib: dict[int, dict[int, int]] = {}
        for part in (a.contrib, b.contrib):
            for u, adds in part.items():
                if u not in nodes:
                    merged = contrib.setdefault(u, {})
                    for c, blocks in adds.items():
                        merged.setdefault(c, blocks)
        cut_space = {**a.cut_space, **b.cut_space}
        space = _space(cut_space, contrib)
        if space != a.space or space != b.space:
            return self.group(nodes)
        facts = self.facts
        external = tuple(dict.fromkeys(u for u in (*a.external, *b.external) if u not in nodes))
        outputs = tuple(sorted(v for v in {*a.outputs, *b.outputs}
                               if v in self.program_outputs or any(c not in nodes for c in self.graph.consumers[v])))
        # inputs that became internal: their consumers' dependencies may shrink, and so on down
        joined = [(u, inner) for outer, inner in ((a, b), (b, a)) for u in outer.nodes.intersection(inner.external)]
        dep = {**a.dep, **b.dep}
        for u, _ in joined:
            dep[u] = (a if u in a.nodes else b).dep[u]
        work = [x for u, inner in joined for x in self.graph.consumers[u] if x in inner.nodes]
        heapq.heapify(work)
        old: dict[int, frozenset[int]] = {}
        while work:
            x = heapq.heappop(work)
            new = frozenset().union(*(dep[u] for u in facts[x].inputs))
            if new != dep[x]:
                old.setdefault(x, dep[x])
                dep[x] = new
                for y in self.graph.consumers[x]:
                    if y in nodes:
                        heapq.heappush(work, y)
        problem = None
        for u, inner in joined:
            if dep[u] - facts[u].own_set:
                problem = f"node {min(inner.nodes & set(self.graph.consumers[u]))} uses partial result {u}"
                break
        for x in sorted(old):
            if problem is None and dep[x] - facts[x].own_set and set(space) - dep[x] - set(facts[x].cut):
                problem = f"partial node {x} ({self.graph.nodes[x].label()}) would be summed over a class it doesn't use"
        if problem:
            return Group(nodes, external, outputs, space, problem, ZERO, {}, {}, {})
        recomputed = ((facts[x].kind, facts[x].work * (_copies(space, dep[x]) - _copies(space, was)))
                      for x, was in old.items())
        cost = self._io_cost(external, outputs, space, dep) + KernelCost(
            0, 0, _work(a.cost.work, b.cost.work, recomputed))
        return Group(nodes, external, outputs, space, None, cost, dep, cut_space, contrib)

    def _outputs(self, nodes: frozenset[int], ordered: list[int]) -> tuple[int, ...]:
        consumers = self.graph.consumers
        return tuple(v for v in ordered if v in self.program_outputs or any(c not in nodes for c in consumers[v]))

    def _problem(self, nodes: list[int], external: tuple[int, ...], outputs: tuple[int, ...],
                 space: dict[int, int], dep: dict[int, frozenset[int]]) -> str | None:
        g, facts = self.graph, self.facts

        def label(v: int) -> str:
            return g.nodes[v].label()

        def is_partial(v: int) -> bool:
            return bool(dep[v] - facts[v].own_set)

        problem = doubled_axis_problem((*nodes, *external), lambda v: facts[v].doubled, space.keys(), label) \
            or partial_problem(nodes, lambda v: facts[v].inputs, is_partial, lambda v: facts[v].combinable,
                               outputs, label)
        if problem:
            return problem
        # The fusion model's own, stricter rule: lowering can run a partial result that is
        # the same in every block of a class it does not use (it combines one copy), but
        # such a kernel does the same work once per block of that class: not fused.
        for v in nodes:
            if is_partial(v) and space.keys() - dep[v] - facts[v].cut.keys():
                return f"partial node {v} ({label(v)}) would be summed over a class it doesn't use"
        for v in outputs:
            n = g.nodes[v]
            for a, c in enumerate(facts[v].own):
                if c in space and n.shape[a] > 1 and c not in facts[v].cut:
                    return f"output {v} ({n.label()}) is not cut on axis {a}, which the kernel cuts"
        return None

    def _io_cost(self, external: tuple[int, ...], outputs: tuple[int, ...], space: dict[int, int],
                 dep: dict[int, frozenset[int]]) -> KernelCost:
        """Tasks and bytes: kernel tasks with their inputs and outputs, re-cuts, combine trees."""
        g, facts, tilings = self.graph, self.facts, self.plan.tilings
        assert tilings is not None
        tasks = math.prod(space.values())
        extra = touched = 0
        for u in external:
            n, f = g.nodes[u], facts[u]
            sliced = {a: c for a, c in enumerate(f.own) if space.get(c, 1) > 1 and n.shape[a] > 1}
            pieces = math.prod(space[c] for c in sliced.values())
            touched += f.nbytes * (tasks // pieces)
            cut = {a for a in tilings[u].axes if self.grids[u].grid_shape[a] > 1}
            if cut != set(sliced):  # re-cut by Assemble tasks, one per distinct slice
                extra += pieces
                touched += f.nbytes * math.prod(space[c] for a, c in sliced.items() if a not in cut) + f.nbytes
        for v in outputs:
            f = facts[v]
            copies = math.prod(b for c, b in space.items() if c not in f.cut)
            touched += f.nbytes * copies
            if dep[v] - f.own_set:  # partial: one combine tree per block
                blocks = self.grids[v].num_blocks
                t, b = tree_size(copies, f.nbytes // max(1, blocks))
                extra += t * blocks
                touched += b * blocks
        return KernelCost(tasks + extra, touched)

    def plan_cost(self, groups: Iterable[Iterable[int]]) -> KernelCost:
        total = ZERO
        for nodes in groups:
            total = total + self.group(nodes).cost
        return total


def _space(cut_space: dict[int, int], contrib: dict[int, dict[int, int]]) -> dict[int, int]:
    space = dict(cut_space)
    for adds in contrib.values():
        for c, blocks in adds.items():
            space.setdefault(c, blocks)
    return space


def _copies(space: dict[int, int], dep: frozenset[int]) -> int:
    return math.prod(b for c, b in space.items() if c not in dep)


def _node_work(plan: Plan, v: int) -> tuple[str, int]:
    """The work to compute node ``v`` whole, as (kind, amount): as ``cost`` counts a block's."""
    g = plan.graph
    n = g.nodes[v]
    if isinstance(n.attrs, Map):
        return map_work(math.prod(n.shape), ELEMENTWISE[n.attrs.fn].calls)
    if isinstance(n.attrs, Reduce):
        return "elementwise", math.prod(g.nodes[n.inputs[0]].shape)
    if isinstance(n.attrs, Einsum):
        kind, amount, _ = einsum_work(n.attrs.subscripts, [g.nodes[u].shape for u in n.inputs])
        return kind, amount
    return "elementwise", 0
