"""What really happened during a run, counted where it happens, and told as it happens.

Besides counting, ``RunMetrics`` tells a listener (``RunMetrics.listen``) each event of the
run as a ``ProgressEvent``: a stage starting and ending, input blocks loaded, an iteration
done, a retry, a node lost or joined, the result published. The command line turns them
into a live view, plain lines or JSON lines (``cli.progress``); the counts in the report
do not depend on anyone listening.
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from arrayjob.io.locations import StorageCounters


@dataclass
class Stage:
    name: str
    wall_seconds: float = 0.0
    start_seconds: float = 0.0  # since the run started, as the timeline counts
    tasks: int = 0
    storage: StorageCounters = field(default_factory=StorageCounters)


@dataclass
class Faults:
    """What went wrong during a run and was survived; ``events`` marks each on the timeline."""

    nodes_lost: list[str] = field(default_factory=list)  # Ray node ids, in the order noticed
    blocks_reconstructed: int = 0  # held blocks that lived on a lost node, found rebuilt elsewhere
    task_retries: int = 0  # task executions beyond the first (Ray attempt numbers)
    storage_retries: int = 0  # requests tried again after a transient failure, on any process
    events: list[dict[str, object]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"nodes_lost": len(self.nodes_lost), "lost_node_ids": list(self.nodes_lost),
                "blocks_reconstructed": self.blocks_reconstructed, "task_retries": self.task_retries,
                "storage_retries": self.storage_retries, "events": list(self.events)}


EVENT_KINDS = ("stage_start", "stage_end", "estimate", "blocks", "iteration", "retry", "node_lost", "node_joined",
               "publish")


@dataclass(frozen=True)
class ProgressEvent:
    """One thing that happened in a run: its ``kind`` (one of ``EVENT_KINDS``), seconds since
    the run started, the stage it happened in, and the kind's own figures."""

    kind: str
    seconds: float
    stage: str | None
    data: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"event": self.kind, "seconds": self.seconds, "stage": self.stage, **self.data}


Listener = Callable[[ProgressEvent], None]


@dataclass
class NodeLog:
    """Which worker nodes (Ray nodes with CPUs) the job used, from when to when: each node
    from the first time the job saw it alive to when it left or the job released it. A node
    that arrived while the job waited for the nodes it asked for counts from the request: it
    was started for the job, booting (and billed) before Ray saw it, as the estimate prices it
    (``costing.estimate``: node start-up)."""

    started: float = field(default_factory=time.perf_counter)
    joined: dict[str, float] = field(default_factory=dict)  # node id -> seconds since the start
    left: dict[str, float] = field(default_factory=dict)
    present: set[str] = field(default_factory=set)  # alive before the job asked for any
    events: list[dict[str, object]] = field(default_factory=list)  # {seconds, node, kind: join|leave|release}
    most: int = 0
    released: bool = False
    asked: float | None = None  # when the job asked the autoscaler for nodes
    arrived: float | None = None  # when it stopped waiting for them

    def _now(self) -> float:
        return round(time.perf_counter() - self.started, 3)

    def start(self, alive: set[str]) -> None:
        """The nodes alive when the job connected (not added for it), as it asks for more."""
        self.present |= alive
        self.asked = self._now()
        self.observe(alive)

    def up(self) -> None:
        """The job has stopped waiting for the nodes it asked for."""
        self.arrived = self._now()

    def observe(self, alive: set[str]) -> None:
        """The worker nodes alive now: joins and departures since the last look."""
        if self.released:
            return
        now = self._now()
        for node in sorted(alive - self.joined.keys()):
            self.joined[node] = now
            self.events.append({"seconds": now, "node": node, "kind": "join"})
        for node in sorted(set(self.joined) - alive - self.left.keys()):
            self.left[node] = now
            self.events.append({"seconds": now, "node": node, "kind": "leave"})
        self.most = max(self.most, len(set(self.joined) - set(self.left)))

    def release(self) -> None:
        """The job is done with every node it still holds."""
        if self.released:
            return
        now = self._now()
        for node in sorted(set(self.joined) - set(self.left)):
            self.left[node] = now
            self.events.append({"seconds": now, "node": node, "kind": "release"})
        self.released = True

    @property
    def added(self) -> list[str]:
        """Nodes that joined after the job connected: started for it (or for another job then)."""
        return [n for n in self.joined if n not in self.present]

    def since(self, node: str) -> float:
        """When the job's use of ``node`` began: its request, for a node started for it."""
        if self.asked is not None and self.arrived is not None and node not in self.present \
                and self.joined[node] <= self.arrived:
            return self.asked
        return self.joined[node]

    def seconds(self, node: str) -> float:
        return self.left.get(node, self._now()) - self.since(node)

    def as_dict(self) -> dict[str, object]:
        return {"count": self.most, "added": len(self.added),
                "node_seconds": round(sum(self.seconds(n) for n in self.joined), 3),
                "per_node": [{"node_id": n, "since": self.since(n), "joined": self.joined[n], "left": self.left.get(n),
                              "seconds": round(self.seconds(n), 3), "added": n not in self.present}
                             for n in self.joined],
                "events": list(self.events)}
