"""The cost of a physical plan, from shapes and placement alone (no data is read).

``ClusterLoad`` replays a plan the way the runtime runs it, task by task in plan order,
and keeps per-node memory and network load. Three users share it, so they agree on what
a byte moved means: ``plan_cost`` (the estimate), the ``lshs`` placement (which tries
each node before committing), and the Ray executor (which replays a finished run with
the nodes tasks really ran on and the sizes they really returned).

The model, which is what the runtime does (``runtime.replay`` measures a run against it):

- a source block is read from storage once, on the node of the task that first uses
  it, and stays in that node's object store for the whole job; a block kept by an
  earlier run (``Session.persist``) is taken to be where its first consumer runs (the
  runtime knows where it really is);
- a driver value is put in the object store on the driver's node (node 0) at the start
  of a run and lives for the run;
- a task result lives on the node its task ran on, and is freed, with every copy of
  it, once its last consumer has run; plan outputs stay until the driver has them;
- a node that needs an object it does not hold fetches it once and keeps the copy, so
  each (object, destination node) pair moves at most once per run;
- results fetched by the driver at the end are not counted as moved between nodes
  (every plan returns the same bytes to the driver, wherever it runs them).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from arrayjob.planner.ir import infer_shape
from arrayjob.planner.ops import ELEMENTWISE, Einsum, Map, Op, Reduce, keeps_sparse
from arrayjob.planner.physical import (
    Arg,
    BlockKernel,
    CachedBlock,
    DriverValue,
    InputArray,
    Kernel,
    PhysicalPlan,
    SourceBlock,
    Task,
    TaskResult,
)
from arrayjob.planner.plan import Plan, WorkRates
from arrayjob.planner.work import einsum_work, map_work, sparse_einsum_work
from arrayjob.units import size


class Trial(NamedTuple):
    """What running one task on ``node`` would do to that node's load (nothing is changed)."""

    node: int
    peak: int  # the node's memory high-water mark after the task
    net_in: int  # bytes the node has received, after the task
    sent: tuple[tuple[int, int], ...]  # (holding node, bytes it sends) for the inputs fetched
    moved: int  # bytes fetched from other nodes for this task
    touched: int = 0  # bytes the task reads and writes (the same on every node)


