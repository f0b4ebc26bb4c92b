"""The cost of a physical plan, from shapes and placement alone (no data is read)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from arrayjob.planner.kernels import BlockKernel
from arrayjob.planner.physical import SourceBlock, TaskResult
from arrayjob.planner.plan import Plan

TRANSCENDENTAL = {"exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf", "logaddexp", "power", "sin", "cos"}


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

    def as_dict(self) -> dict[str, object]:
        return {
            "storage": {"bytes_read": self.bytes_read, "get_requests": self.get_requests,
                        "bytes_written": self.bytes_written},
            "network": {"bytes_between_nodes": self.bytes_between_nodes},
            "memory": {"bytes_touched": self.bytes_touched, "peak_bytes_per_node": list(self.peak_bytes_per_node)},
            "flops": self.flops,
            "tasks": {"count": self.tasks},
        }


def _kernel_flops(kernel: object, in_shapes: list[tuple[int, ...]]) -> int:
    if not isinstance(kernel, BlockKernel):
        return sum(math.prod(s) for s in in_shapes)  # combine / assemble: one op per element
    shapes: list[tuple[int, ...]] = list(in_shapes)
    flops = 0
    for step in kernel.steps:
        ins = [shapes[i] for i in step.inputs]
        if step.op == "const":
            shape: tuple[int, ...] = ()
        elif step.op == "map":
            shape = tuple(np.broadcast_shapes(*ins))
            flops += math.prod(shape) * (10 if step.attrs[0] in TRANSCENDENTAL else 1)
        elif step.op == "reduce":
            _, axes, keepdims = step.attrs
            flops += math.prod(ins[0])
            shape = tuple(1 if a in axes else s for a, s in enumerate(ins[0]) if keepdims or a not in axes)
        elif step.op == "einsum":
            terms, out = step.attrs[0].split("->")
            sizes: dict[str, int] = {}
            for term, s in zip(terms.split(","), ins, strict=True):
                sizes.update(zip(term, s, strict=True))
            flops += 2 * math.prod(sizes.values())
            shape = tuple(sizes[c] for c in out)
        else:  # transpose
            shape = tuple(ins[0][p] for p in step.attrs[0])
        shapes.append(shape)
    return flops


def plan_cost(plan: Plan) -> PlanCost:
    physical = plan.physical
    assert physical is not None, "cost needs a placed plan"
    nodes = max(1, plan.options.cluster.nodes)
    sources = {s.array.name: s for s in physical.sources}
    where: dict[str, int] = {}  # task id -> node
    size: dict[tuple[str, int], int] = {}
    shape_of: dict[tuple[str, int], tuple[int, ...]] = {}
    block_node: dict[SourceBlock, int] = {}
    held = [0] * nodes
    present: set[tuple[object, int]] = set()
    bytes_read = requests = moved = touched = flops = 0
    for i, task in enumerate(physical.tasks):
        node = task.node if task.node is not None else i % nodes
        where[task.id] = node
        in_bytes = 0
        in_shapes = []
        for arg in task.args:
            if isinstance(arg, SourceBlock):
                source = sources[arg.array]
                sel = source.grid.selection(arg.index)
                shape = tuple(s.stop - s.start for s in sel)
                nbytes = math.prod(shape) * np.dtype(source.array.dtype).itemsize
                if arg not in block_node:  # read once, on the node of its first use
                    block_node[arg] = node
                    bytes_read += nbytes
                    requests += math.prod(
                        math.ceil(s.stop / c) - s.start // c for s, c in zip(sel, source.array.chunks, strict=True))
                    held[node] += nbytes
                home, key = block_node[arg], arg
            elif isinstance(arg, TaskResult):
                nbytes = size[(arg.task, arg.output)]
                shape = shape_of[(arg.task, arg.output)]
                home, key = where[arg.task], (arg.task, arg.output)
            else:  # a driver value: put in the object store on the driver's node (node 0)
                nbytes, shape, home, key = arg.nbytes, arg.shape, 0, arg
            if home != node and (key, node) not in present:
                moved += nbytes
                present.add((key, node))
            in_bytes += nbytes
            in_shapes.append(shape)
        out_bytes = task.out_bytes or (0,) * task.num_outputs
        for p, b in enumerate(out_bytes):
            size[(task.id, p)] = b
            shape_of[(task.id, p)] = task.out_shapes[p] if task.out_shapes else ()
        touched += in_bytes + sum(out_bytes)
        flops += _kernel_flops(task.kernel.fn, in_shapes)
    return PlanCost(
        bytes_read=bytes_read, get_requests=requests, bytes_written=0, bytes_between_nodes=moved,
        bytes_touched=touched, peak_bytes_per_node=tuple(held), flops=flops, tasks=len(physical.tasks),
    )
