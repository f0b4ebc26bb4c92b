"""Placement (NumS): on which node each block task runs.

Strategies take a lowered plan (tasks without nodes) and return it with ``Task.node``
set. ``ray`` leaves every choice to Ray's scheduler; ``roundrobin`` deals tasks out in
order; ``lshs`` simulates per-node memory and network load and puts each task where the
maximum load grows least.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from arrayjob.planner.cost import (
    ClusterLoad,
    TaskClasses,
    Trial,
    block_shape,
    network_seconds,
    work_seconds,
)
from arrayjob.planner.physical import (
    Arg,
    CachedBlock,
    Combine,
    PhysicalPlan,
    SourceBlock,
    Task,
    TaskResult,
)
from arrayjob.planner.plan import ClusterShape, Plan
from arrayjob.planner.reduction import FAN_IN, combine_tree, tree_size
from arrayjob.planner.registry import register
from arrayjob.planner.schedule import WorkerSchedule


def _with_nodes(plan: Plan, nodes: list[int | None]) -> Plan:
    assert plan.physical is not None
    tasks = tuple(dataclasses.replace(t, node=n) for t, n in zip(plan.physical.tasks, nodes, strict=True))
    return dataclasses.replace(plan, physical=dataclasses.replace(plan.physical, tasks=tasks))


@register("placement", "ray")
def ray_default(plan: Plan) -> Plan:
    """No placement: Ray's scheduler decides at run time."""
    assert plan.physical is not None
    return _with_nodes(plan, [None] * len(plan.physical.tasks))


@register("placement", "roundrobin")
def round_robin(plan: Plan) -> Plan:
    """Task i on node i mod N, in plan order."""
    assert plan.physical is not None
    n = plan.options.cluster.nodes
    return _with_nodes(plan, [i % n for i in range(len(plan.physical.tasks))])


@register("placement", "lshs")
def lshs(plan: Plan) -> Plan:
    """Load simulated hierarchical scheduling (LSHS; Elibol et al., "NumS: Scalable Array
    Programming for the Cloud", 2022).

    Tasks are placed one at a time in plan order. Each goes to the node that minimises

        max over nodes of memory + max over nodes of bytes received + max over nodes of bytes sent

    after it is placed there, given where its inputs are (``cost.ClusterLoad``). Ties go to
    the node that moves fewest bytes, then to the least busy one. Stored arrays start in a
    cyclic layout over a node grid: a task that only reads blocks no other task placed yet
    runs on their cyclic node, so co-partitioned arrays are co-located. Reduction trees
    are rebuilt so partials on the same node are combined there first and only one
    partial per node crosses the network, in a tree over the nodes whose fan-in keeps a
    combine's inputs within one block budget: pairwise for big partials, up to ``FAN_IN``
    for small ones (at most ceil(log2 k) hops from any partial to the result, over k
    nodes, and fewer tasks when the partials are small).

    A second placement puts the tasks free to go anywhere at their earliest finish (HEFT),
    and the one the estimate's measure says is sooner is kept. Time is priced as
    ``costing.estimate`` prices it, at the rates on ``ClusterShape``: each task's bytes
    touched and its work by kind (``cost.WORK_KINDS``) on its node's worker free soonest,
    and the bytes moved over every node's network.

    Last, the placement is relieved where one node ends last (``_relieve_last_node``).

    Cost: O(tasks x nodes x arguments) to plan, times at most ``RELIEF_TRIES`` + 2
    placements; plans are cached by structure.
    """
    assert plan.physical is not None
    nodes = max(1, plan.options.cluster.nodes)
    if nodes == 1:
        return _with_nodes(plan, [0] * len(plan.physical.tasks))
    shape, budget = plan.options.cluster, plan.options.target_block_bytes
    placers = [_Placer(plan.physical, shape, budget), _Placer(plan.physical, shape, budget, balance=True)]
    for placer in placers:
        placer.run()
    best = min(placers, key=lambda p: (p.seconds(), p.load.moved))
    best = _relieve_last_node(best)
    physical = dataclasses.replace(plan.physical, tasks=tuple(best.placed))
    physical.validate()
    return dataclasses.replace(plan, physical=physical)


RELIEF_TRIES = 3  # placements tried again by _relieve_last_node, each with one more task moved


