"""One job run, start to finish: validate, connect, load, fit, write, publish.

Nothing is written before every check has passed, and nothing is published before
everything is written (see ``io.output``).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from arrayjob.algorithms import JOBS
from arrayjob.api.job import Job, JobContext, JobResult, check_tables
from arrayjob.catalog import get_job, job_code
from arrayjob.costing.estimate import Estimate, estimate_job, job_block_target, stream_rates
from arrayjob.costing.history import History, recent_history, record_from_report, save_record
from arrayjob.costing.prices import PriceTable, load_prices
from arrayjob.costing.profile import MachineProfile, load_profile
from arrayjob.costing.sizing import NodeChoice, choose_nodes, relocation, usable_bytes
from arrayjob.costing.worker_type import check as check_request
from arrayjob.costing.worker_type import WorkerType, worker_type
from arrayjob.errors import ArrayNotFound, GroupNotArray, InputError, SpecError
from arrayjob.integrations import RunPublished, RunStarted, RunTracking
from arrayjob.io.arrays import ResultGroup, check_chunks_stored, open_array_info, write_group
from arrayjob.io.backend import storage_retries
from arrayjob.io.checkpoint import Checkpoints, CheckpointStore, kill_point
from arrayjob.io.locations import ArrayInfo, Location, StorageCounters, TableSelection
from arrayjob.io.model import PublishedModel, open_model
from arrayjob.io.output import JobOutput
from arrayjob.io.sparse import is_sparse_group, open_sparse_info
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.planner.residency import Residency, StreamRates
from arrayjob.report import html as report_html
from arrayjob.report.build import build_report
from arrayjob.runtime.cluster import ClusterInfo, cluster_shape, ray_cluster
from arrayjob.runtime.metrics import NodeLog, RunMetrics
from arrayjob.runtime.node_types import ClusterTypes, read_node_types
from arrayjob.runtime.scaling import NodeRequest, requested_nodes
from arrayjob.runtime.session import MemoryBudget, Session
from arrayjob.runtime.supervision.pause import hold_from_environment
from arrayjob.spec import JobSpec


@dataclass
class RunOutcome:
    spec: JobSpec
    skipped: bool
    manifest: dict[str, Any]
    report: dict[str, Any] = field(default_factory=dict)
    result: JobResult | None = None
    description: str = ""


def open_models(spec: JobSpec) -> dict[str, PublishedModel]:
    """Open every input the job takes as a published model (``Job.model_inputs``, ``io.model``):
    the run its ``_SUCCESS`` names, that run's algorithm, parameters and result attributes."""
    job = get_job(spec.algorithm)
    return {name: open_model(name, location, spec.storage)
            for name, location in spec.inputs.items() if name in job.model_inputs}