class Streaming:
    """The block cache under a memory budget: what was kept, what was brought back, from where."""

    budget_bytes: int | None = None  # per node; None: no budget applied
    resident_fraction: float = 1.0  # of the input bytes the loads planned, kept in the object store
    source: str | None = None  # where streamed blocks came back from: "spill", "bucket" (None: nothing streamed)
    bytes_reread: int = 0  # input bytes read from storage again after their first read
    reread_requests: int = 0  # the GETs of those re-reads
    spill_bytes_read: int = 0  # streamed bytes read back from the nodes' own spill
    spill_bytes_written: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"budget_bytes": self.budget_bytes, "resident_fraction": self.resident_fraction,
                "streamed_from": self.source, "bytes_reread": self.bytes_reread,
                "reread_requests": self.reread_requests, "spill_bytes_read": self.spill_bytes_read,
                "spill_bytes_written": self.spill_bytes_written}


@dataclass
class ObjectStores:
    """What Ray's object stores held, as their raylets said (``runtime.store_monitor``), by
    node id: the most bytes seen in use, and the bytes Ray spilled to its nodes' disks and
    restored from them while the job ran."""

    peak_bytes: dict[str, int] = field(default_factory=dict)
    spilled_bytes: dict[str, int] = field(default_factory=dict)
    restored_bytes: dict[str, int] = field(default_factory=dict)
    samples: int = 0


