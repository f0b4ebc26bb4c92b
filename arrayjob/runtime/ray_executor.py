"""Runs a physical plan on Ray, each task on the node the plan names, and measures where
each task really ran.

Source blocks are read by Ray tasks (on the workers, straight from storage) and kept in
the object store for the life of the executor; kernels receive them zero-copy. Tasks
are pure functions of their arguments, so Ray may retry any of them. The driver drops
its reference to a task's result once the result's last consumer is submitted, so Ray
frees it as soon as that consumer has run (what the planner's cost model assumes).

Planner node 0 is the driver's node (driver values are put in its object store); the
other planner nodes are the remaining Ray nodes, in the order given.

Measurement: each kernel task returns one extra tiny object, its record (the node it
ran on, the bytes of its arguments and of each result). Ray inlines it into the task's
reply, so it costs no object-store traffic and no extra round trip. After a run the
executor replays the plan with ``planner.cost.ClusterLoad`` on the nodes tasks really ran
on, with the sizes they really returned, and the nodes blocks were really read on: bytes
moved between nodes, per-node network and the per-node object-store high-water mark go
into ``RunMetrics``. Objects under Ray's inlining threshold (100 KiB) really travel
through the driver; they are counted as if they lived where their task ran, as the
planner counts them.

Blocks kept between programs (``Session.persist``: ``keep``, ``alias``, ``release``) stay
in the object store where their tasks ran, and later plans take them zero-copy.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from arrayjob import kernels
from arrayjob.errors import ArrayJobError
from arrayjob.io.locations import StorageCounters, StorageOptions
from arrayjob.planner.cost import ClusterLoad
from arrayjob.planner.physical import (
    CachedBlock,
    DriverValue,
    PhysicalPlan,
    Source,
    SourceBlock,
    TaskResult,
)
from arrayjob.runtime.executor import load_and_check
from arrayjob.runtime.metrics import RunMetrics

TASK_RETRIES = 3
# Driver values up to this size go to the tasks by value, inside the task (Ray inlines
# arguments under 100 KiB): a scalar or a weight vector costs no object-store put per
# compute (about 1 ms each, `benchmarks/bench_micro.py ray-returns`).
INLINE_VALUE_BYTES = 64 * 2**10
BlockKey = tuple[Source, tuple[int, ...]]

_node_id: str | None = None  # a worker process never changes node


def _this_node() -> str:
    global _node_id
    if _node_id is None:
        _node_id = ray.get_runtime_context().get_node_id()
    return _node_id


def _nbytes(x: Any) -> int:
    if isinstance(x, np.ndarray | np.generic):
        return int(x.nbytes)
    if isinstance(x, tuple | list):
        return sum(_nbytes(v) for v in x)
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, bool | int | float | complex):
        return 8
    return sys.getsizeof(x)


@ray.remote(num_returns=2, max_retries=TASK_RETRIES)
def _load(source: Source, index: tuple[int, ...], options: StorageOptions) -> tuple[Any, dict[str, Any]]:
    block, stats = load_and_check(source, index, options)
    stats["node"] = _this_node()
    return block, stats


@ray.remote(max_retries=TASK_RETRIES)
def _run_kernel(fn: Any, *args: Any) -> Any:
    return kernels.run(fn, *args)


@ray.remote(max_retries=TASK_RETRIES)
def _run_measured(fn: Any, num_outputs: int, *args: Any) -> tuple[Any, ...]:
    """``fn(*args)``'s results, then the record ``(node id, bytes of each result, bytes of the args)``."""
    out = kernels.run(fn, *args)
    outs = tuple(out) if num_outputs > 1 else (out,)
    return (*outs, (_this_node(), tuple(_nbytes(o) for o in outs), sum(_nbytes(a) for a in args)))


