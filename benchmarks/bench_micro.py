"""Measurements behind the miss analysis in docs/benchmarks.md, each on the full-size data
that ``bench.py`` generates (run it once first):

    .venv/bin/python benchmarks/bench_micro.py kmeans-ops     # the KMeans step's ops on one block, 1 thread
    .venv/bin/python benchmarks/bench_micro.py pagerank-spmv  # SpMV of Aᵀ's row blocks in Ray tasks vs one process
    .venv/bin/python benchmarks/bench_micro.py block-sizes    # arrayjob loss+grad vs PlanOptions.target_block_bytes
    .venv/bin/python benchmarks/bench_micro.py peer-chunks    # dask chunk and Ray block sizes for the peers
    .venv/bin/python benchmarks/bench_micro.py tsqr-block     # CholeskyQR2 vs Householder on one block, 1 thread
    .venv/bin/python benchmarks/bench_micro.py kmeans-assign  # the k-means step's loop vs the loops and GEMM before it
    .venv/bin/python benchmarks/bench_micro.py pagerank-build # node numbering, distinct vs np.unique, in-place scaling
    .venv/bin/python benchmarks/bench_micro.py pagerank-order # SpMV per block: Fibonacci-hashed vs degree-ordered ids
    .venv/bin/python benchmarks/bench_micro.py pagerank-iteration # an iteration as the job runs it, r kept, one 2-thread task
    .venv/bin/python benchmarks/bench_micro.py store-pages [--preallocate]  # Ray's object store: fresh pages vs touched memory
    .venv/bin/python benchmarks/bench_micro.py s3-block       # one 256 MiB block through obstore and through s3fs
    .venv/bin/python benchmarks/bench_micro.py s3-ops         # every other S3 request arrayjob makes, obstore vs s3fs (no data needed)
    .venv/bin/python benchmarks/bench_micro.py ray-returns    # Ray's cost per task, per returned slice, per hand-over
    .venv/bin/python benchmarks/bench_micro.py mttkrp-gemm    # the rank-32 GEMM's rate in every layout, 1 thread
    .venv/bin/python benchmarks/bench_micro.py logistic-exp   # libm vs inlined exp/log1p in the logistic row loop
    .venv/bin/python benchmarks/bench_micro.py kept-map       # a kept CSR block mapped from the spill vs in memory (no data needed)
    .venv/bin/python benchmarks/bench_micro.py sparse-loop    # the logistic row loop over a CSR and a CSC block vs SciPy's products (no data needed; --rows)
    .venv/bin/python benchmarks/bench_micro.py sparse-floor   # issue 24's logreg evaluation and k-means step at full size, no Ray: SciPy's and arrayjob's kernels on 1 and 2 threads vs the read and scikit-learn (no data needed; --rows)
    .venv/bin/python benchmarks/bench_micro.py sparse-kmeans  # k-means' step and final pass over a CSR block: the loops vs SciPy's products (no data needed; --rows, --columns random|clustered)
    .venv/bin/python benchmarks/bench_micro.py linreg-block   # linreg's R-only TSQR of one [X 1 y] block, its parts, vs the normal equations' Gram (no data needed)
    .venv/bin/python benchmarks/bench_micro.py ray-stop       # a private Ray's shutdown, timed per process type, as ray.init starts it (no data needed)
    .venv/bin/python benchmarks/bench_micro.py timeline --spec SPEC.toml [--set key=value]  # a job's tasks from Ray's timeline: per kind, count and least/median/most
    .venv/bin/python benchmarks/bench_micro.py driver-profile --spec SPEC.toml [--set key=value]  # a job's driver under cProfile: where its own CPU goes
    .venv/bin/python benchmarks/bench_micro.py numba-start    # a fresh process's first compiled loop: numba's import, its typing and LLVM, then a cached loop
    .venv/bin/python benchmarks/bench_micro.py cpu-busy --run "make test"  # how busy the cores are while a command runs (/proc/stat every 5 s)
    .venv/bin/python benchmarks/bench_micro.py ray-start      # ray.init vs the head Node without monitor and log monitor (no data needed)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
os.environ.pop("RAY_ADDRESS", None)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from bench_harness import timed  # noqa: E402

DATA = HERE.parent / ".arrayjob" / "bench" / "full"
MiB = 2**20
GiB = 2**30


def _X(rows: int | None = None) -> np.ndarray:
    import zarr

    z = zarr.open_array(str(DATA / "logreg" / "X.zarr"), mode="r")
    return z[:rows] if rows else z[...]


def kmeans_ops(_: argparse.Namespace) -> None:
    """The ops of the kmeans job's step program on one 100,000-row block, NumPy, 1 thread."""
    from threadpoolctl import threadpool_limits

    X, k = _X(100_000), 8
    C = np.random.default_rng(0).standard_normal((k, X.shape[1]))
    ids = np.arange(k, dtype=float)
    with threadpool_limits(1):
        scores = (C**2).sum(1) - 2.0 * (X @ C.T)
        labels = scores.argmin(axis=1)
        onehot = (labels[:, None] == ids) * 1.0
        nearest = onehot @ C
        ops = {
            "one pass over the block (sum)": lambda: X.sum(),
            "X @ C.T (n × k GEMM)": lambda: X @ C.T,
            "scores = |c|² − 2 x·c": lambda: (C**2).sum(1) - 2.0 * scores,
            "argmin over k": lambda: scores.argmin(axis=1),
            "one-hot": lambda: (labels[:, None] == ids) * 1.0,
            "inertia: nearest = onehot @ C (n × d)": lambda: onehot @ C,
            "inertia: square(X − nearest).sum()": lambda: np.square(X - nearest).sum(),
            "sums = onehot.T @ X": lambda: onehot.T @ X,
            "counts = onehot.sum(0)": lambda: onehot.sum(axis=0),
        }
        for name, fn in ops.items():
            print(f"  {name:42s} {timed(fn, 5).median * 1e3:7.2f} ms")


