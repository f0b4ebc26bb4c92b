"""One model of a job's memory under a budget, read by the run and by the estimate.

A job runs programs in order: loads of stored blocks, computes, persists (kept arrays) and
releases. Under a memory budget per node, each program needs decisions before it runs:

- which of the stored blocks it reads first stay resident and which are streamed, and from
  where (``residency.plan_residency``: Belady over the known schedule);
- whether the arrays it keeps go to the nodes' spill first (they do not fit beside what is
  resident, or inputs already stream);
- which of its results go to the spill so its intermediates fit beside what is resident
  (``residency.spilled_results``), and which resident blocks must stream from now on where
  they still do not (``residency.demotions``);
- the order its tasks are submitted in, when some blocks stream (``residency.task_order``);
- after a persist or a release: which kept blocks in the spill are read back into memory.

``MemoryModel`` makes them, from the plans alone, and returns each program's decisions as a
``ProgramMemory``. ``runtime.Session`` applies them to the executor; ``costing.estimate``
feeds the job's declared passes through the same model and prices what it decides. The
only input that can differ between the two is the size of a kept block in the spill: a run
passes what its workers wrote, the estimate the plan's size of it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from arrayjob.planner.physical import CachedBlock, PhysicalPlan, SourceBlock, TaskResult
from arrayjob.planner.plan import ClusterShape
from arrayjob.planner.residency import (
    SPILL_RESULT_MIN_BYTES,
    Residency,
    StreamRates,
    demotions,
    intermediate_peak,
    plan_residency,
    spilled_results,
    task_order,
)

StoredKey = tuple[str, SourceBlock]  # a stored block of a job: (array URI, block)


@dataclass(frozen=True)
class KeptBlock:
    """Block ``position`` of the kept array ``name`` (``handle:output``)."""

    name: str
    position: int


MemoryKey = StoredKey | KeptBlock


@dataclass(frozen=True)
class MemoryBudget:
    """What a job's block cache may hold: ``bytes`` per node for input blocks, kept blocks and
    intermediates, for programs run ``repeats`` times (an iterative job's ``max_iter``), and
    where streamed blocks come back from (``residency.StreamRates``)."""

    bytes: int
    repeats: int = 1
    rates: StreamRates | None = None


@dataclass(frozen=True)
class ProgramMemory:
    """What the model decided for one program before it runs (see the module docstring)."""

    how: str  # "load" | "compute" | "persist"
    residency: Residency | None = None  # the split of blocks no earlier program decided
    read_now: bool = False  # the executor sets up the split before the program runs
    kept_to_spill: bool = False  # a persist's results go to the nodes' spill
    spilled_results: frozenset[TaskResult] = frozenset()
    demoted: frozenset[StoredKey] = frozenset()  # resident stored blocks streamed from now on
    demoted_kept: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # back to the spill
    order: tuple[int, ...] | None = None  # task submission order (None: the plan's)
    streamed: frozenset[SourceBlock] = frozenset()  # its stored blocks not in memory as it runs
    kept_from_spill: frozenset[KeptBlock] = frozenset()  # its kept blocks read from the spill
    resident_bytes: tuple[int, ...] = ()  # per node, input and kept blocks in memory as it runs
    intermediate_peak: tuple[int, ...] = ()  # per node, its own results held at once

    def summary(self) -> dict[str, object]:
        """The decisions, block by block, in plain values (what the run and the estimate compare)."""
        r = self.residency
        return {
            "how": self.how,
            "resident": sorted((b.array, b.index) for b in r.resident) if r else None,
            "streamed_from": r.source if r and r.streams else None,
            "kept_to_spill": self.kept_to_spill,
            "spilled_results": sorted((t.task, t.output) for t in self.spilled_results),
            "demoted": sorted((uri, b.array, b.index) for uri, b in self.demoted),
            "demoted_kept": {k: list(v) for k, v in sorted(self.demoted_kept.items())},
            "streamed": sorted((b.array, b.index) for b in self.streamed),
            "kept_from_spill": sorted((k.name, k.position) for k in self.kept_from_spill),
        }


@dataclass(frozen=True)
class Admission:
    """Kept blocks read back from the spill into memory after a persist or a release."""

    after: str  # "persist" | "release"
    positions: Mapping[str, tuple[int, ...]]


class MemoryModel:
    """The decisions of a job's programs under ``budget`` on ``cluster`` (no budget: none).

    ``spills``: kept blocks and results may be written to the nodes' spill (an executor that
    can, and rates that leave room on the nodes' disks). ``log`` holds every program's
    decisions and every admission, in order.
    """

    def __init__(self, budget: MemoryBudget | None, cluster: ClusterShape, *, spills: bool) -> None:
        self.budget = budget
        self.cluster = cluster  # the nodes programs are placed on now (a sized cluster follows them)
        rates = budget.rates if budget is not None else None
        self.spills = spills and (rates is None or rates.spill_capacity > 0)
        nodes = max(1, cluster.nodes)
        self.residencies: list[Residency] = []  # one per split, in order
        # stored blocks (URI, block) and kept blocks in memory -> (node, bytes), in the order admitted
        self.resident: dict[MemoryKey, tuple[int, int]] = {}
        self.resident_bytes = [0] * nodes
        self.streamed: set[StoredKey] = set()
        self.kept_spilled: dict[str, list[tuple[int, int]]] = {}  # kept arrays in a spill: per block
        self.kept_held: dict[str, list[int]] = {}  # kept arrays in memory from the start: bytes per node
        self.reserve = [0] * nodes  # the most intermediates seen, per node
        self.log: list[ProgramMemory | Admission] = []
        # per program (by identity; a job's plans are cached, so its iterations hit): the
        # submission order, and the make-room decisions for how it keeps its outputs
        self._orders: dict[int, tuple[PhysicalPlan, frozenset[SourceBlock], tuple[int, ...] | None]] = {}
        self._rooms: dict[int, tuple[PhysicalPlan, tuple[bool, bool], tuple[int, ...], tuple[int, ...],
                                     frozenset[TaskResult]]] = {}

    @property
    def nodes(self) -> int:
        """The nodes the model keeps books for (those of the first program)."""
        return len(self.resident_bytes)

    # -- programs ----------------------------------------------------------------------------
    def load(self, physical: PhysicalPlan) -> ProgramMemory:
        """A program whose stored blocks are read now, to stay for later programs: its split
        under the budget. Raises ``residency.BudgetError`` if a block cannot fit even streamed."""
        residency = self._split(physical)
        if residency is not None:
            self._admit(physical, residency)
        return self._record(ProgramMemory("load", residency=residency, read_now=True,
                                          resident_bytes=tuple(self.resident_bytes)))

    def run(self, physical: PhysicalPlan, *, keeps: bool = False) -> ProgramMemory:
        """A program about to run (``keeps``: a persist, its results kept for later programs)."""
        if self.budget is None:
            return self._record(ProgramMemory("persist" if keeps else "compute"))
        residency, read_now = self._decide(physical, keeps)
        to_spill = keeps and self._spills_kept(physical)
        spilled, demoted, demoted_kept, peaks = self._make_room(physical, keeps, to_spill)
        streamed, order = self._streaming(physical)
        return self._record(ProgramMemory(
            "persist" if keeps else "compute", residency=residency, read_now=read_now, kept_to_spill=to_spill,
            spilled_results=spilled, demoted=demoted, demoted_kept=demoted_kept, order=order,
            streamed=streamed, kept_from_spill=self._kept_from_spill(physical),
            resident_bytes=tuple(self.resident_bytes), intermediate_peak=peaks))

    def keep(self, physical: PhysicalPlan, arrays: Sequence[tuple[str, int]], decided: ProgramMemory,
             measured: Mapping[str, Sequence[tuple[int, int] | None]] | None = None) -> Mapping[str, tuple[int, ...]]:
        """A persist of ``physical`` kept ``arrays`` (each kept array's name and block count, in
        the order of the program's outputs), as ``decided``. In the spill: their blocks' (node,
        bytes), ``measured`` by the run or else the plan's, and those that fit are read back
        (returned, by array); in memory: they take the budget's room by the plan's sizes."""
        if self.budget is None:
            return {}
        outputs = iter(self._made(physical, physical.outputs))
        planned = {name: list(itertools.islice(outputs, count)) for name, count in arrays}
        if decided.kept_to_spill:
            for name, blocks in planned.items():
                sizes = (measured or {}).get(name)
                self.kept_spilled[name] = [s or (0, 0) for s in sizes] if sizes is not None else blocks
            return self._admit_kept("persist")
        for name, blocks in planned.items():
            held = [0] * self.nodes
            for node, nbytes in blocks:
                held[node] += nbytes
            self.kept_held[name] = held
            self.resident_bytes = [a + b for a, b in zip(self.resident_bytes, held, strict=True)]
        return {}

    def release(self, names: Iterable[str]) -> Mapping[str, tuple[int, ...]]:
        """Kept arrays freed: their room goes to spilled kept blocks that fit (returned, by array)."""
        freed = False
        for name in names:
            held = self.kept_held.pop(name, None)
            if held is not None:
                self.resident_bytes = [a - b for a, b in zip(self.resident_bytes, held, strict=True)]
                freed = True
            if self.kept_spilled.pop(name, None) is not None:
                for key in [k for k in self.resident if isinstance(k, KeptBlock) and k.name == name]:
                    node, nbytes = self.resident.pop(key)
                    self.resident_bytes[node] -= nbytes
                freed = True
        if freed and self.kept_spilled and self.budget is not None:
            return self._admit_kept("release")
        return {}

    def follow(self, cluster: ClusterShape) -> None:
        """Programs are placed on ``cluster`` from now on (a sized cluster's nodes came or went)."""
        self.cluster = cluster

    # -- the decisions -------------------------------------------------------------------------
    def _record(self, decision: ProgramMemory) -> ProgramMemory:
        self.log.append(decision)
        return decision

    def _key(self, physical: PhysicalPlan, block: SourceBlock) -> StoredKey:
        return physical.source(block.array).array.uri, block

    def _split(self, physical: PhysicalPlan, keeps: bool = False) -> Residency | None:
        """The planner's split of ``physical``'s blocks under what earlier programs left of the
        budget. With ``keeps``, the program's results are counted as kept where a budget keeps
        them: in the spill, not in memory."""
        if self.budget is None:
            return None
        left = self.budget.bytes - max(self.resident_bytes)
        spilled = frozenset(physical.outputs) if keeps and self.spills else frozenset()
        return plan_residency(physical, self.cluster.nodes, max(0, left), repeats=self.budget.repeats,
                              rates=self.budget.rates, workers_per_node=self.cluster.workers_per_node,
                              spilled=spilled)

    def _admit(self, physical: PhysicalPlan, residency: Residency) -> None:
        """Record a split: its resident blocks, on their nodes, in a stable order."""
        self.residencies.append(residency)
        homes = physical.block_homes(self.nodes)
        for block in sorted(residency.resident, key=lambda b: (b.array, b.index)):
            key = self._key(physical, block)
            if key not in self.resident:
                self.resident[key] = (homes[block], residency.block_bytes[block])
                self.resident_bytes[homes[block]] += residency.block_bytes[block]
        self.streamed |= {self._key(physical, b) for b in residency.streamed} - set(self.resident)

    def _decide(self, physical: PhysicalPlan, keeps: bool) -> tuple[Residency | None, bool]:
        """Split the stored blocks no earlier program decided (PageRank reads its edges in its
        first programs, not in a load); the executor sets the split up when anything streams."""
        keys = {self._key(physical, a) for t in physical.tasks for a in t.args if isinstance(a, SourceBlock)}
        if not keys - set(self.resident) - self.streamed:
            return None, False
        residency = self._split(physical, keeps)
        assert residency is not None
        self._admit(physical, residency)
        read_now = residency.streams or bool(self.streamed)
        if read_now:
            self._orders.clear()
        return residency, read_now

    def _made(self, physical: PhysicalPlan, results: Iterable[TaskResult]) -> list[tuple[int, int]]:
        """(node, planned bytes) of each of ``results``, on the node of the task that makes it."""
        positions = {t.id: i for i, t in enumerate(physical.tasks)}
        made = []
        for result in results:
            i = positions[result.task]
            sizes = physical.tasks[i].out_bytes
            made.append((physical.node_of(i, self.nodes), sizes[result.output] if result.output < len(sizes) else 0))
        return made

    def _spills_kept(self, physical: PhysicalPlan) -> bool:
        """Whether a persist's results go to the spill first: when the budget already streams
        (it has no room to spare, and a job's size of an object block is its own estimate), or
        when by the plan's sizes they would not fit beside what is resident on some node."""
        assert self.budget is not None
        if not self.spills:
            return False
        if self.streamed or self.kept_spilled:
            return True
        need = [0] * self.nodes
        for node, nbytes in self._made(physical, physical.outputs):
            need[node] += nbytes
        return any(held + reserve + n > self.budget.bytes
                   for held, reserve, n in zip(self.resident_bytes, self.reserve, need, strict=True))

    def _make_room(self, physical: PhysicalPlan, keeps: bool, kept_spilled: bool,
                   ) -> tuple[frozenset[TaskResult], frozenset[StoredKey], dict[str, tuple[int, ...]], tuple[int, ...]]:
        """The results to write to the spill so that the program's intermediates fit beside what
        is resident, the resident blocks to stream from now on where they still do not, and the
        program's intermediate peak per node. With ``keeps`` (a persist) its outputs are kept: in
        the spill with ``kept_spilled`` (taking no memory), else in memory (counted as kept
        afterwards, not in the room later programs' intermediates need)."""
        assert self.budget is not None
        if not (self.resident or self.kept_spilled or self.streamed):
            return frozenset(), frozenset(), {}, ()
        cached = self._rooms.get(id(physical))
        if cached is None or cached[0] is not physical or cached[1] != (keeps, kept_spilled):
            if len(self._rooms) > 64:
                self._rooms.clear()
            # results go to the spill where they would not fit beside what is resident: a
            # result is written and read once, where a resident block streamed instead would
            # come back at every later program that reads it; but not results under a 16th of
            # the budget (or 1 MiB), whose files would cost more than the room they free
            spilled: frozenset[TaskResult] = frozenset()
            if self.spills:
                room = [max(0, self.budget.bytes - held) for held in self.resident_bytes]
                spilled = spilled_results(physical, self.nodes, room,
                                          min_bytes=min(SPILL_RESULT_MIN_BYTES, self.budget.bytes // 16))
            outputs = frozenset(physical.outputs)
            peaks = intermediate_peak(physical, self.nodes, spilled=spilled | outputs if kept_spilled else spilled)
            alone = intermediate_peak(physical, self.nodes, spilled=spilled | outputs) \
                if keeps and not kept_spilled else peaks
            cached = self._rooms[id(physical)] = (physical, (keeps, kept_spilled), peaks, alone, spilled)
        _, _, peaks, alone, spilled = cached
        self.reserve = [max(r, p) for r, p in zip(self.reserve, alone, strict=False)]
        dropped = demotions([(k, n, b) for k, (n, b) in self.resident.items()], self.budget.bytes, peaks)
        kept: dict[str, list[int]] = {}
        stored: set[StoredKey] = set()
        for key in dropped:
            assert isinstance(key, (KeptBlock, tuple))
            node, nbytes = self.resident.pop(key)
            self.resident_bytes[node] -= nbytes
            if isinstance(key, KeptBlock):
                kept.setdefault(key.name, []).append(key.position)
            else:
                stored.add(key)
        self.streamed |= stored
        if stored:
            self._orders.clear()
        return spilled, frozenset(stored), {k: tuple(v) for k, v in kept.items()}, peaks

    def _admit_kept(self, after: str) -> dict[str, tuple[int, ...]]:
        """Bring spilled kept blocks into memory where the budget has room for them beside what
        is resident and the most intermediates seen on their node: the first positions first
        (every later program reads them all, in a cyclic scan: any fixed set is as good as
        another, and better than churning)."""
        assert self.budget is not None
        admitted: dict[str, tuple[int, ...]] = {}
        for name, blocks in self.kept_spilled.items():
            these = []
            for position, (node, nbytes) in enumerate(blocks):
                node %= self.nodes
                key = KeptBlock(name, position)
                if key in self.resident or nbytes == 0:
                    continue
                if self.resident_bytes[node] + self.reserve[node] + nbytes <= self.budget.bytes:
                    self.resident[key] = (node, nbytes)
                    self.resident_bytes[node] += nbytes
                    these.append(position)
            if these:
                admitted[name] = tuple(these)
        self.log.append(Admission(after, admitted))
        return admitted

    def _streaming(self, physical: PhysicalPlan) -> tuple[frozenset[SourceBlock], tuple[int, ...] | None]:
        """The stored blocks of ``physical`` not in memory (read when a task uses them), and the
        submission order of its tasks around their reads (None: the plan's)."""
        if not self.streamed:
            return frozenset(), None
        cached = self._orders.get(id(physical))
        if cached is None or cached[0] is not physical:
            streamed = frozenset(a for t in physical.tasks for a in t.args if isinstance(a, SourceBlock)
                                 and self._key(physical, a) not in self.resident)
            order = task_order(physical, streamed, self.cluster.nodes, max(1, self.cluster.workers_per_node - 1)) \
                if streamed else None
            if len(self._orders) > 64:
                self._orders.clear()
            cached = self._orders[id(physical)] = (physical, streamed, order)
        return cached[1], cached[2]

    def _kept_from_spill(self, physical: PhysicalPlan) -> frozenset[KeptBlock]:
        """The kept blocks ``physical`` uses that are in the spill, not in memory."""
        return frozenset(KeptBlock(a.handle, a.position) for t in physical.tasks for a in t.args
                         if isinstance(a, CachedBlock) and a.handle in self.kept_spilled
                         and KeptBlock(a.handle, a.position) not in self.resident)
