"""Plans for map-reduce over row blocks: one kernel per row block, partials summed in a tree.

This is the shape of one pass of most iterative ML jobs (loss and gradient of a GLM,
KMeans' assignment and sums): the big arrays stay partitioned, small driver values are
broadcast, and only small partials move.
"""

from __future__ import annotations

import functools

from arrayjob.planner.kernels import add_partials
from arrayjob.planner.physical import (
    Arg,
    DriverValue,
    Kernel,
    PhysicalPlan,
    Source,
    SourceBlock,
    Task,
    TaskResult,
)

ADD = Kernel("add_partials", add_partials)


@functools.lru_cache(maxsize=256)
def row_map_reduce(
    sources: tuple[Source, ...],
    kernel: Kernel,
    values: tuple[str, ...] = (),
    *,
    fan_in: int = 8,
) -> PhysicalPlan:
    """``kernel(block_0, block_1, ..., *values)`` on every row block, summed to one result.

    All sources must share the same row blocking. Cached by structure: an iterative job
    plans once and reuses the plan every iteration.
    """
    rows = {s.grid.grid_shape[0] for s in sources}
    if len(rows) != 1 or len({s.grid.block_shape[0] for s in sources}) != 1:
        raise ValueError("row_map_reduce needs sources with the same row blocks")
    (n_blocks,) = rows
    tasks: list[Task] = []
    level: list[str] = []
    for i in range(n_blocks):
        args: list[Arg] = [SourceBlock(s.array.name, (i,) + (0,) * (len(s.grid.shape) - 1)) for s in sources]
        args += [DriverValue(v) for v in values]
        task = Task(f"{kernel.name}[{i}]", kernel, tuple(args))
        tasks.append(task)
        level.append(task.id)
    depth = 0
    while len(level) > 1:
        depth += 1
        next_level = []
        for j in range(0, len(level), fan_in):
            group = level[j : j + fan_in]
            if len(group) == 1:
                next_level.append(group[0])
                continue
            task = Task(f"sum{depth}[{j // fan_in}]", ADD, tuple(TaskResult(t) for t in group))
            tasks.append(task)
            next_level.append(task.id)
        level = next_level
    plan = PhysicalPlan(sources=sources, tasks=tuple(tasks), outputs=(TaskResult(level[0]),))
    plan.validate()
    return plan

