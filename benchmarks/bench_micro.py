"""Measurements behind the miss analysis in docs/benchmarks.md, each on the full-size data
that ``bench.py`` generates (run it once first):

    .venv/bin/python benchmarks/bench_micro.py kmeans-ops     # the KMeans step's ops on one block, 1 thread
    .venv/bin/python benchmarks/bench_micro.py pagerank-spmv  # SpMV of Aᵀ's row blocks in Ray tasks vs one process
    .venv/bin/python benchmarks/bench_micro.py block-sizes    # arrayjob loss+grad vs PlanOptions.target_block_bytes
    .venv/bin/python benchmarks/bench_micro.py peer-chunks    # dask chunk and Ray block sizes for the peers
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
os.environ.pop("RAY_ADDRESS", None)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from bench_harness import timed  # noqa: E402

DATA = HERE.parent / ".arrayjob" / "bench" / "full"
MiB = 2**20


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

    from arrayjob.jobs.logreg import LogisticRegression, LogRegParams
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


COMMANDS = {"kmeans-ops": kmeans_ops, "pagerank-spmv": pagerank_spmv, "block-sizes": block_sizes,
            "peer-chunks": peer_chunks}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=sorted(COMMANDS))
    args = parser.parse_args()
    COMMANDS[args.command](args)
