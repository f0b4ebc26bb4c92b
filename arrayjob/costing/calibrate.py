"""``arrayjob calibrate``: measure the rates the time model uses, on this cluster and bucket.

Compute rates are measured inside Ray tasks (one thread each, as the job's kernels run),
one per kind of work the cost model counts (``planner.cost.WORK_KINDS``), each on the
operation the kernels really run for it: numexpr expressions over a cache-sized row chunk
(``row_chunks.CHUNK_BYTES``), ``kernels.primitives.evaluate`` for contractions, ``algorithms.tsqr``'s
LAPACK QR on its sub-blocks. Read and write rates are the block paths themselves (workers
read a Zarr array of the bucket into the object store, and write it back with
``lazy.store``); request latency is measured from the driver. Everything written to the
bucket is removed afterwards.
"""

from __future__ import annotations

import datetime as dt
import functools
import statistics
import time
import uuid
from collections.abc import Callable

import numpy as np

from arrayjob.costing.profile import MachineProfile
from arrayjob.io.backend import backend_for
from arrayjob.io.locations import ArrayInfo, Location, StorageOptions

OBJECT_BYTES = 16 * 2**20  # one chunk of the calibration array
LOAD_BLOCKS = 32  # 512 MiB read and written by the workers


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


def _per_second(work: float, fn: Callable[[], object], repeats: int = 3) -> float:
    return work / _median_seconds(fn, repeats)


