"""``arrayjob calibrate``: measure the rates the time model uses, on this cluster and bucket.

Compute rates are measured inside Ray tasks (one thread each, as the job's kernels run);
storage rates from the driver against the bucket, with the same s3fs/local filesystem
the jobs use; the objects written are removed afterwards.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
import uuid
from collections.abc import Callable

import numpy as np

from arrayjob.costing.profile import MachineProfile
from arrayjob.io.storage import Location, StorageOptions, filesystem

OBJECT_BYTES = 16 * 2**20
OBJECTS = 8


def _median_seconds(fn: Callable[[], object], repeats: int = 3) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def memory_rate() -> float:
    """Bytes per second one core moves through an elementwise kernel: c = a + b over 64 MiB
    arrays (two read, one written), the rate the cost model's 'bytes touched' runs at."""
    a, b = np.ones(8 * 2**20), np.ones(8 * 2**20)
    c = np.empty_like(a)
    return 3 * a.nbytes / _median_seconds(lambda: np.add(a, b, out=c))


def flop_rate() -> float:
    """float64 GEMM flops per second on one core."""
    n = 768
    a, b = np.random.default_rng(0).standard_normal((2, n, n))
    return 2 * n**3 / _median_seconds(lambda: a @ b)


def storage_rates(bucket: Location, options: StorageOptions) -> tuple[float, float, float]:
    """(read bytes/s, write bytes/s, seconds per small GET) against ``bucket``."""
    fs = filesystem(bucket.scheme, options)
    prefix = bucket.join(f"_arrayjob_calibrate-{uuid.uuid4().hex[:8]}")
    payload = np.random.default_rng(1).bytes(OBJECT_BYTES)
    paths = [prefix.join(f"object-{i}").path for i in range(OBJECTS)]
    try:
        start = time.perf_counter()
        fs.pipe({p: payload for p in paths})  # concurrent PUTs on S3
        write = OBJECTS * OBJECT_BYTES / (time.perf_counter() - start)
        start = time.perf_counter()
        fs.cat(paths)  # concurrent GETs on S3
        read = OBJECTS * OBJECT_BYTES / (time.perf_counter() - start)
        small = prefix.join("small").path
        fs.pipe_file(small, b"x")
        latencies = []
        for _ in range(20):
            t = time.perf_counter()
            fs.cat_file(small)
            latencies.append(time.perf_counter() - t)
        return read, write, statistics.median(latencies)
    finally:
        fs.rm(prefix.path, recursive=True)


def ray_rates(node_ids: tuple[str, ...], cpus: int) -> tuple[float, float, float, float, float]:
    """(memory bytes/s, flops/s, task overhead s, bytes/s between nodes, warm-up s) from Ray tasks."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote
    def rates() -> tuple[float, float]:
        return memory_rate(), flop_rate()

    @ray.remote
    def hello() -> None:
        return None

    start = time.perf_counter()
    ray.get([hello.remote() for _ in range(cpus)])  # cold: worker processes start
    warmup = time.perf_counter() - start
    memory, flops = ray.get(rates.remote())

    @ray.remote
    def nothing() -> None:
        return None

    ray.get([nothing.remote() for _ in range(20)])  # warm the worker pool
    n = 400
    start = time.perf_counter()
    ray.get([nothing.remote() for _ in range(n)])
    overhead = (time.perf_counter() - start) * cpus / n

    network = memory
    if len(node_ids) > 1:
        @ray.remote
        def make() -> np.ndarray:
            return np.ones(8 * 2**20)

        @ray.remote
        def touch(a: np.ndarray) -> int:
            return a.nbytes

        on = [{"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)} for node in node_ids[:2]]
        block = make.options(**on[0]).remote()
        ray.wait([block], fetch_local=False)
        start = time.perf_counter()
        nbytes = ray.get(touch.options(**on[1]).remote(block))
        network = nbytes / (time.perf_counter() - start)
    return memory, flops, overhead, network, warmup


def run_overhead(node_ids: tuple[str, ...], options: StorageOptions) -> float:
    """The driver's share of one program run: plan lookup, submit, fetch and accounting."""
    from arrayjob import lazy as la
    from arrayjob.planner.plan import ClusterShape, PlanOptions
    from arrayjob.runtime.ray_executor import RayExecutor
    from arrayjob.runtime.session import Session

    session = Session(RayExecutor(options, node_ids), PlanOptions(cluster=ClusterShape(nodes=max(1, len(node_ids)))))
    program = {"s": (la.value("v", (8,)) * 2.0).sum()}
    values = {"v": np.ones(8)}
    session.compute(program, values)
    return _median_seconds(lambda: session.compute(program, values), repeats=20)


def calibrate(bucket: Location, options: StorageOptions, node_ids: tuple[str, ...], cpus: int,
              startup: float, shutdown: float) -> MachineProfile:
    """Everything but Ray's start and stop times, which the caller measures around its cluster."""
    read, write, latency = storage_rates(bucket, options)
    memory, flops, overhead, network, warmup = ray_rates(node_ids, cpus)
    return MachineProfile(
        name=f"measured ({len(node_ids)} node(s), {cpus} CPUs)",
        memory_bytes_per_s=memory, flops_per_s=flops, storage_read_bytes_per_s=read,
        storage_write_bytes_per_s=write, request_seconds=latency, task_overhead_seconds=overhead,
        network_bytes_per_s=network, startup_seconds=startup, shutdown_seconds=shutdown, warmup_seconds=warmup,
        run_overhead_seconds=run_overhead(node_ids, options),
        measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), bucket=str(bucket),
    )
