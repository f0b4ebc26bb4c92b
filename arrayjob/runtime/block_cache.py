"""The block cache of ``RayExecutor``: the blocks it holds between programs, and where they are.

Stored blocks are read by Ray tasks (on the workers, straight from storage) and kept in the
object store for the life of the executor; kernels receive them zero-copy. Blocks kept
between programs (``Session.persist``: ``keep``, ``alias``, ``release``) stay in the object
store where their tasks ran, and later plans take them zero-copy. Each held block has a home
(its node and bytes), which the measurement replay (``runtime.replay``) counts from.

Memory budget (``planner.residency``): a ``load`` given a ``Residency`` that streams reads
only the resident blocks into the object store. A streamed block (and, from then on, any
block not resident) is read by the task that uses it, on its worker, from the node's own
spill of it when the plan says so (``runtime.spill``: written by the load, one task per block)
or else from storage; it never enters the object store and is freed when its task ends. The
first read of a block from storage is a read, any later one a re-read
(``RunMetrics.bytes_reread``).

Kept blocks under a budget: a kept block written to its node's spill is held as a
``KeptFile`` (a few bytes); ``admit_kept`` reads it into the object store (a task on its
node), ``demote_kept`` drops it back to the file. A spilled kept block has no lineage: if its
node is lost, the task that needs it fails with ``KeptBlockLost``.

After a node loss, ``NodeWatch.rehome`` moves the homes of held blocks Ray rebuilt elsewhere.
After the nodes change (a sized cluster), a held block first used on another node is moved
there once, or read again there (a kept block, being a result, is always moved).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from arrayjob.io.locations import StorageCounters, StorageOptions
from arrayjob.planner.physical import CachedBlock, InputArray, PhysicalPlan, SourceBlock, Task
from arrayjob.planner.residency import Residency
from arrayjob.runtime import kept_spill, spill, worker_tasks
from arrayjob.runtime.metrics import RunMetrics
from arrayjob.runtime.node_watch import NodeWatch
from arrayjob.runtime.spill import StreamedRead

BlockKey = tuple[InputArray, tuple[int, ...]]


def block_bytes(source: InputArray) -> int:
    """The bytes of a full block of ``source``, as read (a sparse source: its largest block)."""
    if source.array.sparse is not None:
        return max((source.array.block_nbytes(source.grid.selection(i)) for i in source.grid.indices()), default=0)
    return math.prod(source.grid.block_shape) * np.dtype(source.array.dtype).itemsize


class BlockCache:
    """Held source blocks (by source and index) and kept blocks (by name), with their homes.

    ``place(node, nbytes)`` gives the Ray options of a task planned on ``node`` holding
    ``nbytes`` (the executor's placement); ``relocate(nbytes)`` says whether a held source
    block whose first use moved to another node is moved there (``"move"``) or read again
    there (``"read"``).
    """

    def __init__(self, options: StorageOptions, metrics: RunMetrics, nodes: NodeWatch, spill_dir: str,
                 place: Callable[[int | None, int], dict[str, Any]], relocate: Callable[[int], str]) -> None:
        self.options = options
        self.metrics = metrics
        self.nodes = nodes
        self.spill_dir = spill_dir
        self.place = place
        self.relocate_as = relocate
        self.blocks: dict[BlockKey, ray.ObjectRef] = {}
        self.block_home: dict[BlockKey, tuple[str, int]] = {}  # node id and bytes, as read
        self._pending_stats: list[tuple[BlockKey, ray.ObjectRef]] = []
        # Session.persist's blocks, by name: an object ref, or a KeptFile for one in a spill
        self.kept: dict[str, list[Any]] = {}
        # where a kept block is, and its bytes in the object store (0 for a KeptFile)
        self.kept_home: dict[Any, tuple[str, int]] = {}
        self._kept_file: dict[ray.ObjectRef, kept_spill.KeptFile] = {}  # admitted: the file it came from
        # the memory budget: blocks streamed (read by their tasks), with their spill file if planned
        self.streaming = False
        self.stream: dict[BlockKey, str | None] = {}
        self._read_once: set[BlockKey] = set()  # streamed blocks read from storage at least once
        # after the nodes changed: the next run's plan may put held blocks' first uses elsewhere
        self.relocating = False
        self._relocated: set[Any] = set()  # block keys and kept blocks looked at since the nodes changed

    # -- source blocks -----------------------------------------------------------------------
    def block(self, plan: PhysicalPlan, ref: SourceBlock, node: int | None) -> ray.ObjectRef:
        """``ref``'s block in the object store: held, or read now by a task on ``node``."""
        source = plan.source(ref.array)
        key = (source, ref.index)
        if key not in self.blocks:
            refs = worker_tasks.load_block.options(**self.place(node, block_bytes(source))).remote(
                source, ref.index, self.options)
            block, stats = cast(tuple[ray.ObjectRef, ray.ObjectRef], refs)  # num_returns=2
            self.blocks[key] = block
            self._pending_stats.append((key, stats))
            self.metrics.count_tasks(1)
        return self.blocks[key]

    def load(self, plan: PhysicalPlan, residency: Residency | None = None) -> None:
        """Read ``plan``'s source blocks into the object store, each by a task on its first
        user's node; under a ``residency`` that streams, only the resident ones (the streamed
        ones into their node's spill, if the residency says so)."""
        first_use: dict[SourceBlock, int | None] = {}
        for task in plan.tasks:
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    first_use.setdefault(arg, task.node)
        spilled: list[tuple[SourceBlock, int | None]] = []
        if residency is not None and residency.streams:
            self.streaming = True
            for ref in residency.streamed:
                source = plan.source(ref.array)
                self.stream[(source, ref.index)] = spill.block_file(self.spill_dir, source, ref.index) \
                    if residency.source == "spill" else None
            if residency.source == "spill":
                spilled = [(ref, node) for ref, node in first_use.items() if ref in residency.streamed]
            first_use = {ref: node for ref, node in first_use.items() if ref in residency.resident}
        for ref, node in first_use.items():
            self.block(plan, ref, node)
        self._spill(plan, spilled)
        self.collect_stats()

    def _spill(self, plan: PhysicalPlan, blocks: list[tuple[SourceBlock, int | None]]) -> None:
        """Read streamed blocks from storage into the spill of the node that uses them, now:
        the load reads every block once (the resident ones into the object store), and the
        iterations that follow bring every streamed block back from the spill alike."""
        if not blocks:
            return
        waits = []
        for ref, node in blocks:
            source = plan.source(ref.array)
            read = StreamedRead(source, ref.index, self.stream[(source, ref.index)])
            task = worker_tasks.write_spill.options(**self.nodes.placement(node), name="spill block")
            waits.append((read, task.remote(read, self.options)))
        for (read, _), stats in zip(waits, worker_tasks.fetch([w for _, w in waits]), strict=True):
            self.metrics.fault("task_retry", stats.get("attempt", 0))
            self.count_reads(plan, {(read.source.array.name, read.index): stats})
        self.metrics.count_tasks(len(blocks))

    @property
    def loading(self) -> bool:
        """Whether block reads were submitted whose stats are not collected yet."""
        return bool(self._pending_stats)

    def collect_stats(self) -> None:
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
                for ref, stats in zip(ready, worker_tasks.fetch(ready), strict=True):
                    self._count_block(by_ref[ref], stats)
                    loaded, nbytes = loaded + 1, nbytes + stats["bytes_read"]
                if ready and (not waiting or time.monotonic() - told >= 0.5):
                    told = time.monotonic()
                    self.metrics.emit("blocks", loaded=loaded, total=len(pending), bytes_read=nbytes)
        except BaseException:
            self._forget_loads([(key, ref) for key, ref in pending if key not in self.block_home])
            raise

    def _count_block(self, key: BlockKey, stats: dict[str, Any]) -> None:
        counters = StorageCounters(**{k: stats[k] for k in StorageCounters.__dataclass_fields__})
        self.metrics.count_storage(counters)
        self.metrics.fault("task_retry", stats.get("attempt", 0))
        self.metrics.fault("storage_retry", stats.get("storage_retries", 0))
        self.metrics.hold_block(stats["node"], stats["nbytes"])
        self.block_home[key] = (stats["node"], stats["nbytes"])

    def _forget_loads(self, pending: list[tuple[BlockKey, ray.ObjectRef]]) -> None:
        """After a failed read the job stops: drop the other reads' blocks, so Ray frees each
        as soon as its read ends. They are not cancelled: ``ray.cancel`` of a task that is
        finishing races with its completion in Ray's core worker (Ray 2.60, ray-project/ray
        #54846) and ends the driver process with a failed check; each read is one chunk."""
        for key, _ in pending:
            self.blocks.pop(key, None)

    def streamed(self, plan: PhysicalPlan, ref: SourceBlock) -> StreamedRead | None:
        """The read a task makes itself of ``ref``, if it is not held (under a budget)."""
        source = plan.source(ref.array)
        key = (source, ref.index)
        if not self.streaming or key in self.blocks:
            return None
        return StreamedRead(source, ref.index, self.stream.setdefault(key, None))

    def demote(self, blocks: set[tuple[str, SourceBlock]]) -> None:
        """Stream these resident blocks (array URI, block) from now on: their refs are dropped
        (Ray frees them), their tasks read them (from storage: they were read once already)."""
        self.streaming = True
        for key in [k for k in self.blocks if (k[0].array.uri, SourceBlock(k[0].array.name, k[1])) in blocks]:
            del self.blocks[key]
            node, nbytes = self.block_home.pop(key, (None, 0))
            if node is not None:
                self.metrics.block_bytes_by_node[node] -= nbytes
            self.stream[key] = None
            self._read_once.add(key)

    def count_reads(self, plan: PhysicalPlan, reads: Mapping[tuple[str, tuple[int, ...]], Mapping[str, Any]]) -> None:
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

    # -- kept blocks (Session.persist) -------------------------------------------------------
    def hold_kept(self, handle: str, blocks: list[Any], homes: list[tuple[str, int] | None]) -> None:
        """Keep ``blocks`` (refs, or ``KeptFile``s) as blocks 0, 1, ... of ``handle``, each at its
        home (node and bytes in the object store; None: not known, unmeasured)."""
        for block, home in zip(blocks, homes, strict=True):
            if isinstance(block, kept_spill.KeptFile):
                self.kept_home[block] = (block.node, 0)
            elif home is not None:
                self.kept_home[block] = home
        self.kept[handle] = blocks

    def kept_sizes(self, name: str) -> list[tuple[int, int] | None]:
        """For each block kept under ``name`` that is in a spill: (planner node index of its
        node, its bytes); None for one in the object store."""
        order = self.nodes.order
        return [(order.index(b.node) if b.node in order else 0, b.nbytes)
                if isinstance(b, kept_spill.KeptFile) else None for b in self.kept[name]]

    def _swap_kept(self, old: Any, new: Any, home: tuple[str, int]) -> None:
        """Put ``new`` wherever ``old`` is kept, under every name."""
        for refs in self.kept.values():
            for i, ref in enumerate(refs):
                if ref == old:
                    refs[i] = new
        self.kept_home.pop(old, None)
        self.kept_home[new] = home

    def admit_kept(self, name: str, positions: list[int]) -> None:
        """Read these spilled blocks of ``name`` into the object store, each on its node."""
        refs = []
        for p in positions:
            kept = self.kept[name][p]
            if not isinstance(kept, kept_spill.KeptFile):
                continue
            strategy = NodeAffinitySchedulingStrategy(kept.node, soft=True)
            ref = worker_tasks.admit_kept.options(scheduling_strategy=strategy, name="admit kept block").remote(kept)
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
            ref = self.kept[name][p]
            kept = self._kept_file.pop(ref, None) if not isinstance(ref, kept_spill.KeptFile) else None
            if kept is not None:
                self._swap_kept(ref, kept, (kept.node, 0))

    def alias(self, name: str, handle: str, positions: range) -> None:
        self.kept[name] = [self.kept[handle][p] for p in positions]

    def release(self, name: str) -> None:
        dropped = set(self.kept.pop(name, ()))
        still = {ref for refs in self.kept.values() for ref in refs}
        for ref in dropped - still:
            self.kept_home.pop(ref, None)
            self._kept_file.pop(ref, None)

    # -- where held blocks are -----------------------------------------------------------------
    def held(self) -> dict[Any, tuple[str, int]]:
        """Everything held (source block keys, kept blocks), and its home."""
        return {**self.block_home, **self.kept_home}

    def used(self, plan: PhysicalPlan) -> dict[Any, SourceBlock | CachedBlock]:
        """The held blocks ``plan`` uses: the cache's key -> the plan's argument."""
        used: dict[Any, SourceBlock | CachedBlock] = {}
        for task in plan.tasks:
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    used.setdefault((plan.source(arg.array), arg.index), arg)
                elif isinstance(arg, CachedBlock):
                    used.setdefault(self.kept[arg.handle][arg.position], arg)
        return used

    def home(self, plan: PhysicalPlan, task: Task) -> str | None:
        """The node holding most of ``task``'s held blocks (source or kept), by bytes, if known."""
        held: Counter[str] = Counter()
        for arg in task.args:
            if isinstance(arg, SourceBlock):
                found = self.block_home.get((plan.source(arg.array), arg.index))
            elif isinstance(arg, CachedBlock):
                found = self.kept_home.get(self.kept[arg.handle][arg.position])
            else:
                continue
            if found is not None and found[0] not in self.nodes.lost:
                held[found[0]] += found[1]
        return held.most_common(1)[0][0] if held else None

    def relocate(self, plan: PhysicalPlan, ref: SourceBlock, node: int | None) -> None:
        """At the first run after the nodes changed: a held block first used on another node
        than its home is moved there, or read again there, whichever ``relocate`` says."""
        key = (plan.source(ref.array), ref.index)
        if node is None or key in self._relocated or key not in self.block_home:
            return
        self._relocated.add(key)
        target = self.nodes.node_of(node)
        home, nbytes = self.block_home[key]
        if home == target or home in self.nodes.lost:
            return
        if self.relocate_as(nbytes) == "read":
            del self.blocks[key]  # ``block`` reads it on ``node`` now
            self.metrics.hold_block(home, -nbytes)
            return
        strategy = NodeAffinitySchedulingStrategy(target, soft=True)
        self.blocks[key] = worker_tasks.copy_block.options(scheduling_strategy=strategy, name="move block").remote(
            self.blocks[key])
        self.block_home[key] = (target, nbytes)
        self.metrics.count_moved(home, target, nbytes)
        self.metrics.count_tasks(1)

    def relocate_kept(self, arg: CachedBlock, node: int | None) -> None:
        """At the first run after the nodes changed: a kept block (computed, so never read
        again) first used on another node than its home is moved there once, instead of
        fetched by every later use; every name it is kept under follows it."""
        old = self.kept[arg.handle][arg.position]
        found = self.kept_home.get(old)
        if node is None or old in self._relocated or found is None or isinstance(old, kept_spill.KeptFile):
            return  # a spilled block stays on its node's disk: its tasks go there
        self._relocated.add(old)
        home, nbytes = found
        target = self.nodes.node_of(node)
        if home == target or home in self.nodes.lost:
            return
        strategy = NodeAffinitySchedulingStrategy(target, soft=True)
        new = worker_tasks.copy_block.options(scheduling_strategy=strategy, name="move block").remote(old)
        self._swap_kept(old, new, (target, nbytes))
        self._relocated.add(new)
        self.metrics.count_moved(home, target, nbytes, held=False)
        self.metrics.count_tasks(1)

    def relocated(self) -> None:
        """The run after the nodes changed is submitted: its blocks are where it uses them."""
        self.relocating = False
        self._relocated.clear()
