"""The estimate: a job's plan, priced. Same keys as ``report.json`` (docs/report.md).

Quantities come from the planner's cost of each program the job runs (storage bytes and
requests, bytes between nodes, bytes touched, flops, tasks, peak memory per node); time
comes from those quantities and a measured ``MachineProfile``; dollars from node-hours
and requests at the price table's rates. Nothing here reads data.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from arrayjob.costing.history import History
from arrayjob.costing.prices import Instance, PriceTable
from arrayjob.costing.profile import MachineProfile
from arrayjob.io.arrays import write_requests
from arrayjob.io.locations import StorageCounters, TableTarget
from arrayjob.io.sparse import member_info, stored_members
from arrayjob.lazy import capture
from arrayjob.planner.cost import BlockKey, network_seconds, physical_cost
from arrayjob.planner.memory import KeptBlock, MemoryBudget, MemoryModel, StoredKey
from arrayjob.planner.physical import CachedBlock, SourceBlock, WriteBlock
from arrayjob.planner.pipeline import Planner, budget_block_target
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.planner.residency import Residency, StreamRates, intermediate_peak
from arrayjob.planner.schedule import makespan
from arrayjob.units import size

STORAGE_CONCURRENCY = 8  # requests in flight per node when reading blocks
# How long a node the autoscaler adds for a job takes to be usable when neither the spec
# ([cluster] node_startup) nor the price table (node_startup of the node type) says: a cloud
# VM booting, starting Ray and joining the cluster is about a minute (the fake cluster's
# raylets on one host: 15-22 s, tests/system/autoscale/prices.toml).
DEFAULT_NODE_STARTUP_SECONDS = 60.0


@dataclass
class StageEstimate:
    name: str
    runs: int = 1
    bytes_read: int = 0
    get_requests: int = 0
    bytes_written: int = 0
    put_requests: int = 0
    bytes_between_nodes: int = 0
    bytes_touched: int = 0
    flops: float = 0.0
    work: Counter[str] = field(default_factory=Counter)  # by kind (planner.cost.WORK_KINDS)
    tasks: int = 0
    peak_bytes_per_node: list[int] = field(default_factory=list)
    wall_seconds: float = 0.0
    bytes_reread: int = 0  # streamed blocks read from storage again (in bytes_read too)
    reread_requests: int = 0
    spill_bytes_read: int = 0  # streamed blocks read back from the nodes' spill
    profile_wall_seconds: float | None = None  # the profile's prediction, before a history corrected it

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "runs": self.runs, "wall_seconds": round(self.wall_seconds, 4),
            "profile_wall_seconds": round(self.wall_seconds if self.profile_wall_seconds is None
                                          else self.profile_wall_seconds, 4),
            "storage.bytes_read": self.bytes_read, "storage.get_requests": self.get_requests,
            "storage.bytes_written": self.bytes_written, "storage.put_requests": self.put_requests,
            "storage.bytes_reread": self.bytes_reread, "memory.spill_bytes_read": self.spill_bytes_read,
            "network.bytes_between_nodes": self.bytes_between_nodes, "memory.bytes_touched": self.bytes_touched,
            "flops": self.flops, "work": {k: float(v) for k, v in sorted(self.work.items())},
            "tasks.count": self.tasks,
        }


@dataclass
class Estimate:
    job: str
    stages: list[StageEstimate]
    nodes: int
    instance: Instance
    prices: PriceTable
    profile: MachineProfile
    iterations: int
    iterations_source: str
    memory_warning: str = ""
    budget_bytes: int = 0  # per node ([cluster] memory_budget)
    residencies: list[Residency] = field(default_factory=list)
    kept_streamed_per_iteration: int = 0  # kept blocks (``Pass.keeps``) read back from the spill each iteration
    memory: MemoryModel | None = field(default=None, repr=False)  # its decisions, program by program
    nodes_added: int = 0  # of ``nodes``, those the autoscaler must start for the job
    node_startup_seconds: float = 0.0  # what starting one takes (they start together)
    history: History | None = None  # the recent runs that corrected the stages' times, or why none did

    def total(self, key: str) -> float:
        return sum(getattr(s, key) for s in self.stages)

    @property
    def scale_up_seconds(self) -> float:
        """Waiting for the added nodes before anything is read (none added: none)."""
        return self.node_startup_seconds if self.nodes_added else 0.0

    @property
    def wall_seconds(self) -> float:
        return self.total("wall_seconds") + self.scale_up_seconds

    @property
    def peak_bytes_per_node(self) -> list[int]:
        peaks = [s.peak_bytes_per_node for s in self.stages if s.peak_bytes_per_node]
        return [max(p[i] for p in peaks) for i in range(len(peaks[0]))] if peaks else [0] * self.nodes

    @property
    def node_seconds(self) -> float:
        """Every node for the job's stages, and the added ones while they start too (the
        provider bills a node from its boot)."""
        return self.total("wall_seconds") * self.nodes + self.nodes_added * self.scale_up_seconds

    def dollars(self) -> dict[str, float]:
        compute = self.node_seconds / 3600 * self.instance.usd_per_hour
        gets = self.total("get_requests") / 1000 * self.prices.get_per_1000
        puts = self.total("put_requests") / 1000 * self.prices.put_per_1000
        return {"compute": compute, "get_requests": gets, "put_requests": puts, "total": compute + gets + puts}

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "wall_seconds": round(self.wall_seconds, 4),
            "storage": {"bytes_read": int(self.total("bytes_read")), "get_requests": int(self.total("get_requests")),
                        "bytes_written": int(self.total("bytes_written")),
                        "put_requests": int(self.total("put_requests")),
                        "bytes_reread": int(self.total("bytes_reread")),
                        "reread_requests": int(self.total("reread_requests")),
                        "bytes_reread_per_iteration": self.reread_per_iteration,
                        "reread_seconds_per_iteration": round(self.reread_seconds_per_iteration, 4)},
            "network": {"bytes_between_nodes": int(self.total("bytes_between_nodes"))},
            "memory": {"peak_bytes_per_node": self.peak_bytes_per_node,
                       "bytes_touched": int(self.total("bytes_touched")),
                       "budget_bytes": self.budget_bytes, "resident_fraction": round(self.resident_fraction, 6),
                       "streamed_from": next((r.source for r in self.residencies if r.streams), None),
                       "spill_bytes_read": int(self.total("spill_bytes_read"))},
            "flops": float(self.total("flops")),
            "tasks": {"count": int(self.total("tasks")), "retries": 0},
            "nodes": {"count": self.nodes, "instance_type": self.instance.name,
                      "node_seconds": round(self.node_seconds, 3), "added": self.nodes_added,
                      "scale_up_seconds": round(self.scale_up_seconds, 3)},
            "dollars": {k: round(v, 6) for k, v in self.dollars().items()},
            "stages": [s.as_dict() for s in self.stages],
            "iterations": {"assumed": self.iterations, "from": self.iterations_source},
            "assumptions": self.assumptions(),
            "profile": {"name": self.profile.name, "measured_at": self.profile.measured_at or None,
                        "calibrated": self.profile.calibrated},
            **({"history": self.history.as_dict()} if self.history is not None else {}),
            **({"warning": self.memory_warning} if self.memory_warning else {}),
        }

    @property
    def resident_fraction(self) -> float:
        total = sum(r.input_bytes for r in self.residencies)
        return sum(r.resident_bytes for r in self.residencies) / total if total else 1.0

    @property
    def reread_per_iteration(self) -> int:
        """Input and kept bytes brought back each iteration (from storage or the spill)."""
        return sum(r.streamed_bytes for r in self.residencies if r.repeats > 1) + self.kept_streamed_per_iteration

    @property
    def reread_seconds_per_iteration(self) -> float:
        """What bringing those bytes back takes, at the calibrated rate of where they come from
        (spread over the nodes; overlapped with compute in the stage's time)."""
        seconds = 0.0
        for r in self.residencies:
            if r.repeats > 1 and r.streams:
                rate = self.profile.spill_read_bytes_per_s if r.source == "spill" else self.profile.storage_read_bytes_per_s
                seconds += r.streamed_bytes / (rate * max(1, self.nodes))
        return seconds

    def assumptions(self) -> list[str]:
        p = self.profile
        return [
            f"{self.nodes} × {self.instance.name} ({self.instance.vcpus} vCPUs, {self.instance.memory_gib:g} GiB, "
            f"${self.instance.usd_per_hour:g}/hour), price table {self.prices.version}",
            f"storage ${self.prices.get_per_1000:g} per 1,000 GET, ${self.prices.put_per_1000:g} per 1,000 PUT",
            f"profile: {p.name}{' measured ' + p.measured_at if p.measured_at else ''}",
            f"{self.iterations} iteration(s) ({self.iterations_source})",
            *([f"{self.nodes_added} node(s) added by the autoscaler, {self.node_startup_seconds:g} s to start"]
              if self.nodes_added else []),
        ]


def _seconds(stage: StageEstimate, profile: MachineProfile, cluster: ClusterShape) -> float:
    """Storage and network time, and compute as if it spread evenly over the workers (the
    fit and load stages replace that with the schedule's length: ``planner.schedule``)."""
    workers, nodes = cluster.workers, cluster.nodes
    storage = (stage.bytes_read / (profile.storage_read_bytes_per_s * nodes)
               + stage.get_requests * profile.request_seconds / (STORAGE_CONCURRENCY * nodes)
               + stage.bytes_written / (profile.storage_write_bytes_per_s * nodes)
               + stage.put_requests * profile.request_seconds / (STORAGE_CONCURRENCY * nodes))
    # each kind of work at its own calibrated rate (an exp is not an add, a QR is not a GEMM)
    compute = (stage.bytes_touched / profile.memory_bytes_per_s
               + sum(amount / profile.rate(kind) for kind, amount in stage.work.items())) / workers
    overhead = stage.tasks * profile.task_overhead_seconds / workers
    network = stage.bytes_between_nodes / (profile.network_bytes_per_s * max(1, nodes))
    return storage + compute + overhead + network


def _compute_seconds(cost: Any, profile: MachineProfile, cluster: ClusterShape) -> float:
    """One run of a plan: its tasks' compute, each work kind at its rate, scheduled."""
    return makespan([(node, touched / profile.memory_bytes_per_s + profile.task_overhead_seconds
                      + sum(amount / profile.rate(kind) for kind, amount in work.items()))
                     for node, touched, work in cost.task_work], cluster.nodes, cluster.workers_per_node)


def _read_seconds(reads: list[tuple[int, int]], profile: MachineProfile, cluster: ClusterShape) -> float:
    """Reading stored blocks ``(node, bytes)``, one task per block on the node that first uses
    it; the node's read rate is shared by its workers."""
    per_worker = profile.storage_read_bytes_per_s / max(1, cluster.workers_per_node)
    return makespan([(node, nbytes / per_worker + profile.task_overhead_seconds)
                     for node, nbytes in reads], cluster.nodes, cluster.workers_per_node)


def stream_rates(profile: MachineProfile) -> StreamRates:
    """Where a streamed block may come back from: storage, or this host's temporary
    directory (half its free space may be spilled to)."""
    free = shutil.disk_usage(tempfile.gettempdir()).free
    return StreamRates(bucket_bytes_per_s=profile.storage_read_bytes_per_s,
                       spill_bytes_per_s=profile.spill_read_bytes_per_s, spill_capacity=free // 2,
                       task_seconds=profile.task_overhead_seconds)


def job_block_target(job: Any, options: PlanOptions, budget: int, *, repeats: int, rates: StreamRates,
                     planner: Planner | None = None) -> int:
    """The target block size ``run`` and ``estimate`` tile ``job`` with under ``budget`` bytes
    per node (``planner.pipeline.budget_block_target`` over the job's passes, each as often as
    it runs in ``repeats`` iterations)."""
    inputs = sum(info.nbytes for info in getattr(job, "arrays", {}).values())
    if inputs <= budget:
        return options.target_block_bytes
    programs = [(capture(list(p.program.values())), p.runs.times(repeats))
                for p in job.stages(options.cluster.workers).passes]
    return budget_block_target(programs, options, budget, inputs, repeats=repeats, rates=rates, planner=planner)


def budget_bytes(spec: Any, instance: Instance, store_bytes: int | None = None) -> int:
    """``[cluster] memory_budget`` per node, of the store a run found (``store_bytes``), else
    of ``[cluster] object_store_memory``, else of Ray's default store on ``instance``."""
    store = store_bytes or spec.cluster.store_bytes or instance.object_store_bytes
    return spec.cluster.budget_bytes(store)


def node_startup_seconds(spec: Any, instance: Instance) -> float:
    """How long an added node takes to start: ``[cluster] node_startup``, else the price
    table's ``node_startup`` for ``instance``, else ``DEFAULT_NODE_STARTUP_SECONDS``."""
    given = getattr(getattr(spec, "cluster", None), "node_startup_seconds", None)
    if given is not None:
        return float(given)
    if instance.node_startup_seconds is not None:
        return instance.node_startup_seconds
    return DEFAULT_NODE_STARTUP_SECONDS


def estimate_cluster(nodes: int, instance: Instance, profile: MachineProfile) -> ClusterShape:
    """The cluster an estimate plans for: ``nodes`` × ``instance``, at ``profile``'s rates."""
    return ClusterShape(nodes=nodes, workers_per_node=max(1, instance.vcpus),
                        memory_per_node=int(instance.memory_gib * 2**30), **profile.placement_rates())


def estimate_job(job: Any, spec: Any, *, nodes: int, instance: Instance, prices: PriceTable,
                 profile: MachineProfile, iterations: int | None = None, store_bytes: int | None = None,
                 rates: StreamRates | None = None, nodes_added: int = 0,
                 history: History | None = None) -> Estimate:
    """Plan every program ``job`` runs on ``nodes`` × ``instance`` and price it, under the
    memory budget (``planner.residency``: what is streamed, from where, at what cost).
    ``nodes_added`` of the nodes are not up yet: the job waits for them to start
    (``node_startup_seconds``), and pays for them meanwhile. ``history`` (``costing.history``)
    corrects each stage's time by the recent runs' measured / predicted ratio, and, for the
    spec's own runs, assumes the iterations they did (unless ``iterations`` is given).

    Raises ``BudgetError`` when a block cannot fit the budget even streamed."""
    cluster = estimate_cluster(nodes, instance, profile)
    budget = budget_bytes(spec, instance, store_bytes)
    options = PlanOptions(tiling=spec.planner.tiling, fusion=spec.planner.fusion,
                          placement=spec.planner.placement, cluster=cluster)
    assumed, source = job.iterations_assumed(iterations)
    if history is not None and iterations is None and history.iterations:
        done = history.iterations  # an iterative job's own runs say how many it takes
        if job.iterations_assumed(done)[0] == done != assumed:
            assumed, source = done, f"the iterations of this spec's last {len(history.records)} run(s)"
    rates = rates or stream_rates(profile)
    planner = Planner()  # the block size's trial plans, of which the chosen one is this estimate's
    target = job_block_target(job, options, budget, repeats=assumed, rates=rates, planner=planner)
    options = dataclasses.replace(options, target_block_bytes=target)
    declared = job.stages(cluster.workers)
    load = StageEstimate("load")
    # stored blocks are read in "load"; each pass is priced in the stage the job declares for it
    by_stage = {"load": load}
    seconds = {"load": 0.0}
    moving: dict[str, float] = {}  # seconds of moving data between nodes, by stage
    for p in declared.passes:
        if p.stage not in by_stage:
            by_stage[p.stage] = StageEstimate(p.stage, runs=0)
            seconds[p.stage] = 0.0
    sources_seen: set[object] = set()
    homes: dict[BlockKey, tuple[int, int]] = {}
    peaks: dict[str, list[list[int]]] = {name: [] for name in by_stage}
    # what stays in memory, streams and goes to the spill: the run's own model (a Ray executor
    # can spill kept blocks and results), fed the declared passes in the order they run
    memory = MemoryModel(MemoryBudget(budget, assumed, rates), cluster, spills=True)
    demoted: set[StoredKey] = set()  # resident until a later program needed the room: read from storage
    read_before: set[StoredKey] = set()
    source_of_stream = "bucket"
    kept_streamed_per_iteration = 0
    # where a run creates the arrays the workers write (an estimate creates nothing)
    targets = {name: w.target(name, spec.output.join("result.zarr"), spec.output_format)
               for p in declared.passes for name, w in p.writes.items()}
    table_writes = StorageCounters()  # per-row outputs as Parquet: a file per store task, as planned
    for p in declared.passes:
        program = p.writing(targets, spec.storage)
        plan = planner.plan(capture(list(program.values())), options)
        assert plan.physical is not None and plan.cost is not None
        physical = plan.physical
        for task in physical.tasks:
            body = task.kernel.fn
            if isinstance(body, WriteBlock) and isinstance(body.target, TableTarget):
                for _ in range(p.runs.times(assumed)):
                    table_writes.add(body.target.block_requests(*body.selection[0]))
        # stored blocks stay where the first program read them, for the job (see physical_cost)
        cost = physical_cost(physical, nodes, homes)
        fresh = [s for s in physical.sources if s.array.uri not in sources_seen]
        stage, runs = by_stage[p.stage], p.runs.times(assumed)
        decided = memory.run(physical, keeps=p.keeps is not None)
        if p.keeps is not None:  # kept by the plan's sizes of them (a run: what its workers wrote)
            memory.keep(physical, [(f"{p.keeps}:{name}", len(out.blocks))
                                   for name, out in zip(p.program, plan.assembly, strict=True)], decided)
        for handle in p.releases:
            memory.release(f"{handle}:{name}" for q in declared.passes if q.keeps == handle for name in q.program)
        residency = decided.residency if fresh else None
        if residency is not None and residency.streams:
            source_of_stream = residency.source
        block_homes = physical.block_homes(nodes)
        key = {b: (physical.source(b.array).array.uri, b) for b in block_homes}
        demoted |= decided.demoted  # the runtime reads these from storage
        read_before |= decided.demoted
        kept_uses = [a for t in physical.tasks for a in dict.fromkeys(t.args) if isinstance(a, CachedBlock)
                     and KeptBlock(a.handle, a.position) in decided.kept_from_spill]
        if kept_uses:  # each use maps its block from the spill
            stage.spill_bytes_read += runs * sum(a.nbytes for a in kept_uses)
            if p.runs.per_iteration:
                kept_streamed_per_iteration += sum(a.nbytes for a in kept_uses)
        # every task reads the streamed blocks it uses, each run
        uses = Counter(b for t in physical.tasks for b in dict.fromkeys(t.args)
                       if isinstance(b, SourceBlock) and b in decided.streamed)
        if fresh:  # stored blocks are read once, by one task each, then kept for the job
            # or written to their node's spill, if streamed from there (the runtime's load does);
            # blocks of a source an earlier pass read are not read again (PageRank's indptr)
            spilled = {b for b in block_homes if residency is not None and residency.source == "spill"
                       and b in residency.streamed}
            unread = {s.array.uri for s in fresh}
            first = [b for b in block_homes if key[b][0] in unread and (key[b] in memory.resident or b in spilled)]
            seconds["load"] += _read_seconds([(block_homes[b], physical.block_read_bytes(b)) for b in first],
                                             profile, cluster)
            for b in first:
                load.bytes_read += physical.block_read_bytes(b)
                load.get_requests += physical.block_requests(b)
            load.tasks += len(first)
            read_before.update(key[b] for b in spilled)
            sources_seen.update(s.array.uri for s in fresh)
        run_seconds = _compute_seconds(cost, profile, cluster)
        held = decided.intermediate_peak or intermediate_peak(
            physical, nodes, spilled=decided.spilled_results | (frozenset(physical.outputs)
                                                                if decided.kept_to_spill else frozenset()))
        with_resident = [i + r for i, r in zip(held, decided.resident_bytes, strict=True)]
        if uses:
            # each run reads its streamed blocks, overlapped with the resident ones' compute:
            # a block's first read from storage, then (from the spill, if planned) again at each use
            first_node, again_node, spill_node = [0] * nodes, [0] * nodes, [0] * nodes
            for b, count in uses.items():
                nbytes, gets = physical.block_bytes(b), physical.block_requests(b)
                reads = runs * count
                if key[b] not in read_before:
                    read_before.add(key[b])
                    stage.bytes_read += physical.block_read_bytes(b)
                    stage.get_requests += gets
                    first_node[block_homes[b]] += nbytes
                    reads -= 1
                again_node[block_homes[b]] += nbytes * reads
                if source_of_stream == "spill" and key[b] not in demoted:
                    stage.spill_bytes_read += reads * nbytes
                    spill_node[block_homes[b]] += reads * nbytes
                else:
                    stage.bytes_read += reads * nbytes
                    stage.get_requests += reads * gets
                    stage.bytes_reread += reads * nbytes
                    stage.reread_requests += reads * gets
            rate = profile.spill_read_bytes_per_s if sum(spill_node) else profile.storage_read_bytes_per_s
            read_seconds = max(first_node) / profile.storage_read_bytes_per_s + max(again_node) / rate
            seconds[p.stage] += max(runs * run_seconds, read_seconds) + runs * profile.run_overhead_seconds
            peak = with_resident
        else:
            seconds[p.stage] += runs * (run_seconds + profile.run_overhead_seconds)
            streams = read_before or any(r.streams for r in memory.residencies[-1:])
            peak = with_resident if streams else list(cost.peak_bytes_per_node)
        if stage is not load:
            stage.runs += runs
        stage.bytes_between_nodes += runs * cost.bytes_between_nodes
        moving[p.stage] = moving.get(p.stage, 0.0) + runs * network_seconds(
            cost.bytes_between_nodes, cost.max_network_in_bytes, nodes, profile.network_bytes_per_s)
        stage.bytes_touched += runs * cost.bytes_touched
        stage.flops += runs * cost.flops
        stage.work.update({kind: runs * amount for kind, amount in cost.work.items()})
        stage.tasks += runs * cost.tasks
        peaks[p.stage].append(peak)
    # arrays of the job no program reads, read whole on the driver (factor matrices, PageRank's indptr)
    for info in getattr(job, "arrays", {}).values():
        # a sparse input is read by a program that reads its blocks or its member arrays (PageRank's)
        read_as = {info.uri} | ({member_info(info, m).uri for m in stored_members(info)} if info.sparse else set())
        if read_as.isdisjoint(sources_seen):
            nbytes, requests = info.block_reads(tuple(slice(0, s) for s in info.shape))
            load.bytes_read += nbytes
            load.get_requests += requests
    # outputs the workers write (``Pass.writes``) are planned with their pass, store tasks and
    # all; their bytes and requests are priced here, with the driver's
    write = StageEstimate("write")
    driver: dict[str, tuple[tuple[int, ...], str]] = {}
    workers: dict[str, tuple[tuple[int, ...], tuple[int, ...], str]] = {}
    tables = any(isinstance(t, TableTarget) for t in targets.values())  # [output] format = "parquet"
    for i, (shape, dtype, chunk_rows) in enumerate(job.outputs_estimate()):
        if chunk_rows and not tables:  # written by the workers, chunked by rows
            workers[f"output{i}"] = (tuple(shape), (chunk_rows, *shape[1:]), dtype)
        elif not chunk_rows:
            driver[f"output{i}"] = (tuple(shape), dtype)
    requests = write_requests(driver, workers)
    requests.add(table_writes)
    write.get_requests, write.put_requests = requests.get_requests, requests.put_requests
    write.bytes_written, write.bytes_read = requests.bytes_written, requests.bytes_read
    connect = StageEstimate("connect", wall_seconds=profile.startup_seconds)
    shutdown = StageEstimate("shutdown", wall_seconds=profile.shutdown_seconds)
    stages = [connect, *by_stage.values(), write, shutdown]
    reads = job.metadata_reads  # what opening the inputs read (a sparse input's indptr), as a run counts it
    if reads.get_requests:
        validate = StageEstimate("validate", bytes_read=reads.bytes_read, get_requests=reads.get_requests)
        validate.wall_seconds = (reads.bytes_read / profile.storage_read_bytes_per_s  # by the driver alone
                                 + reads.get_requests * profile.request_seconds)
        stages.insert(0, validate)
    write.wall_seconds = _seconds(write, profile, cluster)
    # every stage: its runs' tasks scheduled, plus moving data between nodes; load also its
    # block reads scheduled, requests and driver-side reads, and the first run's warm-up
    for name, stage in by_stage.items():
        stage.wall_seconds = seconds[name]
        if stage is load:
            stage.wall_seconds += load.get_requests * profile.request_seconds / (STORAGE_CONCURRENCY * cluster.nodes)
            stage.wall_seconds += profile.warmup_seconds + profile.run_overhead_seconds
        stage.wall_seconds += moving.get(name, 0.0)  # at the aggregate rate, or the busiest receiver's
        stage.peak_bytes_per_node = [max(q[i] for q in peaks[name]) for i in range(len(peaks[name][0]))] \
            if peaks[name] else []
    result = Estimate(spec.name, stages, nodes, instance, prices, profile, assumed, source,
                      budget_bytes=budget, residencies=memory.residencies, memory=memory,
                      kept_streamed_per_iteration=kept_streamed_per_iteration,
                      nodes_added=max(0, min(nodes, nodes_added)),
                      node_startup_seconds=node_startup_seconds(spec, instance) if nodes_added > 0 else 0.0)
    result.memory_warning = memory_warning(result.peak_bytes_per_node, instance)
    if history is not None:
        result.history = history
        history.correct(result.stages, result.scale_up_seconds)
    return result


# the share of a node's memory a plan may fill when nodes are counted (Ray's object store,
# the workers' heaps and the OS share the rest)
MEMORY_HEADROOM = 0.8


def memory_warning(peak_bytes_per_node: Sequence[int], instance: Instance) -> str:
    """One line when a plan needs more memory on a node than an ``instance`` node has: the
    plan's peak per node, the node's memory, and the node count that would hold the plan
    (its peaks summed, spread at ``MEMORY_HEADROOM``); empty when it fits."""
    peak = max(peak_bytes_per_node, default=0)
    memory = int(instance.memory_gib * 2**30)
    if peak <= memory:
        return ""
    need = math.ceil(sum(peak_bytes_per_node) / (MEMORY_HEADROOM * memory))
    return (f"the plan needs {size(peak)} of memory on a node, but one {instance.name} node has "
            f"{instance.memory_gib:g} GiB ({len(peak_bytes_per_node)} node(s) planned): about {need:,} such "
            f"nodes would hold it (--nodes {need})")
