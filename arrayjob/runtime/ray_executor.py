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

Faults: every task reports its Ray attempt number (0 on the first execution; in the load
stats or the record), so ``faults.task_retries`` counts the executions Ray repeated. The
executor watches the cluster's nodes (``ray.nodes()``, at most once a second, and at once
when a task reports a retry or ran away from its planned node): a node alive when the
executor started, or seen since, that is no longer alive is lost. A task planned on a lost
node is pinned (softly) to the node holding most of its held blocks' bytes now, or left to
Ray's scheduler if none is known: Ray's own fallback for a dead node ignores where the
arguments are, and moved a whole block every iteration. A held block (source or kept) whose home was a lost node is looked up again
(``ray.experimental.get_object_locations``) after the next run, when Ray has rebuilt it
from its lineage: it is re-homed there (so the replay counts what moves from where the
block is, not from a dead node) and counted in ``faults.blocks_reconstructed``.

Blocks kept between programs (``Session.persist``: ``keep``, ``alias``, ``release``) stay
in the object store where their tasks ran, and later plans take them zero-copy. After the
nodes change, a kept block first used on another node is moved there once (it is a result,
so it cannot be read again). A block's bytes are its arrays', those of the objects in an
object array (PageRank's graph blocks: SciPy matrices) included.

Memory budget (``planner.residency``): a ``load`` given a ``Residency`` that streams reads
only the resident blocks into the object store. A streamed block (and, from then on, any
block not resident) is read by the task that uses it, on its worker, from the node's own
spill of it when the plan says so (a ``.npy`` file on local disk, written by the load, one
task per block, and mapped read-only from the page cache by each use) or else from
storage; it never enters the object store and is freed when its task ends. Tasks are submitted in the planner's order, so blocks are read while others compute.
Each streaming task reports its reads in its record; the first read of a block from storage
is a read, any later one a re-read (``RunMetrics.bytes_reread``). The spill is removed by
``close``.

Kept blocks under a budget (``keep(..., spill=True)``): every kept block is written by the
task that made it to its node's spill (``runtime.kept_spill``: pickled with its arrays out
of band, mapped back in place) and the executor holds a ``KeptFile`` for it, a few bytes.
``admit_kept`` reads the ones the session keeps resident into the object store (a task on
their node); ``demote_kept`` drops them back to the file. A task using a spilled kept block
runs on the node that has the file and maps it itself, as it does a streamed source block.
A spilled kept block has no lineage: if its node is lost, the task that needs it fails
with ``KeptBlockLost`` (exit 5), and a rerun of the job builds it again and goes on from
the last checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from arrayjob import kernels
from arrayjob.errors import ArrayJobError, ClusterError
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
from arrayjob.planner.residency import Residency
from arrayjob.runtime import kept_spill, reaper
from arrayjob.runtime.executor import load_and_check
from arrayjob.runtime.metrics import RunMetrics
from arrayjob.runtime.scaling import worker_ids

TASK_RETRIES = 3
# Driver values up to this size go to the tasks by value, inside the task (Ray inlines
# arguments under 100 KiB): a scalar or a weight vector costs no object-store put per
# compute (about 1 ms each, `benchmarks/bench_micro.py ray-returns`).
INLINE_VALUE_BYTES = 64 * 2**10
# A task whose results and own reads come to at least this many bytes declares them as Ray's
# ``memory`` resource: Ray then runs no more such tasks on a node than its memory holds, and an
# autoscaler sees the demand. Smaller tasks declare only their CPU, as Ray's default.
BIG_TASK_BYTES = 64 * 2**20
BlockKey = tuple[Source, tuple[int, ...]]

_node_id: str | None = None  # a worker process never changes node


def _this_node() -> str:
    global _node_id
    if _node_id is None:
        _node_id = ray.get_runtime_context().get_node_id()
    return _node_id


def _attempt() -> int:
    """This task's Ray attempt number: 0 on its first execution, n on its n-th retry or
    reconstruction. Read from the core worker (the public runtime context has no getter)."""
    core = getattr(ray._private.worker.global_worker, "core_worker", None)
    try:
        return int(core.get_current_task_attempt_number())  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - not in a task, or an older Ray: nothing to count
        return 0


def _nbytes(x: Any) -> int:
    if isinstance(x, np.ndarray) and x.dtype == object:  # e.g. PageRank's graph blocks
        return int(x.nbytes) + sum(_nbytes(v) for v in x.flat)
    if isinstance(x, np.ndarray | np.generic):
        return int(x.nbytes)
    if hasattr(x, "indptr") and hasattr(x, "indices") and hasattr(x, "data"):  # a SciPy CSR or CSC matrix
        return int(x.data.nbytes + x.indices.nbytes + x.indptr.nbytes)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return sum(_nbytes(getattr(x, f.name)) for f in dataclasses.fields(x))
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
    stats["attempt"] = _attempt()
    return block, stats


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