def open_inputs(spec: JobSpec, reads: StorageCounters | None = None,
                models: Mapping[str, PublishedModel] | None = None) -> dict[str, ArrayInfo]:
    """Read every input's metadata; a missing one is named with how to create demo data.

    An input the job takes sparse (``Job.sparse_inputs``) may be a sparse matrix group
    (AnnData's CSR layout, ``io.sparse``): one entry, its ``sparse`` set; opening it reads its
    ``indptr`` whole, counted into ``reads``. An input the job reads as a pattern
    (``Job.pattern_inputs``: PageRank's adjacency) may also be a group without encoding-type
    (``indptr``, ``indices`` and a ``shape`` attribute); its ``data``, if any, is not read.
    An input given as Parquet, or found to be a Parquet dataset where no Zarr array is, is
    read as a dense matrix (``io.parquet``): opening it reads its files' footers, counted into
    ``reads``. Inputs that are models (``open_models``) are left out; each input's shape is
    checked against ``models`` (``Job.check_shape``) as soon as it is known, before a sparse
    input's ``indptr`` is read.
    """
    arrays = {}
    job = get_job(spec.algorithm)
    models = models or {}
    for name, location in spec.inputs.items():
        if name in job.model_inputs:
            continue
        missing = spec.missing_chunks.get(name, "error")
        if spec.formats.get(name) == "parquet":
            arrays[name] = _open_table(name, location, spec, reads)
            continue
        try:
            arrays[name] = open_array_info(name, location, spec.storage, missing_chunks=missing)
        except InputError as exc:
            if isinstance(exc, ArrayNotFound) and spec.formats.get(name) != "zarr" and _is_parquet(location, spec):
                arrays[name] = _open_table(name, location, spec, reads)
                continue
            group = isinstance(exc, GroupNotArray)
            encoding = group and is_sparse_group(location, spec.storage)
            if encoding and name not in job.sparse_inputs:  # refused before reading its indptr
                takes = sorted(n for n, j in JOBS.items() if j.sparse_inputs)
                raise InputError(f"inputs.{name}: {location} is a sparse matrix ({encoding}); {spec.algorithm} "
                                 f"takes a dense array here (sparse input: {', '.join(takes)})") from None
            pattern = name in job.pattern_inputs
            if encoding or (group and pattern):
                opened = open_sparse_info(name, location, spec.storage, missing_chunks=missing, pattern=pattern,
                                          check_shape=functools.partial(job.check_shape, name, models=models))
                if reads is not None:
                    reads.add(opened.counters)
                arrays[name] = opened.info
                continue
            if isinstance(exc, ArrayNotFound) and spec.algorithm in JOBS:  # a user's job has no datagen
                parent = str(location).rsplit("/", 1)[0]
                raise InputError(f"{exc} (demo data: arrayjob datagen {spec.algorithm} {parent})") from None
            raise
        job.check_shape(name, arrays[name].shape, models)
    return arrays


def _is_parquet(location: Location, spec: JobSpec) -> bool:
    from arrayjob.io.parquet import is_parquet_dataset  # pyarrow, only for Parquet inputs

    return is_parquet_dataset(location, spec.storage)


def _open_table(name: str, location: Location, spec: JobSpec, reads: StorageCounters | None) -> ArrayInfo:
    from arrayjob.io.parquet import open_table_info

    opened = open_table_info(name, location, spec.storage, spec.tables.get(name, TableSelection()))
    if reads is not None:
        reads.add(opened.counters)
    return opened.info


def plan_options(spec: JobSpec, cluster: ClusterShape, job: Job | None = None,
                 budget: MemoryBudget | None = None) -> PlanOptions:
    """The planner's options; under a budget the inputs exceed, the blocks whose run costs least
    (``costing.estimate.job_block_target``, as ``estimate`` plans it)."""
    p = spec.planner
    options = PlanOptions(tiling=p.tiling, fusion=p.fusion, placement=p.placement, cluster=cluster)
    if job is None or budget is None:
        return options
    target = job_block_target(job, options, budget.bytes, repeats=budget.repeats,
                              rates=budget.rates or StreamRates(1.0, 1.0))
    return dataclasses.replace(options, target_block_bytes=target)


def memory_budget(spec: JobSpec, job: Job, cluster: ClusterInfo, profile: MachineProfile) -> MemoryBudget:
    """The session's block cache: ``[cluster] memory_budget`` of the smallest node's object
    store, for the job's iterations, with the calibrated rates of storage and the local spill."""
    store = cluster.object_store_per_node
    return MemoryBudget(spec.cluster.budget_bytes(store) if store else 2**62, job.iterations_assumed()[0],
                        stream_rates(profile))


def resident_fraction(residencies: list[Residency]) -> float:
    """Of the input bytes the job's loads planned, the fraction kept in the object store."""
    total = sum(r.input_bytes for r in residencies)
    return sum(r.resident_bytes for r in residencies) / total if total else 1.0


def prepare(spec: JobSpec, *, check_chunks: bool = False) -> Job:
    """Check the inputs against the algorithm: exist, readable, shapes and dtypes fit.

    ``check_chunks`` (a run, before it plans anything): each input's first and last chunk
    exist, so metadata declaring far more data than is stored is refused at once (two HEAD
    requests per input; ``plan`` and ``estimate`` read metadata only)."""
    reads = StorageCounters()
    models = open_models(spec)  # published outputs the job reads as models: the report, the attributes
    arrays = open_inputs(spec, reads, models)
    job = get_job(spec.algorithm)(spec.params, arrays, spec.storage, models)  # shapes and dtypes first
    job.metadata_reads = reads
    check_tables(job, spec.output_format)
    if check_chunks:
        check_inputs(job)
    return job