class ClusterLoad:
    """Per-node memory and network load of running tasks in order (see the module docstring).

    Every load figure only grows (memory is a high-water mark), which keeps the maxima
    over nodes cheap to maintain and a trial cheap to score.
    """

    def __init__(self, physical: PhysicalPlan, nodes: int, *, driver_node: int = 0,
                 value_bytes: Mapping[str, int] | None = None) -> None:
        self.nodes = max(1, nodes)
        n = self.nodes
        self.resident = [0] * n  # bytes held now
        self.peak = [0] * n  # high-water mark of ``resident``
        self.net_in = [0] * n
        self.net_out = [0] * n
        self.work = [0] * n  # bytes touched by the tasks run on each node
        self.tasks = [0] * n
        self.moved = 0
        self.max_peak = self.max_in = self.max_out = 0
        self.home: dict[Arg, int] = {}
        self.copies: dict[Arg, set[int]] = {}
        self.size: dict[Arg, int] = {}
        self._physical = physical
        self._kept = set(physical.outputs)
        self.uses: Counter[Arg] = Counter()
        for task in physical.tasks:
            for arg in dict.fromkeys(task.args):
                if isinstance(arg, TaskResult):
                    self.uses[arg] += 1
                elif isinstance(arg, DriverValue) and arg not in self.home:
                    nbytes = (value_bytes or {}).get(arg.name, arg.nbytes)
                    self.hold(arg, driver_node % n, nbytes)

    # -- objects -------------------------------------------------------------------------
    def block_bytes(self, ref: SourceBlock) -> int:
        return self._physical.block_bytes(ref)

    def object_bytes(self, arg: Arg) -> int:
        """The size of ``arg``: as held, or as planned for a block not yet read."""
        if arg in self.size:
            return self.size[arg]
        if isinstance(arg, SourceBlock):
            return self.block_bytes(arg)
        return arg.nbytes if isinstance(arg, CachedBlock) else 0

    def hold(self, key: Arg, node: int, nbytes: int) -> None:
        """``key`` now lives on ``node`` (a block read there, a value put there)."""
        self.home[key] = node
        self.copies[key] = {node}
        self.size[key] = nbytes
        self._grow(node, nbytes)

    def reserve(self, node: int, nbytes: int) -> None:
        """Memory ``node`` holds for something outside the plan (another plan's blocks)."""
        self._grow(node, nbytes)

    def _grow(self, node: int, nbytes: int) -> None:
        self.resident[node] += nbytes
        if self.resident[node] > self.peak[node]:
            self.peak[node] = self.resident[node]
            self.max_peak = max(self.max_peak, self.peak[node])

    def _free(self, key: Arg) -> None:
        for node in self.copies.pop(key, ()):
            self.resident[node] -= self.size[key]

    # -- tasks ---------------------------------------------------------------------------
    def trials(self, task: Task, candidates: Iterable[int]) -> Iterator[Trial]:
        """What running ``task`` on each candidate node would do (nothing is changed)."""
        fresh = 0
        held = []  # (bytes, holding node, nodes with a copy) of each input already somewhere
        for arg in dict.fromkeys(task.args):
            if arg in self.home:
                held.append((self.size[arg], self.home[arg], self.copies[arg]))
            else:  # a block not read yet (stored or kept): it is taken where the task runs
                fresh += self.object_bytes(arg)
        base = fresh + sum(task.out_bytes)
        touched = sum(self.object_bytes(arg) for arg in task.args) + sum(task.out_bytes)
        for node in candidates:
            moved = 0
            sent: dict[int, int] = {}
            for nbytes, home, copies in held:
                if node not in copies:
                    moved += nbytes
                    sent[home] = sent.get(home, 0) + nbytes
            peak = max(self.peak[node], self.resident[node] + base + moved)
            yield Trial(node, peak, self.net_in[node] + moved, tuple(sent.items()), moved, touched)

    def run(self, task: Task, node: int, out_bytes: Iterable[int] | None = None) -> int:
        """Run ``task`` on ``node``; returns the bytes it fetched from other nodes."""
        moved = touched = 0
        for arg in task.args:
            touched += self.object_bytes(arg)
        for arg in dict.fromkeys(task.args):
            if arg not in self.home:
                self.hold(arg, node, self.object_bytes(arg))
            elif node not in self.copies[arg]:
                nbytes, home = self.size[arg], self.home[arg]
                self.copies[arg].add(node)
                self._grow(node, nbytes)
                self.net_in[node] += nbytes
                self.net_out[home] += nbytes
                self.max_in = max(self.max_in, self.net_in[node])
                self.max_out = max(self.max_out, self.net_out[home])
                moved += nbytes
        outs = tuple(out_bytes) if out_bytes is not None else (task.out_bytes or (0,) * task.num_outputs)
        for p, nbytes in enumerate(outs):
            key = TaskResult(task.id, p)
            self.home[key], self.copies[key], self.size[key] = node, {node}, nbytes
            self._grow(node, nbytes)
            touched += nbytes
        self.moved += moved
        self.work[node] += touched
        self.tasks[node] += 1
        # free what no later task needs: inputs after their last use, unused outputs at once
        for arg in dict.fromkeys(task.args):
            if isinstance(arg, TaskResult):
                self.uses[arg] -= 1
                if self.uses[arg] <= 0 and arg not in self._kept:
                    self._free(arg)
        for p in range(len(outs)):
            key = TaskResult(task.id, p)
            if self.uses[key] <= 0 and key not in self._kept:
                self._free(key)
        return moved


# -- the plan's cost ------------------------------------------------------------------------


def _fmt_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


