"""Fusion (KASEN, SystemML codegen): which graph nodes are computed together, one task per block.

A fused kernel runs once per block of its *iteration space* and keeps its intermediates in
the task, so they are never written out, shipped or read back (KASEN's IterOnVec; SystemML's
Cell, Row and MultiAgg templates). What may be fused is what lowering can run
(``fusion_model`` states the rules and checks them); on top of those, fusing never
multiplies tasks (one group's space must contain the other's) and the kernel graph stays
acyclic (kernels are listed in topological order).

Strategies (``--fusion``):

``none``  one kernel per operation: every intermediate is materialised.
``all``   greedy: merge producer into consumer along every edge (largest intermediate first),
          then groups that read the same array (multi-aggregate, largest array first), until
          nothing more is legal. ``X.T @ f(X @ w)`` with ``X`` row-cut becomes one kernel per
          row block (SystemML's Row template), the loss and the gradient its partial outputs.
``cost``  (default) the same greedy walk, taking a merge only if the modelled cost does not
          grow, and never returning a plan the model prices above ``all``'s.

The cost model (``fusion_model.KernelCost``) prices a kernel in seconds at the rates of the
plan's ``ClusterShape`` (those placement and the estimate use; a calibrated profile's when
the caller passes one)::

    bytes_touched / memory_bytes_per_s + Σ work[kind] / work_rates[kind] + tasks * task_seconds

with ``bytes_touched`` counted as ``cost.plan_cost`` counts it (inputs each task receives,
outputs it returns, re-cut and combine tasks) and the work including recomputation: a node
that does not depend on some class of the kernel's space is computed again in each of that
class's blocks. Fusing a multi-consumer or loop-invariant intermediate saves a task, its write
and its consumers' reads; when its recomputation (or the bigger inputs every task must then
receive) costs more, ``cost`` materialises it in a kernel of its own — that is the only way it
differs from ``all``. Failed merges are remembered per pair of group versions (the memo), so
the walk does not re-analyse them.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterable

from arrayjob.planner.fusion_model import Fuser, Group
from arrayjob.planner.ops import Op
from arrayjob.planner.plan import ClusterShape, FusedKernel, Plan
from arrayjob.planner.registry import register


def kernel_name(plan: Plan, nodes: tuple[int, ...]) -> str:
    labels = [plan.graph.nodes[i].label() for i in nodes]
    head = "+".join(dict.fromkeys(labels))
    return head if len(head) <= 48 else head[:45] + "..."


def outputs_of(plan: Plan, nodes: tuple[int, ...]) -> tuple[int, ...]:
    """The nodes of a group that are used outside it or returned by the program."""
    inside = set(nodes)
    program_outputs = set(plan.graph.outputs)
    return tuple(
        i for i in nodes
        if i in program_outputs or any(u not in inside for u in plan.graph.consumers[i])
    )


def kernel_problem(plan: Plan, nodes: Iterable[int]) -> str | None:
    """Why ``nodes`` can't be one kernel of ``plan`` (None if they can)."""
    return Fuser(plan).group(nodes).problem


# -- greedy grouping ---------------------------------------------------------------------------

Accept = Callable[[Group, Group, Group], bool]


def _legal(a: Group, b: Group, merged: Group) -> bool:
    # never multiply tasks: one side's iteration space must hold the other's
    return merged.problem is None and merged.space in (a.space, b.space)


def _cheaper(shape: ClusterShape) -> Accept:
    def cheaper(a: Group, b: Group, merged: Group) -> bool:
        return _legal(a, b, merged) and merged.cost.seconds(shape) <= (a.cost + b.cost).seconds(shape) * (1 + 1e-9)

    return cheaper


class _Partition:
    """Groups of non-leaf nodes, merged pairwise while the group graph stays acyclic."""

    def __init__(self, fuser: Fuser) -> None:
        self.fuser = fuser
        g = fuser.graph
        self.group_of = {v: v for v, n in enumerate(g.nodes) if not n.is_leaf}
        self.groups: dict[int, Group] = {v: fuser.group((v,)) for v in self.group_of}
        self.succ: dict[int, set[int]] = {v: set() for v in self.group_of}
        self.pred: dict[int, set[int]] = {v: set() for v in self.group_of}
        for v in self.group_of:
            for u in g.nodes[v].inputs:
                if u in self.group_of and u != v:
                    self.succ[u].add(v)
                    self.pred[v].add(u)
        self.version = dict.fromkeys(self.group_of, 0)
        self.last = {v: v for v in self.group_of}  # a group's id is its first node; this its last
        self.failed: set[tuple[int, int, int, int]] = set()

    def reaches_indirectly(self, start: int, target: int) -> bool:
        """Whether a path ``start -> other groups -> target`` exists."""
        # an edge runs from a node to a later one, so every group on a path to ``target``
        # holds a node before ``target``'s last: the search never leaves that prefix
        last = self.last[target]
        seen, stack = set(), [s for s in self.succ[start] if s != target and s <= last]
        while stack:
            gid = stack.pop()
            if gid == target:
                return True
            if gid not in seen:
                seen.add(gid)
                stack.extend(s for s in self.succ[gid] if s not in seen and s <= last)
        return False

    def merge(self, a: int, b: int, accept: Accept) -> bool:
        if a == b:
            return False
        key = (a, self.version[a], b, self.version[b])
        if key in self.failed:
            return False
        first, second = self.groups[a], self.groups[b]
        merged = self.fuser.merge(first, second)
        # a path a -> c -> b (or b -> c -> a) through another group would become a cycle
        if not accept(first, second, merged) or self.reaches_indirectly(a, b) or self.reaches_indirectly(b, a):
            self.failed.add(key)
            return False
        keep, drop = min(a, b), max(a, b)
        for v in self.groups[drop].nodes:
            self.group_of[v] = keep
        for p in self.pred.pop(drop):
            self.succ[p].discard(drop)
            if p != keep:
                self.succ[p].add(keep)
                self.pred[keep].add(p)
        for s in self.succ.pop(drop):
            self.pred[s].discard(drop)
            if s != keep:
                self.pred[s].add(keep)
                self.succ[keep].add(s)
        self.succ[keep].discard(drop)
        self.pred[keep].discard(drop)
        self.groups[keep] = merged
        self.last[keep] = max(self.last.pop(drop), self.last[keep])
        del self.groups[drop], self.version[drop]
        self.version[keep] += 1
        return True

    def result(self) -> list[tuple[int, ...]]:
        return [tuple(sorted(group.nodes)) for group in self.groups.values()]