@ray.remote(max_retries=TASK_RETRIES)
def _run_kernel(fn: Any, *args: Any) -> Any:
    return kernels.run(fn, *_kept_args(args))


@ray.remote(max_retries=TASK_RETRIES)
def _run_measured(fn: Any, num_outputs: int, *args: Any) -> tuple[Any, ...]:
    """``fn(*args)``'s results, then the record ``(node id, bytes of each result, bytes of the
    args, attempt number)``."""
    args = _kept_args(args)
    out = kernels.run(fn, *args)
    outs = tuple(out) if num_outputs > 1 else (out,)
    return (*outs, (_this_node(), tuple(_nbytes(o) for o in outs), sum(_nbytes(a) for a in args), _attempt()))


class StreamedRead:
    """A block a task reads itself: from ``spill`` (a file on its node) if there, else from
    storage, writing ``spill`` then if one is planned."""

    __slots__ = ("index", "source", "spill")

    def __init__(self, source: Source, index: tuple[int, ...], spill: str | None) -> None:
        self.source, self.index, self.spill = source, index, spill

    def __reduce__(self) -> tuple[Any, ...]:
        return StreamedRead, (self.source, self.index, self.spill)

    def read(self, options: StorageOptions) -> tuple[np.ndarray, dict[str, Any]]:
        if self.spill is not None:
            with contextlib.suppress(FileNotFoundError, ValueError, OSError):
                # mapped, not copied: the task reads the node's page cache in place (read-only,
                # as blocks from the object store are)
                block = np.asarray(np.load(self.spill, mmap_mode="r", allow_pickle=False))  # a plain ndarray view
                return block, {"spill_read": int(block.nbytes)}
        block, stats = load_and_check(self.source, self.index, options)
        if self.spill is not None:
            with contextlib.suppress(OSError):  # a full disk: the next use reads storage again
                os.makedirs(os.path.dirname(self.spill), exist_ok=True)
                partial = f"{self.spill}.{os.getpid()}.tmp.npy"
                np.save(partial, block, allow_pickle=False)
                os.replace(partial, self.spill)
                stats["spill_written"] = int(block.nbytes)
        return block, stats


@ray.remote(max_retries=TASK_RETRIES)
def _run_streaming(fn: Any, num_outputs: int, options: StorageOptions, spill: tuple[str | None, ...],
                   *args: Any) -> tuple[Any, ...]:
    """``_run_measured`` for a task some of whose blocks it reads itself (``StreamedRead``, a
    ``KeptFile``), or whose results it writes to its node's spill (``spill``: a path per
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
    in_bytes = sum(_nbytes(a) for a in real)
    del real  # the streamed blocks are freed with the task
    sizes = [_nbytes(o) for o in outs]
    if any(spill):
        node = _this_node()
        written = []
        for o, path, n in zip(outs, spill, sizes, strict=True):
            if path is None:
                written.append(o)
                continue
            try:
                reads[("kept-written", path)] = {"spill_written": kept_spill.write(path, o)}
            except OSError:  # a full disk: this result stays in the object store
                with contextlib.suppress(OSError):
                    os.remove(f"{path}.{os.getpid()}.tmp")
                written.append(o)
                continue
            written.append(kept_spill.KeptFile(path, node, n))
        outs = tuple(written)
        sizes = [0 if isinstance(o, kept_spill.KeptFile) else n for o, n in zip(outs, sizes, strict=True)]
    return (*outs, (_this_node(), tuple(sizes), in_bytes, _attempt(), reads))


@ray.remote(max_retries=TASK_RETRIES)
def _admit_kept(kept: kept_spill.KeptFile) -> Any:
    """A spilled kept block, read into the object store where this task runs (its node)."""
    return _read_kept(kept)


@ray.remote(max_retries=TASK_RETRIES)
def _write_spill(read: StreamedRead, options: StorageOptions) -> dict[str, Any]:
    """Read a streamed block from storage into its node's spill (at load): its stats."""
    _, stats = read.read(options)
    stats["node"] = _this_node()
    stats["attempt"] = _attempt()
    return stats


