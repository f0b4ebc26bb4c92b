"""Logistic regression on X (n × d float64, the logistic-regression demo data): one
loss-and-gradient evaluation and L-BFGS iterations — arrayjob and its peers (NumPy + SciPy,
dask.array, dask-glm, hand-written Ray blocks) on the same Zarr arrays, each at its best on
2 cores. Also the helpers the other X workloads share (dask arrays, plan notes, tuning).

Peers' data are read once with zarr into NumPy (that load is reported in the first row);
dask reads the same Zarr arrays into persisted chunks; the hand-written Ray peer reads row
blocks with Ray tasks into the object store, as arrayjob does.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.optimize
from bench_context import Context, rows_per_block
from bench_harness import Row, Timing, dask_threads, repeat_timed, timed
from scipy.special import expit

from arrayjob.algorithms.logreg import LogisticRegression, LogRegParams
from arrayjob.api.job import JobContext
from arrayjob.runtime.metrics import RunMetrics

L2 = 1e-4  # the demo spec's
TOL = 1e-6  # the demo spec's: stop when the gradient's 2-norm is this small (arrayjob's callback)
MiB = 2**20
TUNING: dict[str, int] = {"dask_chunk_mib": 128, "ray_block_mib": 256}  # set from the command line


def loss_grad_numpy(X: np.ndarray, y: np.ndarray, w: np.ndarray, b: float) -> tuple[float, np.ndarray, float]:
    """The summed logistic loss and its gradient, as arrayjob's program computes them."""
    sign = 2.0 * y - 1.0
    margin = sign * (X @ w + b)
    dz = -sign * expit(-margin)
    return float(np.logaddexp(0.0, -margin).sum()), X.T @ dz, float(dz.sum())


def scipy_lbfgs(evaluate: Any, n: int, d: int, iterations: int) -> tuple[float, int, int, float]:
    """SciPy's L-BFGS-B on the mean loss + (l2/2)‖w‖², with arrayjob's objective, options and
    stopping test (the gradient's 2-norm <= TOL, checked in a callback).

    Returns seconds, iterations, evaluations, objective. (Past convergence, at machine
    precision, L-BFGS-B's line search burns evaluations; the stopping test keeps every
    system out of that end-game, so iterations cost what they cost while converging.)"""
    evals, last_norm = [0], [np.inf]

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        evals[0] += 1
        w = theta[:d]
        loss, gw, gb = evaluate(w, float(theta[d]))
        grad = np.concatenate([gw, [gb]]) / n
        grad[:d] += L2 * w
        last_norm[0] = float(np.linalg.norm(grad))
        return loss / n + 0.5 * L2 * float(w @ w), grad

    def stop_when_small(intermediate_result: scipy.optimize.OptimizeResult) -> None:
        if last_norm[0] <= TOL:
            raise StopIteration

    start = time.perf_counter()
    result = scipy.optimize.minimize(fun, np.zeros(d + 1), jac=True, method="L-BFGS-B", callback=stop_when_small,
                                     options={"maxiter": iterations, "gtol": 0.0, "ftol": 64 * np.finfo(float).eps})
    return time.perf_counter() - start, max(1, int(result.nit)), evals[0], float(result.fun)


# -- the hand-written Ray peer: row blocks in the object store, one task per block -------------
def _ray_read(path: str, start: int, stop: int) -> np.ndarray:
    import zarr

    return zarr.open_array(path, mode="r")[start:stop]


def _ray_loss_grad(X: np.ndarray, y: np.ndarray, w: np.ndarray, b: float) -> tuple[float, np.ndarray, float]:
    return loss_grad_numpy(X, y, w, b)