@dataclass(frozen=True)
class PlanCost:
    bytes_read: int
    get_requests: int
    bytes_written: int
    bytes_between_nodes: int
    bytes_touched: int
    peak_bytes_per_node: tuple[int, ...]
    flops: int
    tasks: int
    network_in_per_node: tuple[int, ...] = ()
    network_out_per_node: tuple[int, ...] = ()
    tasks_per_node: tuple[int, ...] = ()
    work: Mapping[str, float] = field(default_factory=dict)  # by kind, see WORK_KINDS
    # per task, in plan order: (node, bytes touched, work by kind) — for a schedule's length
    task_work: tuple[tuple[int, int, Mapping[str, float]], ...] = ()
    block_reads: tuple[tuple[int, int], ...] = ()  # (node, bytes) of each stored block read

    @property
    def max_peak_bytes(self) -> int:
        return max(self.peak_bytes_per_node, default=0)

    @property
    def max_network_in_bytes(self) -> int:
        """The most bytes any one node receives."""
        return max(self.network_in_per_node, default=0)

    @property
    def max_network_bytes(self) -> int:
        """The busiest node's traffic, in plus out: what bounds a network-bound stage."""
        return max((i + o for i, o in zip(self.network_in_per_node, self.network_out_per_node, strict=True)),
                   default=0)

    def as_dict(self) -> dict[str, object]:
        return {
            "storage": {"bytes_read": self.bytes_read, "get_requests": self.get_requests,
                        "bytes_written": self.bytes_written},
            "network": {"bytes_between_nodes": self.bytes_between_nodes,
                        "bytes_in_per_node": list(self.network_in_per_node),
                        "bytes_out_per_node": list(self.network_out_per_node)},
            "memory": {"bytes_touched": self.bytes_touched, "peak_bytes_per_node": list(self.peak_bytes_per_node)},
            "flops": self.flops,
            "work": dict(self.work),
            "tasks": {"count": self.tasks, "per_node": list(self.tasks_per_node)},
        }

    def table(self, max_rows: int = 16) -> str:
        """The cost as ``arrayjob plan`` and ``arrayjob estimate`` print it."""
        lines = [
            "cost (one run of the plan):",
            f"  tasks           {self.tasks:>12,}",
            f"  flops           {_fmt_count(self.flops):>12}",
            f"  storage read    {size(self.bytes_read):>12}   in {self.get_requests:,} GET requests",
            f"  storage written {size(self.bytes_written):>12}",
            f"  between nodes   {size(self.bytes_between_nodes):>12}",
            f"  bytes touched   {size(self.bytes_touched):>12}",
            "",
            f"  {'node':>5} {'tasks':>7} {'peak memory':>12} {'network in':>12} {'network out':>12}",
        ]
        n = len(self.peak_bytes_per_node)
        columns = (self.tasks_per_node or (0,) * n, self.peak_bytes_per_node,
                   self.network_in_per_node or (0,) * n, self.network_out_per_node or (0,) * n)
        rows = list(zip(range(n), *columns, strict=True))

        def row(label: str, t: float, m: float, i: float, o: float) -> str:
            return f"  {label:>5} {t:>7,.0f} {size(m):>12} {size(i):>12} {size(o):>12}"

        if n <= max_rows:
            lines += [row(str(r[0]), *r[1:]) for r in rows]
        else:  # a big cluster: the spread, not every node
            for label, pick in (("min", min), ("mean", lambda xs: sum(xs) / len(xs)), ("max", max)):
                lines.append(row(label, *(pick(c) for c in columns)))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


# -- work by kind ---------------------------------------------------------------------------
#
# Time is not one rate: on one core an exp costs about what 20 additions do, LAPACK's QR of
# a narrow block runs far below the GEMM rate, and a matrix × vector product is bound by
# memory, not flops. So the model counts each kernel's work by kind, from shapes alone, and
# ``costing.estimate`` divides each kind by the rate ``arrayjob calibrate`` measured for it.

WORK_KINDS = {
    "elementwise": "elements through a plain elementwise operation or reduction",
    "transcendental": "elements through exp, log, log1p, tanh, erf, ... (sigmoid one, logaddexp two)",
    "contraction_bytes": "operand bytes of memory-bound two-operand contractions (matrix × vector)",
    "contraction_flops": "flops of compute-bound two-operand contractions (BLAS, tall-skinny products)",
    "einsum_flops": "flops (2 × the product of all label sizes) of contractions of three or more operands",
    "qr_flops": "flops of LAPACK QR with Q formed (4mn² − 4n³/3 for an m × n block)",
    "triangular_solve_flops": "flops (mn²) of BLAS trsm: an m × n block times the inverse of an n × n triangle",
    "edge_split": "edges through PageRank's split of an edge chunk by target block (algorithms.pagerank.graph.SplitByTarget)",
    "edge_build": "edges into one CSR block of Aᵀ: distinct pairs by a sort, CSR layout (algorithms.pagerank.graph.BuildBlock)",
    "sparse_product": "nonzeros through a SciPy CSR product with a vector in cache, or a sum over it",
    "sparse_product_large": "nonzeros through a SciPy CSR product gathering from a vector too big for the cache",
    "result_bytes": "bytes of task results big enough for Ray's object store (fresh memory, page faults)",
}
# Ray returns results smaller than this inline with the task's reply (its
# max_direct_call_object_size); bigger ones are written into fresh object-store memory.
INLINE_RESULT_BYTES = 100 * 1024