def check_inputs(job: Job) -> None:
    """Each input's first and last chunk exist (two HEAD requests per input)."""
    for info in job.arrays.values():
        check_chunks_stored(info, job.storage)


def sizes_cluster(spec: JobSpec, nodes: int | None = None, deadline: float | None = None) -> bool:
    """Whether a run chooses its node count and asks the cluster's autoscaler for it: with
    ``cluster.max_nodes``, ``--nodes`` or ``--deadline``; only a Ray at an address can grow."""
    wanted = spec.cluster.max_nodes is not None or nodes is not None or deadline is not None
    if wanted and spec.cluster.address == "local":
        key = "--nodes" if nodes is not None else "--deadline" if deadline is not None else "cluster.max_nodes"
        raise SpecError(f"{key}: sizing the cluster needs a Ray with an autoscaler (cluster.address = \"auto\" "
                        "or HOST:PORT); a local Ray has this machine only")
    return wanted


def node_request(choice: NodeChoice, spec: JobSpec) -> NodeRequest:
    """The autoscaler request for ``choice``: one bundle per node of the node type's CPUs and
    the object-store bytes the plan puts on a node (at most what the type's store can give)."""
    instance = choice.instance
    per_node = min(max(choice.estimate.peak_bytes_per_node, default=0), usable_bytes(instance))
    return NodeRequest(count=choice.nodes, cpus=max(1, instance.vcpus), object_store_bytes=per_node,
                       enough=min(choice.needed, choice.nodes), node_type=instance.name,
                       timeout=spec.cluster.scale_timeout_seconds)


@dataclass(frozen=True)
class Sizing:
    """What a run's node count is chosen from: the price table, the calibrated profile, the
    spec's recent runs, the cluster's worker types and the user's ``--nodes``/``--deadline``."""

    prices: PriceTable
    profile: MachineProfile
    history: History
    types: ClusterTypes
    nodes: int | None
    deadline: float | None


def size(job: Job, spec: JobSpec, worker: WorkerType, sizing: Sizing, *, scaling: bool,
         notify: Callable[[str], None]) -> NodeChoice:
    """The node count for ``job`` (``costing.sizing.choose_nodes``), at most ``cluster.max_nodes``
    and the worker type's ``max_workers``; when the run sizes its cluster, the autoscaler
    request is checked against the worker types before any chunk is touched."""
    instance = worker.instance
    ceiling, named = spec.cluster.max_nodes, "cluster.max_nodes"
    if worker.max_workers is not None and (ceiling is None or worker.max_workers < ceiling):
        ceiling, named = worker.max_workers, f"the cluster's max_workers of {instance.name}"
    choice = choose_nodes(job, spec, instance=instance, prices=sizing.prices, profile=sizing.profile,
                          nodes=sizing.nodes, deadline=sizing.deadline, history=sizing.history,
                          max_nodes=ceiling, max_nodes_from=named)
    if scaling:
        request = node_request(choice, spec)
        check_request(sizing.types, count=request.count, cpus=request.cpus,
                      object_store_bytes=request.object_store_bytes, node_type=request.node_type)
        notify(f"nodes: {choice.line}")
    return choice


def stderr_warning(line: str) -> None:
    print(f"arrayjob: warning: {line}", file=sys.stderr, flush=True)


