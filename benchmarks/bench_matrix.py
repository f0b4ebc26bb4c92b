"""Factorisations on X (n × d float64, the logistic-regression demo data): TSQR (Q and R)
and 10 Lloyd iterations of KMeans, k = 8 — arrayjob and its peers (numpy.linalg.qr,
dask.array.linalg.tsqr; scikit-learn, dask-ml) on the same Zarr arrays; and the linreg job's
default method on a dense X (``refined``: the normal equations refined against X, TSQR where X
is too ill-conditioned) and ``tsqr`` (the R of [X 1 y], Q never formed) against its plain
normal equations.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from bench_context import Context
from bench_harness import Row, dask_threads, repeat_timed, timed
from bench_logreg import MiB, dask_arrays, plan_note

import arrayjob.lazy as la
from arrayjob.algorithms.kmeans import kmeans_program
from arrayjob.algorithms.linreg import LinearRegression, LinRegParams
from arrayjob.algorithms.tsqr import R1, TSQR, TSQRParams, cholesky_upper, sum_grams
from arrayjob.api.job import JobContext
from arrayjob.runtime.metrics import RunMetrics


def _tsqr_arrayjob(ctx: Context, size: str, what: str, limit: float) -> tuple[Row, np.ndarray]:
    """The tsqr job's sequence (method auto): the Gram pass, the driver's Cholesky and its
    condition check, then the pass that forms Q — kept on the workers instead of written."""
    job = TSQR(TSQRParams(), {"A": ctx.info("logreg", "X")})
    declared = job.stages(ctx.workers)
    grams_program, program = declared["grams"], declared["q"]
    load, session = ctx.loaded_session(grams_program)
    r1: list[np.ndarray] = []

    def factor() -> float:
        start = time.perf_counter()
        r = cholesky_upper(sum_grams(session.compute(grams_program)["grams"]))
        assert r is not None, "X failed CholeskyQR2's condition check"
        kept = session.persist(program, {R1: r})
        seconds = time.perf_counter() - start
        session.release(kept)
        r1.append(r)
        return seconds

    t = repeat_timed(factor, ctx.repeat)
    R = session.compute({"R2": program["R2"]}, {R1: r1[-1]})["R2"] @ r1[-1]
    return Row("TSQR", size, "arrayjob", what, load.median, t.median, arrayjob=True, limit_s=limit,
               load_runs=load.runs, compute_runs=t.runs,
               note=f"the tsqr job's CholeskyQR2 (method auto), Q kept on the workers (Session.persist); "
                    f"{plan_note(session, program)}"), R


def tsqr(ctx: Context) -> list[Row]:
    import dask
    import dask.array as da

    s, lim = ctx.size, ctx.limits
    n, d = s.rows, s.cols
    size = f"X {n:,} × {d}"
    limit = lim.bound(16 * n * d, 4 * n * d * d)  # read X, write Q; QR with Q formed ≥ 4nd² flops at the GEMM rate
    what = "Q and R, in memory"
    aj, R_aj = _tsqr_arrayjob(ctx, size, what, limit)
    rows = [aj]

    X, x_load = ctx.numpy_array("logreg", "X")
    R_np: list[np.ndarray] = []
    t = timed(lambda: R_np.append(np.linalg.qr(X)[1]), ctx.repeat)
    assert np.allclose(np.abs(np.diag(R_np[-1])), np.abs(np.diag(R_aj)), rtol=1e-8)
    R_np.clear()
    rows.append(Row("TSQR", size, "numpy.linalg.qr", what, x_load.median, t.median, limit_s=limit,
                    compute_runs=t.runs, note="LAPACK dgeqrf + dorgqr, 2 BLAS threads"))

    (Xd,), dload = dask_arrays(ctx, "X")
    with dask_threads():
        t = timed(lambda: dask.persist(*da.linalg.tsqr(Xd)), ctx.repeat)
    rows.append(Row("TSQR", size, "dask.array.linalg.tsqr", what, dload.median, t.median, limit_s=limit,
                    load_runs=dload.runs, compute_runs=t.runs,
                    note=f"{Xd.numblocks[0]} chunks of {Xd.chunks[0][0]:,} rows; persist(Q, R)"))
    return rows


def _kmeans_arrayjob(ctx: Context, C0: np.ndarray, size: str, what: str, limit: float,
                     block_bytes: int | None = None) -> tuple[Row, np.ndarray]:
    k, iters = ctx.size.k, ctx.size.iterations
    step = kmeans_program(la.from_zarr(ctx.info("logreg", "X")), k, final=False)
    load, session = ctx.loaded_session(step, block_bytes=block_bytes)
    ids = np.arange(k, dtype=np.float64)

    def lloyd() -> np.ndarray:
        C = C0.copy()
        for _ in range(iters):  # the kmeans job's loop
            r = session.compute(step, {"centroids": C, "centroid_sq": (C**2).sum(1), "cluster_ids": ids})
            counts = r["counts"]
            C = np.where(counts[:, None] > 0, r["sums"] / np.maximum(counts, 1)[:, None], C)
        return C

    centres: list[np.ndarray] = []
    t = timed(lambda: centres.append(lloyd()), ctx.repeat)
    if block_bytes is None:
        return Row("KMeans", size, "arrayjob", what, load.median, t.median, arrayjob=True, peer=False, limit_s=limit,
                   load_runs=load.runs, compute_runs=t.runs,
                   note=f"the kmeans job's program and loop (assignment, sums, counts in one pass); "
                        f"{plan_note(session, step)} per iteration"), centres[-1]
    return Row("KMeans", size, f"arrayjob, {block_bytes // MiB} MiB blocks (proposed)", what, load.median, t.median,
               peer=False, limit_s=limit, load_runs=load.runs, compute_runs=t.runs,
               note=f"not the default: PlanOptions(target_block_bytes={block_bytes // MiB} MiB), the job's program; "
                    f"{plan_note(session, step)} per iteration"), centres[-1]


def kmeans(ctx: Context) -> list[Row]:
    from dask_ml.cluster import KMeans as DaskKMeans
    from sklearn.cluster import KMeans

    s, lim = ctx.size, ctx.limits
    n, d, k, iters = s.rows, s.cols, s.k, s.iterations
    size = f"X {n:,} × {d}, k = {k}"
    what = f"{iters} Lloyd iterations"
    limit = iters * lim.bound(8 * n * d, 4 * n * d * k)  # per iteration: one pass; distances and sums 4ndk flops
    X, x_load = ctx.numpy_array("logreg", "X")
    C0 = X[np.random.default_rng(2).choice(min(n, 10_000), size=k, replace=False)].copy()
    aj, C_aj = _kmeans_arrayjob(ctx, C0, size, what, limit)
    rows = [aj]

    fits: list[Any] = []
    t = timed(lambda: fits.append(KMeans(n_clusters=k, init=C0, n_init=1, max_iter=iters, tol=0.0,
                                         algorithm="lloyd").fit(X)), ctx.repeat)
    assert fits[-1].n_iter_ == iters, fits[-1].n_iter_
    diff = float(np.abs(fits[-1].cluster_centers_ - C_aj).max())
    rows.append(Row("KMeans", size, "scikit-learn", what, x_load.median, t.median, limit_s=limit, compute_runs=t.runs,
                    note=f"lloyd, 2 OpenMP threads; fit() also validates X and ends with an E-step; "
                         f"centroids match arrayjob's to {diff:.1e}"))
    fits.clear()

    (Xd,), dload = dask_arrays(ctx, "X")
    with dask_threads():
        t = timed(lambda: DaskKMeans(n_clusters=k, init=C0, max_iter=iters, tol=0.0, random_state=0).fit(Xd),
                  ctx.repeat)
    rows.append(Row("KMeans", size, "dask-ml", what, dload.median, t.median, limit_s=limit, load_runs=dload.runs,
                    compute_runs=t.runs, note=f"{Xd.numblocks[0]} chunks; fit() also computes labels and inertia"))
    return rows


def linreg(ctx: Context) -> list[Row]:
    """The linreg job's fit stage (its passes over X and y in memory, and the driver's solves):
    its default method on a dense X (``refined``), and ``tsqr``, against method ``normal``, on X
    and the 0/1 labels y of the logistic-regression data as the target; the coefficients
    compared."""
    s = ctx.size
    size = f"X {s.rows:,} × {s.cols}"
    limit = ctx.limits.bound(8 * s.rows * s.cols, 2 * s.rows * s.cols * s.cols)  # read X, its Gram at the GEMM rate
    rows, coefs = [], {}
    for method in ("normal", "tsqr", "auto"):
        job = LinearRegression(LinRegParams(method=method), {"X": ctx.info("logreg", "X"), "y": ctx.info("logreg", "y")})
        plan = job.stages(ctx.workers)
        program = plan["normal" if job.method == "refined" else job.method]
        load, session = ctx.loaded_session(program)
        ran: dict[str, Any] = {}

        def fit(job: LinearRegression = job, session: Any = session, method: str = method,
                ran: dict[str, Any] = ran) -> float:
            metrics = RunMetrics()
            result = job.run(JobContext(session, metrics))
            coefs[method] = result.arrays["coef"]
            ran.update(result.attrs)
            return next(st.wall_seconds for st in metrics.stages if st.name == "fit")

        t = repeat_timed(fit, ctx.repeat)
        note = f"method {ran['method']}; {plan_note(session, program)}"
        if "refinement" in ran:
            steps = ran["refinement"]["steps"]
            note += f"; {steps} refinement pass{'es' if steps != 1 else ''}"
        if method != "normal":
            gap = float(np.abs(coefs[method] - coefs["normal"]).max() / np.abs(coefs["normal"]).max())
            note += f"; coefficients within {gap:.1e} of the normal equations' (relative to the largest)"
        system = "arrayjob, the default (refined)" if method == "auto" else f"arrayjob, method {method}"
        rows.append(Row("linreg", size, system, "per fit", load.median, t.median, arrayjob=method == "auto",
                        peer=method == "normal", limit_s=limit, load_runs=load.runs, compute_runs=t.runs, note=note))
    return rows


WORKLOADS = {"tsqr": tsqr, "kmeans": kmeans, "linreg": linreg}