@dataclass
class RunMetrics:
    """Counters for one job run. Stages are timed by the driver; tasks and bytes by the executor."""

    stages: list[Stage] = field(default_factory=list)
    storage: StorageCounters = field(default_factory=StorageCounters)
    tasks: int = 0
    block_bytes_by_node: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # Measured from where tasks really ran (Ray node ids) and what they really returned;
    # see ``runtime.replay`` and ``planner.cost.ClusterLoad`` for the accounting.
    bytes_between_nodes: int = 0  # summed over runs; each (object, node) pair once per run
    bytes_touched: int = 0  # kernel inputs + outputs, as the workers saw them
    tasks_by_node: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    network_in_by_node: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    network_out_by_node: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # the most bytes any run held in a node's object store: input blocks, driver values,
    # task results until their last consumer ran
    peak_object_store_bytes_per_node: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # one sample per measured run: seconds since the start, bytes moved so far, that run's per-node peak
    timeline: list[dict[str, object]] = field(default_factory=list)
    faults: Faults = field(default_factory=Faults)
    streaming: Streaming = field(default_factory=Streaming)
    stores: ObjectStores = field(default_factory=ObjectStores)  # read from the raylets, not replayed
    started: float = field(default_factory=time.perf_counter)
    nodes: NodeLog | None = None  # set when the run sizes its cluster: which nodes, when
    _current: Stage | None = None
    _listeners: list[Listener] = field(default_factory=list)

    # -- events ------------------------------------------------------------------------------
    def listen(self, listener: Listener) -> None:
        """Tell ``listener`` every event of this run from now on, in the driver's thread."""
        self._listeners.append(listener)

    def emit(self, kind: str, **data: object) -> None:
        """Tell the listeners that ``kind`` happened now (``EVENT_KINDS``), with ``data``."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        if not self._listeners:
            return
        event = ProgressEvent(kind, round(time.perf_counter() - self.started, 3), self.current_stage, data)
        for listener in self._listeners:
            listener(event)

    def iteration(self, iteration: int, max_iter: int, *, objective: float | None = None,
                  gradient_norm: float | None = None, **figures: float) -> None:
        """An iterative job finished ``iteration`` (counted from 1) of at most ``max_iter``;
        ``objective`` and ``gradient_norm`` where the algorithm has them, else its own
        convergence figures (``l1_change``, ``fit``, ``shift``)."""
        self.emit("iteration", iteration=iteration, max_iter=max_iter, objective=_plain(objective),
                  gradient_norm=_plain(gradient_norm), **{k: _plain(v) for k, v in figures.items()})

    @contextmanager
    def stage(self, name: str) -> Iterator[Stage]:
        stage = Stage(name)
        self.stages.append(stage)
        outer, self._current = self._current, stage
        start = time.perf_counter()
        stage.start_seconds = start - self.started
        self.emit("stage_start")
        ok = False
        try:
            yield stage
            ok = True
        finally:
            stage.wall_seconds = time.perf_counter() - start
            if ok:  # a failed stage ends in the error's one line, not in a stage line
                self.emit("stage_end", wall_seconds=round(stage.wall_seconds, 4), tasks=stage.tasks,
                          bytes_read=stage.storage.bytes_read, bytes_written=stage.storage.bytes_written)
            self._current = outer

    @property
    def current_stage(self) -> str | None:
        """The name of the stage being timed now, if any."""
        return self._current.name if self._current is not None else None

    def count_tasks(self, n: int) -> None:
        self.tasks += n
        if self._current is not None:
            self._current.tasks += n

    def count_storage(self, counters: StorageCounters) -> None:
        self.storage.add(counters)
        if self._current is not None:
            self._current.storage.add(counters)

    def fault(self, kind: str, count: int = 1, **detail: object) -> None:
        """Count a fault ("node_lost", "block_reconstructed", "task_retry", "storage_retry")
        and mark it on the timeline."""
        if count <= 0:
            return
        f = self.faults
        if kind == "node_lost":
            f.nodes_lost.append(str(detail["node"]))
        elif kind == "block_reconstructed":
            f.blocks_reconstructed += count
        elif kind == "task_retry":
            f.task_retries += count
        elif kind == "storage_retry":
            f.storage_retries += count
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        if kind == "node_lost":
            self.emit("node_lost", node=str(detail["node"]))
        elif kind in ("task_retry", "storage_retry"):
            self.emit("retry", what=kind.removesuffix("_retry"), count=count)
        seconds = round(time.perf_counter() - self.started, 4)
        last = next((e for e in reversed(f.events) if e["kind"] == kind), None)
        if kind != "node_lost" and last is not None and last["stage"] == self.current_stage \
                and seconds - float(last["seconds"]) < 1.0:  # type: ignore[arg-type]
            last["count"] = int(last["count"]) + count  # type: ignore[call-overload]  # one mark per burst
            return
        f.events.append({"seconds": seconds, "kind": kind, "count": count, "stage": self.current_stage, **detail})

    def count_stream(self, *, reread: int = 0, reread_requests: int = 0, spill_read: int = 0,
                     spill_written: int = 0) -> None:
        """Count what streamed blocks cost (their storage bytes and requests are counted by
        ``count_storage`` too: ``storage.bytes_read`` grows with re-reads)."""
        s = self.streaming
        s.bytes_reread += reread
        s.reread_requests += reread_requests
        s.spill_bytes_read += spill_read
        s.spill_bytes_written += spill_written

    def hold_block(self, node: str, nbytes: int) -> None:
        self.block_bytes_by_node[node] += nbytes

    def count_moved(self, source: str, target: str, nbytes: int, *, held: bool = True) -> None:
        """A block moved from node to node (its nodes changed): traffic, and, for a held input
        block (not a kept result), where the input blocks live."""
        self.bytes_between_nodes += nbytes
        self.network_out_by_node[source] += nbytes
        self.network_in_by_node[target] += nbytes
        if held:
            self.hold_block(source, -nbytes)
            self.hold_block(target, nbytes)

    def count_placement(self, *, moved: int, touched: int, tasks: dict[str, int], net_in: dict[str, int],
                        net_out: dict[str, int], peak: dict[str, int]) -> None:
        """Add one run's measured placement: bytes moved and touched, and per-node figures."""
        self.bytes_between_nodes += moved
        self.bytes_touched += touched
        for total, part in ((self.tasks_by_node, tasks), (self.network_in_by_node, net_in),
                            (self.network_out_by_node, net_out)):
            for node, n in part.items():
                total[node] += n
        for node, n in peak.items():
            self.peak_object_store_bytes_per_node[node] = max(self.peak_object_store_bytes_per_node[node], n)
        self.timeline.append({"seconds": round(time.perf_counter() - self.started, 4),
                              "network_bytes": self.bytes_between_nodes, "memory_bytes_per_node": dict(peak)})


def _plain(value: float | None) -> float | None:
    """A NumPy scalar as a Python float (JSON-ready); None stays None."""
    return None if value is None else float(value)


def driver_peak_rss_bytes() -> int:
    """Peak resident memory of this (driver) process; Linux reports kilobytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
