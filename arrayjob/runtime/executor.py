"""Executors run a ``PhysicalPlan``: read source blocks once, run kernels, return outputs.

``Executor`` is the interface ``Session`` and the runner use. ``LocalExecutor`` runs in this
process (tests, tiny jobs); ``RayExecutor`` (``runtime.ray_executor``) runs each task as a Ray
task on the node the plan names. Both keep source blocks across runs of the same job, so an
iterative job reads each block from storage once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from arrayjob import kernels
from arrayjob.errors import InputError
from arrayjob.io.arrays import read_block
from arrayjob.io.backend import storage_retries
from arrayjob.io.locations import StorageCounters, StorageOptions
from arrayjob.planner.physical import (
    CachedBlock,
    InputArray,
    PhysicalPlan,
    SourceBlock,
    TaskResult,
)
from arrayjob.planner.residency import Residency
from arrayjob.runtime.metrics import RunMetrics


class Executor(ABC):
    """What ``Session`` and the runner need of an executor; ``tests/integration/runtime/test_executor_conformance.py``
    runs the same cases against every implementation.

    Blocks are named three ways: a source block (``SourceBlock``: read from storage, held
    across runs unless streamed), a task's result within one program (``TaskResult``), and a
    kept block (``CachedBlock``: block ``position`` of a name given to ``keep`` or ``alias``,
    held until ``release``).
    """

    metrics: RunMetrics
    # ``keep`` can put kept blocks in a spill (on local disk, out of memory): then
    # ``kept_sizes``, ``admit_kept`` and ``demote_kept`` move them; else those are no-ops
    spills_kept: bool = False

    @abstractmethod
    def load(self, plan: PhysicalPlan, residency: Residency | None = None) -> None:
        """Read every source block of ``plan`` now (and check it), if not already held; with a
        ``residency`` that streams, only its resident blocks (the others are read by their tasks)."""

    @abstractmethod
    def run(self, plan: PhysicalPlan, values: Mapping[str, Any], order: tuple[int, ...] | None = None,
            spill_results: frozenset[TaskResult] = frozenset()) -> list[Any]:
        """Run ``plan`` with the driver values, submitting its tasks in ``order`` if given;
        returns the results named by ``plan.outputs``. ``spill_results`` are written to their
        node's spill by the tasks that make them, and read back in place by their users."""

    @abstractmethod
    def demote(self, blocks: set[tuple[str, SourceBlock]]) -> None:
        """Stream these resident blocks (array URI, block) from now on: drop them from memory."""

    @abstractmethod
    def keep(self, plan: PhysicalPlan, values: Mapping[str, Any], handle: str,
             order: tuple[int, ...] | None = None, spill: bool = False,
             spill_results: frozenset[TaskResult] = frozenset()) -> None:
        """Run ``plan`` (tasks submitted in ``order``, if given) and keep its outputs, unfetched, as
        blocks 0, 1, ... of ``handle``; with ``spill`` (where ``spills_kept``), each in its node's
        spill, not in memory."""

    @abstractmethod
    def kept_sizes(self, name: str) -> list[tuple[int, int] | None]:
        """Per block of ``name``: (planner node, bytes) if it is in a spill, else None."""

    @abstractmethod
    def admit_kept(self, name: str, positions: list[int]) -> None:
        """Bring these spilled blocks of ``name`` into memory (those not spilled stay as they are)."""

    @abstractmethod
    def demote_kept(self, name: str, positions: list[int]) -> None:
        """Use these admitted blocks of ``name`` from their spill again, dropping them from memory."""

    @abstractmethod
    def alias(self, name: str, handle: str, positions: range) -> None:
        """Name blocks ``positions`` of ``handle`` as blocks 0, 1, ... of ``name``."""

    @abstractmethod
    def release(self, name: str) -> None:
        """Forget the blocks kept under ``name`` (a block another name holds stays)."""

    @abstractmethod
    def nodes_now(self) -> int | None:
        """The nodes to plan the next program on, when the executor follows a cluster whose
        nodes come and go (binding planner nodes to them); None: the plan's own count."""

    @abstractmethod
    def check_nodes(self) -> None:
        """Count the nodes lost since the last check (the runner calls it before its report)."""

    @abstractmethod
    def close(self) -> None:
        """Drop what the executor keeps outside the object store (a spill of streamed blocks)."""