def elementwise_rates() -> tuple[float, float]:
    """(plain, transcendental) elements per second through one numexpr operation on a row
    chunk that fits in cache, one thread — how a fused kernel's expressions run. The
    transcendental rate is the mean time of exp and log1p."""
    import numexpr

    from arrayjob.kernels.row_chunks import CHUNK_BYTES

    a = np.random.default_rng(2).random(CHUNK_BYTES // 8)
    b = np.random.default_rng(3).random(a.size)
    out, names = np.empty_like(a), {"a": a, "b": b}
    threads = numexpr.set_num_threads(1)

    def run(expression: str) -> None:
        for _ in range(20):
            numexpr.evaluate(expression, local_dict=names, out=out)

    try:
        plain = _per_second(a.size * 20, lambda: run("a * b"))
        seconds = [_median_seconds(functools.partial(run, e)) for e in ("exp(a)", "log1p(a)")]
    finally:
        numexpr.set_num_threads(threads)
    return plain, a.size * 20 / sum(seconds) * len(seconds)


def contraction_rates(cols: int = 64) -> tuple[float, float]:
    """(operand bytes/s of matrix × vector, flops/s of XᵀX) on row chunks of a 64 MiB block
    with ``cols`` columns, through ``kernels.primitives.evaluate`` as a compiled kernel's loop runs them."""
    from arrayjob.kernels.primitives import evaluate
    from arrayjob.kernels.row_chunks import CHUNK_BYTES
    from arrayjob.planner.ops import Einsum, Op
    from arrayjob.planner.physical import Step

    x = np.random.default_rng(4).standard_normal((8 * 2**20 // cols, cols))
    w = np.ones(cols)
    rows = CHUNK_BYTES // (8 * cols)
    chunks = [x[s: s + rows] for s in range(0, x.shape[0], rows)]
    gemv, gram = Step(Op.EINSUM, Einsum("ij,j->i"), (0, 1), "float64"), Step(Op.EINSUM, Einsum("ij,ik->jk"), (0, 0), "float64")
    memory = _per_second(x.nbytes, lambda: [evaluate(gemv, [c, w]) for c in chunks])
    flops = _per_second(2.0 * x.shape[0] * cols * cols, lambda: [evaluate(gram, [c, c]) for c in chunks])
    return memory, flops


def einsum_rate() -> float:
    """Flops/s (2 × the product of the label sizes) of a three-operand contraction: MTTKRP
    of each mode (``ijk,jf,kf->if`` and the others) on a 16 MiB block of a tensor, as a
    kernel step runs it."""
    from arrayjob.kernels.primitives import evaluate
    from arrayjob.planner.ops import Einsum, Op
    from arrayjob.planner.physical import Step

    rng = np.random.default_rng(5)
    i, j, k, f = 8, 512, 512, 16
    x, b, c = rng.standard_normal((i, j, k)), rng.standard_normal((j, f)), rng.standard_normal((k, f))
    a = rng.standard_normal((i, f))
    modes = [(Step(Op.EINSUM, Einsum("ijk,jf,kf->if"), (0, 1, 2), "float64"), [x, b, c]),
             (Step(Op.EINSUM, Einsum("ijk,if,kf->jf"), (0, 1, 2), "float64"), [x, a, c]),
             (Step(Op.EINSUM, Einsum("ijk,if,jf->kf"), (0, 1, 2), "float64"), [x, a, b])]
    seconds = sum(_median_seconds(functools.partial(evaluate, s, v)) for s, v in modes)
    return 3 * 2.0 * i * j * k * f / seconds


def qr_rate(cols: int = 64, rows: int = 2**16) -> float:
    """Flops/s of TSQR's block QR (``algorithms.tsqr.qr_block``: LAPACK QR of its sub-blocks and
    of their stacked R, Q formed) on a ``rows`` × ``cols`` block, counted as its declared
    cost counts it (the BLAS part at the contraction rate is small beside it)."""
    from arrayjob.algorithms.tsqr import qr_block, qr_block_cost

    a = np.random.default_rng(6).standard_normal((rows, cols))
    return _per_second(qr_block_cost([a.shape])["qr_flops"], lambda: qr_block(a))


def triangular_solve_rate(cols: int = 64, rows: int = 2**17) -> float:
    """Flops/s (mn²) of CholeskyQR2's triangular solve (``algorithms.tsqr.solve_block``, BLAS
    trsm) on a ``rows`` × ``cols`` block."""
    from arrayjob.algorithms.tsqr import solve_block, solve_cost

    a = np.random.default_rng(7).standard_normal((rows, cols))
    r = np.linalg.cholesky(a.T @ a).T.copy()
    return _per_second(solve_cost([a.shape])["triangular_solve_flops"], lambda: solve_block(a, r))


def graph_rates() -> dict[str, float]:
    """PageRank's graph kernels, timed as they run (one core): the split of a chunk of 2^21
    edges by target block and the build of a CSR block from 2^23 edges (edges per second),
    and a CSR matrix × vector (nonzeros per second) gathering from a vector that fits in
    the cache (2^19 nodes) and from one that does not (2^22 nodes, 32 MiB)."""
    import scipy.sparse

    from arrayjob.algorithms.pagerank.graph import BuildBlock, SplitByTarget, degree_order

    rng = np.random.default_rng(7)
    n = 2**22
    chunk = rng.integers(0, n, (2**21, 2))
    split = SplitByTarget(n, n // 4)
    labels = degree_order(rng.integers(0, 8, n), n // 4)
    # block 0's 2^23 edges, as 4 chunks' sorted edges hand them to its build
    edges = np.stack([rng.integers(0, n, 2**23), rng.integers(0, n // 4, 2**23)], axis=1).astype(np.int32)
    offsets = np.tile(np.array([0, 2**21, 2**21, 2**21, 2**21], dtype=np.int64), (4, 1))
    build = BuildBlock(n, n // 4, 2**21)

    def product_rate(nodes: int, nnz: int = 2**23) -> float:
        indptr = np.arange(0, nnz + 1, nnz // nodes, dtype=np.int64)
        matrix = scipy.sparse.csr_matrix((np.ones(nnz), rng.integers(0, nodes, nnz), indptr), shape=(nodes, nodes))
        x = np.ones(nodes)
        return _per_second(nnz, lambda: matrix @ x)

    return {"edge_split_per_s": _per_second(len(chunk), lambda: split(chunk, labels)),
            "edge_build_per_s": _per_second(len(edges), lambda: build(np.array([0]), edges, offsets)),
            "sparse_product_per_s": product_rate(2**19), "sparse_product_large_per_s": product_rate(2**22)}


def block_rates(bucket: Location, options: StorageOptions, node_ids: tuple[str, ...]) -> tuple[float, float, float]:
    """(read, write, spill read) bytes per second of the workers of all nodes together moving
    a Zarr array of ``bucket`` into the object store and back out, as a job's load stage and
    its worker-written outputs (``lazy.store``) do: one task per chunk-aligned block; and
    reading blocks back from their own spill, as a job streams them under a memory budget."""
    from arrayjob import lazy as la
    from arrayjob.io.arrays import create_array, open_array_info
    from arrayjob.planner.plan import ClusterShape, PlanOptions
    from arrayjob.runtime.ray_executor import RayExecutor
    from arrayjob.runtime.session import Session

    location = bucket.join(f"_arrayjob_calibrate-load-{uuid.uuid4().hex[:8]}")
    rows, cols = LOAD_BLOCKS * OBJECT_BYTES // (8 * 64), 64
    chunks = (rows // LOAD_BLOCKS, cols)
    try:
        array = create_array(location.join("in"), options, shape=(rows, cols), chunks=chunks, dtype="float64")
        block = np.random.default_rng(1).standard_normal(chunks)
        for i in range(LOAD_BLOCKS):
            array[i * block.shape[0]: (i + 1) * block.shape[0]] = block
        info = open_array_info("calibrate", location.join("in"), options)
        reads, writes = [], []
        for i in range(3):
            session = Session(RayExecutor(options, node_ids),
                              PlanOptions(cluster=ClusterShape(nodes=max(1, len(node_ids)))))
            x = la.from_zarr(info)
            start = time.perf_counter()
            session.load({"s": x.sum()})
            reads.append(time.perf_counter() - start)
            create_array(location.join(f"out{i}"), options, shape=(rows, cols), chunks=chunks, dtype="float64")
            target = open_array_info("calibrate", location.join(f"out{i}"), options)
            start = time.perf_counter()
            session.compute({"written": la.store(x, target, options)})
            writes.append(time.perf_counter() - start)
            del session
        nbytes = rows * cols * 8
        return nbytes / statistics.median(reads), nbytes / statistics.median(writes), \
            spill_rate(info, options, node_ids, nbytes)
    finally:
        backend_for(location, options).delete()


def request_seconds(bucket: Location, options: StorageOptions) -> float:
    """Seconds per small GET against ``bucket`` (median of 20)."""
    backend = backend_for(bucket, options)
    small = f"_arrayjob_calibrate-{uuid.uuid4().hex[:8]}"
    try:
        backend.write_bytes(small, b"x")
        latencies = []
        for _ in range(20):
            t = time.perf_counter()
            backend.read_bytes(small)
            latencies.append(time.perf_counter() - t)
        return statistics.median(latencies)
    finally:
        backend.delete(small)


def ray_rates(node_ids: tuple[str, ...], cpus: int) -> tuple[dict[str, float], float, float, float]:
    """(compute rates by profile field, task overhead s, bytes/s between nodes, warm-up s) from Ray tasks."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote
    def rates() -> dict[str, float]:
        plain, transcendental = elementwise_rates()
        gemv, gram = contraction_rates()
        return {"memory_bytes_per_s": memory_rate(), "flops_per_s": flop_rate(), "elementwise_per_s": plain,
                "transcendental_per_s": transcendental, "contraction_bytes_per_s": gemv,
                "contraction_flops_per_s": gram, "einsum_flops_per_s": einsum_rate(), "qr_flops_per_s": qr_rate(),
                "triangular_solve_flops_per_s": triangular_solve_rate(),
                **graph_rates()}

    @ray.remote
    def hello() -> None:
        # what a job's first tasks load in a fresh worker: Zarr block reads, compiled kernels
        import numexpr  # noqa: F401
        import scipy.linalg  # noqa: F401

        import arrayjob.io.arrays  # noqa: F401
        import arrayjob.kernels.compiler  # noqa: F401
        return None

    start = time.perf_counter()
    ray.get([hello.remote() for _ in range(cpus)])  # cold: worker processes start and import
    warmup = time.perf_counter() - start
    # every worker at once, as a job's kernels run: cores share memory bandwidth and caches
    measured = ray.get([rates.remote() for _ in range(max(1, cpus // max(1, len(node_ids))))])
    compute = {k: statistics.median(m[k] for m in measured) for k in measured[0]}

    @ray.remote
    def nothing() -> None:
        return None

    @ray.remote
    def fresh(block: np.ndarray) -> np.ndarray:
        return block.copy()  # a new result array, as a kernel makes one

    block = ray.put(np.ones(OBJECT_BYTES * 8 // 8))
    copies = [fresh.remote(block) for _ in range(max(1, cpus // max(1, len(node_ids))))]  # warm
    ray.wait(copies, num_returns=len(copies), fetch_local=False)
    del copies
    start = time.perf_counter()
    copies = [fresh.remote(block) for _ in range(2 * max(1, cpus // max(1, len(node_ids))))]
    ray.wait(copies, num_returns=len(copies), fetch_local=False)
    # per worker, as the other compute rates: each of the node's workers made two copies
    compute["result_bytes_per_s"] = 2 * OBJECT_BYTES * 8 / (time.perf_counter() - start)
    del copies, block

    ray.get([nothing.remote() for _ in range(20)])  # warm the worker pool
    n = 400
    start = time.perf_counter()
    ray.get([nothing.remote() for _ in range(n)])
    overhead = (time.perf_counter() - start) * cpus / n

    network = compute["memory_bytes_per_s"]
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
    return compute, overhead, network, warmup


def cold_start_seconds(address: str, repeats: int = 3) -> tuple[float, float]:
    """(start, stop) seconds of a Ray for a job, median of ``repeats``: each in a fresh Python
    process that imports Ray, as ``arrayjob run`` does (a second start in one process is faster)."""
    import json
    import subprocess
    import sys

    code = ("import json, time; t = time.perf_counter()\n"
            "from arrayjob.runtime.cluster import ray_cluster\nfrom arrayjob.spec import ClusterOptions\n"
            f"with ray_cluster(ClusterOptions(address={address!r})):\n"
            "    up = time.perf_counter() - t; s = time.perf_counter()\n"
            "print(json.dumps([up, time.perf_counter() - s]))")
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1]) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


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


def spill_rate(info: ArrayInfo, options: StorageOptions, node_ids: tuple[str, ...], nbytes: int) -> float:
    """Bytes per second of the workers reading blocks back from their node's spill: a session
    whose budget holds half the array streams the rest, the first pass writing the spill."""
    from arrayjob import lazy as la
    from arrayjob.planner.plan import ClusterShape, PlanOptions
    from arrayjob.planner.residency import StreamRates
    from arrayjob.runtime.ray_executor import RayExecutor
    from arrayjob.runtime.session import MemoryBudget, Session

    executor = RayExecutor(options, node_ids)
    rates = StreamRates(bucket_bytes_per_s=1.0, spill_bytes_per_s=2.0, spill_capacity=2**62)
    session = Session(executor, PlanOptions(cluster=ClusterShape(nodes=max(1, len(node_ids)))),
                      budget=MemoryBudget(nbytes // 2 + 2**20, repeats=5, rates=rates))
    try:
        program = {"s": la.from_zarr(info).sum()}
        session.load(program)
        session.compute(program)  # the first reads write the spill
        streamed = sum(r.streamed_bytes for r in session.residencies) or 1
        seconds = []
        for _ in range(3):
            start = time.perf_counter()
            session.compute(program)
            seconds.append(time.perf_counter() - start)
        return streamed / statistics.median(seconds)
    finally:
        executor.close()


def calibrate(bucket: Location, options: StorageOptions, node_ids: tuple[str, ...], cpus: int,
              startup: float, shutdown: float) -> MachineProfile:
    """Everything but Ray's start and stop times, which the caller measures around its cluster."""
    latency = request_seconds(bucket, options)
    compute, overhead, network, warmup = ray_rates(node_ids, cpus)
    read, write, spill = (rate / max(1, len(node_ids)) for rate in block_rates(bucket, options, node_ids))  # per node
    return MachineProfile(
        name=f"measured ({len(node_ids)} node(s), {cpus} CPUs)", **compute, storage_read_bytes_per_s=read,
        storage_write_bytes_per_s=write, spill_read_bytes_per_s=spill, request_seconds=latency, task_overhead_seconds=overhead,
        network_bytes_per_s=network, startup_seconds=startup, shutdown_seconds=shutdown, warmup_seconds=warmup,
        run_overhead_seconds=run_overhead(node_ids, options),
        measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), bucket=str(bucket),
    )
