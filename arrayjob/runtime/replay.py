"""The measurement replay: what a run on Ray really moved and held, from its tasks' records.

After a run ``RayExecutor`` replays the plan with ``planner.cost.ClusterLoad`` on the nodes
tasks really ran on (each task's record, ``runtime.worker_tasks``), with the sizes they
really returned, and the nodes held blocks really are on: bytes moved between nodes,
per-node network and the per-node object-store high-water mark go into ``RunMetrics``.
Objects under Ray's inlining threshold (100 KiB) really travel through the driver; they are
counted as if they lived where their task ran, as the planner counts them. The model is the
planner's own, so a run that obeyed its plan measures what the plan predicted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from arrayjob.planner.cost import ClusterLoad
from arrayjob.planner.physical import CachedBlock, DriverValue, PhysicalPlan, SourceBlock
from arrayjob.runtime.metrics import RunMetrics
from arrayjob.runtime.worker_tasks import nbytes

# a streaming task's reads, by block, from its record: counted by the block cache
CountReads = Callable[[PhysicalPlan, Mapping[tuple[str, Any], Mapping[str, Any]]], None]


def replay(plan: PhysicalPlan, values: Mapping[str, Any], records: list[tuple[Any, ...]],
           submitted: tuple[int, ...] | None, order: list[str], held: Mapping[Any, tuple[str, int]],
           used: Mapping[Any, SourceBlock | CachedBlock], rebuilt: Mapping[Any, set[str]],
           metrics: RunMetrics, count_reads: CountReads) -> None:
    """Replay ``plan``'s run (tasks in the order ``submitted``, each with its record) into
    ``metrics``.

    ``order`` is the Ray node ids by planner node index (nodes the run met that it does not
    name are added at its end); ``held`` every block the executor holds and its home, ``used``
    those of them the plan reads (the executor's key -> the plan's argument), ``rebuilt`` the
    blocks Ray rebuilt during the run and the nodes with a copy of each.
    """
    order = list(order)
    index = {n: i for i, n in enumerate(order)}

    def node_index(node_id: str) -> int:
        if node_id not in index:  # a node that joined after the executor started
            index[node_id] = len(order)
            order.append(node_id)
        return index[node_id]

    task_nodes = [node_index(r[0]) for r in records]
    held_nodes = {key: node_index(node) for key, (node, _) in held.items()}
    value_bytes = {a.name: nbytes(values[a.name]) for t in plan.tasks for a in t.args
                   if isinstance(a, DriverValue) and a.name in values}
    load = ClusterLoad(plan, len(order), driver_node=0, value_bytes=value_bytes)
    for key, (_, size) in held.items():
        if key in used:
            load.hold(used[key], held_nodes[key], size)
        else:
            load.reserve(held_nodes[key], size)
    # A block rebuilt during this run was on the lost node until it died and is on the
    # nodes that have it now: its uses in this run are not counted as moves (Ray rebuilt
    # it from storage, counted in faults.blocks_reconstructed).
    for key, nodes in rebuilt.items():
        if key in used:
            load.copies[used[key]] |= {node_index(n) for n in nodes}
    touched = 0
    for position in submitted if submitted is not None else range(len(plan.tasks)):
        task, node, record = plan.tasks[position], task_nodes[position], records[position]
        _, out_bytes, in_bytes = record[:3]
        if len(record) > 4:  # a streaming task: its own reads live in the worker, not the store
            count_reads(plan, record[4])
            for arg in task.args:
                if isinstance(arg, SourceBlock) and arg not in load.home:
                    load.hold(arg, node, 0)
        load.run(task, node, out_bytes)
        touched += in_bytes + sum(out_bytes)

    def by_node(counts: list[int]) -> dict[str, int]:
        return {order[i]: n for i, n in enumerate(counts) if n}

    metrics.count_placement(
        moved=load.moved, touched=touched, tasks=by_node(load.tasks), net_in=by_node(load.net_in),
        net_out=by_node(load.net_out), peak=by_node(load.peak),
    )