class RayBlocks:
    """X and y cut into row blocks by Ray tasks; each evaluation is one task per block."""

    def __init__(self, ctx: Context) -> None:
        import ray

        self.ray = ray
        self.read = ray.remote(_ray_read)
        self.kernel = ray.remote(_ray_loss_grad)
        s = ctx.size
        self.step = rows_per_block(s.chunk_rows, s.cols * 8, TUNING["ray_block_mib"] * MiB, s.rows)
        self.paths = (str(ctx.data["logreg"] / "X.zarr"), str(ctx.data["logreg"] / "y.zarr"))
        self.blocks: list[tuple[Any, Any]] = []

    def load(self) -> float:
        self.blocks = []
        start = time.perf_counter()
        n = int(__import__("zarr").open_array(self.paths[0], mode="r").shape[0])
        blocks = [(self.read.remote(self.paths[0], a, min(a + self.step, n)),
                   self.read.remote(self.paths[1], a, min(a + self.step, n))) for a in range(0, n, self.step)]
        refs = [r for pair in blocks for r in pair]
        self.ray.wait(refs, num_returns=len(refs), fetch_local=False)
        self.blocks = blocks
        return time.perf_counter() - start

    def evaluate(self, w: np.ndarray, b: float) -> tuple[float, np.ndarray, float]:
        w_ref = self.ray.put(w)
        parts = self.ray.get([self.kernel.remote(X, y, w_ref, b) for X, y in self.blocks])
        return sum(p[0] for p in parts), np.sum([p[1] for p in parts], axis=0), sum(p[2] for p in parts)


# -- dask ---------------------------------------------------------------------------------------
def dask_arrays(ctx: Context, *names: str) -> tuple[list[Any], Timing]:
    """The arrays as persisted dask arrays of row chunks (whole Zarr chunks, ~dask_chunk_mib)."""
    import dask
    import dask.array as da

    s = ctx.size
    rows = rows_per_block(s.chunk_rows, s.cols * 8, TUNING["dask_chunk_mib"] * MiB, s.rows)
    held: list[list[Any]] = []

    def once() -> float:
        held.clear()
        with dask_threads():
            start = time.perf_counter()
            arrays = [da.from_zarr(str(ctx.data["logreg"] / f"{n}.zarr"), chunks=rows) for n in names]
            held.append(list(dask.persist(*arrays)))
            return time.perf_counter() - start

    t = repeat_timed(once, ctx.repeat)
    return held[0], t


def dask_loss_grad(X: Any, y: Any, w: np.ndarray, b: float) -> tuple[float, np.ndarray, float]:
    import dask
    import dask.array as da

    sign = 2.0 * y - 1.0
    margin = sign * (X @ w + b)
    dz = -sign * (1.0 / (1.0 + da.exp(margin)))
    loss, gw, gb = dask.compute(da.logaddexp(0.0, -margin).sum(), X.T @ dz, dz.sum())
    return float(loss), gw, float(gb)


# -- the workloads ------------------------------------------------------------------------------
def plan_note(session: Any, program: dict[str, Any]) -> str:
    physical = session.plan(program).physical
    big = max(physical.sources, key=lambda source: source.array.nbytes)
    return f"{len(physical.tasks)} tasks, {big.grid.num_blocks} blocks of {big.array.name}"