def pagerank_spmv(_: argparse.Namespace) -> None:
    """SpMV with the 4 row blocks of Aᵀ D⁻¹ (as the pagerank job cuts it on 2 workers), in Ray
    tasks (concurrently, one at a time, returning the slice or a scalar) and in one process."""
    import ray
    import scipy.sparse
    import zarr
    from bench_graph_tensor import scipy_graph

    edges = zarr.open_array(str(DATA / "pagerank" / "edges.zarr"), mode="r")[...]
    n = int(edges.max()) + 1
    P, _ = scipy_graph(edges, n)
    rows = -(-n // 4)
    blocks = [P[i: i + rows] for i in range(0, n, rows)]
    x = np.random.default_rng(0).random(n)
    print(f"Aᵀ D⁻¹: {n:,} × {n:,}, {P.nnz:,} entries; 4 row blocks")
    print(f"  one process, whole matrix           {timed(lambda: P @ x, 7).median * 1e3:7.2f} ms")
    print(f"  one process, 4 blocks one by one    "
          f"{sum(timed(lambda b=b: b @ x, 7).median for b in blocks) * 1e3:7.2f} ms")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    refs = [ray.put(b) for b in blocks]

    def spmv(b: scipy.sparse.csr_matrix, v: np.ndarray, whole: bool) -> tuple[object, float]:
        start = time.perf_counter()
        y = b @ v
        return (y if whole else 0.0), time.perf_counter() - start

    task = ray.remote(spmv)
    for label, whole, together in (("4 tasks at once, slices returned", True, True),
                                   ("4 tasks at once, a scalar returned", False, True),
                                   ("4 tasks one at a time", True, False)):
        walls, inner = [], []
        for _ in range(20):
            v = ray.put(x)
            start = time.perf_counter()
            if together:
                out = ray.get([task.remote(r, v, whole) for r in refs])
            else:
                out = [ray.get(task.remote(r, v, whole)) for r in refs]
            walls.append(time.perf_counter() - start)
            inner.append(sum(o[1] for o in out))
        print(f"  Ray, {label:34s} wall {np.median(walls) * 1e3:7.2f} ms; SpMV in the tasks, summed "
              f"{np.median(inner) * 1e3:7.2f} ms")
    ray.shutdown()


def block_sizes(_: argparse.Namespace) -> None:
    """arrayjob's loss+grad on the full X at several tiling block targets (default 64 MiB)."""
    from bench_context import Context
    from bench_data import SIZES
    from bench_limits import Limits

    from arrayjob.algorithms.logreg import LogisticRegression, LogRegParams
    from arrayjob.runtime.cluster import ray_cluster
    from arrayjob.spec import ClusterOptions

    with ray_cluster(ClusterOptions(address="local", num_cpus=2)) as cluster:
        ctx = Context(SIZES["full"], 3, Limits(1.0, 1.0), cluster, {"logreg": DATA / "logreg"})
        w, b = 0.1 * np.random.default_rng(1).standard_normal(64), 0.05
        job = LogisticRegression(LogRegParams(), {"X": ctx.info("logreg", "X"), "y": ctx.info("logreg", "y")})
        program = job.program(ctx.workers)
        for mib in (64, 128, 256, 512):
            _, session = ctx.loaded_session(program, block_bytes=mib * MiB)
            t = timed(lambda s=session: s.compute(program, {"w": w, "b": b}), 5)
            tasks = len(session.plan(program).physical.tasks)
            print(f"  target_block_bytes {mib:4d} MiB: {tasks:3d} tasks, loss+grad {t.median:.3f} s")
            del session


def peer_chunks(_: argparse.Namespace) -> None:
    """dask's loss+grad and tsqr, and the hand-written Ray peer's loss+grad, by chunk size."""
    import bench_logreg as bm
    import dask
    import dask.array as da
    import ray
    from bench_context import rows_per_block
    from bench_harness import dask_threads

    w, b = 0.1 * np.random.default_rng(1).standard_normal(64), 0.05
    root = DATA / "logreg"
    for mib in (32, 64, 128, 256, 512):
        rows = rows_per_block(50_000, 512, mib * MiB, 4_000_000)
        with dask_threads():
            X = da.from_zarr(str(root / "X.zarr"), chunks=rows).persist()
            y = da.from_zarr(str(root / "y.zarr"), chunks=rows).persist()
            t = timed(lambda X=X, y=y: bm.dask_loss_grad(X, y, w, b), 3)
            q = timed(lambda X=X: dask.persist(*da.linalg.tsqr(X)), 1).median if mib >= 64 else float("nan")
        print(f"  dask {mib:3d} MiB chunks ({X.numblocks[0]:2d}): loss+grad {t.median:.3f} s, tsqr {q:.2f} s", flush=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    size = dataclasses.make_dataclass("S", [("chunk_rows", int), ("cols", int), ("rows", int)])(50_000, 64, 4_000_000)
    ctx = type("Ctx", (), {"size": size, "data": {"logreg": root}})()
    for mib in (32, 64, 128, 256):
        bm.TUNING["ray_block_mib"] = mib
        blocks = bm.RayBlocks(ctx)  # type: ignore[arg-type]
        blocks.load()
        t = timed(lambda blocks=blocks: blocks.evaluate(w, b), 3)
        print(f"  Ray blocks {mib:3d} MiB ({len(blocks.blocks):2d}): loss+grad {t.median:.3f} s", flush=True)
    ray.shutdown()


BLOCK_ROWS = 500_000  # one block of the full-size X as the jobs cut it (8 blocks of 244 MiB)


def _ms(fn, repeat: int = 5) -> str:  # type: ignore[no-untyped-def]
    return f"{timed(fn, repeat).median * 1e3:8.1f} ms"


def cpu_and_wall(fn) -> str:  # type: ignore[no-untyped-def]
    """Median of 5 after a warm-up: wall time and this thread's CPU time (steadier on a shared machine)."""
    def once() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        fn()
        return time.perf_counter() - wall, time.thread_time() - cpu
    once()
    runs = sorted(once() for _ in range(5))
    return f"{runs[2][0] * 1e3:7.1f} ms wall {sorted(c for _, c in runs)[2] * 1e3:7.1f} ms CPU"


def tsqr_block(_: argparse.Namespace) -> None:
    """QR of one 500,000 × 64 block of X, 1 thread: the Householder block QR (LAPACK on
    2,048-row sub-blocks) against CholeskyQR2's passes over the same block."""
    from threadpoolctl import threadpool_limits

    from arrayjob.algorithms.tsqr import (
        cholesky_of_stack,
        cholesky_upper,
        gram_block,
        qr_block,
        solve_twice_block,
        solved_gram_block,
    )

    A = _X(BLOCK_ROWS)

    def cholesky_qr2() -> None:
        r1 = cholesky_upper(gram_block(A))
        r2 = cholesky_of_stack(solved_gram_block(A, r1))
        solve_twice_block(A, r1, r2)

    with threadpool_limits(1):
        print(f"  Householder qr_block (Q and R)    {_ms(lambda: qr_block(A), 3)}")
        print(f"  CholeskyQR2, all three passes     {_ms(cholesky_qr2, 3)}")
        print(f"  one pass over the block (sum)     {_ms(A.sum)}")


def kmeans_assign(_: argparse.Namespace) -> None:
    """The k-means step on one 500,000 × 64 block, k = 8, 1 thread: the one loop the planner
    runs (assignment, sums and counts: ``loops.nearest_group_sums``), the three loops it
    replaced, and the GEMM and argmin the assignment loop replaced before them."""
    from threadpoolctl import threadpool_limits

    from arrayjob.kernels import loops

    X, k = _X(BLOCK_ROWS), 8
    C = np.random.default_rng(0).standard_normal((k, X.shape[1]))
    a, ids = (C**2).sum(1), np.arange(k, dtype=float)
    labels = np.ascontiguousarray(loops.nearest_rows(X, C, a, 2.0)[:, 0])
    with threadpool_limits(1):
        print(f"  nearest_group_sums (the planner's loop) {_ms(lambda: loops.nearest_group_sums(X, C, a, 2.0, ids))}")
        print(f"  nearest_rows (the assignment alone)     {_ms(lambda: loops.nearest_rows(X, C, a, 2.0))}")
        print(f"  group_sum (sums per cluster)            {_ms(lambda: loops.group_sum(labels, ids, X))}")
        print(f"  count                                   {_ms(lambda: loops.count(labels, ids))}")
        print(f"  X @ C.T alone (GEMM)                    {_ms(lambda: X @ C.T)}")
        print(f"  scores and argmin (NumPy)               {_ms(lambda: (a - 2.0 * (X @ C.T)).argmin(axis=1))}")
        print(f"  one pass over the block (sum)           {_ms(X.sum)}")


def _fibonacci(ids: np.ndarray, n: int) -> np.ndarray:
    """The numbering the pagerank job used before ``degree_order``: i ↦ i·a mod n, a ≈ n/φ
    coprime to n (Fibonacci hashing)."""
    import math

    a = round(n * 0.6180339887498949)
    while math.gcd(a, n) != 1:
        a += 1
    return (ids.astype(np.int64) * a) % n


def pagerank_build(_: argparse.Namespace) -> None:
    """The pagerank job's graph build on the full-size graph (1M nodes, 10M R-MAT edges):
    targets per block with contiguous ids, Fibonacci-hashed ids and ``degree_order``'s,
    ``distinct`` against ``np.unique`` (on one block's keys and on 17.5 M random keys, the
    size of one block of the 1 GB accuracy graph), and column scaling in place against a
    product with a diagonal matrix, one thread."""
    import scipy.sparse
    import zarr

    from arrayjob.algorithms.pagerank.graph import (
        BuildBlock,
        SplitByTarget,
        degree_order,
        distinct,
        scale_block,
    )

    edges = zarr.open_array(str(DATA / "pagerank" / "edges.zarr"), mode="r")[...]
    n = int(edges.max()) + 1
    block = -(-n // 4)
    labels = degree_order(np.bincount(edges[:, 0], minlength=n), block)
    for name, targets in (("contiguous ids", edges[:, 1]), ("Fibonacci hash", _fibonacci(edges[:, 1], n)),
                          ("degree order", labels[edges[:, 1]])):
        share = np.bincount(targets // block, minlength=4) / len(edges)
        print(f"  targets per block, {name:15s} {' '.join(f'{s:5.1%}' for s in share)}")
    print(f"  degree order of {n:,} nodes           {_ms(lambda: degree_order(np.bincount(edges[:, 0], minlength=n), block), 3)}")
    ordered, offsets = SplitByTarget(n, block)(edges, labels)  # all edges as one chunk
    mine = ordered[offsets[0, 0]: offsets[0, 1]].astype(np.int64)
    keys = mine[:, 1] * n + mine[:, 0]
    random_keys = np.random.default_rng(3).integers(0, 4_000_000, 17_500_000) * 4_000_000 \
        + np.random.default_rng(4).integers(0, 4_000_000, 17_500_000)
    graph = BuildBlock(n, block, len(edges))(np.array([0]), ordered, offsets)
    inverse, dangling = np.random.default_rng(5).random(n), np.zeros(n, dtype=bool)
    m = graph[0, 0].matrix
    print(f"  split all edges (4 blocks)              {_ms(lambda: SplitByTarget(n, block)(edges, labels), 3)}")
    print(f"  build block 0 ({len(keys):,} edges)       "
          f"{_ms(lambda: BuildBlock(n, block, len(edges))(np.array([0]), ordered, offsets), 3)}")
    print(f"  np.unique, block 0's keys               {_ms(lambda: np.unique(keys), 3)}")
    print(f"  distinct, block 0's keys                {_ms(lambda: distinct(keys), 3)}")
    print(f"  np.unique, 17.5 M random int64 keys     {_ms(lambda: np.unique(random_keys), 1)}")
    print(f"  distinct, 17.5 M random int64 keys      {_ms(lambda: distinct(random_keys), 3)}")
    print(f"  scale block 0 in place                  {_ms(lambda: scale_block(graph, inverse, dangling), 3)}")
    print(f"  scale block 0 by a diagonal product     "
          f"{_ms(lambda: (m @ scipy.sparse.diags(inverse)).tocsr(), 3)}")


def _graph() -> tuple[np.ndarray, int]:
    """The full-size graph's edges (int64) and node count."""
    import zarr

    edges = zarr.open_array(str(DATA / "pagerank" / "edges.zarr"), mode="r")[...].astype(np.int64)
    return edges, int(edges.max()) + 1


def _pagerank_matrix(edges: np.ndarray, n: int, number: np.ndarray):  # type: ignore[no-untyped-def]
    """Aᵀ D⁻¹ with node i numbered ``number[i]``, distinct edges counted once, as the job."""
    import scipy.sparse

    keys = np.unique(number[edges[:, 1]] * n + number[edges[:, 0]])  # sorted by target, then source
    t, s = keys // n, keys % n
    degree = np.bincount(s, minlength=n).astype(float)
    inverse = np.where(degree > 0, 1 / np.maximum(degree, 1), 0.0)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(t, minlength=n), out=indptr[1:])
    return scipy.sparse.csr_matrix((inverse[s], s, indptr), shape=(n, n))


def _row_blocks(matrix, count: int) -> list:  # type: ignore[no-untyped-def]
    """``matrix`` cut into ``count`` row blocks: [(first row, CSR block)]."""
    rows = -(-matrix.shape[0] // count)
    return [(lo, matrix[lo: lo + rows]) for lo in range(0, matrix.shape[0], rows)]


def pagerank_order(_: argparse.Namespace) -> None:
    """The SpMV of each of the two blocks of Aᵀ D⁻¹ (as the pagerank job cuts the full-size
    graph on 2 workers) under the Fibonacci-hashed numbering and under ``degree_order``'s,
    one thread, three alternating rounds: the busiest sources' ranks stay in the cache."""
    from arrayjob.algorithms.pagerank.graph import degree_order

    edges, n = _graph()
    labels = degree_order(np.bincount(edges[:, 0], minlength=n), -(-n // 2)).astype(np.int64)
    x = np.random.default_rng(0).random(n)
    numberings = {name: [m for _, m in _row_blocks(_pagerank_matrix(edges, n, number), 2)]
                  for name, number in (("Fibonacci hash", _fibonacci(np.arange(n), n)), ("degree order", labels))}
    for _ in range(3):
        for name, (b0, b1) in numberings.items():
            print(f"  {name:15s} block 0 ({b0.nnz:,} nonzeros) {_ms(lambda b0=b0: b0 @ x, 9)}   "
                  f"block 1 ({b1.nnz:,}) {_ms(lambda b1=b1: b1 @ x, 9)}")


def pagerank_iteration(_: argparse.Namespace) -> None:
    """A PageRank iteration of the full-size graph on a local 2-CPU Ray, three ways (median
    of 5 × 20 iterations): as the job runs it (the driver puts r, two tasks return their
    slices, the driver joins them); with r kept on the workers (each task gathers from the
    previous iteration's two slices; only the L1 sums come back); and as one task whose
    SpMV runs on both cores (numba threads), r kept. Beside them the SpMV of both halves in
    one process, one thread: Ray's share is the rest."""
    import numba
    import ray

    from arrayjob.algorithms.pagerank.graph import degree_order

    edges, n = _graph()
    split = -(-n // 2)
    matrix = _pagerank_matrix(edges, n, degree_order(np.bincount(edges[:, 0], minlength=n), split).astype(np.int64))
    halves, whole = _row_blocks(matrix, 2), _row_blocks(matrix, 1)
    damping, base = 0.85, 0.15 / n

    @numba.njit(nogil=True, parallel=True)
    def product(indptr, indices, data, p0, p1, split, first, new, parts):  # type: ignore[no-untyped-def]
        rows, l1 = new.shape[0], np.zeros(parts)
        for p in numba.prange(parts):
            for i in range(p * rows // parts, (p + 1) * rows // parts):
                acc = 0.0
                for j in range(indptr[i], indptr[i + 1]):
                    c = indices[j]
                    acc += data[j] * (p0[c] if c < split else p1[c - split])
                v = damping * acc + base
                new[i] = v
                k = first + i
                l1[p] += abs(v - (p0[k] if k < split else p1[k - split]))
        return l1.sum()

    def step(block, p0, p1, threads):  # type: ignore[no-untyped-def]
        first, m = block
        numba.set_num_threads(threads)
        new = np.empty(m.shape[0])
        cut = split if len(p1) else len(p0)
        return new, product(m.indptr, m.indices.view(np.uint32), m.data, p0, p1, cut, first, new, threads)

    x = np.random.default_rng(0).random(n)
    print(f"  SpMV of both halves, one process, 1 thread {sum(timed(lambda m=m: m @ x, 9).median for _, m in halves) * 1e3:7.2f} ms")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        blocks, one = [ray.put(b) for b in halves], ray.put(whole[0])
        as_job = ray.remote(lambda block, r: damping * (block[1] @ r) + base)
        kept = ray.remote(num_returns=2)(lambda block, p0, p1: step(block, p0, p1, 1))
        threaded = ray.remote(num_cpus=2, num_returns=2)(lambda block, r: step(block, r, np.empty(0), 2))
        start = np.full(n, 1 / n)

        def job_way(iterations: int) -> None:
            r = start
            for _ in range(iterations):
                ref = ray.put(r)
                r = np.concatenate(ray.get([as_job.remote(b, ref) for b in blocks]))

        def kept_way(iterations: int) -> None:
            parts = [ray.put(start[:split]), ray.put(start[split:])]
            for _ in range(iterations):
                outs = [kept.remote(b, *parts) for b in blocks]
                parts = [o[0] for o in outs]
                ray.get([o[1] for o in outs])
            ray.get(parts)

        def threaded_way(iterations: int) -> None:
            r = ray.put(start)
            for _ in range(iterations):
                r, l1 = threaded.remote(one, r)
                ray.get(l1)
            ray.get(r)

        ways = (("as the job runs it (2 tasks)", job_way), ("r kept on the workers (2 tasks)", kept_way),
                ("one 2-thread task, r kept", threaded_way))
        for _, way in ways:
            way(3)
        for _ in range(2):
            for name, way in ways:
                print(f"  {name:42s} {timed(lambda way=way: way(20), 5).median / 20 * 1e3:7.2f} ms per iteration")
    finally:
        ray.shutdown()


def store_pages(args: argparse.Namespace) -> None:
    """Ray's object store on a fresh local Ray: 4 blocks of 256 MiB (an S3 load's GiB) put
    while all are held, so every page is new to the store; then freed and put again into
    the memory the store has touched; and the same as 4 tasks returning the blocks. What a
    load pays beyond its reads. ``--preallocate`` has the store touch all of its memory as Ray
    starts, and prints how long that start takes."""
    import ray

    if args.preallocate:
        os.environ["RAY_preallocate_plasma_memory"] = "1"  # noqa: SIM112 - Ray reads this exact name
    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"  Ray started in {time.perf_counter() - start:.1f} s; object store "
          f"{ray.available_resources().get('object_store_memory', 0) / GiB:.1f} GiB")
    try:
        block = np.ones(256 * MiB // 8)
        make = ray.remote(lambda: np.ones(256 * MiB // 8))
        ray.get(make.remote())  # the workers started
        for round_ in ("fresh store memory", "memory the store has touched", "again"):
            start = time.perf_counter()
            held = [ray.put(block) for _ in range(4)]
            put = time.perf_counter() - start
            del held
            start = time.perf_counter()
            held = [make.remote() for _ in range(4)]
            ray.wait(held, num_returns=4, fetch_local=False)
            returned = time.perf_counter() - start
            del held
            print(f"  {round_:30s} 4 × 256 MiB puts {put * 1e3:7.1f} ms ({GiB / put / 1e9:5.2f} GB/s); "
                  f"4 tasks returning 256 MiB {returned * 1e3:7.1f} ms")
            time.sleep(1.0)
        fill = timed(lambda: np.ones(256 * MiB // 8), 3).median
        print(f"  making one 256 MiB block in this process (np.ones)  {fill * 1e3:7.1f} ms")
    finally:
        ray.shutdown()


def s3_block(_: argparse.Namespace) -> None:
    """One 256 MiB block (16 chunks of 16 MiB) of a Zarr array on the loopback S3 server, read
    in this process through obstore (as arrayjob reads blocks) and through s3fs (zarr's
    ``FsspecStore``, the stack arrayjob used before: kept here as the comparison)."""
    import zarr
    from bench_data import SIZES, write_s3_array
    from bench_limits import LoopbackS3
    from zarr.storage import FsspecStore

    from arrayjob.io.backend import backend_for
    from arrayjob.io.locations import StorageOptions, parse_uri

    s3 = LoopbackS3()
    try:
        s3.create_bucket("micro")
        uri = write_s3_array(SIZES["full"], s3.endpoint, "micro")
        options = StorageOptions(endpoint_url=s3.endpoint)
        rows = 256 * MiB // (64 * 8)
        stores = {"obstore": backend_for(parse_uri(uri), options).block_store(),
                  "s3fs": FsspecStore.from_url(uri, storage_options={"endpoint_url": s3.endpoint}, read_only=True)}
        for name, store in stores.items():
            array = zarr.open_array(store=store, mode="r")
            print(f"  {name:8s} {_ms(lambda array=array: array[:rows], 3)}")
    finally:
        s3.stop()


def s3_ops(_: argparse.Namespace) -> None:
    """The S3 requests arrayjob makes besides block reads, on the loopback S3 server, through
    the obstore backend and through s3fs (the stack it used before): small PUT and GET (the
    report, ``_SUCCESS``), a listing and a publish of 200 staged objects, a result group,
    and one 64 MiB block of 4 MiB chunks written and read. Needs no generated data."""
    import fsspec
    import zarr
    from bench_limits import LoopbackS3
    from zarr.storage import FsspecStore

    from arrayjob.io.backend import backend_for
    from arrayjob.io.locations import StorageOptions, parse_uri

    s3 = LoopbackS3()
    try:
        s3.create_bucket("micro")
        options = StorageOptions(endpoint_url=s3.endpoint)
        fs = fsspec.filesystem("s3", endpoint_url=s3.endpoint)
        backend = backend_for(parse_uri("s3://micro"), options)
        n = 200

        def zarr_stores(name: str) -> dict[str, Any]:
            return {"obstore": backend.child(f"ob-{name}").zarr_store(read_only=False),
                    "s3fs": FsspecStore.from_url(f"s3://micro/fs-{name}", storage_options={"endpoint_url": s3.endpoint})}

        def stage() -> None:
            for j in range(n):
                backend.write_bytes(f"stage/f{j:04d}", b"y" * 1000)

        print(f"  small PUT        s3fs {_ms(lambda: fs.pipe_file('micro/x', b'x'), 20)}   "
              f"obstore {_ms(lambda: backend.write_bytes('x', b'x'), 20)}")
        print(f"  small GET        s3fs {_ms(lambda: fs.cat_file('micro/x'), 20)}   "
              f"obstore {_ms(lambda: backend.read_bytes('x'), 20)}")
        stage()
        print(f"  list {n}         s3fs {_ms(lambda: (fs.invalidate_cache(), fs.find('micro/stage')))}   "
              f"obstore {_ms(lambda: backend.list('stage'))}")
        sources = [f"stage/f{j:04d}" for j in range(n)]
        copies = timed(lambda: fs.copy([f"micro/{k}" for k in sources], [f"micro/fs-pub/{k}" for k in sources]), 3).median
        moves = []
        for _ in range(3):
            stage()
            start = time.perf_counter()
            backend.move((k, f"ob-pub/{k}") for k in sources)
            moves.append(time.perf_counter() - start)
        print(f"  publish {n}      s3fs copies {copies:.2f} s   obstore copies and a batched delete {sorted(moves)[1]:.2f} s")
        for name, store in zarr_stores("group").items():
            def group(store: Any = store) -> None:
                g = zarr.open_group(store=store, mode="w", zarr_format=3)
                g.update_attributes({"fit": 0.0})
                g.create_array("coef", data=np.ones(1000), chunks=(1000,))

            print(f"  result group     {name:8s} {_ms(group)}")
        data = np.ones((64 * MiB // (64 * 8), 64))
        for name, store in zarr_stores("block").items():
            array = zarr.create_array(store=store, shape=data.shape, chunks=(8192, 64), dtype="f8",
                                      compressors=None, overwrite=True)
            print(f"  64 MiB write     {name:8s} {_ms(lambda array=array: array.__setitem__(slice(None), data), 3)}")
            print(f"  64 MiB read      {name:8s} {_ms(lambda array=array: array[:], 3)}")
    finally:
        s3.stop()


def ray_returns(_: argparse.Namespace) -> None:
    """What Ray charges per task and per returned slice on a local 2-CPU Ray: 2 or 4 trivial
    tasks at once (one 8 MB argument in the object store, as PageRank's r) returning 8 MB in
    all, or one float each; and 8 tasks that keep a CPU busy for 29 ms each (the logreg
    block's time), against the 116 ms two workers need for them, as tasks and as calls
    queued on two actors (no lease per task, the next call waiting at the worker). The
    pagerank job's blocks per worker rest on this."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=2 * 10**9)
    try:
        task = ray.remote(lambda rows, _: np.full(rows, 1.0))
        rank = ray.put(np.zeros(1_000_000))
        for tasks in (2, 4):
            for rows in (1_048_576 // tasks, 1):
                def run(tasks=tasks, rows=rows):  # type: ignore[no-untyped-def]
                    return ray.get([task.remote(rows, rank) for _ in range(tasks)])

                returned = f"{8 * rows / 2**20:.0f} MiB each" if rows > 1 else "one float each"
                print(f"  {tasks} tasks at once, returning {returned:14s} {_ms(run, 30)}")
        print(f"  ray.put of 8 MB (r)                          {_ms(lambda: ray.put(np.ones(1_000_000)), 30)}")
        print(f"  ray.put of one float64 (a driver scalar)     {_ms(lambda: ray.put(np.float64(1.0)), 30)}")
        for mib in (1, 4, 8, 16, 64, 256):  # each object freed before the next: what a put costs per byte
            values = np.ones(mib * 2**20 // 8)
            seconds = timed(lambda values=values: ray.put(values), 12).median
            print(f"  ray.put of {mib:3d} MiB, freed each time      {seconds * 1e3:7.2f} ms  "
                  f"{values.nbytes / seconds / 1e9:5.2f} GB/s")

        def busy(seconds: float) -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass

        spin = ray.remote(busy)
        run = lambda: ray.get([spin.remote(0.029) for _ in range(8)])  # noqa: E731 - logreg's 8 blocks
        print(f"  8 tasks of 29 ms of CPU on 2 workers (116 ms of work) {_ms(run, 10)}")
        spinner = ray.remote(type("Spinner", (), {"busy": lambda self, seconds: busy(seconds)}))
        actors = [spinner.remote() for _ in range(2)]
        ray.get([a.busy.remote(0.0) for a in actors])
        queued = lambda: ray.get([actors[j % 2].busy.remote(0.029) for j in range(8)])  # noqa: E731
        print(f"  the same 8 as calls queued on 2 actors (116 ms)        {_ms(queued, 10)}")
    finally:
        ray.shutdown()


def mttkrp_gemm(_: argparse.Namespace) -> None:
    """MTTKRP's GEMM on one (100, 400, 400) block (128 MB; the job's block), rank 32, 1 thread,
    in every layout: X(ij, k) @ C (arrayjob's first step), its transpose, and the unfolded
    block against the Khatri-Rao product (TensorLy's) both ways; and the same GEMM 64 and
    128 wide; then the kernel's whole block contraction, in cache-sized pieces of the block
    and whole. The narrow product runs at about 70 % of the wide one's rate in every layout."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    X, B, C = rng.standard_normal((100, 400, 400)), rng.standard_normal((400, 32)), rng.standard_normal((400, 32))
    X2, kr = X.reshape(-1, 400), (B[:, None, :] * C[None, :, :]).reshape(-1, 32)
    CT, krT = np.ascontiguousarray(C.T), np.ascontiguousarray(kr.T)
    flops = 2 * X.size * 32
    with threadpool_limits(1):
        for name, fn, f in (("X(ij, k) @ C", lambda: X2 @ C, flops), ("Cᵀ @ X(ij, k)ᵀ", lambda: CT @ X2.T, flops),
                            ("X(i, jk) @ KR", lambda: X.reshape(100, -1) @ kr, flops),
                            ("KRᵀ @ X(i, jk)ᵀ", lambda: krT @ X.reshape(100, -1).T, flops),
                            ("X(ij, k) @ (400 × 64)", lambda: X2 @ np.hstack([C, C]), 2 * flops),
                            ("X(ij, k) @ (400 × 128)", lambda: X2 @ np.hstack([C, C, C, C]), 4 * flops)):
            t = timed(fn, 5).median
            print(f"  {name:24s} {t * 1e3:7.1f} ms  {f / t / 1e9:5.1f} GFLOP/s")
        from arrayjob.kernels.primitives import einsum
        from arrayjob.planner import contraction

        for label, piece_bytes in (("in pieces (the kernel)", contraction.PIECE_BYTES), ("whole", 2**62)):
            saved, contraction.PIECE_BYTES = contraction.PIECE_BYTES, piece_bytes
            contraction.pieces.cache_clear()
            try:
                t = timed(lambda: einsum("ijk,jf,kf->if", X, B, C), 5).median
            finally:
                contraction.PIECE_BYTES = saved
                contraction.pieces.cache_clear()
            print(f"  MTTKRP of the block, {label:22s} {t * 1e3:7.1f} ms")


def logistic_exp(_: argparse.Namespace) -> None:
    """The logistic loss and gradient of one 500,000 × 64 block, 1 thread, as numba loops:
    with libm's exp and log1p per row (what the generated row loop does), with both inlined
    as polynomials (e^z by its Taylor series to z^13 after z = -k·ln2 + r and a table of
    2^-k; log1p(e) = 2·atanh(e / (2 + e)) by its series), and with rows in groups of 16 so
    the transcendental step could be vectorised. Tried and not adopted: numba's LLVM
    vectorises neither, and the inlined polynomials are slower than libm's calls."""
    import math

    import numba

    jit = numba.njit(inline="always", error_model="numpy")
    fast = {"error_model": "numpy", "fastmath": {"reassoc", "contract"}}
    pow2 = np.array([2.0 ** -k for k in range(1100)])

    @jit
    def exp_nonpositive(z, pow2):  # type: ignore[no-untyped-def]
        z = z if z > -745.5 else -745.5
        k = math.floor(-z * 1.4426950408889634 + 0.5)
        r = z + k * 6.93147180369123816490e-01 + k * 1.90821492927058770002e-10
        p = 1.0 / 6227020800.0
        for f in (479001600.0, 39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0, 24.0, 6.0, 2.0, 1.0,
                  1.0):
            p = p * r + 1.0 / f
        return p * pow2[int(k)]

    @jit
    def log1p_unit(e):  # type: ignore[no-untyped-def]
        s = e / (2.0 + e)
        q = 1.0 / 35.0
        for j in range(33, 0, -2):
            q = q * (s * s) + 1.0 / j
        return 2.0 * s * q

    @numba.njit(**fast)
    def with_libm(X, y, w, b):  # type: ignore[no-untyped-def]
        loss, g = 0.0, np.zeros(X.shape[1])
        for i in range(X.shape[0]):
            m = b
            for c in range(X.shape[1]):
                m += X[i, c] * w[c]
            e = math.exp(-abs(m))
            loss += (m if m > 0 else 0.0) + math.log1p(e) - y[i] * m
            t = (1.0 / (1.0 + e) if m >= 0 else e / (1.0 + e)) - y[i]
            for c in range(X.shape[1]):
                g[c] += X[i, c] * t
        return loss, g

    @numba.njit(**fast)
    def inlined(X, y, w, b, pow2):  # type: ignore[no-untyped-def]
        loss, g = 0.0, np.zeros(X.shape[1])
        for i in range(X.shape[0]):
            m = b
            for c in range(X.shape[1]):
                m += X[i, c] * w[c]
            e = exp_nonpositive(-abs(m), pow2)
            loss += (m if m > 0 else 0.0) + log1p_unit(e) - y[i] * m
            t = (1.0 / (1.0 + e) if m >= 0 else e / (1.0 + e)) - y[i]
            for c in range(X.shape[1]):
                g[c] += X[i, c] * t
        return loss, g

    @numba.njit(**fast)
    def grouped(X, y, w, b, pow2):  # type: ignore[no-untyped-def]
        n, d = X.shape
        loss, g, ms, ts = 0.0, np.zeros(d), np.empty(16), np.empty(16)
        for i0 in range(0, n, 16):
            rows = min(16, n - i0)
            for r in range(rows):
                m = b
                for c in range(d):
                    m += X[i0 + r, c] * w[c]
                ms[r] = m
            for r in range(rows):
                m = ms[r]
                e = exp_nonpositive(-abs(m), pow2)
                loss += (m if m > 0 else 0.0) + log1p_unit(e) - y[i0 + r] * m
                ts[r] = (1.0 / (1.0 + e) if m >= 0 else e / (1.0 + e)) - y[i0 + r]
            for r in range(rows):
                for c in range(d):
                    g[c] += X[i0 + r, c] * ts[r]
        return loss, g

    X = _X(BLOCK_ROWS)
    rng = np.random.default_rng(0)
    y, w = (rng.random(len(X)) < 0.5).astype(float), 0.3 * rng.standard_normal(X.shape[1])
    want = with_libm(X, y, w, 0.1)
    for name, fn in (("libm exp and log1p per row", lambda: with_libm(X, y, w, 0.1)),
                     ("inlined polynomials per row", lambda: inlined(X, y, w, 0.1, pow2)),
                     ("inlined, rows in groups of 16", lambda: grouped(X, y, w, 0.1, pow2))):
        loss, grad = fn()
        assert abs(loss - want[0]) <= 1e-12 * abs(want[0]) and np.allclose(grad, want[1], rtol=1e-12, atol=1e-9)
        print(f"  {name:32s} {_ms(fn)}")
    print(f"  one pass over the block (sum)    {_ms(X.sum)}")


def kept_map(_: argparse.Namespace) -> None:
    """A PageRank-sized graph block (625,000 targets × 2.5M sources, 6M nonzeros) written to a
    spill file (``runtime.kept_spill``) and mapped back, against the block in memory: the
    read alone, and the read with an SpMV, which touches every page of the mapping."""
    import tempfile

    import scipy.sparse

    from arrayjob.runtime import kept_spill

    rng = np.random.default_rng(0)
    nnz, rows, n = 6_000_000, 625_000, 2_500_000
    m = scipy.sparse.csr_matrix((rng.random(nnz), (rng.integers(0, rows, nnz), rng.integers(0, n, nnz))),
                                shape=(rows, n))
    x = rng.random(n)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "block.bin")
        size = kept_spill.write(path, m)
        print(f"  a CSR block of {m.nnz:,} nonzeros, {size / 1e6:.1f} MB in its file; one thread")
        print(f"  mapped afresh (the read alone)     {_ms(lambda: kept_spill.read(path))}")
        print(f"  SpMV, the block in memory          {_ms(lambda: m @ x)}")
        print(f"  SpMV, the block mapped afresh      {_ms(lambda: kept_spill.read(path) @ x)}")
        mapped = kept_spill.read(path)
        mapped @ x
        print(f"  SpMV, the block mapped before      {_ms(lambda: mapped @ x)}")


def sparse_loop(args: argparse.Namespace) -> None:
    """The logistic loss and gradient of one 1,000,000-row (``--rows``) CSR block, 30 non-zeros a row
    (sorted columns, float64 values, int32 indices), 1 thread: the generated row loop over the
    non-zeros (``row_layouts.CSRRows``) against SciPy's ``X @ w`` then ``X.T @ r`` (the two
    products alone, and with NumPy's elementwise steps between them: the same program). At
    2^20 columns (the issue's size) and at 2^17, where w and the gradient (8 MiB each at 2^20)
    fit in cache together. At 2^20 also the block as the reader holds it there, by columns
    (``io.locations.HELD_BY_COLUMNS_ABOVE``): the generated loop's two column sweeps
    (``row_layouts.CSCColumns``) against SciPy's products on the CSC block. Medians of 5 after a
    warm-up: wall time, and the thread's CPU time (steadier on a shared machine)."""
    import scipy.sparse
    from threadpoolctl import threadpool_limits

    from arrayjob import lazy as la
    from arrayjob.kernels.block_kernel import CompiledPrograms

    n, per_row = args.rows or 1_000_000, 30
    print(f"  {os.cpu_count()} cores (shared), 1 thread; {n:,} rows, {per_row} non-zeros a row")
    for d in (2**20, 2**17):
        rng = np.random.default_rng(0)
        indices = np.sort(rng.integers(0, d, (n, per_row), dtype=np.int32), axis=1).ravel()
        X = scipy.sparse.csr_matrix((rng.standard_normal(n * per_row), indices,
                                     np.arange(0, n * per_row + 1, per_row, dtype=np.int32)), shape=(n, d))
        y, w, b = (rng.random(n) < 0.5) * 1.0, 0.1 * rng.standard_normal(d), np.float64(0.1)
        x, yv, wv, bv = la.value("X", (n, d)), la.value("y", (n,)), la.value("w", (d,)), la.value("b", ())
        sign = 2.0 * yv - 1.0
        margin = sign * (x @ wv + bv)
        dz = -sign * la.sigmoid(-margin)
        graph = la.capture([la.sum(la.logaddexp(0.0, -margin)), x.T @ dz, la.sum(dz)])
        names = {"X": X, "y": y, "w": w, "b": b}
        args = tuple(names[node.attrs.name] for node in graph.nodes if node.op == "value")
        program = CompiledPrograms().get(_block_kernel(graph), args)
        assert program.row_loop is not None, "the sparse block did not get its row loop"

        def scipy_products(X=X, w=w) -> None:  # type: ignore[no-untyped-def]
            X.T @ (X @ w)

        def scipy_program(X=X, w=w, y=y, b=b) -> tuple[float, np.ndarray, float]:  # type: ignore[no-untyped-def]
            s = 2.0 * y - 1.0
            m = s * (X @ w + b)
            g = -s / (1.0 + np.exp(m))  # -s · sigmoid(-m)
            return float(np.logaddexp(0.0, -m).sum()), X.T @ g, float(g.sum())

        got, want = program(args), scipy_program()
        assert abs(got[0] - want[0]) <= 1e-10 * abs(want[0]) and np.allclose(got[1], want[1], rtol=1e-9, atol=1e-12)
        stored = (X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / 2**20
        print(f"  d = 2^{d.bit_length() - 1}: {stored:.0f} MiB of CSR; w and the gradient {8 * d / 2**20:g} MiB each")
        with threadpool_limits(1):
            print(f"    the row loop (loss, gradient, its sum)  {cpu_and_wall(lambda program=program, args=args: program(args))}")
            print(f"    SciPy X @ w, then X.T @ r               {cpu_and_wall(scipy_products)}")
            print(f"    SciPy's products and NumPy's steps      {cpu_and_wall(scipy_program)}")
            print(f"    one pass over data and indices (sum)    "
                  f"{cpu_and_wall(lambda X=X: (X.data.sum(), X.indices.sum()))}")
        if d > 2**17:  # held by columns, as the reader holds a block this wide
            C = X.tocsc()
            held = tuple(C if a is X else a for a in args)
            by_columns = CompiledPrograms().get(_block_kernel(graph), held)
            assert by_columns.row_loop is not None, "the CSC block did not get its loop"
            got = by_columns(held)
            assert abs(got[0] - want[0]) <= 1e-10 * abs(want[0]) and np.allclose(got[1], want[1], rtol=1e-9, atol=1e-12)
            with threadpool_limits(1):
                print(f"    held by columns: the loop's two sweeps  "
                      f"{cpu_and_wall(lambda p=by_columns, a=held: p(a))}")
                print(f"    held by columns: SciPy's products, steps {cpu_and_wall(lambda X=C: scipy_program(X))}")
            del C, held, by_columns
        del X, indices, program


def sparse_floor(args: argparse.Namespace) -> None:
    """Issue 24's logreg evaluation (``_sparse_logreg_floor``), then its k-means step
    (``_sparse_kmeans_floor``), without Ray."""
    _sparse_logreg_floor(args.rows or 10_000_000)
    _sparse_kmeans_floor()


def _sparse_logreg_floor(n: int) -> None:
    """Issue 24's logreg evaluation at its
    full size (``n`` rows, by ``--rows``, default 10,000,000 × 2^20, 30 non-zeros a row, float64 values, int32
    indices, in the 500,000-row blocks the job reads), without Ray: what the fastest kernels at
    hand take over all of X, on 1 thread and on this machine's 2 cores (the blocks dealt out
    between the threads), against one read of the CSR bytes and scikit-learn's
    ``loss_gradient`` (what LogisticRegression(solver="lbfgs") calls per evaluation). The
    kernels: SciPy's ``X @ w`` then ``X.T @ r`` on the CSR blocks (its C++ loops; sparsetools
    releases the GIL), and arrayjob's compiled block program (loss, gradient, its sum) on the
    blocks as the job holds them at this width, CSC. Then ``X @ w`` over one block, SciPy
    against the same loop compiled by numba with int32 and int64 indices. Best of 3 after a
    warm-up."""
    import scipy.sparse
    from sklearn._loss.loss import HalfBinomialLoss
    from sklearn.linear_model._linear_loss import LinearModelLoss
    from threadpoolctl import threadpool_limits

    from arrayjob import lazy as la
    from arrayjob.kernels.block_kernel import CompiledPrograms

    d, per_row, block = 2**20, 30, 500_000
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    blocks = [_distinct_csr(rng, min(block, n - lo), d, per_row) for lo in range(0, n, block)]
    X = scipy.sparse.vstack(blocks, format="csr")
    y, w, b = (rng.random(n) < 0.5) * 1.0, 0.01 * rng.standard_normal(d), 0.1
    stored = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes
    print(f"  {os.cpu_count()} cores; X {n:,} × 2^20, {per_row} a row, {stored / 1e9:.2f} GB of CSR in "
          f"{len(blocks)} blocks of {block:,} rows (made in {time.perf_counter() - started:.0f} s)")
    floor = _csr_read(X)
    print(f"    one read of the CSR bytes, 2 threads        {floor:7.3f} s ({stored / floor / 1e9:.1f} GB/s)")
    ys = np.split(y, np.cumsum([blk.shape[0] for blk in blocks])[:-1])
    x, yv, wv, bv = la.value("X", (block, d)), la.value("y", (block,)), la.value("w", (d,)), la.value("b", ())
    sign = 2.0 * yv - 1.0
    margin = sign * (x @ wv + bv)
    dz = -sign * la.sigmoid(-margin)
    graph = la.capture([la.sum(la.logaddexp(0.0, -margin)), x.T @ dz, la.sum(dz)])
    kernel = _block_kernel(graph)
    with threadpool_limits(1):
        for threads in (1, 2):
            seconds = _best(_over_blocks(lambda blk: blk.T @ (blk @ w), blocks, threads))
            print(f"    SciPy X @ w, X.T @ r, {threads} thread{'s' if threads > 1 else ' '}          {seconds:7.3f} s "
                  f"({seconds / floor:.1f}× the read)")
        one = blocks[0]
        print(f"    one block's X @ w, 1 thread: SciPy {_best(functools.partial(one.__matmul__, w)) * 1e3:.1f} ms, "
              f"a numba loop with int32 indices {_best(_numba_gather(one, w, np.int32)) * 1e3:.1f} ms, int64 "
              f"{_best(_numba_gather(one, w, np.int64)) * 1e3:.1f} ms")
        held = [tuple({"X": blk.tocsc(), "y": yb, "w": w, "b": np.float64(b)}[node.attrs.name]
                      for node in graph.nodes if node.op == "value") for blk, yb in zip(blocks, ys, strict=True)]
        del blocks
        programs = CompiledPrograms()
        for threads in (1, 2):
            seconds = _best(_over_blocks(lambda vals: programs.get(kernel, vals)(vals), held, threads))
            print(f"    arrayjob's block program (CSC), {threads} thread{'s' if threads > 1 else ' '} {seconds:7.3f} s "
                  f"({seconds / floor:.1f}× the read)")
        del held
    loss = LinearModelLoss(HalfBinomialLoss(), fit_intercept=True)
    coef = np.r_[w, b]
    seconds = _best(lambda: loss.loss_gradient(coef, X, y, l2_reg_strength=1e-4, n_threads=2))
    print(f"    scikit-learn loss_gradient (2 threads)      {seconds:7.3f} s; half of it {seconds / 2:.3f} s "
          f"(issue 24's target), twice the read {2 * floor:.3f} s")


def _sparse_kmeans_floor() -> None:
    """``sparse-floor``'s k-means half: one Lloyd step at issue 24's full size (2,000,000 × 2^16,
    30 a row, k = 16, 500,000-row blocks): arrayjob's loop over the non-zeros (its scores,
    argmin and sums per block) on 1 and 2 threads against scikit-learn's lloyd iteration (its
    Cython over CSR, OpenMP on 2 threads: fit() of 10 iterations / 10) and one read."""
    from sklearn.cluster import KMeans

    from arrayjob.kernels import loops
    from arrayjob.kernels.row_layouts import CSRRows

    n, d, k, per_row, block = 2_000_000, 2**16, 16, 30, 500_000
    rng = np.random.default_rng(1)
    X = _distinct_csr(rng, n, d, per_row)
    C = X[rng.choice(n, k, replace=False)].toarray()
    CT, a, ids = np.ascontiguousarray(C.T), (C * C).sum(axis=1), np.arange(k, dtype=np.float64)
    held = [CSRRows().arguments(X[lo: lo + block]) for lo in range(0, n, block)]  # as the job passes them
    print(f"  X {n:,} × 2^16, {per_row} a row, k = {k}, {len(held)} blocks of {block:,} rows")
    print(f"    one read of the CSR bytes, 2 threads        {_csr_read(X):7.3f} s")
    for threads in (1, 2):
        seconds = _best(_over_blocks(lambda args: loops.nearest_group_sums_csr(*args, CT, a, 2.0, ids), held, threads))
        print(f"    arrayjob's loop (one visit), {threads} thread{'s' if threads > 1 else ' '}    {seconds:7.3f} s")
    iterations = 10
    seconds = _best(lambda: KMeans(n_clusters=k, init=C, n_init=1, algorithm="lloyd", max_iter=iterations,
                                   tol=0).fit(X)) / iterations
    print(f"    scikit-learn lloyd (2 threads), an iteration {seconds:7.3f} s; half of it {seconds / 2:.3f} s "
          f"(issue 24's target)")


def _distinct_csr(rng: np.random.Generator, rows: int, d: int, per_row: int) -> Any:
    """A CSR matrix of ``rows`` × ``d`` with ``per_row`` distinct, sorted columns a row and
    normal values, as ``arrayjob datagen --nnz-per-row`` writes it (int32 indices)."""
    import scipy.sparse

    cols = (np.sort(rng.integers(0, d - per_row + 1, (rows, per_row), dtype=np.int32), axis=1)
            + np.arange(per_row, dtype=np.int32)).ravel()
    return scipy.sparse.csr_matrix((rng.standard_normal(rows * per_row), cols,
                                    np.arange(0, rows * per_row + 1, per_row, dtype=np.int32)), shape=(rows, d))


def _best(fn) -> float:  # type: ignore[no-untyped-def]
    """The least of 3 timed runs after a warm-up."""
    return min(timed(fn, 3).runs)


def _over_blocks(kernel, items, threads: int):  # type: ignore[no-untyped-def]
    """A run of ``kernel`` over every item, the items dealt out between ``threads`` threads."""
    from concurrent.futures import ThreadPoolExecutor

    def run() -> None:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda part: [kernel(item) for item in part], [items[i::threads] for i in range(threads)]))
    return run


def _csr_read(X: Any) -> float:
    """One read of a CSR matrix's values and indices, a thread each: the memory floor."""
    return _best(_over_blocks(lambda v: v.sum(), [X.data, X.indices], 2))


def _numba_gather(X: Any, w: np.ndarray, index: type):  # type: ignore[no-untyped-def]
    """``X @ w`` over a CSR block as a plain loop compiled by numba, its indices as ``index``."""
    import numba

    @numba.njit(nogil=True)
    def gather(data, indices, indptr, w):  # type: ignore[no-untyped-def]
        z = np.empty(indptr.shape[0] - 1)
        for i in range(z.shape[0]):
            t = 0.0
            for p in range(indptr[i], indptr[i + 1]):
                t += data[p] * w[indices[p]]
            z[i] = t
        return z

    indices, indptr = X.indices.astype(index), X.indptr.astype(index)
    assert np.allclose(gather(X.data, indices, indptr, w), X @ w)
    return lambda: gather(X.data, indices, indptr, w)


def sparse_kmeans(args: argparse.Namespace) -> None:
    """K-means' step and its final pass (``algorithms.kmeans.kmeans_program``, sparse: centroids held
    as (d, k)) on one CSR block of ``--rows`` rows (default 1,000,000; the benchmark's
    500,000-row blocks at full size) × 2^16, 30 non-zeros a row (``--columns``: at random, or a
    cluster centre's as in bench_sparse's X), k = 16, 1 thread: each as the
    loop over the non-zeros (``loops.nearest_group_sums_csr``; ``nearest_rows_min_csr`` for the
    labels and least scores of the final pass) against SciPy's X @ Cᵀ, NumPy's argmin, min and
    the one-hot products; and X * X (the final pass's Σ‖x‖²) on the block's own index arrays
    against SciPy's ``X.multiply(X)``; the step's loop with Cᵀ on a cache line and 16 bytes off
    one. Medians of 5 after a warm-up, thread CPU time and wall."""
    import scipy.sparse
    from threadpoolctl import threadpool_limits

    from arrayjob import lazy as la
    from arrayjob.algorithms.kmeans import centroid_values, kmeans_program
    from arrayjob.kernels import compiler
    from arrayjob.kernels import sparse as block_steps

    n, d, k, per_row = args.rows or 1_000_000, 2**16, 16, 30
    rng = np.random.default_rng(0)
    if args.columns == "clustered":  # as ``arrayjob datagen kmeans --nnz-per-row`` (bench_sparse's X): a centre's columns
        support = np.array([np.sort(rng.choice(d, per_row, replace=False)) for _ in range(k)], dtype=np.int32)
        columns = support[rng.integers(0, k, n)].ravel()
    else:
        columns = rng.integers(0, d, n * per_row).astype(np.int32)
    X = scipy.sparse.csr_matrix((rng.standard_normal(n * per_row), columns, np.arange(0, n * per_row + 1, per_row)),
                                shape=(n, d))
    X.sum_duplicates()  # canonical, as datagen writes it
    C = X[rng.choice(n, k, replace=False)].toarray()
    names = {"X": X, **centroid_values(C, transposed=True), "cluster_ids": np.arange(k, dtype=np.float64)}
    names["centroids"] = _on_cache_line(names["centroids"])  # as a task gets it from Ray's store
    print(f"  {n:,} × 2^16, {per_row} a row, {args.columns} columns "
          f"({(X.data.nbytes + X.indices.nbytes) / 2**20:.0f} MiB), k = {k}, 1 thread")
    for final, what in ((False, "the step"), (True, "the final pass")):
        graph = la.capture(list(kmeans_program(la.value("X", (n, d)), k, final=final, sparse=True).values()))
        values = tuple(names[node.attrs.name] for node in graph.nodes if node.op == "value")
        kernel = _block_kernel(graph)
        loop = compiler.Program(kernel, values)
        assert loop.packed, "the CSR block did not get its loop"
        saved, compiler.SPARSE_LOOP_MIN_BYTES = compiler.SPARSE_LOOP_MIN_BYTES, 2**62
        products = compiler.Program(kernel, values)
        compiler.SPARSE_LOOP_MIN_BYTES = saved
        got, want = loop(values), products(values)
        assert all(np.allclose(g, v, rtol=1e-10, atol=1e-6) for g, v in zip(got, want, strict=True))
        with threadpool_limits(1):
            print(f"    {what + ': the loop over the non-zeros':<46} {cpu_and_wall(functools.partial(loop, values))}")
            print(f"    {what + ': SciPy, NumPy and one-hot steps':<46} "
                  f"{cpu_and_wall(functools.partial(products, values))}")
    from arrayjob.kernels import loops
    from arrayjob.kernels.row_layouts import CSRRows

    args_of_X = CSRRows().arguments(X)[:3]
    for offset in (0, 16):  # Cᵀ on a cache line, where Ray's store puts it, and off one
        held = _on_cache_line(names["centroids"], offset)
        step = functools.partial(loops.nearest_group_sums_csr, *args_of_X, d, held, names["centroid_sq"], 2.0,
                                 names["cluster_ids"])
        with threadpool_limits(1):
            print(f"    {f'the step, Cᵀ {offset} bytes off a cache line':<46} {cpu_and_wall(step)}")
    with threadpool_limits(1):
        print(f"    X * X on the block's own indices             "
              f"{cpu_and_wall(lambda: block_steps._map('multiply', [X, X]))}")
        print(f"    SciPy's X.multiply(X)                       {cpu_and_wall(lambda: X.multiply(X))}")
        print(f"    one pass over data and indices (sum)         {cpu_and_wall(lambda: (X.data.sum(), X.indices.sum()))}")


def _on_cache_line(a: np.ndarray, offset: int = 0) -> np.ndarray:
    """A copy of ``a`` starting ``offset`` bytes past a 64-byte boundary."""
    room = np.empty(a.nbytes + 128, dtype=np.uint8)
    start = -room.ctypes.data % 64 + offset
    held = room[start: start + a.nbytes].view(a.dtype).reshape(a.shape)
    held[...] = a
    return held


def sparse_layout(_: argparse.Namespace) -> None:
    """One 250,000 × 2^20 row block, 30 non-zeros a row, held as CSR and as CSC
    (``io.locations.HELD_BY_COLUMNS_ABOVE``): X @ w and Xᵀ @ r with SciPy, and the conversion
    a worker makes once as it reads the block. Medians of 5 after a warm-up, 1 thread."""
    import scipy.sparse
    from threadpoolctl import threadpool_limits

    n, d, per_row = 250_000, 2**20, 30
    rng = np.random.default_rng(0)
    X = scipy.sparse.csr_matrix((rng.random(n * per_row), rng.integers(0, d, n * per_row).astype(np.int32),
                                 np.arange(0, n * per_row + 1, per_row)), shape=(n, d))
    w, r = rng.random(d), rng.random(n)
    with threadpool_limits(1):
        start = time.perf_counter()
        C = X.tocsc()
        print(f"tocsc, once: {time.perf_counter() - start:.3f} s")
        for name, M in (("CSR", X), ("CSC", C)):
            print(f"{name}: X @ w {_ms(lambda M=M: M @ w)}, Xᵀ @ r {_ms(lambda M=M: M.T @ r)}")


def _block_kernel(graph: Any) -> Any:
    """The one block kernel of a captured lazy graph over ``la.value`` leaves (as the planner
    would hand a fused group to a task)."""
    from arrayjob.planner.physical import BlockKernel, Step

    leaves = [i for i, node in enumerate(graph.nodes) if node.op == "value"]
    slot = {node: a for a, node in enumerate(leaves)}
    steps = []
    for i, node in enumerate(graph.nodes):
        if node.op != "value":
            slot[i] = len(leaves) + len(steps)
            steps.append(Step(node.op, node.attrs, tuple(slot[j] for j in node.inputs), node.dtype))
    return BlockKernel("logistic", len(leaves), tuple(steps), tuple(slot[o] for o in graph.outputs))


def _parquet_floor(paths: list[str], columns: list[str], stop_after: str, out: Any) -> None:
    """One process's share of ``parquet_bound``: per file, map it, decode its row group (one
    thread), copy the columns into a row-major block by bands of rows (as the load does), check
    it is finite and copy it once into fresh shared pages (what a put into the object store costs)."""
    import mmap

    import pyarrow as pa
    import pyarrow.parquet as pq

    steps = dict.fromkeys(("decode", "rows", "check", "put"), 0.0)
    for path in paths:
        a = time.perf_counter()
        with open(path, "rb") as f:
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        table = pq.ParquetFile(pa.BufferReader(pa.py_buffer(view))).read_row_group(0, columns=columns, use_threads=False)
        b = time.perf_counter()
        steps["decode"] += b - a
        if stop_after == "decode":
            continue
        values = [table.column(c).to_numpy() for c in columns]
        block = np.empty((table.num_rows, len(columns)))
        for s in range(0, table.num_rows, 4096):
            for j, v in enumerate(values):
                block[s:s + 4096, j] = v[s:s + 4096]
        c = time.perf_counter()
        steps["rows"] += c - b
        assert np.isfinite(block).all()
        d = time.perf_counter()
        steps["check"] += d - c
        np.copyto(np.frombuffer(mmap.mmap(-1, block.nbytes), dtype=np.float64).reshape(block.shape), block)
        steps["put"] += time.perf_counter() - d
    out.put(steps)


def parquet_bound(args: argparse.Namespace) -> None:
    """The Parquet load's floor on this machine, without Ray (issue 25's pyarrow target): the
    files of ``benchmarks/parquet.py``'s data (``--parquet DIR``, default its full size) read by
    one process a core, each decoding its share and, in the second pass, making the row-major
    blocks a job holds, checking and copying them once; against one pyarrow process's
    ``dataset(...).to_table(columns)``. Medians of 3 after a warm-up."""
    import multiprocessing

    import pyarrow.dataset as ds

    files = [str(p) for p in sorted((args.parquet / "features").iterdir())]
    dataset = ds.dataset(str(args.parquet / "features"), format="parquet")
    columns = [c for c in dataset.schema.names if c.startswith("f")]
    context = multiprocessing.get_context("fork")
    cores = os.cpu_count() or 1

    def processes(stop_after: str) -> tuple[float, dict[str, float]]:
        out = context.Queue()
        workers = [context.Process(target=_parquet_floor, args=(files[i::cores], columns, stop_after, out))
                   for i in range(cores)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        steps = [out.get() for _ in workers]
        for w in workers:
            w.join()
        return time.perf_counter() - start, {k: sum(s[k] for s in steps) for k in steps[0]}

    print(f"  {len(files)} files, {len(columns)} columns, {cores} processes; {os.popen('uptime').read().strip()}")
    print(f"    pyarrow to_table, one process           {_ms(lambda: dataset.to_table(columns=columns), 3)}")
    print(f"    {cores} processes: map and decode only       {_ms(lambda: processes('decode'), 3)}")
    print(f"    {cores} processes: + rows, check, one copy   {_ms(lambda: processes('all'), 3)}")
    _, steps = processes("all")
    print("    CPU-side sums over the processes: " + ", ".join(f"{k} {v:.3f} s" for k, v in steps.items()))


def linreg_block(_: argparse.Namespace) -> None:
    """linreg's TSQR floor on one 500,000 × 64 block, 1 thread: R of [X 1 y] as the job makes
    it (``linreg.augmented_r_with_ones``: sketch, assembly, trsm, Gram), its trsm and Gram alone
    over F-order pieces of 8,192 rows (right-side trsm, as the job does), the left-side
    transposed trsm over C-order pieces and a recursive blocked trsm (GEMM updates), all
    against the normal equations' Gram XᵀX of the same block. Random data: no files needed."""
    from scipy.linalg.blas import dgemm, dtrsm
    from threadpoolctl import threadpool_limits

    from arrayjob.algorithms.linreg import augmented_r_with_ones

    rng = np.random.default_rng(0)
    m, d, piece = BLOCK_ROWS, 64, 8192
    X, y = rng.standard_normal((m, d)), rng.standard_normal(m)
    A = np.column_stack([X, np.ones(m), y])
    R = np.triu(np.linalg.qr(rng.standard_normal((d + 2, d + 2)))[1])
    f_pieces = [np.asfortranarray(A[lo:lo + piece]) for lo in range(0, m, piece)]
    c_pieces = [np.ascontiguousarray(A[lo:lo + piece]) for lo in range(0, m, piece)]

    def recursive(a: np.ndarray, r: np.ndarray) -> None:  # Z r = a in place, a in Fortran order
        n = r.shape[0]
        if n <= 16:
            dtrsm(1.0, r, a, side=1, lower=0, overwrite_b=1)
            return
        h = n // 2
        recursive(a[:, :h], r[:h, :h])
        dgemm(-1.0, a[:, :h], r[:h, h:], beta=1.0, c=a[:, h:], overwrite_c=1)
        recursive(a[:, h:], r[h:, h:])

    def right() -> None:
        for a in f_pieces:
            q = dtrsm(1.0, R, a.copy(order="F"), side=1, lower=0, overwrite_b=1)
            q.T @ q

    def left() -> None:
        for a in c_pieces:
            q = dtrsm(1.0, R, a.copy().T, side=0, lower=0, trans_a=1, overwrite_b=1)
            q @ q.T

    def blocked() -> None:
        for a in f_pieces:
            q = a.copy(order="F")
            recursive(q, R)
            q.T @ q

    flops = m * (d + 2) ** 2  # a trsm of the block: m·d² multiply-adds
    with threadpool_limits(1):
        print(f"  R of [X 1 y] as linreg's tsqr makes it      {_ms(lambda: augmented_r_with_ones(X, y), 3)}")
        print(f"  trsm (right side, F pieces) + Gram          {_ms(right, 3)}")
        print(f"  trsm (left side, transposed C pieces) + Gram {_ms(left, 3)}")
        print(f"  recursive blocked trsm + Gram               {_ms(blocked, 3)}")
        t = timed(lambda: [dtrsm(1.0, R, a.copy(order="F"), side=1, lower=0, overwrite_b=1) for a in f_pieces], 3)
        print(f"  trsm alone: {t.median * 1e3:.1f} ms, {flops / t.median / 1e9:.1f} GFLOP/s; "
              f"GEMM {_gemm_rate():.1f} GFLOP/s")
        print(f"  the normal equations' Gram XᵀX              {_ms(lambda: X.T @ X, 3)}")


def _gemm_rate() -> float:
    a = np.random.default_rng(1).standard_normal((2048, 2048))
    t = timed(lambda: a @ a, 3)
    return 2 * 2048**3 / t.median / 1e9


def _quiet_ray_environment() -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_enable_metrics_collection", "0")


def ray_stop(_: argparse.Namespace) -> None:
    """A private Ray's ``ray.shutdown``, started as arrayjob starts one (no dashboard, 2 CPUs,
    one round of tasks run), timed per process type: Ray stops them one after another, giving
    each 1 s on SIGTERM. Three starts."""
    _quiet_ray_environment()
    import ray
    import ray._private.worker as worker

    for _ in range(3):
        ray.init(include_dashboard=False, log_to_driver=False, num_cpus=2)
        ray.get([ray.remote(lambda: 1).remote() for _ in range(2)])
        node, times = worker._global_node, {}

        def timed_kill(process_type: str, kill: Any = node._kill_process_impl, times: dict[str, float] = times,
                       **kwargs: Any) -> None:
            start = time.perf_counter()
            kill(process_type, **kwargs)
            times[process_type] = time.perf_counter() - start

        node._kill_process_impl = timed_kill
        start = time.perf_counter()
        ray.shutdown()
        total = time.perf_counter() - start
        print(f"  shutdown {total:.3f} s: " + ", ".join(f"{k} {v:.3f}" for k, v in times.items()))


def ray_start(_: argparse.Namespace) -> None:
    """A private Ray's start to its first tasks: ``ray.init`` as arrayjob calls it, against
    starting the head ``Node`` without the autoscaler monitor and the log monitor (which
    ``ray.init`` cannot leave out) and joining it; wall time and the CPU of its processes.
    Three of each, alternating."""
    _quiet_ray_environment()
    import psutil
    import ray
    import ray._private.node
    import ray._private.parameter

    def once(bare: bool) -> tuple[float, float]:
        start, node = time.perf_counter(), None
        if bare:
            params = ray._private.parameter.RayParams(num_cpus=2, include_dashboard=False, no_monitor=True,
                                                      include_log_monitor=False)
            node = ray._private.node.Node(params, head=True, shutdown_at_exit=False, spawn_reaper=True,
                                          ray_init_cluster=True)
            ray.init(address=node.address, log_to_driver=False)
        else:
            ray.init(include_dashboard=False, log_to_driver=False, num_cpus=2)
        ray.get([ray.remote(lambda: 1).remote() for _ in range(2)])
        wall = time.perf_counter() - start
        cpu = 0.0
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                cpu += times.user + times.system
        ray.shutdown()
        if node is not None:
            node.kill_all_processes(check_alive=False, allow_graceful=True)
        return wall, cpu

    for _ in range(3):
        for bare in (False, True):
            wall, cpu = once(bare)
            name = "head Node, no monitors" if bare else "ray.init             "
            print(f"  {name} {wall:.2f} s to the first tasks, its processes' CPU {cpu:.2f} s")


def _run_spec(args: argparse.Namespace, command: str, around: Any = contextlib.nullcontext) -> Any:
    """``--spec`` (with ``--set`` overrides) run in this process on a local Ray of 2 CPUs, its
    output in a temporary directory, inside ``around()``; the run's outcome. Ray is left up for
    the caller to read (``ray.timeline()``) and shut down."""
    import tempfile

    import ray

    from arrayjob import runner
    from arrayjob.spec import load_spec

    if args.spec is None:
        raise SystemExit(f"{command}: --spec SPEC.toml is needed")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    with tempfile.TemporaryDirectory() as out:
        spec = load_spec(str(args.spec), [f"output.uri={out}", *args.set])
        with around():
            return runner.run(spec, overwrite=True)


def timeline(args: argparse.Namespace) -> None:
    """Where a job's time goes, task by task: ``--spec`` run as ``_run_spec`` does; then Ray's
    timeline, per kind of task (its fused kernel's name), the count and the least, median and
    most seconds (the first of a kind also loads its compiled loop), and the fit stage over the
    job's iterations or evaluations."""
    import statistics
    from collections import defaultdict

    import ray

    outcome = _run_spec(args, "timeline")
    kinds: dict[str, list[float]] = defaultdict(list)
    for event in ray.timeline():
        if event.get("ph") == "X" and str(event.get("cat", "")).startswith("task::"):
            kinds[event["cat"].removeprefix("task::")].append(event["dur"] / 1e6)
    ray.shutdown()
    print(f"  {'task':<58} {'count':>5} {'least':>9} {'median':>9} {'most':>9}")
    for name, seconds in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {name[:58]:<58} {len(seconds):>5} {min(seconds) * 1e3:7.1f}ms {statistics.median(seconds) * 1e3:7.1f}ms "
              f"{max(seconds) * 1e3:7.1f}ms")
    attrs = outcome.result.attrs
    fit = sum(stage["wall_seconds"] for stage in outcome.report["stages"] if stage["name"] == "fit")
    count = attrs.get("evaluations") or attrs.get("iterations")
    if count:
        print(f"  fit stage {fit:.2f} s over {count} {'evaluations' if 'evaluations' in attrs else 'iterations'}: "
              f"{fit / count:.3f} s each")


def driver_profile(args: argparse.Namespace) -> None:
    """What a job's driver spends its own CPU on: ``--spec`` run as ``_run_spec`` does, under
    cProfile; the 20 functions with the most time of their own (Ray's waits for results among
    them: the rest is time the workers may wait on the driver)."""
    import cProfile
    import pstats

    import ray

    profile = cProfile.Profile()
    outcome = _run_spec(args, "driver-profile", lambda: profile)
    ray.shutdown()
    print("  stages: " + ", ".join(f"{s['name']} {s['wall_seconds']:.2f} s" for s in outcome.report["stages"]))
    pstats.Stats(profile).sort_stats("tottime").print_stats(20)


def numba_start(_: argparse.Namespace) -> None:
    """What a process pays at its first compiled loop (``kernels.start_loops`` takes it off a
    job's first iteration): in a fresh Python with NumPy and SciPy imported, the import of
    ``kernels.loops`` (numba's import),
    the first call of a cached loop (numba's typing and LLVM), then a second cached loop's load
    and run on a small CSR block. Three fresh processes, each printed."""
    import subprocess

    code = """
import time
import numpy as np, scipy.sparse
t0 = time.perf_counter()
from arrayjob.kernels import loops
t1 = time.perf_counter()
loops.started(0)
t2 = time.perf_counter()
X = scipy.sparse.random(10, 64, density=0.2, format="csr", random_state=0)
loops.nearest_group_sums_csr(X.data, X.indices.astype(np.uint32), X.indptr.astype(np.uint32), 64,
                             np.zeros((64, 16)), np.zeros(16), 2.0, np.arange(16.0))
t3 = time.perf_counter()
print(f"    import {t1 - t0:.3f} s, first cached call {t2 - t1:.3f} s, then a loop {(t3 - t2) * 1e3:.1f} ms")
"""
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)  # may compile and cache the loops
    for _ in range(3):
        subprocess.run([sys.executable, "-c", code], check=True)


def cpu_busy(args: argparse.Namespace) -> None:
    """How busy the machine's cores are while ``--run`` (a shell command, e.g. ``make test``)
    runs: ``/proc/stat`` read every 5 s; the command's exit status, its wall time and the mean
    share of all cores' time not idle (nor waiting on I/O) over the samples."""
    import subprocess

    def busy_and_total() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # idle and iowait are the 4th and 5th

    if args.run is None:
        raise SystemExit("cpu-busy: --run COMMAND is needed")
    began, samples = time.perf_counter(), []
    process = subprocess.Popen(args.run, shell=True)
    before = busy_and_total()
    while True:
        try:
            process.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            now = busy_and_total()
            samples.append((now[0] - before[0]) / max(1, now[1] - before[1]))
            before = now
    wall = time.perf_counter() - began
    mean = f"{100 * sum(samples) / len(samples):.0f} %" if samples else "no sample"
    print(f"cpu-busy: exit {process.returncode} after {wall:.0f} s; all {os.cpu_count()} cores busy {mean} "
          f"(mean of {len(samples)} samples, 5 s apart)")


COMMANDS = {"kmeans-ops": kmeans_ops, "pagerank-spmv": pagerank_spmv, "block-sizes": block_sizes,
            "peer-chunks": peer_chunks, "tsqr-block": tsqr_block, "kmeans-assign": kmeans_assign,
            "pagerank-build": pagerank_build, "pagerank-order": pagerank_order,
            "pagerank-iteration": pagerank_iteration, "store-pages": store_pages, "s3-block": s3_block, "s3-ops": s3_ops, "ray-returns": ray_returns,
            "mttkrp-gemm": mttkrp_gemm, "logistic-exp": logistic_exp, "kept-map": kept_map,
            "sparse-loop": sparse_loop, "sparse-floor": sparse_floor, "sparse-layout": sparse_layout, "sparse-kmeans": sparse_kmeans,
            "parquet-bound": parquet_bound, "linreg-block": linreg_block, "ray-stop": ray_stop,
            "ray-start": ray_start, "timeline": timeline, "driver-profile": driver_profile, "numba-start": numba_start, "cpu-busy": cpu_busy}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=sorted(COMMANDS))
    parser.add_argument("--rows", type=int, default=None, help="sparse-loop, sparse-kmeans: rows of the block; sparse-floor: rows of X (default 10,000,000)")
    parser.add_argument("--parquet", type=Path, default=HERE.parent / ".arrayjob" / "bench" / "parquet" / "full",
                        help="parquet-bound: benchmarks/parquet.py's data directory of one size")
    parser.add_argument("--preallocate", action="store_true",
                        help="store-pages: start Ray with RAY_preallocate_plasma_memory=1 (the store touched at start)")
    parser.add_argument("--columns", choices=("random", "clustered"), default="random",
                        help="sparse-kmeans: each row's columns drawn at random, or a cluster centre's (as bench_sparse's X)")
    parser.add_argument("--spec", type=Path, help="timeline, driver-profile: the job spec to run")
    parser.add_argument("--run", help="cpu-busy: the shell command to run and watch")
    parser.add_argument("--set", action="append", default=[], help="timeline, driver-profile: a spec override (key=value), repeatable")
    args = parser.parse_args()
    COMMANDS[args.command](args)
