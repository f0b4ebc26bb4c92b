"""Which input blocks stay in the object store and which are streamed: a planned block cache.

SwapAdvisor (Huang, thesis ch. 4) plans a GPU's memory from the schedule it knows ahead;
an iterative job's schedule is known too: one iteration's plan, repeated. For each node,
the sequence of its source-block uses (tasks in plan order, that node's tasks) repeated
``repeats`` times is run through Belady's MIN with bypass: a block not held is admitted
only if it is needed sooner than what it would push out, else it is used straight from
where it comes from and dropped. On a cyclic scan that keeps a fixed set resident and
streams the rest every iteration (LRU, by contrast, evicts each block just before its next
use and misses every one). MIN is optimal for blocks of one size; a job's blocks are all of
one size but the last.

The runtime obeys a ``Residency`` as a fixed split: ``resident`` blocks are read once and
kept as object refs; ``streamed`` blocks are read inside the task that uses them (they
never enter the object store) from the cheaper of the node's own spill of them (written at
their first read) and the bucket, by the calibrated read rates; they are freed when that
task ends, their last use. Intermediates (task results until their last consumer, driver
values) count against the same budget: the inputs get what the plan's replay without them
leaves.

Cost: O(uses × resident blocks) per node for the simulation, uses = blocks × repeats;
``repeats`` is capped at 3 (a cyclic schedule's decisions repeat from the second cycle on).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from arrayjob.errors import SpecError
from arrayjob.planner.cost import ClusterLoad
from arrayjob.planner.physical import CachedBlock, PhysicalPlan, SourceBlock, TaskResult
from arrayjob.units import size

# a smaller result costs more to write and map than its room is worth (the session also
# spills none under a 16th of the budget)
SPILL_RESULT_MIN_BYTES = 2**20
SIMULATED_REPEATS = 3  # a cyclic schedule's decisions repeat from the second cycle on
NEVER = math.inf


class BudgetError(SpecError):
    """A block the plan reads cannot fit the memory budget even when streamed."""


@dataclass(frozen=True)
class StreamRates:
    """Where a streamed block comes back from, and how fast (``costing.profile``)."""

    bucket_bytes_per_s: float  # one node re-reading blocks from the input's storage
    spill_bytes_per_s: float  # one node reading back its own spill of blocks (local disk)
    spill_capacity: int = 0  # bytes a node may spill; 0: no spill, streamed blocks come from the bucket
    task_seconds: float = 0.0  # one task's overhead on a worker: what finer blocks cost (``budget_block_target``)


@dataclass(frozen=True)
class Residency:
    """The planned block cache of one program run ``repeats`` times."""

    budget: int  # bytes per node for input blocks and intermediates
    resident: frozenset[SourceBlock]
    streamed: frozenset[SourceBlock]
    source: str  # where streamed blocks come back from: "spill" or "bucket"
    order: tuple[int, ...]  # the tasks' submission order (indices into the plan's tasks)
    prefetch_depth: int  # streamed tasks in flight beside each node's computing ones
    block_bytes: Mapping[SourceBlock, int] = field(repr=False)
    intermediate_peak: tuple[int, ...] = ()  # per node, without input blocks
    repeats: int = 1

    @property
    def input_bytes(self) -> int:
        return sum(self.block_bytes.values())

    @property
    def resident_bytes(self) -> int:
        return sum(self.block_bytes[b] for b in self.resident)

    @property
    def streamed_bytes(self) -> int:
        """Bytes brought back at each run of the program after its first."""
        return sum(self.block_bytes[b] for b in self.streamed)

    @property
    def resident_fraction(self) -> float:
        return self.resident_bytes / self.input_bytes if self.input_bytes else 1.0

    @property
    def streams(self) -> bool:
        return bool(self.streamed)


# blocks no bigger than this share of the budget when the inputs do not fit: a fixed set of
# blocks is resident, so the finer the blocks, the closer that set comes to the budget
BUDGET_BLOCKS = 8


def block_target(budget: int, input_bytes: int, default: int) -> int:
    """The tiling's target block size under a budget: ``default`` when the inputs fit,
    else at most an eighth of the budget (a 480 MB budget over 1.5 GB of X keeps 18 % of X
    resident with 256 MiB blocks, about 28 % with 51 MB ones)."""
    if input_bytes <= budget:
        return default
    return max(2**20, min(default, budget // BUDGET_BLOCKS))


def belady(uses: Sequence[SourceBlock], sizes: Mapping[SourceBlock, int], capacity: int,
           ) -> tuple[int, set[SourceBlock], set[SourceBlock]]:
    """Belady's MIN with bypass over ``uses``, holding at most ``capacity`` bytes.

    Returns the bytes that came from outside the cache (misses, the first reads included),
    the blocks held from their first admission to the end, and the blocks ever evicted.
    """
    following: list[float] = [NEVER] * len(uses)  # position of each use's next use of the same block
    last: dict[SourceBlock, int] = {}
    for i in range(len(uses) - 1, -1, -1):
        following[i] = last.get(uses[i], NEVER)
        last[uses[i]] = i
    held: dict[SourceBlock, float] = {}  # block -> its next use
    used = missed = 0
    evicted: set[SourceBlock] = set()
    for i, block in enumerate(uses):
        nxt = following[i]
        if block in held:
            held[block] = nxt
            continue
        missed += sizes[block]
        if nxt == NEVER or sizes[block] > capacity:
            continue  # used once more never: bypass
        # push out only blocks needed later than this one, furthest first
        later = sorted((b for b, n in held.items() if n > nxt), key=lambda b: -held[b])
        free, victims = capacity - used, []
        for b in later:
            if free >= sizes[block]:
                break
            victims.append(b)
            free += sizes[b]
        if free < sizes[block]:
            continue  # bypass: everything held is needed sooner
        for b in victims:
            del held[b]
            used -= sizes[b]
            evicted.add(b)
        held[block] = nxt
        used += sizes[block]
    return missed, set(held) - evicted, evicted


def eager_order(physical: PhysicalPlan, leaves: Sequence[int] | None = None) -> tuple[int, ...]:
    """Tasks in an order where each runs as soon as its inputs have: after each task that
    reads stored blocks (in the order ``leaves``, default the plan's), every task it makes
    ready, depth first. A block's results are consumed (a row block of Q written, a partial
    sum combined) before the next block is read, so intermediates are freed early."""
    tasks = physical.tasks
    index = {t.id: i for i, t in enumerate(tasks)}
    waiting = [len({a.task for a in t.args if isinstance(a, TaskResult)}) for t in tasks]
    consumers: dict[int, list[int]] = {}
    for i, t in enumerate(tasks):
        for dep in {a.task for a in t.args if isinstance(a, TaskResult)}:
            consumers.setdefault(index[dep], []).append(i)
    if leaves is None:
        leaves = [i for i, n in enumerate(waiting) if n == 0]
    order: list[int] = []
    for leaf in leaves:
        stack = [leaf]
        while stack:
            i = stack.pop()
            order.append(i)
            ready = []
            for c in consumers.get(i, ()):
                waiting[c] -= 1
                if waiting[c] == 0:
                    ready.append(c)
            stack.extend(sorted(ready, reverse=True))
    return tuple(order)


def spilled_results(physical: PhysicalPlan, nodes: int, room: Sequence[int],
                    order: Sequence[int] | None = None, min_bytes: int = SPILL_RESULT_MIN_BYTES,
                    ) -> frozenset[TaskResult]:
    """Task results to write to their node's spill (and read back in place by the tasks that
    use them) so that the results held in memory on each node stay within ``room``: the tasks
    run in ``order`` (default ``eager_order``); whenever a node's results pass its room, the
    ones needed furthest ahead go to the spill (Belady's rule, as for input blocks), for
    their whole life. Only results every user of which runs on the node that makes them
    (a file is on one node's disk), that the program does not return, and of at least
    ``min_bytes`` can go. PageRank's
    build holds every edge chunk sorted by target block until the last block is built: twice
    the budget at 40 % of the edges, which this keeps on disk."""
    nodes = max(1, nodes)
    tasks = physical.tasks
    node_of = [physical.node_of(i, nodes) for i in range(len(tasks))]
    index = {t.id: i for i, t in enumerate(tasks)}
    steps = list(order if order is not None else eager_order(physical))
    uses: dict[TaskResult, list[int]] = {}
    for k, i in enumerate(steps):
        for arg in dict.fromkeys(tasks[i].args):
            if isinstance(arg, TaskResult):
                uses.setdefault(arg, []).append(k)
    returned = set(physical.outputs)
    movable = {r for r, at in uses.items() if r not in returned
               and tasks[index[r.task]].out_bytes[r.output] >= min_bytes
               and all(node_of[steps[k]] == node_of[index[r.task]] for k in at)}
    held: list[dict[TaskResult, int]] = [{} for _ in range(nodes)]
    total = [0] * nodes
    spilled: set[TaskResult] = set()
    for k, i in enumerate(steps):
        task, node = tasks[i], node_of[i]
        for arg in dict.fromkeys(task.args):  # freed after their last use
            if isinstance(arg, TaskResult) and uses[arg][-1] == k and arg in held[node_of[index[arg.task]]]:
                total[node_of[index[arg.task]]] -= held[node_of[index[arg.task]]].pop(arg)
        for p, nbytes in enumerate(task.out_bytes):
            result = TaskResult(task.id, p)
            if result in uses:
                held[node][result] = nbytes
                total[node] += nbytes
        while total[node] > room[node]:
            candidates = [r for r in held[node] if r in movable]
            if not candidates:
                break
            victim = max(candidates, key=lambda r: next((at for at in uses[r] if at > k), NEVER))
            spilled.add(victim)
            total[node] -= held[node].pop(victim)
    return frozenset(spilled)


def intermediate_peak(physical: PhysicalPlan, nodes: int, order: Sequence[int] | None = None,
                      spilled: frozenset[TaskResult] = frozenset()) -> tuple[int, ...]:
    """Per node, the most bytes of task results and driver values held at once (no input
    blocks, no kept blocks, no ``spilled`` results), the tasks run in ``order`` (default
    ``eager_order``, as a budget runs them)."""
    load = ClusterLoad(physical, nodes)
    for block, node in physical.block_homes(nodes).items():
        load.hold(block, node, 0)
    for i, task in enumerate(physical.tasks):  # kept blocks are held or streamed as inputs are
        for arg in task.args:
            if isinstance(arg, CachedBlock) and arg not in load.home:
                load.hold(arg, physical.node_of(i, nodes), 0)
    for i in order if order is not None else eager_order(physical):
        task = physical.tasks[i]
        out = [0 if TaskResult(task.id, p) in spilled else b for p, b in enumerate(task.out_bytes)] \
            if spilled and task.out_bytes else None
        load.run(task, physical.node_of(i, nodes), out)
    return tuple(load.peak)


def _refuse(physical: PhysicalPlan, block: SourceBlock, nbytes: int, room: int, budget: int,
            nodes: int, workers_per_node: int) -> BudgetError:
    source = physical.source(block.array)
    info = source.array
    row_bytes = nbytes // max(1, source.grid.block_shape[0]) or 1
    rows = max(1, room // 2 // row_bytes)
    chunk_bytes = math.prod(info.chunks) * (nbytes // max(1, math.prod(source.grid.block_shape)))
    hint = f"store inputs.{info.name} in {'row groups' if info.table is not None else 'chunks'} of at most {rows:,} rows"
    if chunk_bytes <= room:
        # the tiling aims at about 2 blocks per worker: enough workers make blocks small enough
        total = math.prod(info.shape) * (nbytes // max(1, math.prod(source.grid.block_shape)))
        wanted = math.ceil(nodes * total / max(1, room // 2) / (2 * workers_per_node * nodes))
        hint = f"run on {max(wanted, nodes + 1)} nodes, or {hint}"
    what = f"the budget ({size(budget)})" if room == budget else \
        f"the budget ({size(budget)}) less the plan's intermediates ({size(budget - room)})"
    return BudgetError(f"cluster.memory_budget: a block of inputs.{info.name} is {size(nbytes)} "
                       f"({nbytes:,} bytes), more than {what} on a node, even streamed; {hint}")


def task_order(physical: PhysicalPlan, streamed: frozenset[SourceBlock], nodes: int, depth: int) -> tuple[int, ...]:
    """Submission order: per node, tasks that read a streamed block spread among those that
    only use resident ones, ``depth`` ahead, so a block is being read while others compute.
    Each task that reads blocks is followed by the tasks it makes ready (``eager_order``)."""
    leaves = [i for i, t in enumerate(physical.tasks) if not any(isinstance(a, TaskResult) for a in t.args)]
    if not streamed:
        return tuple(range(len(physical.tasks)))
    by_node: dict[int, tuple[list[int], list[int]]] = {}
    for i in leaves:
        task = physical.tasks[i]
        node = physical.node_of(i, nodes)
        reading, computing = by_node.setdefault(node, ([], []))
        (reading if any(a in streamed for a in task.args) else computing).append(i)
    lanes: list[list[int]] = []
    for reading, computing in by_node.values():
        lane = reading[:depth]  # the first reads start at once
        reading = reading[depth:]
        total = len(reading) + len(computing)
        r = c = 0
        for k in range(total):
            # Bresenham: reads spread evenly over the rest of the node's tasks
            if r < len(reading) and (c >= len(computing) or (r + 1) * total <= (k + 1) * len(reading) + total // 2):
                lane.append(reading[r])
                r += 1
            else:
                lane.append(computing[c])
                c += 1
        lanes.append(lane)
    longest = max(len(lane) for lane in lanes)
    ordered = [lane[k] for k in range(longest) for lane in lanes if k < len(lane)]  # nodes' lanes interleaved
    return eager_order(physical, ordered)


def demotions(resident: Sequence[tuple[object, int, int]], budget: int, peaks: Sequence[int]) -> list[object]:
    """Resident blocks ``(key, node, bytes)``, in the order they were admitted, to stream from
    now on so that a program whose intermediates peak at ``peaks`` per node fits the budget
    beside the rest: the last admitted first (a later program's outputs, e.g. labels kept
    until the driver has them, can need more room than the iteration's)."""
    held = [0] * len(peaks)
    for _, node, nbytes in resident:
        held[node % len(peaks)] += nbytes
    out = []
    for key, node, nbytes in reversed(resident):
        node %= len(peaks)
        if held[node] + peaks[node] > budget:
            out.append(key)
            held[node] -= nbytes
    return out


def plan_residency(physical: PhysicalPlan, nodes: int, budget: int, *, repeats: int = 1,
                   rates: StreamRates | None = None, workers_per_node: int = 2,
                   spilled: frozenset[TaskResult] = frozenset()) -> Residency:
    """Split ``physical``'s source blocks into resident and streamed under ``budget`` bytes per
    node, for the program run ``repeats`` times (an iterative job's ``max_iter``); ``spilled``
    results take no memory (written to the spill by their tasks).

    Raises ``BudgetError`` (one line: the block's size, a chunking or node count that would
    fit) when a block is bigger than what the budget leaves beside the intermediates.
    """
    nodes = max(1, nodes)
    homes = physical.block_homes(nodes)
    load = ClusterLoad(physical, nodes)
    sizes = {block: load.block_bytes(block) for block in homes}
    peaks = intermediate_peak(physical, nodes, spilled=spilled)
    room = [max(0, budget - p) for p in peaks]
    for block, node in homes.items():
        if sizes[block] > room[node]:
            raise _refuse(physical, block, sizes[block], room[node], budget, nodes, workers_per_node)
    resident: set[SourceBlock] = set()
    cycle = min(max(1, repeats), SIMULATED_REPEATS)
    for node in range(nodes):
        uses = [a for i, t in enumerate(physical.tasks) if physical.node_of(i, nodes) == node
                for a in t.args if isinstance(a, SourceBlock) and homes[a] == node]
        if not uses:
            continue
        if sum(sizes[b] for b in set(uses)) <= room[node]:
            resident |= set(uses)  # everything fits: the fast path, nothing streamed
            continue
        _, kept, _ = belady(uses * cycle, sizes, room[node])
        resident |= kept
    streamed = frozenset(homes) - resident
    rates = rates or StreamRates(bucket_bytes_per_s=1.0, spill_bytes_per_s=1.0)
    per_node = [sum(sizes[b] for b in streamed if homes[b] == n) for n in range(nodes)]
    spill_fits = rates.spill_capacity >= max(per_node, default=0) and rates.spill_capacity > 0
    source = "spill" if streamed and repeats > 1 and spill_fits and \
        rates.spill_bytes_per_s > rates.bucket_bytes_per_s else "bucket"
    depth = max(1, workers_per_node - 1)
    return Residency(budget=budget, resident=frozenset(resident), streamed=streamed, source=source,
                     order=task_order(physical, streamed, nodes, depth), prefetch_depth=depth,
                     block_bytes=sizes, intermediate_peak=peaks, repeats=repeats)