def _logreg_arrayjob(ctx: Context, w: np.ndarray, b: float, block_bytes: int | None = None,
                     ) -> tuple[Row, Row, float]:
    """The job's own program (loss and gradient in one fused pass) via Session, then its L-BFGS.
    With ``block_bytes``: the same with another tiling block target (not the target row)."""
    s, n, d = ctx.size, ctx.size.rows, ctx.size.cols
    job = LogisticRegression(LogRegParams(max_iter=s.iterations, tol=TOL),
                             {"X": ctx.info("logreg", "X"), "y": ctx.info("logreg", "y")})
    program = job.program(ctx.workers)
    load, session = ctx.loaded_session(program, block_bytes=block_bytes)
    system, default = ("arrayjob", True) if block_bytes is None else \
        (f"arrayjob, {block_bytes // MiB} MiB blocks (proposed)", False)
    tuned = "" if default else f"not the default: PlanOptions(target_block_bytes={block_bytes // MiB} MiB); "
    t = timed(lambda: session.compute(program, {"w": w, "b": b}), ctx.repeat)
    loss = float(session.compute(program, {"w": w, "b": b})["loss"])
    limit = ctx.limits.bound(8 * n * d + 8 * n, 4 * n * d)
    evaluation = Row("logreg loss+grad", f"X {n:,} × {d}", system, "per evaluation", load.median, t.median,
                     arrayjob=default, peer=False, limit_s=limit, load_runs=load.runs, compute_runs=t.runs,
                     note=tuned + plan_note(session, program))
    fits = []
    compute, evaluations = session.compute, [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        evaluations[0] += 1
        return compute(*args, **kwargs)

    session.compute = counted  # type: ignore[method-assign]  # counts the job's evaluations
    for _ in range(ctx.repeat + 1):
        metrics, evaluations[0] = RunMetrics(), 0
        result = job.run(JobContext(session, metrics))
        fit = next(st.wall_seconds for st in metrics.stages if st.name == "fit")
        fits.append((fit / result.attrs["iterations"], result.attrs["iterations"], result.attrs["objective"],
                     evaluations[0]))
    session.compute = compute  # type: ignore[method-assign]
    per = [f[0] for f in fits[1:]]
    lbfgs = Row("logreg L-BFGS", f"X {n:,} × {d}", system, f"per iteration ({s.iterations} iterations)", None,
                float(np.median(per)), arrayjob=default, peer=False, limit_s=limit, compute_runs=per,
                note=f"{tuned}the logreg job's own L-BFGS-B (fit stage / iterations); {fits[-1][3]} evaluations in "
                     f"{fits[-1][1]} iterations; objective {fits[-1][2]:.10g}")
    return evaluation, lbfgs, loss


def _lbfgs_row(ctx: Context, system: str, runs: list[tuple[float, int, int, float]], note: str) -> Row:
    s = ctx.size
    per = [r[0] / r[1] for r in runs]
    return Row("logreg L-BFGS", f"X {s.rows:,} × {s.cols}", system, f"per iteration ({s.iterations} iterations)", None,
               float(np.median(per)), limit_s=ctx.limits.bound(8 * s.rows * s.cols + 8 * s.rows, 4 * s.rows * s.cols),
               compute_runs=per, note=f"{note}; {runs[-1][2]} evaluations in {runs[-1][1]} iterations; "
                                      f"objective {runs[-1][3]:.10g}")


def _logreg_numpy(ctx: Context, w: np.ndarray, b: float, loss: float) -> tuple[Row, Row]:
    s, n, d = ctx.size, ctx.size.rows, ctx.size.cols
    X, x_load = ctx.numpy_array("logreg", "X")
    y, y_load = ctx.numpy_array("logreg", "y")
    ref = loss_grad_numpy(X, y, w, b)
    assert np.isclose(ref[0], loss, rtol=1e-9), (ref[0], loss)
    t = timed(lambda: loss_grad_numpy(X, y, w, b), ctx.repeat)
    evaluation = Row("logreg loss+grad", f"X {n:,} × {d}", "NumPy", "per evaluation", x_load.median + y_load.median,
                     t.median, limit_s=ctx.limits.bound(8 * n * d + 8 * n, 4 * n * d), compute_runs=t.runs,
                     note="load = zarr read into NumPy; 2 BLAS threads")
    runs = [scipy_lbfgs(lambda w_, b_: loss_grad_numpy(X, y, w_, b_), n, d, s.iterations)
            for _ in range(ctx.repeat + 1)][1:]
    return evaluation, _lbfgs_row(ctx, "NumPy + SciPy L-BFGS-B", runs, "2 BLAS threads")


def _logreg_dask(ctx: Context, w: np.ndarray, b: float) -> tuple[Row, Row, Row]:
    s, n, d = ctx.size, ctx.size.rows, ctx.size.cols
    (Xd, yd), load = dask_arrays(ctx, "X", "y")
    with dask_threads():
        t = timed(lambda: dask_loss_grad(Xd, yd, w, b), ctx.repeat)
        runs = [scipy_lbfgs(lambda w_, b_: dask_loss_grad(Xd, yd, w_, b_), n, d, s.iterations)
                for _ in range(ctx.repeat + 1)][1:]
        glm = [_dask_glm_lbfgs(Xd, yd, n, s.iterations) for _ in range(ctx.repeat + 1)][1:]
    chunks = f"{Xd.numblocks[0]} chunks of {Xd.chunks[0][0]:,} rows"
    evaluation = Row("logreg loss+grad", f"X {n:,} × {d}", "dask.array", "per evaluation", load.median, t.median,
                     limit_s=ctx.limits.bound(8 * n * d + 8 * n, 4 * n * d), load_runs=load.runs,
                     compute_runs=t.runs, note=f"{chunks}; threaded scheduler, 1 BLAS thread per dask thread")
    per = [r[0] / r[1] for r in glm]
    glm_row = _lbfgs_row(ctx, "dask-glm lbfgs", [(r[0], r[1], r[2], float("nan")) for r in glm],
                         "its own objective (summed loss, no intercept), normalize=False")
    glm_row.compute_runs, glm_row.compute_s = per, float(np.median(per))
    return evaluation, _lbfgs_row(ctx, "dask.array + SciPy L-BFGS-B", runs, f"{chunks}; one dask.compute per evaluation"), glm_row


def _logreg_ray(ctx: Context, w: np.ndarray, b: float) -> tuple[Row, Row]:
    s, n, d = ctx.size, ctx.size.rows, ctx.size.cols
    blocks = RayBlocks(ctx)
    load = repeat_timed(blocks.load, ctx.repeat)
    t = timed(lambda: blocks.evaluate(w, b), ctx.repeat)
    runs = [scipy_lbfgs(blocks.evaluate, n, d, s.iterations) for _ in range(ctx.repeat + 1)][1:]
    note = f"{len(blocks.blocks)} blocks of {blocks.step:,} rows, one task per block"
    evaluation = Row("logreg loss+grad", f"X {n:,} × {d}", "Ray, hand-written blocks", "per evaluation", load.median,
                     t.median, limit_s=ctx.limits.bound(8 * n * d + 8 * n, 4 * n * d), load_runs=load.runs,
                     compute_runs=t.runs, note=note)
    return evaluation, _lbfgs_row(ctx, "Ray blocks + SciPy L-BFGS-B", runs, note)


def logreg(ctx: Context) -> list[Row]:
    rng = np.random.default_rng(1)
    w, b = 0.1 * rng.standard_normal(ctx.size.cols), 0.05
    aj_eval, aj_lbfgs, loss = _logreg_arrayjob(ctx, w, b)
    np_eval, np_lbfgs = _logreg_numpy(ctx, w, b, loss)
    dk_eval, dk_lbfgs, glm = _logreg_dask(ctx, w, b)
    ray_eval, ray_lbfgs = _logreg_ray(ctx, w, b)
    return [aj_eval, np_eval, dk_eval, ray_eval, aj_lbfgs, np_lbfgs, dk_lbfgs, ray_lbfgs, glm]


def _dask_glm_lbfgs(Xd: Any, yd: Any, n: int, iterations: int) -> tuple[float, int, int]:
    """dask-glm's lbfgs (normalize=False: no extra passes); iterations read from SciPy's info."""
    import warnings

    import dask_glm.algorithms as algorithms
    from dask_glm.families import Logistic

    info: dict[str, Any] = {}
    original = algorithms.fmin_l_bfgs_b

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        info.update(out[2])
        return out

    algorithms.fmin_l_bfgs_b = recording
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # dask-glm sets a renamed dask option
            start = time.perf_counter()
            algorithms.lbfgs(Xd, yd, regularizer="l2", lamduh=L2 * n, max_iter=iterations, tol=0.0, family=Logistic,
                             normalize=False)
            seconds = time.perf_counter() - start
    finally:
        algorithms.fmin_l_bfgs_b = original
    return seconds, max(1, int(info.get("nit", iterations))), int(info.get("funcalls", 0))