@ray.remote
def _remove_spill(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


@ray.remote
def _remove_files(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.remove(path)


def _least_memory(nodes: list[dict[str, Any]]) -> float:
    """The smallest ``memory`` resource among alive nodes with CPUs (0 if one has none)."""
    amounts = [float((n.get("Resources") or {}).get("memory", 0)) for n in nodes
               if n.get("Alive") and (n.get("Resources") or {}).get("CPU", 0) > 0]
    return min(amounts, default=0.0)


def _block_bytes(source: Source) -> int:
    """The bytes of a full block of ``source``, as read."""
    return math.prod(source.grid.block_shape) * np.dtype(source.array.dtype).itemsize


def _unwrap(exc: ray.exceptions.RayTaskError) -> BaseException:
    """The user-facing error inside a failed Ray task, if it is one of ours."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, ArrayJobError) else exc


@ray.remote(max_retries=TASK_RETRIES)
def _copy(block: Any) -> Any:
    """``block``, stored again where this task runs: a held block moved to its new node."""
    return block


class RayExecutor:
    def __init__(self, options: StorageOptions, node_ids: tuple[str, ...] = (),
                 metrics: RunMetrics | None = None, *, measure: bool = True, follow_nodes: bool = False,
                 relocate: Callable[[int], str] = lambda nbytes: "move") -> None:
        self.options = options
        self.node_ids = node_ids
        self.metrics = metrics or RunMetrics()
        self.measure = measure
        # a sized cluster: planner nodes are bound to the live worker nodes at each program,
        # and a held block whose first use moved to another node goes there ("move", a copy
        # from node to node) or is read again there ("read"), as ``relocate(bytes)`` says
        self.follow_nodes = follow_nodes
        self.relocate = relocate
        self._relocating = False
        self._relocated: set[Any] = set()  # block keys and kept blocks looked at since the nodes changed
        self._blocks: dict[BlockKey, ray.ObjectRef] = {}
        self._block_home: dict[BlockKey, tuple[str, int]] = {}  # node id and bytes, as read
        self._pending_stats: list[tuple[BlockKey, ray.ObjectRef]] = []
        self._order: list[str] | None = None
        self._uses: dict[int, tuple[PhysicalPlan, Counter[str], frozenset[str]]] = {}
        # Session.persist's blocks, by name: an object ref, or a KeptFile for one in a spill
        self._kept: dict[str, list[Any]] = {}
        # where a kept block is, and its bytes in the object store (0 for a KeptFile)
        self._kept_home: dict[Any, tuple[str, int]] = {}
        self._kept_file: dict[ray.ObjectRef, kept_spill.KeptFile] = {}  # admitted: the file it came from
        self._spill_used = False  # kept blocks or results were written to the spill (close removes it)
        self._recorded: list[int] = []
        # nodes: seen alive (at the start or since), lost; held blocks whose home was lost
        self._seen: set[str] = set(node_ids)
        self._lost: set[str] = set()
        self._orphans: set[Any] = set()
        self._rebuilt: dict[Any, set[str]] = {}  # found again since the last replay: every node with a copy
        self._watched = 0.0
        self._workers: set[str] = set(node_ids)
        self._memory_cap: float | None = None  # the least ``memory`` resource of a worker node
        # the memory budget: blocks streamed (read by their tasks), with their spill file if planned
        self._streaming = False
        self._stream: dict[BlockKey, str | None] = {}
        self._read_once: set[BlockKey] = set()  # streamed blocks read from storage at least once
        # a private Ray's: named by its owner token, so the watchdog removes it if this process
        # is killed outright (``runtime.reaper``); a cluster's nodes keep theirs until ``close``
        self._spill_dir = os.path.join(reaper.spill_directory(os.environ.get(reaper.OWNER_VARIABLE, "")),
                                       uuid.uuid4().hex)
        if node_ids:
            self.check_nodes()

    # -- nodes -----------------------------------------------------------------------------
    @property
    def node_order(self) -> list[str]:
        """Ray node ids by planner node index: the driver's node first."""
        if self._order is None:
            driver = ray.get_runtime_context().get_node_id()
            ids = list(self.node_ids)
            self._order = [driver, *(n for n in ids if n != driver)] if driver in ids or not ids else ids
        return self._order

    def nodes_now(self) -> int | None:
        """Bind planner nodes to the worker nodes alive now, keeping the order of those that
        stay (their blocks' homes keep their indices) and adding those that joined after
        them; a node gone is a lost node (``check_nodes``). None unless following nodes."""
        if not self.follow_nodes:
            return None
        self.check_nodes()
        live = self._workers
        order = [n for n in self.node_order if n in live] + sorted(live - set(self.node_order))
        if order and order != self.node_order:
            self._order, self.node_ids = order, tuple(order)
            self._relocating = True  # the next run's plan may put held blocks' first uses elsewhere
        return len(self.node_order)

    def _relocate(self, plan: PhysicalPlan, ref: SourceBlock, node: int | None) -> None:
        """At the first run after the nodes changed: a held block first used on another node
        than its home is moved there, or read again there, whichever ``relocate`` says."""
        key = (plan.source(ref.array), ref.index)
        if node is None or key in self._relocated or key not in self._block_home:
            return
        self._relocated.add(key)
        target = self.node_order[node % len(self.node_order)]
        home, nbytes = self._block_home[key]
        if home == target or home in self._lost:
            return
        if self.relocate(nbytes) == "read":
            del self._blocks[key]  # ``_block`` reads it on ``node`` now
            self.metrics.hold_block(home, -nbytes)
            return
        strategy = NodeAffinitySchedulingStrategy(target, soft=True)
        self._blocks[key] = _copy.options(scheduling_strategy=strategy, name="move block").remote(self._blocks[key])
        self._block_home[key] = (target, nbytes)
        self.metrics.count_moved(home, target, nbytes)
        self.metrics.count_tasks(1)

    def _options(self, node: int | None, home: str | None = None) -> dict[str, Any]:
        """Where a task planned on ``node`` runs: there, or, if that node is lost, on ``home``
        (``_home``: where most of its held blocks are now), else where Ray's scheduler puts it."""
        if node is None or not self.node_ids:
            return {}
        order = self.node_order
        target = order[node % len(order)]
        if target in self._lost:
            if home is None or home in self._lost:
                return {}
            target = home
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(target, soft=True)}

    def _memory(self, nbytes: int) -> dict[str, Any]:
        """Ray's ``memory`` resource for a task holding ``nbytes`` in its worker (results, own
        reads), when big; never more than the smallest worker node has (a task no node
        can hold would wait forever)."""
        if nbytes < BIG_TASK_BYTES:
            return {}
        if self._memory_cap is None:
            self._memory_cap = _least_memory(ray.nodes())
        return {"memory": min(nbytes, int(self._memory_cap))} if self._memory_cap else {}

    def _home(self, plan: PhysicalPlan, task: Any) -> str | None:
        """The node holding most of ``task``'s held blocks (source or kept), by bytes, if known."""
        held: Counter[str] = Counter()
        for arg in task.args:
            if isinstance(arg, SourceBlock):
                found = self._block_home.get((plan.source(arg.array), arg.index))
            elif isinstance(arg, CachedBlock):
                found = self._kept_home.get(self._kept[arg.handle][arg.position])
            else:
                continue
            if found is not None and found[0] not in self._lost:
                held[found[0]] += found[1]
        return held.most_common(1)[0][0] if held else None

    # -- faults ------------------------------------------------------------------------------
    def check_nodes(self, *, every: float = 0.0) -> None:
        """Count the nodes lost since the last check (at most one check per ``every`` seconds)."""
        now = time.monotonic()
        if now - self._watched < every:
            return
        self._watched = now
        nodes = ray.nodes()
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        self._workers = worker_ids(nodes)
        self._memory_cap = _least_memory(nodes)
        if self.metrics.nodes is not None:
            self.metrics.nodes.observe(self._workers)
        lost = sorted(self._seen - alive - self._lost)
        for node in sorted((alive - self._seen) & self._workers):  # a head without CPUs runs no block
            self.metrics.emit("node_joined", node=node)
        self._seen |= alive
        for node in lost:
            self._lost.add(node)
            self.metrics.fault("node_lost", node=node)
        if lost:
            self._orphans |= {key for key, (home, _) in self._block_home.items() if home in self._lost}
            self._orphans |= {ref for ref, (home, _) in self._kept_home.items()
                              if home in self._lost and not isinstance(ref, kept_spill.KeptFile)}

    def _rehome(self) -> None:
        """Find where Ray rebuilt the held blocks that lived on a lost node."""
        if not self._orphans:
            return
        keys = [k for k in self._orphans if k in self._block_home or k in self._kept_home]
        refs = [self._blocks[k] if k in self._block_home else k for k in keys]
        from ray.experimental import get_object_locations

        try:
            where = get_object_locations(refs, timeout_ms=10_000)
        except Exception:  # noqa: BLE001 - not known yet: looked up after the next run
            return
        rebuilt = 0
        for key, ref in zip(keys, refs, strict=True):
            nodes = [n for n in (where.get(ref) or {}).get("node_ids") or [] if n not in self._lost]
            if not nodes:
                continue  # not rebuilt yet (Ray does it when a task needs it)
            homes = self._block_home if key in self._block_home else self._kept_home
            self._rebuilt[key] = {homes[key][0], *nodes}
            homes[key] = (nodes[0], homes[key][1])
            self._orphans.discard(key)
            rebuilt += 1
        self._orphans &= set(keys)  # forget blocks no longer held
        self.metrics.fault("block_reconstructed", rebuilt)

    # -- source blocks -----------------------------------------------------------------------
    def _block(self, plan: PhysicalPlan, ref: SourceBlock, node: int | None) -> ray.ObjectRef:
        source = plan.source(ref.array)
        key = (source, ref.index)
        if key not in self._blocks:
            options = {**self._options(node), **self._memory(_block_bytes(source))}
            block, stats = _load.options(**options).remote(source, ref.index, self.options)
            self._blocks[key] = block
            self._pending_stats.append((key, stats))
            self.metrics.count_tasks(1)
        return self._blocks[key]

    def _collect_stats(self) -> None:
        """Wait for the pending block reads, counting each as it lands: a ``blocks`` event
        (loaded of total, bytes so far) at most every half second and at the end."""
        pending, self._pending_stats = self._pending_stats, []
        by_ref = {ref: key for key, ref in pending}
        waiting = [ref for _, ref in pending]
        loaded = nbytes = 0
        told = time.monotonic()
        try:
            while waiting:
                ready, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=0.5)
                # ray.get raises at the first failed read: the rest are not waited for
                for ref, stats in zip(ready, self._get(ready), strict=True):
                    self._count_block(by_ref[ref], stats)
                    loaded, nbytes = loaded + 1, nbytes + stats["bytes_read"]
                if ready and (not waiting or time.monotonic() - told >= 0.5):
                    told = time.monotonic()
                    self.metrics.emit("blocks", loaded=loaded, total=len(pending), bytes_read=nbytes)
        except BaseException:
            self._forget_loads([(key, ref) for key, ref in pending if key not in self._block_home])
            raise

    def _count_block(self, key: BlockKey, stats: dict[str, Any]) -> None:
        counters = StorageCounters(**{k: stats[k] for k in StorageCounters.__dataclass_fields__})
        self.metrics.count_storage(counters)
        self.metrics.fault("task_retry", stats.get("attempt", 0))
        self.metrics.fault("storage_retry", stats.get("storage_retries", 0))
        self.metrics.hold_block(stats["node"], stats["nbytes"])
        self._block_home[key] = (stats["node"], stats["nbytes"])

    def _forget_loads(self, pending: list[tuple[BlockKey, ray.ObjectRef]]) -> None:
        """After a failed read the job stops: drop the other reads' blocks, so Ray frees each
        as soon as its read ends. They are not cancelled: ``ray.cancel`` of a task that is
        finishing races with its completion in Ray's core worker (Ray 2.60, ray-project/ray
        #54846) and ends the driver process with a failed check; each read is one chunk."""
        for key, _ in pending:
            self._blocks.pop(key, None)

    def _get(self, refs: list[ray.ObjectRef]) -> list[Any]:
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as exc:
            raise _unwrap(exc) from None

    def load(self, plan: PhysicalPlan, residency: Residency | None = None) -> None:
        first_use: dict[SourceBlock, int | None] = {}
        for task in plan.tasks:
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    first_use.setdefault(arg, task.node)
        spilled: list[tuple[SourceBlock, int | None]] = []
        if residency is not None and residency.streams:
            self._streaming = True
            for ref in residency.streamed:
                source = plan.source(ref.array)
                name = f"{source.array.name}-{'.'.join(map(str, ref.index))}-{abs(hash(source)):x}.npy"
                self._stream[(source, ref.index)] = os.path.join(self._spill_dir, name) \
                    if residency.source == "spill" else None
            if residency.source == "spill":
                spilled = [(ref, node) for ref, node in first_use.items() if ref in residency.streamed]
            first_use = {ref: node for ref, node in first_use.items() if ref in residency.resident}
        for ref, node in first_use.items():
            self._block(plan, ref, node)
        self._spill(plan, spilled)
        self._collect_stats()

    def _spill(self, plan: PhysicalPlan, blocks: list[tuple[SourceBlock, int | None]]) -> None:
        """Read streamed blocks from storage into the spill of the node that uses them, now:
        the load reads every block once (the resident ones into the object store), and the
        iterations that follow bring every streamed block back from the spill alike."""
        if not blocks:
            return
        waits = []
        for ref, node in blocks:
            source = plan.source(ref.array)
            read = StreamedRead(source, ref.index, self._stream[(source, ref.index)])
            waits.append((read, _write_spill.options(**self._options(node), name="spill block").remote(read, self.options)))
        for (read, _), stats in zip(waits, self._get([w for _, w in waits]), strict=True):
            self.metrics.fault("task_retry", stats.get("attempt", 0))
            self._count_reads(plan, {(read.source.array.name, read.index): stats})
        self.metrics.count_tasks(len(blocks))

    def _streamed(self, plan: PhysicalPlan, ref: SourceBlock) -> StreamedRead | None:
        """The read a task makes itself of ``ref``, if it is not held (under a budget)."""
        source = plan.source(ref.array)
        key = (source, ref.index)
        if not self._streaming or key in self._blocks:
            return None
        return StreamedRead(source, ref.index, self._stream.setdefault(key, None))

    def demote(self, blocks: set[tuple[str, SourceBlock]]) -> None:
        """Stream these resident blocks (array URI, block) from now on: their refs are dropped
        (Ray frees them), their tasks read them (from storage: they were read once already)."""
        self._streaming = True
        for key in [k for k in self._blocks if (k[0].array.uri, SourceBlock(k[0].array.name, k[1])) in blocks]:
            del self._blocks[key]
            node, nbytes = self._block_home.pop(key, (None, 0))
            if node is not None:
                self.metrics.block_bytes_by_node[node] -= nbytes
            self._stream[key] = None
            self._read_once.add(key)

    def close(self) -> None:
        """Remove this executor's spill of streamed and kept blocks, on every node."""
        if not any(self._stream.values()) and not self._spill_used:
            return
        waits = []
        for node in self.node_order if self.node_ids else []:
            if node in self._lost:
                continue
            strategy = NodeAffinitySchedulingStrategy(node, soft=False)
            waits.append(_remove_spill.options(scheduling_strategy=strategy).remote(self._spill_dir))
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

    def _relocate_kept(self, arg: CachedBlock, node: int | None) -> None:
        """At the first run after the nodes changed: a kept block (computed, so never read
        again) first used on another node than its home is moved there once, instead of
        fetched by every later use; every name it is kept under follows it."""
        old = self._kept[arg.handle][arg.position]
        found = self._kept_home.get(old)
        if node is None or old in self._relocated or found is None or isinstance(old, kept_spill.KeptFile):
            return  # a spilled block stays on its node's disk: its tasks go there
        self._relocated.add(old)
        home, nbytes = found
        target = self.node_order[node % len(self.node_order)]
        if home == target or home in self._lost:
            return
        strategy = NodeAffinitySchedulingStrategy(target, soft=True)
        new = _copy.options(scheduling_strategy=strategy, name="move block").remote(old)
        for refs in self._kept.values():
            for i, ref in enumerate(refs):
                if ref == old:
                    refs[i] = new
        del self._kept_home[old]
        self._kept_home[new] = (target, nbytes)
        self._relocated.add(new)
        self.metrics.count_moved(home, target, nbytes, held=False)
        self.metrics.count_tasks(1)

    def _submit(self, plan: PhysicalPlan, values: Mapping[str, Any], order: tuple[int, ...] | None = None,
                spill: Mapping[str, tuple[str | None, ...]] | None = None,
                ) -> tuple[list[ray.ObjectRef], list[ray.ObjectRef]]:
        """Submit every task of ``plan`` (in ``order``, if given); the refs of its outputs and of
        the tasks' records, in plan order. A task in ``spill`` writes its results to the paths
        given (None: kept in the object store) and returns ``KeptFile``s for them."""
        uses, returned = self._consumers(plan)
        if self.node_ids:
            self.check_nodes(every=1.0)
        remaining = Counter(uses)
        value_refs = {name: v if _nbytes(v) <= INLINE_VALUE_BYTES else ray.put(v) for name, v in values.items()}
        refs: dict[str, list[ray.ObjectRef]] = {}
        records: dict[int, ray.ObjectRef] = {}
        for position in order if order is not None else range(len(plan.tasks)):
            task = plan.tasks[position]
            args = []
            writes = (spill or {}).get(task.id)
            streams = writes is not None
            on_disk: str | None = None  # the node whose spill holds a kept block this task maps
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    read = self._streamed(plan, arg)
                    streams = streams or read is not None
                    if read is None and self._relocating:
                        self._relocate(plan, arg, task.node)
                    args.append(read if read is not None else self._block(plan, arg, task.node))
                elif isinstance(arg, TaskResult):
                    args.append(refs[arg.task][arg.output])
                elif isinstance(arg, CachedBlock):
                    if self._relocating:
                        self._relocate_kept(arg, task.node)
                    kept = self._kept[arg.handle][arg.position]
                    if isinstance(kept, kept_spill.KeptFile):
                        streams, on_disk = True, on_disk or kept.node
                    args.append(kept)
                else:
                    args.append(value_refs[arg.name])
            home = self._home(plan, task) if self._lost else None
            holds = sum(task.out_bytes) + sum(_block_bytes(a.source) for a in args if isinstance(a, StreamedRead))
            options = {**self._options(task.node, home), **self._memory(holds),
                       "name": task.kernel.name}  # in Ray's dashboard and timeline
            if on_disk is not None and on_disk not in self._lost:
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(on_disk, soft=True)
            if streams:
                options["num_returns"] = task.num_outputs + 1
                *outs, record = _run_streaming.options(**options).remote(
                    task.kernel.fn, task.num_outputs, self.options, writes or (None,) * task.num_outputs, *args)
                records[position] = record
            elif self.measure:
                options["num_returns"] = task.num_outputs + 1
                *outs, record = _run_measured.options(**options).remote(task.kernel.fn, task.num_outputs, *args)
                records[position] = record
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
        self._relocating = False
        self._relocated.clear()
        self._recorded = sorted(records)  # the positions of the tasks with records, for ``_remove_results``
        return [refs[o.task][o.output] for o in plan.outputs], [records[i] for i in self._recorded]

    def run(self, plan: PhysicalPlan, values: Mapping[str, Any], order: tuple[int, ...] | None = None,
            spill_results: frozenset[TaskResult] = frozenset()) -> list[Any]:
        writes = self._spill_paths(plan, spill_results, "result")
        outs, records = self._submit(plan, values, order, spill={k: tuple(v) for k, v in writes.items()})
        outputs = self._get(outs)
        if self._pending_stats:
            self._collect_stats()
        got = self._get(records)
        if self.measure:
            self._measure(plan, values, got, order)
        elif records:  # streaming tasks report their reads even unmeasured
            for record in got:
                self._count_reads(plan, record[4])
        self._remove_results(plan, writes, got)
        return outputs

    def _spill_paths(self, plan: PhysicalPlan, results: frozenset[TaskResult] | set[TaskResult],
                     kind: str) -> dict[str, list[str | None]]:
        """A file in this executor's spill for each of ``results``, by task: a path per result."""
        if not results:
            return {}
        self._spill_used = True
        outputs = {t.id: t.num_outputs for t in plan.tasks}
        writes: dict[str, list[str | None]] = {}
        for r in sorted(results, key=lambda r: (r.task, r.output)):
            paths = writes.setdefault(r.task, [None] * outputs[r.task])
            paths[r.output] = os.path.join(self._spill_dir, f"{kind}-{uuid.uuid4().hex}.bin")
        return writes

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
        for node, paths in by_node.items():
            strategy = NodeAffinitySchedulingStrategy(node, soft=True)
            _remove_files.options(scheduling_strategy=strategy).remote(paths)

    def _count_reads(self, plan: PhysicalPlan, reads: Mapping[tuple[str, tuple[int, ...]], Mapping[str, Any]]) -> None:
        """Count a streaming task's own block reads: storage (a read, or a re-read after the
        block's first) or the node's spill."""
        for (name, index), stats in reads.items():
            if "spill_read" in stats:
                self.metrics.count_stream(spill_read=stats["spill_read"])
                continue
            if name == "kept-written":
                self.metrics.count_stream(spill_written=stats["spill_written"])
                continue
            key = (plan.source(name), index)
            counters = StorageCounters(**{k: stats[k] for k in StorageCounters.__dataclass_fields__})
            self.metrics.count_storage(counters)
            self.metrics.fault("storage_retry", stats.get("storage_retries", 0))
            reread = stats["nbytes"] if key in self._read_once else 0
            self._read_once.add(key)
            self.metrics.count_stream(reread=reread, reread_requests=counters.get_requests if reread else 0,
                                      spill_written=stats.get("spill_written", 0))

    # -- blocks kept between programs (Session.persist) --------------------------------------
    spills_kept = True

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
        outs, records = self._submit(plan, values, order, spill={k: tuple(v) for k, v in writes.items()})
        if self._pending_stats:
            self._collect_stats()
        got = self._get(records)  # waits for the tasks, and raises what failed
        if self.measure:
            ran = self._measure(plan, values, got, order)
            homes = [ran[o.task] for o in plan.outputs]
        else:
            ray.wait(outs, num_returns=len(outs), fetch_local=False)
            for record in got:  # streaming tasks report their reads even unmeasured
                self._count_reads(plan, record[4])
            homes = []
        self._remove_results(plan, results, got)
        kept: list[Any] = list(outs)
        if spill:  # the KeptFiles (a few bytes each) of the results written to the spill
            record = {plan.tasks[p].id: r for p, r in zip(self._recorded, got, strict=True)}
            spilled = [i for i, o in enumerate(plan.outputs) if record[o.task][1][o.output] == 0]
            for i, value in zip(spilled, self._get([outs[i] for i in spilled]), strict=True):
                if isinstance(value, kept_spill.KeptFile):  # else it stayed in the store (a full disk)
                    kept[i] = value
        for i, (block, o) in enumerate(zip(kept, plan.outputs, strict=True)):
            if isinstance(block, kept_spill.KeptFile):
                self._kept_home[block] = (block.node, 0)
            elif homes:
                node, out_bytes = homes[i]
                self._kept_home[block] = (node, out_bytes[o.output])
        self._kept[handle] = kept

    def kept_sizes(self, name: str) -> list[tuple[int, int] | None]:
        """For each block kept under ``name`` that is in a spill: (planner node index of its
        node, its bytes); None for one in the object store."""
        order = self.node_order
        return [(order.index(b.node) if b.node in order else 0, b.nbytes)
                if isinstance(b, kept_spill.KeptFile) else None for b in self._kept[name]]

    def _swap_kept(self, old: Any, new: Any, home: tuple[str, int]) -> None:
        for refs in self._kept.values():
            for i, ref in enumerate(refs):
                if ref == old:
                    refs[i] = new
        self._kept_home.pop(old, None)
        self._kept_home[new] = home

    def admit_kept(self, name: str, positions: list[int]) -> None:
        """Read these spilled blocks of ``name`` into the object store, each on its node."""
        refs = []
        for p in positions:
            kept = self._kept[name][p]
            if not isinstance(kept, kept_spill.KeptFile):
                continue
            strategy = NodeAffinitySchedulingStrategy(kept.node, soft=True)
            ref = _admit_kept.options(scheduling_strategy=strategy, name="admit kept block").remote(kept)
            self._kept_file[ref] = kept
            self._swap_kept(kept, ref, (kept.node, kept.nbytes))
            refs.append(ref)
        if refs:
            ray.wait(refs, num_returns=len(refs), fetch_local=False)
            self.metrics.count_tasks(len(refs))
            self.metrics.count_stream(spill_read=sum(self._kept_file[r].nbytes for r in refs))

    def demote_kept(self, name: str, positions: list[int]) -> None:
        """Use these admitted blocks of ``name`` from their spill again (Ray frees the copies)."""
        for p in positions:
            ref = self._kept[name][p]
            kept = self._kept_file.pop(ref, None) if not isinstance(ref, kept_spill.KeptFile) else None
            if kept is not None:
                self._swap_kept(ref, kept, (kept.node, 0))

    def alias(self, name: str, handle: str, positions: range) -> None:
        self._kept[name] = [self._kept[handle][p] for p in positions]

    def release(self, name: str) -> None:
        dropped = set(self._kept.pop(name, ()))
        still = {ref for refs in self._kept.values() for ref in refs}
        for ref in dropped - still:
            self._kept_home.pop(ref, None)
            self._kept_file.pop(ref, None)

    def _measure(self, plan: PhysicalPlan, values: Mapping[str, Any],
                 records: list[tuple[Any, ...]], submitted: tuple[int, ...] | None = None,
                 ) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Replay the run as it happened (tasks in the order ``submitted``): bytes moved between
        nodes, per-node load.

        Returns where each task ran and the bytes of each of its results.
        """
        order = list(self.node_order)
        retried = sum(r[3] for r in records)
        self.metrics.fault("task_retry", retried)
        planned = [None if t.node is None or not self.node_ids else order[t.node % len(order)] for t in plan.tasks]
        strayed = any(p is not None and p != r[0] and p not in self._lost for p, r in zip(planned, records, strict=True))
        self.check_nodes(every=0.0 if retried or strayed else 1.0)
        self._rehome()
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
        task_nodes = [node_index(r[0]) for r in records]
        held_nodes = {key: node_index(node) for key, (node, _) in held.items()}
        value_bytes = {a.name: _nbytes(values[a.name]) for t in plan.tasks for a in t.args
                       if isinstance(a, DriverValue) and a.name in values}
        load = ClusterLoad(plan, len(order), driver_node=0, value_bytes=value_bytes)
        for key, (_, nbytes) in held.items():
            if key in used:
                load.hold(used[key], held_nodes[key], nbytes)
            else:
                load.reserve(held_nodes[key], nbytes)
        # A block rebuilt during this run was on the lost node until it died and is on the
        # nodes that have it now: its uses in this run are not counted as moves (Ray rebuilt
        # it from storage, counted in faults.blocks_reconstructed).
        rebuilt, self._rebuilt = self._rebuilt, {}
        for key, nodes in rebuilt.items():
            if key in used:
                load.copies[used[key]] |= {node_index(n) for n in nodes}
        touched = 0
        for position in submitted if submitted is not None else range(len(plan.tasks)):
            task, node, record = plan.tasks[position], task_nodes[position], records[position]
            _, out_bytes, in_bytes = record[:3]
            if len(record) > 4:  # a streaming task: its own reads live in the worker, not the store
                self._count_reads(plan, record[4])
                for arg in task.args:
                    if isinstance(arg, SourceBlock) and arg not in load.home:
                        load.hold(arg, node, 0)
            load.run(task, node, out_bytes)
            touched += in_bytes + sum(out_bytes)

        def by_node(counts: list[int]) -> dict[str, int]:
            return {order[i]: n for i, n in enumerate(counts) if n}

        self.metrics.count_placement(
            moved=load.moved, touched=touched, tasks=by_node(load.tasks), net_in=by_node(load.net_in),
            net_out=by_node(load.net_out), peak=by_node(load.peak),
        )
        return {task.id: (r[0], r[1]) for task, r in zip(plan.tasks, records, strict=True)}
