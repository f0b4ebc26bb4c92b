"""A node's spill: the files an executor writes on a node's local disk instead of memory.

Under a memory budget (``planner.residency``) three kinds of block live there, each in the
executor's own directory (``reaper.spill_directory``; removed by its ``close``, or by the
watchdog if the driver is killed outright):

- a streamed source block: a ``.npy`` file, written by the load (or the first task that
  reads it) and mapped read-only from the page cache by each use (``StreamedRead``);
- a task's result spilled so that a program's intermediates fit: written by the task that
  makes it, read in place by its users, removed once the program is done;
- a kept block (``Session.persist``) that does not fit: the same, in ``runtime.kept_spill``'s
  format, until released.

These are the file operations themselves, run inside Ray tasks on the node whose disk it is
(``runtime.worker_tasks``), and the names of the files, chosen on the driver. No Ray here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from typing import Any

import numpy as np

from arrayjob.io.locations import StorageOptions
from arrayjob.planner.physical import InputArray, PhysicalPlan, TaskResult
from arrayjob.runtime import kept_spill
from arrayjob.runtime.executor import load_and_check


class StreamedRead:
    """A block a task reads itself: from ``spill`` (a file on its node) if there, else from
    storage, writing ``spill`` then if one is planned."""

    __slots__ = ("index", "source", "spill")

    def __init__(self, source: InputArray, index: tuple[int, ...], spill: str | None) -> None:
        self.source, self.index, self.spill = source, index, spill

    def __reduce__(self) -> tuple[Any, ...]:
        return StreamedRead, (self.source, self.index, self.spill)

    def read(self, options: StorageOptions) -> tuple[Any, dict[str, Any]]:
        sparse = self.source.array.sparse is not None
        if self.spill is not None:
            with contextlib.suppress(FileNotFoundError, ValueError, OSError):
                # mapped, not copied: the task reads the node's page cache in place (read-only,
                # as blocks from the object store are); a sparse block's three arrays likewise
                if sparse:
                    block = kept_spill.read(self.spill)
                    return block, {"spill_read": self.source.array.block_nbytes(self.source.grid.selection(self.index))}
                block = np.asarray(np.load(self.spill, mmap_mode="r", allow_pickle=False))  # a plain ndarray view
                return block, {"spill_read": int(block.nbytes)}
        block, stats = load_and_check(self.source, self.index, options)
        if self.spill is not None:
            with contextlib.suppress(OSError):  # a full disk: the next use reads storage again
                if sparse:
                    kept_spill.write(self.spill, block)
                else:
                    os.makedirs(os.path.dirname(self.spill), exist_ok=True)
                    partial = f"{self.spill}.{os.getpid()}.tmp.npy"
                    np.save(partial, block, allow_pickle=False)
                    os.replace(partial, self.spill)
                stats["spill_written"] = int(stats["nbytes"])
        return block, stats


def write_result(path: str, value: Any) -> int | None:
    """Write a task's result to ``path`` (``kept_spill``'s format): the file's bytes, or None if
    the disk refused it (full: the result stays in the object store)."""
    try:
        return kept_spill.write(path, value)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(f"{path}.{os.getpid()}.tmp")
        return None


def remove_directory(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def remove_files(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.remove(path)


def block_file(directory: str, source: InputArray, index: tuple[int, ...]) -> str:
    """The spill file of a streamed source block (the same name on every node)."""
    name = f"{source.array.name}-{'.'.join(map(str, index))}-{abs(hash(source)):x}.npy"
    return os.path.join(directory, name)


def result_files(directory: str, plan: PhysicalPlan, results: frozenset[TaskResult] | set[TaskResult],
                 kind: str) -> dict[str, list[str | None]]:
    """A fresh file in ``directory`` for each of ``results``, by task: a path per result of the
    task (None for those not written)."""
    outputs = {t.id: t.num_outputs for t in plan.tasks}
    writes: dict[str, list[str | None]] = {}
    for r in sorted(results, key=lambda r: (r.task, r.output)):
        paths = writes.setdefault(r.task, [None] * outputs[r.task])
        paths[r.output] = os.path.join(directory, f"{kind}-{uuid.uuid4().hex}.bin")
    return writes