def run(spec: JobSpec, *, overwrite: bool = False, instance_type: str | None = None, wait: bool = True,
        restart: bool = False, notify: Callable[[str], None] = lambda line: None,
        metrics: RunMetrics | None = None, nodes: int | None = None, deadline: float | None = None,
        check_cost: Callable[[Estimate], None] | None = None,
        warn: Callable[[str], None] = stderr_warning) -> RunOutcome:
    """Run ``spec`` and publish its output. Another run holding the output is waited for (or,
    unless ``wait``, ``LeaseHeldError``); waiting and takeovers are told to ``notify``. An
    iterative job resumes from the checkpoint a dead run of the same spec left (told to
    ``notify``), unless ``restart``: then checkpoints are removed first (``io.checkpoint``).
    ``metrics`` (fresh by default) is where the run counts what happens, stage by stage.

    The node count (``costing.sizing.choose_nodes``: ``nodes``, ``deadline``, or the plan's
    memory) is chosen before any data is read and told to ``notify``; when the run sizes its
    cluster (``sizes_cluster``) it is asked of the autoscaler. ``check_cost`` sees the estimate
    at that count first (``--max-cost``).

    The run is recorded where the spec and the environment ask (``integrations``: an MLflow
    run, OpenLineage events) once it holds its output; what fails there is told to ``warn``."""
    started = time.perf_counter()
    tracking = RunTracking.for_spec(spec, warn)  # a missing extra the spec asks for: before any work
    metrics = metrics or RunMetrics()
    hold_from_environment(metrics)  # tests only: a run held at a named point (``runtime.pause``)
    retries = storage_retries()  # this (driver) process's; the workers' come with their reads
    with metrics.stage("validate"):
        job = prepare(spec)
        metrics.count_storage(job.metadata_reads)  # a sparse input's indptr, Parquet footers: to plan blocks
        prices = load_prices()
        scaling = sizes_cluster(spec, nodes, deadline)
        # a cluster that grows is sized for the worker types it says it has (the price table
        # only adds dollars); elsewhere the price table's node type, "local" by default
        types = read_node_types(spec.cluster.address) if scaling else ClusterTypes()
        worker = worker_type(types, prices, instance_type or spec.cluster.node_type)
        instance = worker.instance
        if worker.note:
            notify(worker.note)
        profile = load_profile()
        # the recent runs of this spec (or algorithm) correct the profile's estimate (costing.history)
        history = recent_history(spec, profile)
        choice = None
        if scaling or check_cost is not None:  # before any chunk is touched
            choice = size(job, spec, worker, Sizing(prices, profile, history, types, nodes, deadline),
                          scaling=scaling, notify=notify)
            if check_cost is not None:
                check_cost(choice.estimate)
        check_inputs(job)
        output = JobOutput(spec.output, spec.storage, spec.digest())
        done = output.check(overwrite=overwrite, expected_bytes=job.output_bytes())
    if done is not None:
        return RunOutcome(spec, skipped=True, manifest=done.manifest, description=job.describe())
    waiting = time.perf_counter()
    done = output.take(overwrite=overwrite, wait=wait, notify=notify)
    if done is not None:
        return RunOutcome(spec, skipped=True, manifest=done.manifest, description=job.describe())
    started += time.perf_counter() - waiting  # time spent waiting for another run is not this run's
    if history.line():
        notify(f"history: {history.line()}")
    store = CheckpointStore(output.backend, spec.digest())
    if restart:
        store.clear()
    checkpoints = Checkpoints(store, output.run_id, spec.algorithm, spec.run.checkpoint_every, notify,
                              metrics.count_storage)
    models = {name: spec.inputs[name] for name in job.model_inputs if name in spec.inputs}
    tracking.start(RunStarted(spec, output.run_id, job.arrays, models), metrics)

    try:
        with ExitStack() as stack:
            with metrics.stage("connect"):
                # if a dying Ray ends this process, the output is given up first: a rerun need not wait
                cluster = stack.enter_context(ray_cluster(spec.cluster, before_exit=output.give_up,
                                                          code=job_code(type(job))))
                if scaling:
                    assert choice is not None
                    metrics.nodes = NodeLog(started=metrics.started)
                    cluster = stack.enter_context(
                        requested_nodes(node_request(choice, spec), metrics.nodes, notify))
            from arrayjob.runtime.ray_executor import RayExecutor
            from arrayjob.runtime.supervision.store_monitor import watching

            stack.enter_context(watching(metrics.stores))  # what the stores really held, per node

            # the nodes the autoscaler started for the job: the estimate waits for them too
            added = len(metrics.nodes.added) if scaling and metrics.nodes is not None else 0
            predicted = estimate_job(job, spec, nodes=len(cluster.node_ids), instance=instance, prices=prices,
                                     profile=profile, store_bytes=cluster.object_store_per_node,
                                     nodes_added=added, history=history).as_dict()
            # what a live view needs to tell the time left: each stage's predicted wall time
            metrics.emit("estimate", wall_seconds=predicted["wall_seconds"],
                         iterations=predicted["iterations"]["assumed"],
                         stages=[{"name": s["name"], "wall_seconds": s["wall_seconds"]} for s in predicted["stages"]])
            # a sized cluster's nodes may come and go: each program is planned on those alive then
            executor = RayExecutor(spec.storage, cluster.node_ids, metrics, follow_nodes=scaling,
                                   relocate=relocation(profile))
            stack.callback(executor.close)  # its spill of streamed blocks, if any
            budget = memory_budget(spec, job, cluster, profile)
            # placement weighs compute against traffic at the rates the estimate priced with
            shape = dataclasses.replace(cluster_shape(cluster), **profile.placement_rates())
            session = Session(executor, plan_options(spec, shape, job, budget), budget=budget)
            group = ResultGroup(output.staging.join("result.zarr"), spec.storage)
            result = job.run(JobContext(session, metrics, spec.storage, group, checkpoints, spec.output_format))
            metrics.count_storage(group.counters)
            metrics.streaming.budget_bytes = budget.bytes
            metrics.streaming.resident_fraction = resident_fraction(session.residencies)
            metrics.streaming.source = next((r.source for r in session.residencies if r.streams), None)

            with metrics.stage("write"):
                written = StorageCounters()
                write_group(group.location, spec.storage, result.arrays, result.attrs, written)
                metrics.count_storage(written)
            kill_point("write")
            executor.check_nodes()  # a node lost up to here is in the report
        metrics.fault("storage_retry", storage_retries() - retries)
        # an iterative job rarely runs the max_iter iterations the estimate assumed: price the
        # iterations it ran too, so the report compares like with like
        ran = result.attrs.get("iterations")
        rescaled = None
        if isinstance(ran, int) and ran > 0 and ran != predicted["iterations"]["assumed"]:
            rescaled = estimate_job(job, spec, nodes=len(cluster.node_ids), instance=instance, prices=prices,
                                    profile=profile, iterations=ran, store_bytes=cluster.object_store_per_node,
                                    nodes_added=added, history=history).as_dict()
            rescaled["iterations"]["from"] = "the iterations the run did"
        report = build_report(
            spec, metrics, wall_seconds=time.perf_counter() - started, cluster=cluster, result=result,
            instance=instance, prices=prices, estimate=predicted, estimate_rescaled=rescaled,
        )
        if choice is not None and scaling:
            report["nodes"]["requested"] = choice.nodes
            report["nodes"]["choice"] = choice.line
            report["nodes"]["types"] = {"source": types.source or None, "offer": types.offer() or None}
        resumed = checkpoints.resumed
        report["checkpoints"] = {
            "every_seconds": spec.run.checkpoint_every, "saved": checkpoints.saved,
            "resumed": None if resumed is None else {"run_id": resumed.run_id, "iteration": resumed.iteration},
        }
        output.write_json("report.json", report)
        html = report_html.render(report)
        output.write_text("report.html", html)
        kill_point("publish")
        manifest = output.commit()
        # published: this run now corrects the next estimates of its spec (a rerun that finds
        # the output complete publishes nothing, and records nothing)
        try:
            save_record(record_from_report(report, run_id=manifest["run_id"], spec=spec, profile=profile))
        except OSError as exc:  # the result is published; only the next estimate loses this run
            notify(f"history: this run was not recorded ({exc})")
        metrics.emit("publish", uri=str(spec.output), run_id=manifest["run_id"], prefix=manifest["prefix"])
        store.clear()  # published: no run needs them now
    except BaseException as exc:
        output.abandon()
        tracking.fail(exc)
        raise
    finally:
        output.release()
    tracking.complete(RunPublished(report, html, manifest, str(spec.output.join(manifest["prefix"])),
                                   {name: (a.shape, str(a.dtype)) for name, a in result.arrays.items()}))
    return RunOutcome(spec, skipped=False, manifest=manifest, report=report, result=result,
                      description=job.describe())
