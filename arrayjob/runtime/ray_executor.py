"""Runs a physical plan on Ray, each task on the node the plan names, and measures where
each task really ran.

The executor submits a program's tasks (``runtime.worker_tasks``) in the planner's order,
each with Ray node affinity to its planned node (``runtime.node_watch``: planner node 0 is
the driver's node). A task's arguments are held blocks (``runtime.block_cache``: source
blocks read once into the object store, blocks kept between programs), results of earlier
tasks of the program, and driver values. The driver drops its reference to a task's result
once the result's last consumer is submitted, so Ray frees it as soon as that consumer has run
(what the planner's cost model assumes). After a run it replays the plan on the nodes tasks
really ran on (``runtime.replay``) to count bytes moved and per-node peaks.

Under a memory budget, blocks not resident are streamed (read by the tasks that use them,
from the node's spill or storage), and results the session names are written to the node's
spill by the tasks that make them (``runtime.spill``); ``close`` removes the spill on every
node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from arrayjob.io.locations import StorageOptions
from arrayjob.planner.physical import CachedBlock, PhysicalPlan, SourceBlock, TaskResult
from arrayjob.planner.residency import Residency
from arrayjob.runtime import kept_spill, spill, worker_tasks
from arrayjob.runtime.block_cache import BlockCache, block_bytes
from arrayjob.runtime.executor import Executor
from arrayjob.runtime.metrics import RunMetrics
from arrayjob.runtime.node_watch import NodeWatch
from arrayjob.runtime.replay import replay
from arrayjob.runtime.spill import StreamedRead
from arrayjob.runtime.supervision import reaper
from arrayjob.runtime.worker_tasks import TASK_RETRIES, KeptBlockLost, nbytes

__all__ = ["BIG_TASK_BYTES", "INLINE_VALUE_BYTES", "TASK_RETRIES", "KeptBlockLost", "RayExecutor"]

# Driver values up to this size go to the tasks by value, inside the task (Ray inlines
# arguments under 100 KiB): a scalar or a weight vector costs no object-store put per
# compute (about 1 ms each, `benchmarks/bench_micro.py ray-returns`).
INLINE_VALUE_BYTES = 64 * 2**10
# A task whose results and own reads come to at least this many bytes declares them as Ray's
# ``memory`` resource: Ray then runs no more such tasks on a node than its memory holds, and an
# autoscaler sees the demand. Smaller tasks declare only their CPU, as Ray's default.
BIG_TASK_BYTES = 64 * 2**20


class RayExecutor(Executor):
    spills_kept = True  # kept blocks over the budget go to their node's spill (``runtime.kept_spill``)

    def __init__(self, options: StorageOptions, node_ids: tuple[str, ...] = (),
                 metrics: RunMetrics | None = None, *, measure: bool = True, follow_nodes: bool = False,
                 relocate: Callable[[int], str] = lambda nbytes: "move") -> None:
        self.options = options
        self.metrics = metrics or RunMetrics()
        self.measure = measure
        # a sized cluster: planner nodes are bound to the live worker nodes at each program,
        # and a held block whose first use moved to another node goes there ("move", a copy
        # from node to node) or is read again there ("read"), as ``relocate(bytes)`` says
        self.follow_nodes = follow_nodes
        self.nodes = NodeWatch(self.metrics, node_ids)
        # a private Ray's: named by its owner token, so the watchdog removes it if this process
        # is killed outright (``runtime.reaper``); a cluster's nodes keep theirs until ``close``
        self._spill_dir = os.path.join(reaper.spill_directory(os.environ.get(reaper.OWNER_VARIABLE, "")),
                                       uuid.uuid4().hex)
        # ``_memory`` looked up at each call: tests wrap it to see what tasks declare
        self.cache = BlockCache(options, self.metrics, self.nodes, self._spill_dir,
                                lambda node, nbytes: {**self.nodes.placement(node), **self._memory(nbytes)},
                                relocate)
        self._uses: dict[int, tuple[PhysicalPlan, Counter[str], frozenset[str]]] = {}
        self._spill_used = False  # kept blocks or results were written to the spill (close removes it)
        self._recorded: list[int] = []
        if node_ids:
            self.check_nodes()

    # -- nodes -----------------------------------------------------------------------------
    @property
    def node_ids(self) -> tuple[str, ...]:
        return self.nodes.node_ids

    @property
    def node_order(self) -> list[str]:
        """Ray node ids by planner node index: the driver's node first."""
        return self.nodes.order

    @property
    def _kept(self) -> dict[str, list[Any]]:
        return self.cache.kept  # (tests check a release leaves nothing held)

    @property
    def _kept_home(self) -> dict[Any, tuple[str, int]]:
        return self.cache.kept_home

    def nodes_now(self) -> int | None:
        """Bind planner nodes to the worker nodes alive now, keeping the order of those that
        stay (their blocks' homes keep their indices) and adding those that joined after
        them; a node gone is a lost node (``check_nodes``). None unless following nodes."""
        if not self.follow_nodes:
            return None
        self.check_nodes()
        if self.nodes.follow():
            self.cache.relocating = True  # the next run's plan may put held blocks' first uses elsewhere
        return len(self.node_order)

    def _memory(self, nbytes: int) -> dict[str, Any]:
        """Ray's ``memory`` resource for a task holding ``nbytes`` in its worker (results, own
        reads), when big; never more than the smallest worker node has (a task no node
        can hold would wait forever)."""
        if nbytes < BIG_TASK_BYTES:
            return {}
        cap = self.nodes.memory_cap_now()
        return {"memory": min(nbytes, int(cap))} if cap else {}

    def check_nodes(self, *, every: float = 0.0) -> None:
        """Count the nodes lost since the last check (at most one check per ``every`` seconds)."""
        if self.nodes.check(every):
            self.nodes.orphan(self.cache.block_home, self.cache.kept_home)

    # -- source blocks -----------------------------------------------------------------------
    def load(self, plan: PhysicalPlan, residency: Residency | None = None) -> None:
        self.cache.load(plan, residency)

    def demote(self, blocks: set[tuple[str, SourceBlock]]) -> None:
        """Stream these resident blocks (array URI, block) from now on: their refs are dropped
        (Ray frees them), their tasks read them (from storage: they were read once already)."""
        self.cache.demote(blocks)

    def close(self) -> None:
        """Remove this executor's spill of streamed and kept blocks, on every node."""
        if not any(self.cache.stream.values()) and not self._spill_used:
            return
        waits = []
        for node in self.node_order if self.node_ids else []:
            if node in self.nodes.lost:
                continue
            strategy = NodeAffinitySchedulingStrategy(node, soft=False)
            waits.append(worker_tasks.remove_spill.options(scheduling_strategy=strategy).remote(self._spill_dir))
        with contextlib.suppress(Exception):  # best effort: a node may be gone
            ray.get(waits, timeout=30)
        shutil.rmtree(self._spill_dir, ignore_errors=True)

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

    def _submit(self, plan: PhysicalPlan, values: Mapping[str, Any], order: tuple[int, ...] | None = None,
                spill_to: Mapping[str, tuple[str | None, ...]] | None = None,
                ) -> tuple[list[ray.ObjectRef], list[ray.ObjectRef]]:
        """Submit every task of ``plan`` (in ``order``, if given); the refs of its outputs and of
        the tasks' records, in plan order. A task in ``spill_to`` writes its results to the paths
        given (None: kept in the object store) and returns ``KeptFile``s for them."""
        cache = self.cache
        uses, returned = self._consumers(plan)
        if self.node_ids:
            self.check_nodes(every=1.0)
        remaining = Counter(uses)
        value_refs = {name: v if nbytes(v) <= INLINE_VALUE_BYTES else ray.put(v) for name, v in values.items()}
        refs: dict[str, list[ray.ObjectRef]] = {}
        records: dict[int, ray.ObjectRef] = {}
        for position in order if order is not None else range(len(plan.tasks)):
            task = plan.tasks[position]
            args = []
            writes = (spill_to or {}).get(task.id)
            streams = writes is not None
            on_disk: str | None = None  # the node whose spill holds a kept block this task maps
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    read = cache.streamed(plan, arg)
                    streams = streams or read is not None
                    if read is None and cache.relocating:
                        cache.relocate(plan, arg, task.node)
                    args.append(read if read is not None else cache.block(plan, arg, task.node))
                elif isinstance(arg, TaskResult):
                    args.append(refs[arg.task][arg.output])
                elif isinstance(arg, CachedBlock):
                    if cache.relocating:
                        cache.relocate_kept(arg, task.node)
                    kept = cache.kept[arg.handle][arg.position]
                    if isinstance(kept, kept_spill.KeptFile):
                        streams, on_disk = True, on_disk or kept.node
                    args.append(kept)
                else:
                    args.append(value_refs[arg.name])
            home = cache.home(plan, task) if self.nodes.lost else None
            holds = sum(task.out_bytes) + sum(block_bytes(a.source) for a in args if isinstance(a, StreamedRead))
            options = {**self.nodes.placement(task.node, home), **self._memory(holds),
                       "name": task.kernel.name}  # in Ray's dashboard and timeline
            if on_disk is not None and on_disk not in self.nodes.lost:
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(on_disk, soft=True)
            if streams:
                options["num_returns"] = task.num_outputs + 1
                *outs, record = worker_tasks.run_streaming.options(**options).remote(
                    task.kernel.fn, task.num_outputs, self.options, writes or (None,) * task.num_outputs, *args)
                records[position] = record
            elif self.measure:
                options["num_returns"] = task.num_outputs + 1
                *outs, record = worker_tasks.run_measured.options(**options).remote(
                    task.kernel.fn, task.num_outputs, *args)
                records[position] = record
            else:
                if task.num_outputs > 1:
                    options["num_returns"] = task.num_outputs
                out = worker_tasks.run_kernel.options(**options).remote(task.kernel.fn, *args)
                outs = out if task.num_outputs > 1 else [out]
            refs[task.id] = outs
            for used in {a.task for a in task.args if isinstance(a, TaskResult)}:
                remaining[used] -= 1
                if remaining[used] == 0 and used not in returned:
                    del refs[used]  # Ray frees it once this task has run
        self.metrics.count_tasks(len(plan.tasks))
        cache.relocated()
        self._recorded = sorted(records)  # the positions of the tasks with records, for ``_remove_results``
        return [refs[o.task][o.output] for o in plan.outputs], [records[i] for i in self._recorded]

    def run(self, plan: PhysicalPlan, values: Mapping[str, Any], order: tuple[int, ...] | None = None,
            spill_results: frozenset[TaskResult] = frozenset()) -> list[Any]:
        writes = self._spill_paths(plan, spill_results, "result")
        outs, records = self._submit(plan, values, order, spill_to={k: tuple(v) for k, v in writes.items()})
        outputs = worker_tasks.fetch(outs)
        if self.cache.loading:
            self.cache.collect_stats()
        got = worker_tasks.fetch(records)
        if self.measure:
            self._measure(plan, values, got, order)
        elif records:  # streaming tasks report their reads even unmeasured
            for record in got:
                self.cache.count_reads(plan, record[4])
        self._remove_results(plan, writes, got)
        return outputs

    def _spill_paths(self, plan: PhysicalPlan, results: frozenset[TaskResult] | set[TaskResult],
                     kind: str) -> dict[str, list[str | None]]:
        """A file in this executor's spill for each of ``results``, by task: a path per result."""
        if not results:
            return {}
        self._spill_used = True
        return spill.result_files(self._spill_dir, plan, results, kind)

    def _remove_results(self, plan: PhysicalPlan, writes: Mapping[str, list[str | None]],
                        records: list[tuple[Any, ...]]) -> None:
        """Remove the files of spilled results once the program is done, on the nodes that
        wrote them (a task each, not waited for: ``close`` removes what is left)."""
        if not writes:
            return
        by_node: dict[str, list[str]] = {}
        for position, record in zip(self._recorded, records, strict=True):
            paths = writes.get(plan.tasks[position].id)
            if paths:
                by_node.setdefault(record[0], []).extend(p for p in paths if p)
        for node, files in by_node.items():
            strategy = NodeAffinitySchedulingStrategy(node, soft=True)
            worker_tasks.remove_files.options(scheduling_strategy=strategy).remote(files)

    def _measure(self, plan: PhysicalPlan, values: Mapping[str, Any],
                 records: list[tuple[Any, ...]], submitted: tuple[int, ...] | None = None,
                 ) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Count the run's retries and lost nodes, then replay it as it happened (tasks in the
        order ``submitted``): bytes moved between nodes, per-node load.

        Returns where each task ran and the bytes of each of its results.
        """
        retried = sum(r[3] for r in records)
        self.metrics.fault("task_retry", retried)
        order = self.node_order
        planned = [None if t.node is None or not self.node_ids else order[t.node % len(order)] for t in plan.tasks]
        strayed = any(p is not None and p != r[0] and p not in self.nodes.lost
                      for p, r in zip(planned, records, strict=True))
        self.check_nodes(every=0.0 if retried or strayed else 1.0)
        self.nodes.rehome(self.cache.block_home, self.cache.kept_home, self.cache.blocks)
        replay(plan, values, records, submitted, self.node_order, self.cache.held(), self.cache.used(plan),
               self.nodes.take_rebuilt(), self.metrics, self.cache.count_reads)
        return {task.id: (r[0], r[1]) for task, r in zip(plan.tasks, records, strict=True)}

    # -- blocks kept between programs (Session.persist) --------------------------------------
    def keep(self, plan: PhysicalPlan, values: Mapping[str, Any], handle: str,
             order: tuple[int, ...] | None = None, spill: bool = False,
             spill_results: frozenset[TaskResult] = frozenset()) -> None:
        kept = set(plan.outputs) if spill else set()  # each to a file of its own, by the task that makes it
        writes = self._spill_paths(plan, kept, f"kept-{handle}")
        results = self._spill_paths(plan, spill_results - kept, "result")
        for task, paths in results.items():
            merged = writes.setdefault(task, paths)
            for i, path in enumerate(paths):
                merged[i] = merged[i] or path
        outs, records = self._submit(plan, values, order, spill_to={k: tuple(v) for k, v in writes.items()})
        if self.cache.loading:
            self.cache.collect_stats()
        got = worker_tasks.fetch(records)  # waits for the tasks, and raises what failed
        homes: list[tuple[str, int] | None] = [None] * len(outs)
        if self.measure:
            ran = self._measure(plan, values, got, order)
            homes = [(ran[o.task][0], ran[o.task][1][o.output]) for o in plan.outputs]
        else:
            ray.wait(outs, num_returns=len(outs), fetch_local=False)
            for record in got:  # streaming tasks report their reads even unmeasured
                self.cache.count_reads(plan, record[4])
        self._remove_results(plan, results, got)
        blocks: list[Any] = list(outs)
        if spill:  # the KeptFiles (a few bytes each) of the results written to the spill
            record = {plan.tasks[p].id: r for p, r in zip(self._recorded, got, strict=True)}
            spilled = [i for i, o in enumerate(plan.outputs) if record[o.task][1][o.output] == 0]
            for i, value in zip(spilled, worker_tasks.fetch([outs[i] for i in spilled]), strict=True):
                if isinstance(value, kept_spill.KeptFile):  # else it stayed in the store (a full disk)
                    blocks[i] = value
        self.cache.hold_kept(handle, blocks, homes)

    def kept_sizes(self, name: str) -> list[tuple[int, int] | None]:
        """For each block kept under ``name`` that is in a spill: (planner node index of its
        node, its bytes); None for one in the object store."""
        return self.cache.kept_sizes(name)

    def admit_kept(self, name: str, positions: list[int]) -> None:
        """Read these spilled blocks of ``name`` into the object store, each on its node."""
        self.cache.admit_kept(name, positions)

    def demote_kept(self, name: str, positions: list[int]) -> None:
        """Use these admitted blocks of ``name`` from their spill again (Ray frees the copies)."""
        self.cache.demote_kept(name, positions)

    def alias(self, name: str, handle: str, positions: range) -> None:
        self.cache.alias(name, handle, positions)

    def release(self, name: str) -> None:
        self.cache.release(name)