def qr_flops(m: int, n: int) -> float:
    """Flops of a reduced Householder QR of an m × n block with Q formed (geqrf + orgqr)."""
    k = min(m, n)
    return max(0.0, 4.0 * m * n * k - 4.0 * k**3 / 3)


def kernel_work(kernel: object, in_shapes: list[tuple[int, ...]],
                in_density: list[float] | None = None) -> Counter[str]:
    """The work one call of ``kernel`` does on arguments of ``in_shapes``, by kind (``WORK_KINDS``).
    ``in_density``: each argument's fraction of non-zeros (1: dense); a sparse argument and what
    keeps it sparse cost their non-zeros (``ops.keeps_sparse``, ``work.sparse_einsum_work``)."""
    work: Counter[str] = Counter()
    if isinstance(kernel, Kernel):
        if kernel.cost is not None:  # a job's block function that declared its cost
            work.update({k: float(v) for k, v in kernel.cost(in_shapes).items()})
            return work
        kernel = kernel.fn
    if not isinstance(kernel, BlockKernel):  # combine / assemble / undeclared: one op per element
        work["elementwise"] += sum(math.prod(s) for s in in_shapes)
        return work
    shapes: list[tuple[int, ...]] = list(in_shapes)
    density = list(in_density) if in_density is not None else [1.0] * len(in_shapes)
    for step in kernel.steps:
        ins = [shapes[i] for i in step.inputs]
        fill = [density[i] for i in step.inputs]
        attrs = step.attrs
        sparse = keeps_sparse(step.op, attrs, [f < 1.0 for f in fill])
        if step.op is Op.CONST:
            shape: tuple[int, ...] = ()
        elif isinstance(attrs, Map):
            shape = tuple(np.broadcast_shapes(*ins))
            kind, amount = map_work(math.prod(shape), ELEMENTWISE[attrs.fn].calls)
            work[kind] += round(amount * (min(fill) if sparse else 1.0))
        elif isinstance(attrs, Reduce):
            work["elementwise"] += round(math.prod(ins[0]) * fill[0])
            shape = infer_shape(step.op, ins, attrs)
        elif isinstance(attrs, Einsum):
            _, _, shape = einsum_work(attrs.subscripts, ins)
            if min(fill, default=1.0) < 1.0:
                kind, sparse_amount = sparse_einsum_work(attrs.subscripts, ins, fill)
                work[kind] += round(sparse_amount)
            else:
                kind, amount, shape = einsum_work(attrs.subscripts, ins)
                work[kind] += amount
        else:  # transpose: a view
            shape = infer_shape(step.op, ins, attrs)
        shapes.append(shape)
        density.append(min(fill) if sparse else 1.0)
    return work


def task_work(task: Task, in_shapes: list[tuple[int, ...]], in_density: list[float] | None = None) -> Counter[str]:
    """The work of ``task`` on arguments of ``in_shapes`` (and ``in_density``, see
    ``kernel_work``), by kind: its kernel's, and its results written into the object store."""
    work = kernel_work(task.kernel, in_shapes, in_density)
    stored = sum(b for b in task.out_bytes if b >= INLINE_RESULT_BYTES)
    if stored:
        work["result_bytes"] += stored
    return work


class TaskClasses:
    """The work of tasks by class: tasks that run the same kernel on arguments of the same
    shapes and densities, with results of the same sizes, do the same work, so a regular
    tiling's thousands of block tasks cost a handful of ``task_work`` calls. Owned by one
    plan's costing or placement (its key holds the kernel itself, alive as long as the plan)."""

    def __init__(self) -> None:
        # the kernel is kept beside its work, so the id() in the key is never reused meanwhile
        self._work: dict[tuple[object, ...], tuple[object, Counter[str]]] = {}

    def work(self, task: Task, in_shapes: list[tuple[int, ...]], in_density: list[float]) -> Counter[str]:
        key = (id(task.kernel), tuple(in_shapes), tuple(in_density), task.out_bytes)
        found = self._work.get(key)
        if found is None:
            found = self._work[key] = (task.kernel, task_work(task, in_shapes, in_density))
        return found[1]