def load_and_check(source: InputArray, index: tuple[int, ...], options: StorageOptions) -> tuple[Any, dict[str, Any]]:
    """Read one block of a source and check it; runs wherever the block is to live. A block
    of a sparse source is a SciPy CSR matrix: its stored values are checked, and its bytes
    are those of its three arrays."""
    selection = source.grid.selection(index)
    retries = storage_retries()
    block, counters = read_block(source.array, selection, options)
    retries = storage_retries() - retries  # this process runs one read at a time
    where = ", ".join(f"{s.start}:{s.stop}" for s in selection)
    values = block if isinstance(block, np.ndarray) else block.data
    if values.dtype.kind in "fc" and not np.isfinite(values).all():
        raise InputError(f"inputs.{source.array.name}: NaN or infinite values in [{where}] of {source.array.uri}")
    if source.check is not None:
        problem = kernels.run(source.check.fn, block)
        if problem:
            raise InputError(f"inputs.{source.array.name}: {problem} in [{where}] of {source.array.uri}")
    held = values.nbytes if isinstance(block, np.ndarray) else values.nbytes + block.indices.nbytes + block.indptr.nbytes
    return block, {"nbytes": int(held), "storage_retries": retries, **counters.as_dict()}


class LocalExecutor(Executor):
    """Runs the plan in this process, one task at a time, in the order given (else plan order)."""

    def __init__(self, options: StorageOptions, metrics: RunMetrics | None = None) -> None:
        self.options = options
        self.metrics = metrics or RunMetrics()
        self._blocks: dict[tuple[InputArray, tuple[int, ...]], np.ndarray] = {}
        self._kept: dict[str, list[Any]] = {}
        self._streaming = False  # under a budget: blocks not loaded are read at each use
        self._read_once: set[tuple[InputArray, tuple[int, ...]]] = set()

    def nodes_now(self) -> int | None:
        return None  # one process: nothing comes or goes

    def check_nodes(self) -> None:
        pass  # one process: no node to lose

    def _block(self, plan: PhysicalPlan, ref: SourceBlock, hold: bool = False) -> np.ndarray:
        """``ref``'s block: held, or read now; kept unless streaming (``hold``: keep it anyway)."""
        source = plan.source(ref.array)
        key = (source, ref.index)
        if key not in self._blocks:
            block, stats = load_and_check(source, ref.index, self.options)
            self.metrics.count_storage(_counters(stats))
            if self._streaming and not hold:
                reread = stats["nbytes"] if key in self._read_once else 0
                self._read_once.add(key)
                self.metrics.count_stream(reread=reread, reread_requests=stats["get_requests"] if reread else 0)
                return block
            self.metrics.hold_block("local", stats["nbytes"])
            self._blocks[key] = block
        return self._blocks[key]

    def load(self, plan: PhysicalPlan, residency: Residency | None = None) -> None:
        streams = residency is not None and residency.streams
        for source in plan.sources:
            for index in source.grid.indices():
                ref = SourceBlock(source.array.name, index)
                if not streams or ref in residency.resident:  # type: ignore[union-attr]
                    self._block(plan, ref, hold=True)
        self._streaming = self._streaming or streams  # from now on, blocks not held are read at each use

    def demote(self, blocks: set[tuple[str, SourceBlock]]) -> None:
        self._streaming = True
        for source, index in list(self._blocks):
            if (source.array.uri, SourceBlock(source.array.name, index)) in blocks:
                self.metrics.hold_block("local", -int(self._blocks.pop((source, index)).nbytes))
                self._read_once.add((source, index))

    def close(self) -> None:
        pass

    spills_kept = False  # one process: kept blocks are in its memory

    def keep(self, plan: PhysicalPlan, values: Mapping[str, Any], handle: str,
             order: tuple[int, ...] | None = None, spill: bool = False,
             spill_results: frozenset[TaskResult] = frozenset()) -> None:
        self._kept[handle] = self.run(plan, values, order)

    def kept_sizes(self, name: str) -> list[tuple[int, int] | None]:
        return [None] * len(self._kept[name])

    def admit_kept(self, name: str, positions: list[int]) -> None:
        pass

    def demote_kept(self, name: str, positions: list[int]) -> None:
        pass

    def alias(self, name: str, handle: str, positions: range) -> None:
        self._kept[name] = [self._kept[handle][p] for p in positions]

    def release(self, name: str) -> None:
        self._kept.pop(name, None)

    def run(self, plan: PhysicalPlan, values: Mapping[str, Any], order: tuple[int, ...] | None = None,
            spill_results: frozenset[TaskResult] = frozenset()) -> list[Any]:
        results: dict[str, tuple[Any, ...]] = {}
        for position in order if order is not None else range(len(plan.tasks)):
            task = plan.tasks[position]
            args = []
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    args.append(self._block(plan, arg))
                elif isinstance(arg, TaskResult):
                    args.append(results[arg.task][arg.output])
                elif isinstance(arg, CachedBlock):
                    args.append(self._kept[arg.handle][arg.position])
                else:
                    args.append(values[arg.name])
            out = kernels.run(task.kernel.fn, *args)
            results[task.id] = out if task.num_outputs > 1 else (out,)
        self.metrics.count_tasks(len(plan.tasks))
        return [results[o.task][o.output] for o in plan.outputs]


def _counters(stats: Mapping[str, Any]) -> StorageCounters:
    return StorageCounters(**{k: stats[k] for k in StorageCounters.__dataclass_fields__ if k in stats})

