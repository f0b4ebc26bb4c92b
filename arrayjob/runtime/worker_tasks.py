"""What runs on the workers: the Ray tasks ``RayExecutor`` submits, and how a block is sized.

Tasks are pure functions of their arguments, so Ray may retry any of them (``TASK_RETRIES``).

Measurement: each kernel task returns one extra tiny object, its record ``(node id, bytes of
each result, bytes of the args, attempt number)`` and, for a task that reads some of its
blocks itself, what each read cost. Ray inlines the record into the task's reply, so it costs
no object-store traffic and no extra round trip; ``runtime.replay`` reads it.

Faults: every task reports its Ray attempt number (0 on the first execution), so
``faults.task_retries`` counts the executions Ray repeated. A kept block in a spill whose
node is gone fails its task with ``KeptBlockLost`` (exit 5).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np
import ray

from arrayjob import kernels
from arrayjob.errors import ArrayJobError, ClusterError
from arrayjob.io.locations import StorageOptions
from arrayjob.planner.physical import InputArray
from arrayjob.runtime import kept_spill, spill
from arrayjob.runtime.executor import load_and_check
from arrayjob.runtime.spill import StreamedRead

TASK_RETRIES = 3

_node_id: str | None = None  # a worker process never changes node


def this_node() -> str:
    global _node_id
    if _node_id is None:
        _node_id = ray.get_runtime_context().get_node_id()
    return _node_id


def attempt() -> int:
    """This task's Ray attempt number: 0 on its first execution, n on its n-th retry or
    reconstruction. Read from the core worker (the public runtime context has no getter)."""
    core = getattr(ray._private.worker.global_worker, "core_worker", None)
    try:
        return int(core.get_current_task_attempt_number())  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - not in a task, or an older Ray: nothing to count
        return 0


def nbytes(x: Any) -> int:
    """A block's bytes: its arrays', those of the objects in an object array (PageRank's graph
    blocks: SciPy matrices) included."""
    if isinstance(x, np.ndarray) and x.dtype == object:  # e.g. PageRank's graph blocks
        return int(x.nbytes) + sum(nbytes(v) for v in x.flat)
    if isinstance(x, np.ndarray | np.generic):
        return int(x.nbytes)
    if hasattr(x, "indptr") and hasattr(x, "indices") and hasattr(x, "data"):  # a SciPy CSR or CSC matrix
        return int(x.data.nbytes + x.indices.nbytes + x.indptr.nbytes)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return sum(nbytes(getattr(x, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, tuple | list):
        return sum(nbytes(v) for v in x)
    if isinstance(x, dict):
        return sum(nbytes(v) for v in x.values())
    if isinstance(x, bool | int | float | complex):
        return 8
    return sys.getsizeof(x)


class KeptBlockLost(ClusterError):
    """A spilled kept block's node is gone, and its file with it."""


def _read_kept(kept: kept_spill.KeptFile) -> Any:
    try:
        return kept.read()
    except kept_spill.KeptBlockLost as exc:
        raise KeptBlockLost(f"cluster: {exc}, lost with its node; run the job again to build it anew "
                            "(it goes on from its last checkpoint)") from None


def _kept_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with kept blocks that are in a spill (a result of this program's keeping
    tasks) mapped in."""
    if not any(isinstance(a, kept_spill.KeptFile) for a in args):
        return args
    return tuple(_read_kept(a) if isinstance(a, kept_spill.KeptFile) else a for a in args)


def unwrap(exc: ray.exceptions.RayTaskError) -> BaseException:
    """The user-facing error inside a failed Ray task, if it is one of ours."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, ArrayJobError) else exc


def fetch(refs: list[ray.ObjectRef]) -> list[Any]:
    """``ray.get(refs)``, raising the user-facing error of a task that failed with one."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        raise unwrap(exc) from None


@ray.remote(num_returns=2, max_retries=TASK_RETRIES)
def load_block(source: InputArray, index: tuple[int, ...], options: StorageOptions) -> tuple[Any, dict[str, Any]]:
    """A source block read into the object store where this task runs, and its read's stats."""
    if source.array.sparse is not None:
        kernels.start_loops()  # a sparse block's job runs compiled loops: numba starts as this reads
    block, stats = load_and_check(source, index, options)
    stats["node"] = this_node()
    stats["attempt"] = attempt()
    return block, stats