def network_seconds(moved: float, busiest: float, nodes: int, rate: float) -> float:
    """Moving ``moved`` bytes between ``nodes`` nodes, ``busiest`` of them into one node: the
    network's aggregate rate bounds it, and so does that node's own link (a 30 GB gather into
    one node takes 30 s at 1 GB/s, however many nodes send). What one node sends is not
    bounded so: Ray's receivers pull an object from any node holding a copy, so a block
    wanted everywhere spreads as it arrives."""
    return max(moved / (max(1, nodes) * rate), busiest / rate)


def work_seconds(work: Mapping[str, float], rates: WorkRates) -> float:
    """One core's time for ``work``, each kind at its rate (as ``costing.estimate`` prices it)."""
    return sum(amount / rates.rate(kind) for kind, amount in work.items())


def block_shape(source: InputArray, ref: SourceBlock) -> tuple[int, ...]:
    """The shape of block ``ref`` of ``source`` (edge blocks are smaller)."""
    return tuple(s.stop - s.start for s in source.grid.selection(ref.index))


def flops_of(work: Mapping[str, float]) -> float:
    """Arithmetic operations in ``work`` (the table's FLOPs line): every kind but bytes."""
    return sum(v for k, v in work.items() if k != "contraction_bytes")


BlockKey = tuple[str, tuple[tuple[int, int], ...]]  # a stored block: (URI, selection)


def physical_cost(physical: PhysicalPlan, nodes: int, homes: dict[BlockKey, tuple[int, int]] | None = None,
                  ) -> PlanCost:
    """Replay ``physical`` on ``nodes`` nodes. Tasks Ray places (node None) are dealt round-robin.

    ``homes`` carries stored blocks across the programs of one job, as the runtime keeps
    them: (node, bytes) of each block an earlier program read. Such a block stays on that
    node, so a program that places its consumer elsewhere fetches it, and it occupies its
    node's memory in every later program, used or not. Blocks this plan reads first are
    added to ``homes``.
    """
    nodes = max(1, nodes)
    load = ClusterLoad(physical, nodes)
    sources = {s.array.name: s for s in physical.sources}

    def key(ref: SourceBlock) -> BlockKey:
        source = sources[ref.array]
        return source.array.uri, tuple((s.start, s.stop) for s in source.grid.selection(ref.index))

    if homes:
        used = {key(a): a for t in physical.tasks for a in t.args if isinstance(a, SourceBlock)}
        for block, (node, nbytes) in homes.items():
            if block in used:
                load.hold(used[block], node % nodes, nbytes)
            else:
                load.reserve(node % nodes, nbytes)
    shape_of: dict[TaskResult, tuple[int, ...]] = {}
    classes = TaskClasses()
    per_task: list[tuple[int, int, Mapping[str, float]]] = []
    reads: list[tuple[int, int]] = []
    bytes_read = requests = 0
    work: Counter[str] = Counter()
    for i, task in enumerate(physical.tasks):
        node = physical.node_of(i, nodes)
        in_shapes = []
        for arg in task.args:
            if isinstance(arg, SourceBlock):
                in_shapes.append(block_shape(sources[arg.array], arg))
                if arg not in load.home:  # read once, where it is first used
                    bytes_read += physical.block_read_bytes(arg)
                    requests += physical.block_requests(arg)
                    reads.append((node, physical.block_read_bytes(arg)))
                    if homes is not None:
                        homes[key(arg)] = (node, load.block_bytes(arg))
            elif isinstance(arg, TaskResult):
                in_shapes.append(shape_of.get(arg, ()))
            else:
                in_shapes.append(arg.shape)
        for p in range(task.num_outputs):
            shape_of[TaskResult(task.id, p)] = task.out_shapes[p] if task.out_shapes else ()
        kinds = classes.work(task, in_shapes, [physical.density(a) for a in task.args])
        work.update(kinds)
        before = load.work[node]
        load.run(task, node)
        per_task.append((node, load.work[node] - before, kinds))
    return PlanCost(
        bytes_read=bytes_read, get_requests=requests, bytes_written=0, bytes_between_nodes=load.moved,
        bytes_touched=sum(load.work), peak_bytes_per_node=tuple(load.peak), flops=int(flops_of(work)),
        tasks=len(physical.tasks), network_in_per_node=tuple(load.net_in),
        network_out_per_node=tuple(load.net_out), tasks_per_node=tuple(load.tasks), work=dict(work),
        task_work=tuple(per_task), block_reads=tuple(reads),
    )


def plan_cost(plan: Plan) -> PlanCost:
    assert plan.physical is not None, "cost needs a placed plan"
    return physical_cost(plan.physical, plan.options.cluster.nodes)
