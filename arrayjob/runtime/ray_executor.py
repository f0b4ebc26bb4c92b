"""Runs a physical plan on Ray, each task on the node the plan names.

Source blocks are read by Ray tasks (on the workers, straight from storage) and kept in
the object store for the life of the executor; kernels receive them zero-copy. Tasks
are pure functions of their arguments, so Ray may retry any of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from arrayjob.errors import ArrayJobError
from arrayjob.io.storage import StorageCounters, StorageOptions
from arrayjob.planner.physical import PhysicalPlan, Source, SourceBlock, TaskResult
from arrayjob.runtime.executor import load_and_check
from arrayjob.runtime.metrics import RunMetrics

TASK_RETRIES = 3


@ray.remote(num_returns=2, max_retries=TASK_RETRIES)
def _load(source: Source, index: tuple[int, ...], options: StorageOptions) -> tuple[Any, dict[str, Any]]:
    block, stats = load_and_check(source, index, options)
    stats["node"] = ray.get_runtime_context().get_node_id()
    return block, stats


@ray.remote(max_retries=TASK_RETRIES)
def _run_kernel(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _unwrap(exc: ray.exceptions.RayTaskError) -> BaseException:
    """The user-facing error inside a failed Ray task, if it is one of ours."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, ArrayJobError) else exc


class RayExecutor:
    def __init__(self, options: StorageOptions, node_ids: tuple[str, ...] = (),
                 metrics: RunMetrics | None = None) -> None:
        self.options = options
        self.node_ids = node_ids
        self.metrics = metrics or RunMetrics()
        self._blocks: dict[tuple[Source, tuple[int, ...]], ray.ObjectRef] = {}
        self._pending_stats: list[ray.ObjectRef] = []

    def _options(self, node: int | None) -> dict[str, Any]:
        if node is None or not self.node_ids:
            return {}
        node_id = self.node_ids[node % len(self.node_ids)]
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=True)}

    def _block(self, plan: PhysicalPlan, ref: SourceBlock, node: int | None) -> ray.ObjectRef:
        source = plan.source(ref.array)
        key = (source, ref.index)
        if key not in self._blocks:
            block, stats = _load.options(**self._options(node)).remote(source, ref.index, self.options)
            self._blocks[key] = block
            self._pending_stats.append(stats)
            self.metrics.count_tasks(1)
        return self._blocks[key]

    def _collect_stats(self) -> None:
        pending, self._pending_stats = self._pending_stats, []
        for stats in self._get(pending):
            counters = StorageCounters(**{k: stats[k] for k in StorageCounters.__dataclass_fields__})
            self.metrics.count_storage(counters)
            self.metrics.hold_block(stats["node"], stats["nbytes"])

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

    def run(self, plan: PhysicalPlan, values: Mapping[str, Any]) -> list[Any]:
        value_refs = {name: ray.put(v) for name, v in values.items()}
        refs: dict[str, list[ray.ObjectRef]] = {}
        for task in plan.tasks:
            args = []
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    args.append(self._block(plan, arg, task.node))
                elif isinstance(arg, TaskResult):
                    args.append(refs[arg.task][arg.output])
                else:
                    args.append(value_refs[arg.name])
            options = self._options(task.node)
            if task.num_outputs > 1:
                options["num_returns"] = task.num_outputs
            out = _run_kernel.options(**options).remote(task.kernel.fn, *args)
            refs[task.id] = out if task.num_outputs > 1 else [out]
        self.metrics.count_tasks(len(plan.tasks))
        outputs = self._get([refs[o.task][o.output] for o in plan.outputs])
        if self._pending_stats:
            self._collect_stats()
        return outputs