def _greedy(fuser: Fuser, accept: Accept) -> list[tuple[int, ...]]:
    """Merge producer into consumer along every edge (largest intermediate first), then groups
    that read the same array (largest first), until no merge is accepted."""
    g = fuser.graph
    part = _Partition(fuser)
    shared = sorted((u for u in range(len(g)) if len(g.consumers[u]) > 1 and g.nodes[u].op is not Op.CONST),
                    key=lambda u: -g.nodes[u].nbytes)
    producers = {v: sorted((u for u in dict.fromkeys(g.nodes[v].inputs) if u in part.group_of),
                           key=lambda u: -g.nodes[u].nbytes) for v in part.group_of}
    changed = True
    while changed:
        changed = False
        for v, inputs in producers.items():
            for u in inputs:
                changed |= part.merge(part.group_of[u], part.group_of[v], accept)
        for u in shared:
            first = part.group_of[g.consumers[u][0]]
            for c in g.consumers[u][1:]:
                changed |= part.merge(part.group_of[first], part.group_of[c], accept)
    return part.result()


def _ordered(fuser: Fuser, groups: list[tuple[int, ...]]) -> tuple[FusedKernel, ...]:
    """Kernels in topological order of the kernel graph (ties: earliest node first)."""
    plan, g = fuser.plan, fuser.graph
    group_of = {v: k for k, nodes in enumerate(groups) for v in nodes}
    needs: list[set[int]] = [set() for _ in groups]
    for k, nodes in enumerate(groups):
        for v in nodes:
            needs[k] |= {group_of[u] for u in g.nodes[v].inputs if u in group_of and group_of[u] != k}
    users: list[list[int]] = [[] for _ in groups]
    for k, deps in enumerate(needs):
        for d in deps:
            users[d].append(k)
    waiting = [len(d) for d in needs]
    ready = [(groups[k][0], k) for k in range(len(groups)) if not waiting[k]]
    heapq.heapify(ready)
    kernels = []
    while ready:
        _, k = heapq.heappop(ready)
        nodes = groups[k]
        kernels.append(FusedKernel(kernel_name(plan, nodes), nodes, outputs_of(plan, nodes)))
        for user in users[k]:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, (groups[user][0], user))
    if len(kernels) != len(groups):
        raise ValueError("fusion: the kernel graph has a cycle")
    return tuple(kernels)


def with_kernels(plan: Plan, fuser: Fuser, groups: list[tuple[int, ...]]) -> Plan:
    kernels = _ordered(fuser, groups)
    cost = fuser.plan_cost(k.nodes for k in kernels)
    stats = {**plan.stats, "fusion_kernels": float(len(kernels)), "fusion_model_seconds": cost.seconds(plan.options.cluster),
             "fusion_model_bytes": float(cost.bytes_touched)}
    return dataclasses.replace(plan, kernels=kernels, stats=stats)


@register("fusion", "none")
def no_fusion(plan: Plan) -> Plan:
    """Every operation is its own kernel: every intermediate is materialised."""
    fuser = Fuser(plan)
    return with_kernels(plan, fuser, [(i,) for i, n in enumerate(plan.graph.nodes) if not n.is_leaf])


@register("fusion", "all")
def fuse_all(plan: Plan) -> Plan:
    """Fuse every chain lowering allows: maps, their reductions, multi-aggregates, row templates."""
    fuser = Fuser(plan)
    return with_kernels(plan, fuser, _greedy(fuser, _legal))


@register("fusion", "cost")
def fuse_by_cost(plan: Plan) -> Plan:
    """Fuse where the cost model says it pays; materialise where that is cheaper."""
    fuser = Fuser(plan)
    shape = plan.options.cluster
    chosen = _greedy(fuser, _cheaper(shape))
    everything = _greedy(fuser, _legal)
    if fuser.plan_cost(everything).seconds(shape) < fuser.plan_cost(chosen).seconds(shape):
        chosen = everything
    return with_kernels(plan, fuser, chosen)
