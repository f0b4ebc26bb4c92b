"""PageRank per iteration (SciPy sparse power iteration; NetworkX on a smaller graph) and
MTTKRP (numpy.einsum, TensorLy, dask.array.einsum), arrayjob beside them on the same data."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
from bench_context import Context, rows_per_block
from bench_harness import Row, dask_threads, repeat_timed, stopwatch, timed
from bench_logreg import TUNING

from arrayjob.algorithms.pagerank.graph import distinct
from arrayjob.algorithms.pagerank.job import PageRank, PageRankParams
from arrayjob.algorithms.tensor import MTTKRP, MTTKRPParams
from arrayjob.api.job import JobContext
from arrayjob.runtime.metrics import RunMetrics

DAMPING = 0.85


def _stage(metrics: RunMetrics, name: str) -> float:
    return sum(s.wall_seconds for s in metrics.stages if s.name == name)


def scipy_graph(edges: np.ndarray, n: int) -> tuple[Any, np.ndarray]:
    """Aᵀ D⁻¹ as CSR (duplicate edges once, as networkx and arrayjob count them; columns divided
    by the out-degrees once, as arrayjob's kept blocks are), and the dangling nodes."""
    import scipy.sparse

    keys = distinct(edges[:, 1] * n + edges[:, 0])  # np.unique, at np.sort's speed (algorithms.pagerank.graph.distinct)
    At = scipy.sparse.csr_matrix((np.ones(len(keys)), (keys // n, keys % n)), shape=(n, n))
    outdeg = np.asarray(At.sum(axis=0)).ravel()
    dangling = outdeg == 0
    inverse = np.where(dangling, 0.0, 1.0 / np.where(dangling, 1.0, outdeg))
    return (At @ scipy.sparse.diags(inverse)).tocsr(), dangling


def scipy_iterations(P: Any, dangling: np.ndarray, iterations: int) -> np.ndarray:
    """arrayjob's iteration, on one core: r ← d·(Aᵀ D⁻¹) r + (d·Σ_dangling r + 1 − d)/n, and the
    L1 change arrayjob tests for convergence."""
    n = P.shape[0]
    rank = np.full(n, 1.0 / n)
    for _ in range(iterations):
        base = (DAMPING * rank[dangling].sum() + 1.0 - DAMPING) / n
        new = DAMPING * (P @ rank) + base
        _delta = float(np.abs(new - rank).sum())
        rank = new
    return rank


def pagerank(ctx: Context) -> list[Row]:
    s = ctx.size
    iters = s.iterations
    size = f"{s.pr_nodes:,} nodes, {s.pr_edges:,} edges"
    what = "per iteration"
    rows: list[Row] = []

    job = PageRank(PageRankParams(max_iter=iters, tol=1e-300, n_nodes=s.pr_nodes),
                   {"edges": ctx.info("pagerank", "edges")})
    runs: list[tuple[float, float, np.ndarray]] = []
    for _ in range(ctx.repeat + 1):
        metrics = RunMetrics()
        result = job.run(JobContext(ctx.session(), metrics))
        runs.append((_stage(metrics, "load"), _stage(metrics, "fit") / result.attrs["iterations"],
                     result.arrays["rank"]))
    runs = runs[1:]

    scipy_row, diff = _pagerank_scipy(ctx, size, what, runs[-1][2])
    aj = [r[1] for r in runs]
    rows.append(Row("PageRank", size, "arrayjob", what, float(np.median([r[0] for r in runs])), float(np.median(aj)),
                    arrayjob=True, limit_s=scipy_row.limit_s, load_runs=[r[0] for r in runs], compute_runs=aj,
                    note=f"the pagerank job (load = read edges, build and keep CSR blocks of Aᵀ; "
                         f"fit stage / iterations); rank matches SciPy's to {diff:.1e}"))
    rows.append(scipy_row)
    rows.append(_networkx(ctx))
    return rows


def _pagerank_scipy(ctx: Context, size: str, what: str, rank_aj: np.ndarray) -> tuple[Row, float]:
    import zarr

    s, iters = ctx.size, ctx.size.iterations
    edges_path = str(ctx.data["pagerank"] / "edges.zarr")
    held: list[Any] = []

    def load_once() -> float:
        held.clear()
        start = time.perf_counter()
        held.append(scipy_graph(zarr.open_array(edges_path, mode="r")[...], s.pr_nodes))
        return time.perf_counter() - start

    load = repeat_timed(load_once, ctx.repeat)
    At, dangling = held[0]
    ranks: list[np.ndarray] = []
    t = repeat_timed(lambda: stopwatch(lambda: ranks.append(scipy_iterations(At, dangling, iters))) / iters,
                     ctx.repeat)
    diff = float(np.abs(ranks[-1] / ranks[-1].sum() - rank_aj).max())
    # one iteration streams Aᵀ (int32 indices, float64 values, indptr), reads x and r, writes y
    nbytes = At.nnz * 12 + (At.shape[0] + 1) * 4 + 3 * 8 * At.shape[0]
    limit = ctx.limits.bound(nbytes, 2 * At.nnz)
    return Row("PageRank", size, "SciPy sparse", what, load.median, t.median, limit_s=limit, load_runs=load.runs,
               compute_runs=t.runs, note=f"load = zarr read + CSR of Aᵀ D⁻¹ ({At.nnz:,} distinct edges); "
                                         f"the same iteration as arrayjob's, SpMV on 1 core"), diff


def _networkx(ctx: Context) -> Row:
    import networkx as nx
    import zarr

    s = ctx.size
    edges = zarr.open_array(str(ctx.data["pagerank-nx"] / "edges.zarr"), mode="r")[...]
    graphs: list[Any] = []

    def build() -> float:
        graphs.clear()
        start = time.perf_counter()
        G = nx.DiGraph()
        G.add_nodes_from(range(s.nx_nodes))
        G.add_edges_from(edges.tolist())
        graphs.append(G)
        return time.perf_counter() - start

    load = repeat_timed(build, ctx.repeat)

    def run() -> None:
        with contextlib.suppress(nx.PowerIterationFailedConvergence):  # a fixed count of iterations is timed
            nx.pagerank(graphs[0], alpha=DAMPING, max_iter=s.iterations, tol=1e-300)

    t = repeat_timed(lambda: stopwatch(run) / s.iterations, ctx.repeat)
    return Row("PageRank", f"{s.nx_nodes:,} nodes, {s.nx_edges:,} edges", "NetworkX (smaller graph)", "per iteration",
               load.median, t.median, peer=False, load_runs=load.runs, compute_runs=t.runs,
               note="not comparable in size (too slow at full size): load = DiGraph build; each call also converts "
                    "the graph to a SciPy matrix, spread over its iterations")


def _mttkrp_arrayjob(ctx: Context, factors: dict[str, np.ndarray], size: str, what: str, limit: float,
                     ) -> tuple[Row, np.ndarray, int]:
    program = MTTKRP(MTTKRPParams(mode=0), {n: ctx.info("mttkrp", n) for n in "XBC"}).program(ctx.workers)
    load, session = ctx.loaded_session(program)
    values = {"B": factors["B"], "C": factors["C"]}
    t = timed(lambda: session.compute(program, values), ctx.repeat)
    physical = session.plan(program).physical
    return Row("MTTKRP", size, "arrayjob", what, load.median, t.median, arrayjob=True, limit_s=limit,
               load_runs=load.runs, compute_runs=t.runs,
               note=f"the mttkrp job's program; {len(physical.tasks)} tasks, "
                    f"{physical.sources[0].grid.num_blocks} blocks of X"), session.compute(program, values)["M"], \
        physical.sources[0].grid.block_shape[0]


def mttkrp(ctx: Context) -> list[Row]:
    import dask.array as da
    import tensorly as tl
    import zarr

    s, lim = ctx.size, ctx.limits
    t_, F = s.tensor, s.rank
    size = f"{t_}³, rank {F}"
    what = "one MTTKRP (mode 0)"
    limit = lim.bound(8 * t_**3, 2 * t_**3 * F)
    rows: list[Row] = []
    root = ctx.data["mttkrp"]
    factors = {n: zarr.open_array(str(root / f"{n}.zarr"), mode="r")[...] for n in "ABC"}

    aj, M_aj, _ = _mttkrp_arrayjob(ctx, factors, size, what, limit)
    rows.append(aj)

    X, x_load = ctx.numpy_array("mttkrp", "X")
    B, C = factors["B"], factors["C"]
    M = np.einsum("ijk,jf,kf->if", X, B, C, optimize=True)
    assert np.allclose(M, M_aj, rtol=1e-8, atol=1e-8 * np.abs(M).max())
    t = timed(lambda: np.einsum("ijk,jf,kf->if", X, B, C, optimize=True), ctx.repeat)
    rows.append(Row("MTTKRP", size, "numpy.einsum(optimize=True)", what, x_load.median, t.median, limit_s=limit,
                    compute_runs=t.runs, note="2 BLAS threads"))

    tl.set_backend("numpy")
    cp = (None, [factors["A"], B, C])
    assert np.allclose(tl.tenalg.unfolding_dot_khatri_rao(X, cp, 0), M, rtol=1e-8, atol=1e-8 * np.abs(M).max())
    t = timed(lambda: tl.tenalg.unfolding_dot_khatri_rao(X, cp, 0), ctx.repeat)
    rows.append(Row("MTTKRP", size, "TensorLy", what, x_load.median, t.median, limit_s=limit, compute_runs=t.runs,
                    note="tenalg.unfolding_dot_khatri_rao, NumPy backend, 2 BLAS threads"))

    chunk = rows_per_block(s.tensor_chunk, t_ * t_ * 8, TUNING["dask_chunk_mib"] * 2**20, t_)
    held: list[Any] = []

    def dask_load() -> float:
        held.clear()
        with dask_threads():
            start = time.perf_counter()
            held.append(da.from_zarr(str(root / "X.zarr"), chunks=(min(chunk, t_), t_, t_)).persist())
            return time.perf_counter() - start

    dload = repeat_timed(dask_load, ctx.repeat)
    Xd = held[0]
    with dask_threads():
        t = timed(lambda: da.einsum("ijk,jf,kf->if", Xd, B, C, optimize=True).compute(), ctx.repeat)
    rows.append(Row("MTTKRP", size, "dask.array.einsum", what, dload.median, t.median, limit_s=limit,
                    load_runs=dload.runs, compute_runs=t.runs,
                    note=f"{Xd.numblocks[0]} chunks of {Xd.chunks[0][0]} slabs, optimize=True"))
    return rows


WORKLOADS = {"pagerank": pagerank, "mttkrp": mttkrp}
