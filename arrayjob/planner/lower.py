"""Lowering: from tilings and fused kernels to block tasks (the physical plan).

Each kernel runs once per block of its *iteration space*: the axis classes cut in its
nodes, plus classes cut in its inputs that its reductions or contractions sum away.
Every input block a task needs is either a block that exists (a stored block, a task's
output, a driver value) or is cut/glued from existing blocks by an ``Assemble`` task: that
is where re-tiling moves data. A kernel output that sums over a cut class is a partial
result, combined by a reduction tree.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict

import numpy as np

from arrayjob.errors import is_arrayjob_module
from arrayjob.planner import ops
from arrayjob.planner.ir import Graph, Node, blockwise_call
from arrayjob.planner.kernel import KernelBody
from arrayjob.planner.legality import doubled_axis_problem, partial_problem
from arrayjob.planner.ops import Op, combine_of
from arrayjob.planner.physical import (
    Arg,
    Assemble,
    BlockGrid,
    BlockKernel,
    CachedBlock,
    Combine,
    DeclaredBlock,
    DriverValue,
    InputArray,
    JobFunction,
    Kernel,
    PhysicalPlan,
    ReductionStep,
    Selection,
    SourceBlock,
    Step,
    Task,
    TaskResult,
    WriteBlock,
)
from arrayjob.planner.plan import FusedKernel, Plan, Tiling
from arrayjob.planner.reduction import combine_tree


@dataclasses.dataclass(frozen=True)
class OutputAssembly:
    """How the driver rebuilds program output ``node``: blocks (selection, result index)."""

    node: int
    shape: tuple[int, ...]
    dtype: str
    blocks: tuple[tuple[Selection, int], ...]


def _block_selection(grid: BlockGrid, index: tuple[int, ...]) -> Selection:
    return tuple((s.start, s.stop) for s in grid.selection(index))


def _blockwise(node: Node) -> ops.Blockwise:
    assert isinstance(node.attrs, ops.Blockwise)
    return node.attrs


def _nbytes(selection: Selection, dtype: str) -> int:
    return math.prod(b - a for a, b in selection) * np.dtype(dtype).itemsize


class _Lowering:
    def __init__(self, plan: Plan) -> None:
        assert plan.tilings is not None and plan.kernels is not None, "lower needs tile and fuse first"
        self.plan = plan
        self.tilings: tuple[Tiling, ...] = plan.tilings
        self.kernels: tuple[FusedKernel, ...] = plan.kernels
        self.graph: Graph = plan.graph
        self.classes = plan.graph.axis_classes
        self.grids = [plan.grid(i) for i in range(len(plan.graph))]
        self.tasks: list[Task] = []
        self.blocks: dict[int, dict[tuple[int, ...], Arg]] = {}
        self.assembled: dict[tuple[int, Selection], Arg] = {}
        self.sources: list[InputArray] = []
        self.blockwise_tasks: dict[tuple[object, ...], list[str]] = {}

    # -- where blocks are ----------------------------------------------------------------
    def part_classes(self, node: int) -> dict[int, int]:
        """Cut axis classes of ``node`` -> the axis they cut."""
        n = self.graph.nodes[node]
        return {self.classes.of_axis(node, a): a for a in self.tilings[node].axes if n.shape[a] > 0}

    def leaf_blocks(self, node: int) -> None:
        n = self.graph.nodes[node]
        attrs = n.attrs
        if isinstance(attrs, ops.Source):
            source = InputArray(attrs.array, self.grids[node], attrs.check)
            self.sources.append(source)
            self.blocks[node] = {idx: SourceBlock(source.array.name, idx) for idx in source.grid.indices()}
        elif isinstance(attrs, ops.Cached):
            grid = self.grids[node]
            self.blocks[node] = {
                idx: CachedBlock(attrs.handle, k, tuple(b - a for a, b in _block_selection(grid, idx)),
                                 attrs.block_bytes if attrs.block_bytes is not None
                                 else _nbytes(_block_selection(grid, idx), n.dtype))
                for k, idx in enumerate(sorted(grid.indices()))
            }
        elif isinstance(attrs, ops.Value):
            if self.tilings[node].axes:
                raise ValueError(f"driver value {attrs.name!r} must be whole, not cut")
            self.blocks[node] = {(0,) * n.ndim: DriverValue(attrs.name, n.shape, n.nbytes)}

    def block_for(self, node: int, selection: Selection) -> Arg:
        """An argument holding ``node[selection]``: an existing block, or an Assemble task."""
        grid = self.grids[node]
        key = (node, selection)
        if key in self.assembled:
            return self.assembled[key]
        # which blocks overlap, per axis
        ranges = []
        for (lo, hi), length, size in zip(selection, grid.block_shape, grid.shape, strict=True):
            first, last = lo // length, max(lo, hi - 1) // length
            ranges.append(range(first, min(last, math.ceil(size / length) - 1 if size else 0) + 1))
        overlapping = list(itertools.product(*ranges))
        if len(overlapping) == 1 and _block_selection(grid, overlapping[0]) == selection:
            return self.blocks[node][overlapping[0]]
        n = self.graph.nodes[node]
        pieces, args = [], []
        for idx in overlapping:
            block = _block_selection(grid, idx)
            starts = tuple(max(a, c) for (a, _), (c, _) in zip(block, selection, strict=True))
            stops = tuple(min(b, d) for (_, b), (_, d) in zip(block, selection, strict=True))
            dst = tuple((x - s0, y - s0) for x, y, (s0, _) in zip(starts, stops, selection, strict=True))
            src = tuple((x - b0, y - b0) for x, y, (b0, _) in zip(starts, stops, block, strict=True))
            pieces.append((dst, src))
            args.append(self.blocks[node][idx])
        shape = tuple(b - a for a, b in selection)
        task = Task(f"assemble {n.label()}#{node}[{','.join(f'{a}:{b}' for a, b in selection)}]",
                    Kernel("assemble", Assemble(shape, n.dtype, tuple(pieces))), tuple(args),
                    out_shapes=(shape,), out_bytes=(_nbytes(selection, n.dtype),))
        self.tasks.append(task)
        self.assembled[key] = TaskResult(task.id)
        return self.assembled[key]

    # -- kernels ---------------------------------------------------------------------------
    def kernel(self, k: int, kernel: FusedKernel) -> None:
        g, classes = self.graph, self.classes
        opaque = [v for v in kernel.nodes if g.nodes[v].op.is_opaque]
        if opaque:
            if len(kernel.nodes) != 1:
                raise ValueError(f"kernel {kernel.name}: {g.nodes[opaque[0]].op} must not be fused with other ops")
            (v,) = kernel.nodes
            return self.blockwise(k, v) if g.nodes[v].op is Op.BLOCKWISE else self.store(k, v)
        inside = set(kernel.nodes)
        external: list[int] = []
        for v in kernel.nodes:
            for u in g.nodes[v].inputs:
                if u not in inside and g.nodes[u].op is not Op.CONST and u not in external:
                    external.append(u)
        # the iteration space: cut classes of the kernel's nodes, and classes cut in its
        # inputs that a node sums away
        space: dict[int, int] = {}
        for v in kernel.nodes:
            for c, a in self.part_classes(v).items():
                space[c] = self.grids[v].grid_shape[a]
        for v in kernel.nodes:
            own = set(classes.of_node(v, g.nodes[v].ndim))
            for u in g.nodes[v].inputs:
                if u in inside:
                    continue
                for c, a in self.part_classes(u).items():
                    if c not in own:
                        space.setdefault(c, self.grids[u].grid_shape[a])
        def label(v: int) -> str:
            return g.nodes[v].label()

        def doubled(v: int) -> set[int]:
            cls = classes.of_node(v, g.nodes[v].ndim)
            return {c for c in cls if cls.count(c) > 1}

        problem = doubled_axis_problem((*kernel.nodes, *external), doubled, space, label)
        if problem:
            raise ValueError(f"kernel {kernel.name}: {problem}; it cannot be cut")
        lengths = dict(self.plan.block_lengths)

        # dependency of each node on the iteration classes, and which are partial
        dep: dict[int, set[int]] = {}
        for u in external:
            dep[u] = set(space) & set(classes.of_node(u, g.nodes[u].ndim))
        partial: dict[int, set[int]] = {}
        for v in kernel.nodes:
            n = g.nodes[v]
            d = set().union(*(dep.get(u, set()) for u in n.inputs)) if n.inputs else set()
            dep[v] = d
            partial[v] = d - set(classes.of_node(v, n.ndim))
        problem = partial_problem(kernel.nodes, lambda v: g.nodes[v].inputs, lambda v: bool(partial[v]),
                                  lambda v: combine_of(g.nodes[v].op, g.nodes[v].attrs) is not None,
                                  kernel.outputs, label)
        if problem:
            raise ValueError(f"kernel {kernel.name}: {problem}")

        own_cut = {v: set(self.part_classes(v)) for v in kernel.outputs}
        # one kernel object for all of its block tasks: costing finds a class's work by it
        block_kernel = Kernel(kernel.name, self.block_kernel(kernel, external))
        order = sorted(space)
        per_output: dict[int, dict[tuple[int, ...], list[TaskResult]]] = {v: defaultdict(list) for v in kernel.outputs}
        for idx in itertools.product(*(range(space[c]) for c in order)):
            at = dict(zip(order, idx, strict=True))
            args = []
            for u in external:
                n = g.nodes[u]
                sel = []
                for a, size in enumerate(n.shape):
                    c = classes.of_axis(u, a)
                    if c in at and size > 1:
                        length = lengths.get(c, size)
                        sel.append((at[c] * length, min((at[c] + 1) * length, size)))
                    else:
                        sel.append((0, size))
                args.append(self.block_for(u, tuple(sel)))
            where = ",".join(map(str, idx))
            out_shapes = []
            for v in kernel.outputs:
                n = g.nodes[v]
                bidx = tuple(at.get(classes.of_axis(v, a), 0) if a in self.tilings[v].axes else 0
                             for a in range(n.ndim))
                out_shapes.append(tuple(b - a for a, b in _block_selection(self.grids[v], bidx)))
            out_bytes = [math.prod(shape) * np.dtype(g.nodes[v].dtype).itemsize
                         for shape, v in zip(out_shapes, kernel.outputs, strict=True)]
            task = Task(f"{kernel.name}#{k}[{where}]", block_kernel, tuple(args),
                        num_outputs=len(kernel.outputs), out_shapes=tuple(out_shapes), out_bytes=tuple(out_bytes))
            self.tasks.append(task)
            for p, v in enumerate(kernel.outputs):
                if any(at[c] for c in space if c not in dep[v] and c not in own_cut[v]):
                    continue  # the same block again: this output does not depend on that class
                n = g.nodes[v]
                bidx = tuple(at.get(classes.of_axis(v, a), 0) if a in self.tilings[v].axes else 0
                             for a in range(n.ndim))
                per_output[v][bidx].append(TaskResult(task.id, p))
        for v, by_block in per_output.items():
            n = g.nodes[v]
            self.blocks[v] = {}
            for bidx, results in by_block.items():
                if not partial[v]:
                    self.blocks[v][bidx] = results[0]
                    continue
                fn = combine_of(n.op, n.attrs)
                assert fn is not None
                block = _block_selection(self.grids[v], bidx)
                self.blocks[v][bidx] = self.reduce_tree(f"{fn}#{v}[{','.join(map(str, bidx))}]", fn, results,
                                                        tuple(b - a for a, b in block), _nbytes(block, n.dtype))

    def blockwise(self, k: int, v: int) -> None:
        """One task per row block runs the job's function; sibling outputs share the task."""
        g = self.graph
        n = g.nodes[v]
        attrs = n.attrs
        assert isinstance(attrs, ops.Blockwise)
        fn, output, in_rows, out_rows = attrs.kernel, attrs.output, attrs.in_rows, attrs.out_rows
        key = blockwise_call(n)
        siblings = {j: m for j, m in enumerate(g.nodes) if m.op is Op.BLOCKWISE and blockwise_call(m) == key}
        by_output = {_blockwise(m).output: (j, m) for j, m in siblings.items()}
        first = g.nodes[n.inputs[0]]
        count = -(-first.shape[0] // in_rows[0]) if in_rows and in_rows[0] else 1
        if key not in self.blockwise_tasks:
            ids = []
            if not isinstance(fn.fn, KernelBody) and not is_arrayjob_module(getattr(fn.fn, "__module__", "") or ""):
                # a user's block function: the workers check what it returns against its declaration
                promised = tuple(DeclaredBlock(m.shape, m.dtype, _blockwise(m).out_rows) if o in by_output
                                 else DeclaredBlock((), "object", None)
                                 for o in range(max(by_output) + 1) for m in [by_output.get(o, (v, n))[1]])
                fn = dataclasses.replace(fn, fn=JobFunction(fn.fn, fn.name, promised))
            for i in range(count):
                args = []
                for j, u in enumerate(n.inputs):
                    shape = g.nodes[u].shape
                    sel = [(0, s) for s in shape]
                    rows = in_rows[j] if in_rows else None
                    if rows:
                        sel[0] = (i * rows, min((i + 1) * rows, shape[0]))
                    args.append(self.block_for(u, tuple(sel)))
                shapes, nbytes = [], []
                for o in range(max(by_output) + 1):
                    m = by_output[o][1] if o in by_output else n
                    r = _blockwise(m).out_rows
                    shapes.append((min(r, m.shape[0] - i * r), *m.shape[1:]) if r else m.shape)
                    declared = _blockwise(m).out_block_bytes
                    nbytes.append(declared if declared is not None
                                  else math.prod(shapes[-1]) * np.dtype(m.dtype).itemsize)
                task = Task(f"{fn.name}#{k}[{i}]", fn, tuple(args), num_outputs=len(shapes),
                            out_shapes=tuple(shapes), out_bytes=tuple(nbytes))
                self.tasks.append(task)
                ids.append(task.id)
            self.blockwise_tasks[key] = ids
        ids = self.blockwise_tasks[key]
        if out_rows is None and count != 1:
            raise ValueError(f"map_blocks {fn.name}: a whole output needs whole inputs")
        self.blocks[v] = {(i,) + (0,) * (n.ndim - 1) if out_rows else (0,) * n.ndim: TaskResult(t, output)
                          for i, t in enumerate(ids)}
        if out_rows and self.grids[v].grid_shape[0] != count:
            raise ValueError(f"map_blocks {fn.name}: output {output} has {self.grids[v].grid_shape[0]} blocks, "
                             f"its inputs {count}")

    def store(self, k: int, v: int) -> None:
        """One write task per block of the input; their [bytes, PUTs] are summed."""
        n = self.graph.nodes[v]
        assert isinstance(n.attrs, ops.Store)
        target, options = n.attrs.target, n.attrs.options
        u = n.inputs[0]
        results = []
        for idx, ref in sorted(self.blocks[u].items()):
            selection = _block_selection(self.grids[u], idx)
            for (lo, hi), chunk, size in zip(selection, target.chunks, target.shape, strict=True):
                if lo % chunk or (hi % chunk and hi != size):
                    raise ValueError(f"store into {target.uri}: block {selection} does not cover whole chunks {target.chunks}")
            task = Task(f"store {target.name}#{k}[{','.join(map(str, idx))}]",
                        Kernel("store", WriteBlock(target, options, selection)), (ref,),
                        out_shapes=(n.shape,), out_bytes=(8 * n.shape[0],))
            self.tasks.append(task)
            results.append(TaskResult(task.id))
        self.blocks[v] = {(0,): self.reduce_tree(f"store#{v}", "sum", results, n.shape, 8 * n.shape[0])}

    def reduce_tree(self, name: str, fn: str, parts: list[TaskResult], shape: tuple[int, ...],
                    nbytes: int) -> TaskResult:
        """Combine a block's partials (``reduction.combine_tree``); each combine task is marked
        as a step of the tree ``name``, which placement may rebuild."""
        count = iter(range(len(parts)))
        kernel = Kernel(f"{fn}_partials", Combine(fn))  # shared by the tree's tasks

        def combine(group: list[TaskResult], level: int, final: bool) -> TaskResult:
            task = Task(f"combine {name}.{level}.{next(count)}", kernel,
                        tuple(group), out_shapes=(shape,), out_bytes=(nbytes,),
                        reduction=ReductionStep(name, level))
            self.tasks.append(task)
            return TaskResult(task.id)

        return combine_tree(parts, combine)

    def block_kernel(self, kernel: FusedKernel, external: list[int]) -> BlockKernel:
        g = self.graph
        slot = {u: i for i, u in enumerate(external)}
        steps: list[Step] = []
        for v in kernel.nodes:
            for u in g.nodes[v].inputs:
                if u not in slot and g.nodes[u].op is Op.CONST:
                    n = g.nodes[u]
                    steps.append(Step(Op.CONST, n.attrs, (), n.dtype))
                    slot[u] = len(external) + len(steps) - 1
            n = g.nodes[v]
            steps.append(Step(n.op, n.attrs, tuple(slot[u] for u in n.inputs), n.dtype))
            slot[v] = len(external) + len(steps) - 1
        largest = max((g.nodes[u].nbytes for u in external), default=0)
        return BlockKernel(kernel.name, len(external), tuple(steps), tuple(slot[v] for v in kernel.outputs),
                           worker_bytes=largest // self.plan.options.workers_for_tiling)

    # -- program outputs -------------------------------------------------------------------
    def run(self) -> tuple[PhysicalPlan, tuple[OutputAssembly, ...]]:
        computed_by: dict[int, int] = {}
        for k, kernel in enumerate(self.kernels):
            for v in kernel.nodes:
                computed_by[v] = k
        done: set[int] = set()
        for i, n in enumerate(self.graph.nodes):
            if n.op.is_leaf and n.op is not Op.CONST:  # constants are inlined into kernels
                self.leaf_blocks(i)
        for k, kernel in enumerate(self.kernels):
            if k not in done:
                self.kernel(k, kernel)
                done.add(k)
        outputs: list[TaskResult] = []
        assembly = []
        for o in self.graph.outputs:
            n = self.graph.nodes[o]
            parts = []
            for idx, ref in sorted(self.blocks[o].items()):
                if not isinstance(ref, TaskResult):
                    ref = self.block_for(o, _block_selection(self.grids[o], idx))
                    if not isinstance(ref, TaskResult):  # a leaf returned as is: copy through a task
                        sel = _block_selection(self.grids[o], idx)
                        shape = tuple(b - a for a, b in sel)
                        whole = tuple((0, s) for s in shape)
                        task = Task(f"fetch {n.label()}#{o}[{idx}]",
                                    Kernel("assemble", Assemble(shape, n.dtype, ((whole, whole),))), (ref,),
                                    out_shapes=(shape,), out_bytes=(_nbytes(sel, n.dtype),))
                        self.tasks.append(task)
                        ref = TaskResult(task.id)
                parts.append((_block_selection(self.grids[o], idx), len(outputs)))
                outputs.append(ref)
            assembly.append(OutputAssembly(o, n.shape, n.dtype, tuple(parts)))
        physical = PhysicalPlan(tuple(self.sources), tuple(self.tasks), tuple(outputs))
        physical.validate()
        return physical, tuple(assembly)


def lower(plan: Plan) -> Plan:
    physical, assembly = _Lowering(plan).run()
    return dataclasses.replace(plan, physical=physical, assembly=assembly)


def assemble_outputs(plan: Plan, results: list[object]) -> list[np.ndarray]:
    """Rebuild each program output on the driver from its blocks."""
    arrays = []
    for out in plan.assembly:
        if len(out.blocks) == 1 and out.blocks[0][0] == tuple((0, s) for s in out.shape):
            arrays.append(np.asarray(results[out.blocks[0][1]]).reshape(out.shape))
            continue
        array = np.empty(out.shape, dtype=out.dtype)
        for selection, i in out.blocks:
            array[tuple(slice(a, b) for a, b in selection)] = results[i]
        arrays.append(array)
    return arrays