@ray.remote(max_retries=TASK_RETRIES)
def run_kernel(fn: Any, *args: Any) -> Any:
    return kernels.run(fn, *_kept_args(args))


@ray.remote(max_retries=TASK_RETRIES)
def run_measured(fn: Any, num_outputs: int, *args: Any) -> tuple[Any, ...]:
    """``fn(*args)``'s results, then the record ``(node id, bytes of each result, bytes of the
    args, attempt number)``."""
    args = _kept_args(args)
    out = kernels.run(fn, *args)
    outs = tuple(out) if num_outputs > 1 else (out,)
    return (*outs, (this_node(), tuple(nbytes(o) for o in outs), sum(nbytes(a) for a in args), attempt()))


@ray.remote(max_retries=TASK_RETRIES)
def run_streaming(fn: Any, num_outputs: int, options: StorageOptions, spill_to: tuple[str | None, ...],
                  *args: Any) -> tuple[Any, ...]:
    """``run_measured`` for a task some of whose blocks it reads itself (``StreamedRead``, a
    ``KeptFile``), or whose results it writes to its node's spill (``spill_to``: a path per
    result, or None), returning a ``KeptFile`` for each of those. Its record carries what each
    read cost, by block (``{(array, index): stats}``; a kept block's key is ``("kept",
    path)``), and the bytes each result holds in the object store (0 for one spilled)."""
    reads: dict[tuple[str, Any], dict[str, Any]] = {}
    real = []
    for a in args:
        if isinstance(a, StreamedRead):
            block, stats = a.read(options)
            reads[(a.source.array.name, a.index)] = stats
            real.append(block)
        elif isinstance(a, kept_spill.KeptFile):
            real.append(_read_kept(a))
            reads[("kept", a.path)] = {"spill_read": a.nbytes}
        else:
            real.append(a)
    out = kernels.run(fn, *real)
    outs = tuple(out) if num_outputs > 1 else (out,)
    in_bytes = sum(nbytes(a) for a in real)
    del real  # the streamed blocks are freed with the task
    sizes = [nbytes(o) for o in outs]
    if any(spill_to):
        node = this_node()
        written = []
        for o, path, n in zip(outs, spill_to, sizes, strict=True):
            size = spill.write_result(path, o) if path is not None else None
            if path is None or size is None:  # not to be written, or a full disk: in the object store
                written.append(o)
                continue
            reads[("kept-written", path)] = {"spill_written": size}
            written.append(kept_spill.KeptFile(path, node, n))
        outs = tuple(written)
        sizes = [0 if isinstance(o, kept_spill.KeptFile) else n for o, n in zip(outs, sizes, strict=True)]
    return (*outs, (this_node(), tuple(sizes), in_bytes, attempt(), reads))


@ray.remote(max_retries=TASK_RETRIES)
def admit_kept(kept: kept_spill.KeptFile) -> Any:
    """A spilled kept block, read into the object store where this task runs (its node)."""
    return _read_kept(kept)


@ray.remote(max_retries=TASK_RETRIES)
def write_spill(read: StreamedRead, options: StorageOptions) -> dict[str, Any]:
    """Read a streamed block from storage into its node's spill (at load): its stats."""
    _, stats = read.read(options)
    stats["node"] = this_node()
    stats["attempt"] = attempt()
    return stats


@ray.remote(max_retries=TASK_RETRIES)
def copy_block(block: Any) -> Any:
    """``block``, stored again where this task runs: a held block moved to its new node."""
    return block


@ray.remote
def remove_spill(directory: str) -> None:
    spill.remove_directory(directory)


@ray.remote
def remove_files(paths: list[str]) -> None:
    spill.remove_files(paths)