def _relieve_last_node(placer: _Placer) -> _Placer:
    """Both placements choose a node per task, in plan order, from what was placed before:
    neither looks back when a node ends last. So take the free tasks on the node that ends
    last, one of each kind (kernel), the most compute first; place the plan again with that
    task pinned to the node that ends soonest; keep the new placement when its measure
    (``_Placer.seconds``, then bytes moved) is better, and start again from it. At most
    ``RELIEF_TRIES`` placements are tried. TSQR at 16 nodes: the node holding the assemble of
    the stacked Gram matrices also runs its share of the solves and ends 2 s after the
    others; one of its solves moved to the node that ends soonest takes that back."""
    tries = 0
    while tries < RELIEF_TRIES:
        last = max(range(placer.nodes), key=placer.workers.end)
        soonest = min(range(placer.nodes), key=placer.workers.end)
        kinds: dict[object, Task] = {}
        for task in placer.placed:  # the last placed of each kind: it went to the last worker
            if task.node == last and task.id in placer.free_tasks:
                kinds[task.kernel] = task
        if last == soonest or not kinds:
            break
        for task in sorted(kinds.values(), key=placer.compute_seconds, reverse=True):
            if tries == RELIEF_TRIES:
                return placer
            tries += 1
            trial = placer.again({**placer.pinned, task.id: soonest})
            if (trial.seconds(), trial.load.moved) < (placer.seconds(), placer.load.moved):
                placer = trial
                break
        else:
            break
    return placer


# -- cyclic layout --------------------------------------------------------------------------


def node_grid(grid_shape: tuple[int, ...], nodes: int) -> tuple[int, ...]:
    """Factor ``nodes`` over the axes of a block grid, the largest factors to the axes
    with the most blocks per node: ``(8, 1)`` blocks on 4 nodes -> ``(4, 1)``."""
    dims = [1] * len(grid_shape)
    if not dims:
        return ()
    factors, n, p = [], nodes, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    for f in sorted(factors, reverse=True):
        axis = max(range(len(dims)), key=lambda a: (grid_shape[a] / dims[a], -a))
        dims[axis] *= f
    return tuple(dims)


def cyclic_node(index: tuple[int, ...], dims: tuple[int, ...]) -> int:
    """Block ``index`` on a node grid of shape ``dims``: block i of each axis on node row i mod dim."""
    node = 0
    for i, d in zip(index, dims, strict=True):
        node = node * d + i % d
    return node


# -- reduction trees ------------------------------------------------------------------------


@dataclass
class _Tree:
    """The combine tasks lowering emitted for one reduced block, and the partials they sum."""

    prefix: str  # the tree's name, e.g. "sum#12[0]"
    tasks: list[Task]
    root: str
    leaves: list[TaskResult]


def _reduction_trees(physical: PhysicalPlan) -> dict[str, _Tree]:
    """Trees by the id of their first task in plan order; only trees safe to rebuild."""
    groups: dict[str, list[Task]] = {}
    for task in physical.tasks:
        if task.reduction is not None and isinstance(task.kernel.fn, Combine) and task.num_outputs == 1:
            groups.setdefault(task.reduction.tree, []).append(task)
    users: dict[str, set[str]] = {}
    for task in physical.tasks:
        for arg in task.args:
            if isinstance(arg, TaskResult):
                users.setdefault(arg.task, set()).add(task.id)
    outputs = {o.task for o in physical.outputs}
    trees: dict[str, _Tree] = {}
    for prefix, group in groups.items():
        ids = {t.id for t in group}
        roots = [t.id for t in group if not users.get(t.id, set()) & ids]
        inner_ok = all(users.get(t.id, set()) <= ids and t.id not in outputs for t in group if t.id not in roots)
        same = len({t.kernel for t in group}) == 1 and len({t.out_bytes for t in group}) == 1
        leaves = [a for t in group for a in t.args if not (isinstance(a, TaskResult) and a.task in ids)]
        if len(roots) != 1 or not inner_ok or not same or not all(isinstance(a, TaskResult) for a in leaves):
            continue
        trees[group[0].id] = _Tree(prefix, group, roots[0], leaves)  # type: ignore[arg-type]
    return trees


# -- the placer -----------------------------------------------------------------------------