def _unwrap(exc: ray.exceptions.RayTaskError) -> BaseException:
    """The user-facing error inside a failed Ray task, if it is one of ours."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, ArrayJobError) else exc


class RayExecutor:
    def __init__(self, options: StorageOptions, node_ids: tuple[str, ...] = (),
                 metrics: RunMetrics | None = None, *, measure: bool = True) -> None:
        self.options = options
        self.node_ids = node_ids
        self.metrics = metrics or RunMetrics()
        self.measure = measure
        self._blocks: dict[BlockKey, ray.ObjectRef] = {}
        self._block_home: dict[BlockKey, tuple[str, int]] = {}  # node id and bytes, as read
        self._pending_stats: list[tuple[BlockKey, ray.ObjectRef]] = []
        self._order: list[str] | None = None
        self._uses: dict[int, tuple[PhysicalPlan, Counter[str], frozenset[str]]] = {}
        self._kept: dict[str, list[ray.ObjectRef]] = {}  # Session.persist's blocks, by name
        self._kept_home: dict[ray.ObjectRef, tuple[str, int]] = {}  # where a kept block is, and its bytes

    # -- nodes -----------------------------------------------------------------------------
    @property
    def node_order(self) -> list[str]:
        """Ray node ids by planner node index: the driver's node first."""
        if self._order is None:
            driver = ray.get_runtime_context().get_node_id()
            ids = list(self.node_ids)
            self._order = [driver, *(n for n in ids if n != driver)] if driver in ids or not ids else ids
        return self._order

    def _options(self, node: int | None) -> dict[str, Any]:
        if node is None or not self.node_ids:
            return {}
        order = self.node_order
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(order[node % len(order)], soft=True)}

    # -- source blocks -----------------------------------------------------------------------
    def _block(self, plan: PhysicalPlan, ref: SourceBlock, node: int | None) -> ray.ObjectRef:
        source = plan.source(ref.array)
        key = (source, ref.index)
        if key not in self._blocks:
            block, stats = _load.options(**self._options(node)).remote(source, ref.index, self.options)
            self._blocks[key] = block
            self._pending_stats.append((key, stats))
            self.metrics.count_tasks(1)
        return self._blocks[key]

    def _collect_stats(self) -> None:
        pending, self._pending_stats = self._pending_stats, []
        try:
            # ray.get of a list raises at the first failed read, without waiting for the rest
            collected = self._get([ref for _, ref in pending])
        except BaseException:
            self._cancel_loads(pending)
            raise
        for (key, _), stats in zip(pending, collected, strict=True):
            counters = StorageCounters(**{k: stats[k] for k in StorageCounters.__dataclass_fields__})
            self.metrics.count_storage(counters)
            self.metrics.hold_block(stats["node"], stats["nbytes"])
            self._block_home[key] = (stats["node"], stats["nbytes"])

    def _cancel_loads(self, pending: list[tuple[BlockKey, ray.ObjectRef]]) -> None:
        """Cancel block reads still queued or running after one failed: the job stops, and a
        shared cluster should not go on reading (and holding) blocks for it."""
        for key, stats in pending:
            self._blocks.pop(key, None)
            with contextlib.suppress(Exception):  # best effort: the job is failing anyway
                ray.cancel(stats)  # one return of a task cancels the task; a finished one is left

    def _get(self, refs: list[ray.ObjectRef]) -> list[Any]:
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as exc:
            raise _unwrap(exc) from None

    def load(self, plan: PhysicalPlan) -> None:
        first_use: dict[SourceBlock, int | None] = {}
        for task in plan.tasks:
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    first_use.setdefault(arg, task.node)
        for ref, node in first_use.items():
            self._block(plan, ref, node)
        self._collect_stats()

    # -- running -----------------------------------------------------------------------------
    def _consumers(self, plan: PhysicalPlan) -> tuple[Counter[str], frozenset[str]]:
        """How many tasks use each task's results, and the tasks whose results are returned."""
        cached = self._uses.get(id(plan))
        if cached is None or cached[0] is not plan:
            uses: Counter[str] = Counter()
            for task in plan.tasks:
                uses.update({a.task for a in task.args if isinstance(a, TaskResult)})
            if len(self._uses) > 64:
                self._uses.clear()
            cached = self._uses[id(plan)] = (plan, uses, frozenset(o.task for o in plan.outputs))
        return cached[1], cached[2]

    def _submit(self, plan: PhysicalPlan, values: Mapping[str, Any]) -> tuple[list[ray.ObjectRef], list[ray.ObjectRef]]:
        """Submit every task of ``plan``; the refs of its outputs and of the tasks' records."""
        uses, returned = self._consumers(plan)
        remaining = Counter(uses)
        value_refs = {name: v if _nbytes(v) <= INLINE_VALUE_BYTES else ray.put(v) for name, v in values.items()}
        refs: dict[str, list[ray.ObjectRef]] = {}
        records: list[ray.ObjectRef] = []
        for task in plan.tasks:
            args = []
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    args.append(self._block(plan, arg, task.node))
                elif isinstance(arg, TaskResult):
                    args.append(refs[arg.task][arg.output])
                elif isinstance(arg, CachedBlock):
                    args.append(self._kept[arg.handle][arg.position])
                else:
                    args.append(value_refs[arg.name])
            options = {**self._options(task.node), "name": task.kernel.name}  # in Ray's dashboard and timeline
            if self.measure:
                options["num_returns"] = task.num_outputs + 1
                *outs, record = _run_measured.options(**options).remote(task.kernel.fn, task.num_outputs, *args)
                records.append(record)
            else:
                if task.num_outputs > 1:
                    options["num_returns"] = task.num_outputs
                out = _run_kernel.options(**options).remote(task.kernel.fn, *args)
                outs = out if task.num_outputs > 1 else [out]
            refs[task.id] = outs
            for used in {a.task for a in task.args if isinstance(a, TaskResult)}:
                remaining[used] -= 1
                if remaining[used] == 0 and used not in returned:
                    del refs[used]  # Ray frees it once this task has run
        self.metrics.count_tasks(len(plan.tasks))
        return [refs[o.task][o.output] for o in plan.outputs], records

    def run(self, plan: PhysicalPlan, values: Mapping[str, Any]) -> list[Any]:
        outs, records = self._submit(plan, values)
        outputs = self._get(outs)
        if self._pending_stats:
            self._collect_stats()
        if self.measure:
            self._measure(plan, values, self._get(records))
        return outputs

    # -- blocks kept between programs (Session.persist) --------------------------------------
    def keep(self, plan: PhysicalPlan, values: Mapping[str, Any], handle: str) -> None:
        outs, records = self._submit(plan, values)
        if self._pending_stats:
            self._collect_stats()
        if self.measure:  # waits for the tasks, and raises what failed
            ran = self._measure(plan, values, self._get(records))
            for ref, o in zip(outs, plan.outputs, strict=True):
                node, out_bytes = ran[o.task]
                self._kept_home[ref] = (node, out_bytes[o.output])
        else:
            ray.wait(outs, num_returns=len(outs), fetch_local=False)
        self._kept[handle] = outs

    def alias(self, name: str, handle: str, positions: range) -> None:
        self._kept[name] = [self._kept[handle][p] for p in positions]

    def release(self, name: str) -> None:
        dropped = set(self._kept.pop(name, ()))
        still = {ref for refs in self._kept.values() for ref in refs}
        for ref in dropped - still:
            self._kept_home.pop(ref, None)

    def _measure(self, plan: PhysicalPlan, values: Mapping[str, Any],
                 records: list[tuple[str, tuple[int, ...], int]]) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Replay the run as it happened: bytes moved between nodes, per-node load.

        Returns where each task ran and the bytes of each of its results.
        """
        order = list(self.node_order)
        index = {n: i for i, n in enumerate(order)}

        def node_index(node_id: str) -> int:
            if node_id not in index:  # a node that joined after the executor started
                index[node_id] = len(order)
                order.append(node_id)
            return index[node_id]

        used: dict[Any, SourceBlock | CachedBlock] = {}  # the executor's key -> the plan's argument
        for task in plan.tasks:
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    used.setdefault((plan.source(arg.array), arg.index), arg)
                elif isinstance(arg, CachedBlock):
                    used.setdefault(self._kept[arg.handle][arg.position], arg)
        held = {**self._block_home, **self._kept_home}  # everything this executor holds, and where
        task_nodes = [node_index(node) for node, _, _ in records]
        held_nodes = {key: node_index(node) for key, (node, _) in held.items()}
        value_bytes = {a.name: _nbytes(values[a.name]) for t in plan.tasks for a in t.args
                       if isinstance(a, DriverValue) and a.name in values}
        load = ClusterLoad(plan, len(order), driver_node=0, value_bytes=value_bytes)
        for key, (_, nbytes) in held.items():
            if key in used:
                load.hold(used[key], held_nodes[key], nbytes)
            else:
                load.reserve(held_nodes[key], nbytes)
        touched = 0
        for task, node, (_, out_bytes, in_bytes) in zip(plan.tasks, task_nodes, records, strict=True):
            load.run(task, node, out_bytes)
            touched += in_bytes + sum(out_bytes)

        def by_node(counts: list[int]) -> dict[str, int]:
            return {order[i]: n for i, n in enumerate(counts) if n}

        self.metrics.count_placement(
            moved=load.moved, touched=touched, tasks=by_node(load.tasks), net_in=by_node(load.net_in),
            net_out=by_node(load.net_out), peak=by_node(load.peak),
        )
        return {task.id: (node, out_bytes) for task, (node, out_bytes, _) in zip(plan.tasks, records, strict=True)}