class _Placer:
    def __init__(self, physical: PhysicalPlan, shape: ClusterShape, block_budget: int, *, balance: bool = False) -> None:
        nodes = max(1, shape.nodes)
        self.physical = physical
        self.shape = dataclasses.replace(shape, workers_per_node=max(1, shape.workers_per_node))
        self.balance = balance  # free tasks by earliest finish time, not by NumS's load maxima
        self.block_budget = block_budget
        self.nodes = nodes
        self.load = ClusterLoad(physical, nodes)
        # the tasks placed on each node, scheduled as ``costing.estimate`` schedules them: each
        # on the worker free soonest, for the bytes it touches at the memory rate and its
        # compute, each kind of work at its rate. Per node: every worker's seconds, their sum,
        # the soonest a worker is free and when the last one is done.
        self.workers = WorkerSchedule(nodes, self.shape.workers_per_node)
        self.sources = {s.array.name: s for s in physical.sources}
        self.shapes = {TaskResult(t.id, p): s for t in physical.tasks for p, s in enumerate(t.out_shapes)}
        self.grids = {s.array.name: node_grid(s.grid.grid_shape, nodes) for s in physical.sources}
        self.trees = _reduction_trees(physical)
        self.ids = {t.id for t in physical.tasks}
        self.placed: list[Task] = []
        self.done: set[str] = set()
        self.free_tasks: set[str] = set()  # placed where any node was a candidate
        self.pinned: dict[str, int] = {}  # task id -> the node it must run on
        self.classes = TaskClasses()  # the work of each class of task, found once
        self._seconds: dict[int, float] = {}  # compute seconds by the id of a class's work

    def again(self, pinned: dict[str, int]) -> _Placer:
        """A new placement of the same plan, the same way, with ``pinned`` tasks on their nodes."""
        placer = _Placer(self.physical, self.shape, self.block_budget, balance=self.balance)
        placer.pinned = pinned
        placer.run()
        return placer

    def run(self) -> list[Task]:
        skip: set[str] = set()
        for task in self.physical.tasks:
            if task.id in skip:
                continue
            tree = self.trees.get(task.id)
            if tree is not None and all(leaf.task in self.done for leaf in tree.leaves):
                self.rebuild(tree)
                skip.update(t.id for t in tree.tasks)
            elif task.id in self.pinned:
                self.place(task, [self.pinned[task.id]])
            else:
                candidates = self.candidates(task)
                if isinstance(candidates, range):
                    self.free_tasks.add(task.id)
                self.place(task, candidates)
        return self.placed

    # -- choosing a node ---------------------------------------------------------------------
    def candidates(self, task: Task) -> Iterable[int]:
        # A stored (or kept) block is read where its first consumer runs and stays there for
        # the job, and each program of a job is placed on its own: only a layout that is the
        # same in every program (cyclic, from the block grid) keeps a later program from
        # fetching the blocks an earlier one read. So a task that reads blocks not read yet
        # runs on their cyclic node even when it also takes results placed elsewhere (CP-ALS's
        # mode-1 MTTKRP takes a slice of a factor from node 0: placed freely, it dealt X's
        # blocks anew and fetched 1 TB that the norm pass had read).
        fresh = [a for a in task.args if isinstance(a, SourceBlock | CachedBlock) and a not in self.load.home]
        if fresh:
            return sorted({self.cyclic(a) for a in fresh})
        return range(self.nodes)

    def cyclic(self, block: Arg) -> int:
        if isinstance(block, SourceBlock):
            return cyclic_node(block.index, self.grids[block.array])
        assert isinstance(block, CachedBlock)
        return block.position % self.nodes  # kept blocks are numbered in row-major block order

    def score(self, trial: Trial) -> tuple[float, int, float, int]:
        load = self.load
        out = max((load.net_out[h] + b for h, b in trial.sent), default=0)
        worst = max(load.max_peak, trial.peak) + max(load.max_in, trial.net_in) + max(load.max_out, out)
        return worst, trial.moved, self.workers.busy[trial.node], trial.node

    def finish(self, trial: Trial, compute: float) -> tuple[float, int, int]:
        """When the task would be done there (earliest finish time, as in HEFT): on the
        node's worker free soonest, for the bytes it touches and ``compute`` (its work by
        kind), after the bytes the node has received, at its network's rate."""
        node = trial.node
        done = self.workers.free(node) + trial.touched / self.shape.memory_bytes_per_s + compute
        return done + trial.net_in / self.shape.network_bytes_per_s, trial.moved, node

    def schedule(self, node: int, seconds: float) -> None:
        self.workers.add(node, seconds)

    def compute_seconds(self, task: Task) -> float:
        """One worker's time for ``task``'s work, each kind at its rate (``cost.task_work``)."""
        shapes = [block_shape(self.sources[a.array], a) if isinstance(a, SourceBlock)
                  else self.shapes.get(a, ()) if isinstance(a, TaskResult) else a.shape
                  for a in task.args]
        work = self.classes.work(task, shapes, [self.physical.density(a) for a in task.args])
        key = id(work)
        if key not in self._seconds:
            self._seconds[key] = work_seconds(work, self.shape.work_rates)
        return self._seconds[key]

    def place(self, task: Task, candidates: Iterable[int]) -> TaskResult:
        free = self.balance and isinstance(candidates, range) and len(candidates) == self.nodes
        compute = self.compute_seconds(task)
        trials = self.load.trials(task, candidates)
        trial = min(trials, key=lambda t: self.finish(t, compute)) if free else min(trials, key=self.score)
        node = trial.node
        placed = dataclasses.replace(task, node=node)
        self.load.run(placed, node)
        self.schedule(node, trial.touched / self.shape.memory_bytes_per_s + compute)
        self.shapes.update((TaskResult(task.id, p), s) for p, s in enumerate(task.out_shapes))
        self.placed.append(placed)
        self.done.add(task.id)
        return TaskResult(task.id)

    # -- locality-aware reductions -------------------------------------------------------------
    def rebuild(self, tree: _Tree) -> None:
        """Combine partials on their own node first, then one partial per node across nodes."""
        template = tree.tasks[0]
        step = template.reduction
        assert step is not None, "a reduction tree's tasks are marked"
        counter = iter(range(len(self.ids) + 1))

        def combine(parts: list[TaskResult], candidates: list[int], final: bool, label: str, level: int) -> TaskResult:
            task_id = tree.root if final else self.fresh_id(f"combine {tree.prefix}.{label}.{next(counter)}")
            task = dataclasses.replace(template, id=task_id, args=tuple(parts), node=None,
                                       reduction=dataclasses.replace(step, level=level))
            if not final:
                self.load.uses[TaskResult(task_id)] += 1
            return self.place(task, candidates)

        by_node: dict[int, list[TaskResult]] = {}
        for leaf in tree.leaves:
            by_node.setdefault(self.load.home[leaf], []).append(leaf)
        alone = len(by_node) == 1
        per_node: list[tuple[int, TaskResult]] = []
        for node in sorted(by_node):
            def on_node(group: list[TaskResult], level: int, final: bool, node: int = node) -> TaskResult:
                return combine(group, [node], alone and final, f"n{node}", level)

            per_node.append((node, combine_tree(by_node[node], on_node)))
        # across nodes: as many partials per combine as fit one block's budget (at least
        # two, at most FAN_IN), so big partials go pairwise and small ones take few tasks
        fan_in = max(2, min(FAN_IN, self.block_budget // max(1, sum(template.out_bytes))))
        if len(per_node) > 1:
            def across(group: list[tuple[int, TaskResult]], level: int, final: bool) -> tuple[int, TaskResult]:
                result = combine([p for _, p in group], [n for n, _ in group], final, "x", level)
                return self.load.home[result], result

            combine_tree(per_node, across, fan_in)

    def seconds(self) -> float:
        """The placement's time as ``costing.estimate`` counts it: the last worker done (its
        tasks' bytes touched and compute by kind, each at its rate), and the bytes moved
        (the whole plan's, so two placements of it compare), bounded by the network's aggregate
        rate and by the busiest receiver's link (``cost.network_seconds``)."""
        load = self.load
        return self.workers.makespan + network_seconds(load.moved, load.max_in, self.nodes,
                                               self.shape.network_bytes_per_s)

    def fresh_id(self, base: str) -> str:
        task_id, k = base, 0
        while task_id in self.ids:
            k += 1
            task_id = f"{base}~{k}"
        self.ids.add(task_id)
        return task_id


def placed_tree_tasks(parts_per_node: list[int]) -> int:
    """Combine tasks of a reduction tree as ``_Placer.rebuild`` builds it for partials small
    enough to combine ``FAN_IN`` at a time across nodes (a store's [bytes, PUTs]): each
    node's partials combined on that node first, then one partial per node in a tree across
    the nodes. On one node it is ``lower``'s tree."""
    holding = [c for c in parts_per_node if c]
    return sum(tree_size(c, 0)[0] for c in holding) + tree_size(len(holding), 0)[0]
