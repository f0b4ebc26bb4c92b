"""K-means clustering, Lloyd's algorithm, one pass over X per iteration.

Each pass assigns every row to its nearest centroid and, in the same kernel per row
block, sums the rows and counts per cluster (the sums come back as (k, d) partials per
block, summed in a tree): KASEN's fused assignment-and-update. The driver divides sums
by counts. As in scikit-learn's Lloyd, a centroid shift (squared, summed) at or below
tol × mean(var(X)) stops the loop, and a last pass computes labels and inertia for the
final centroids. Assignment compares ‖c‖² − 2x·c (scikit-learn's expansion), inertia is
Σ‖x − c‖² computed directly. A cluster that empties keeps its previous centroid. On big
blocks the assignment (k dot products and an argmin per row, no n × k scores) and the
one-hot products (sums per cluster, counts, each row's centroid) run as compiled loops
over the rows, not as products with n × k matrices, and the step's assignment, sums and
counts as one loop (``kernels.rewrites``): one read of a dense block; two sweeps of a sparse
one's non-zeros, the assignment then the sums (``loops.nearest_group_sums_csr`` says why).

Initialisation: explicit centroids (a URI of a (k, d) array), random rows, or k-means++
(Arthur & Vassilvitskii 2007) on a sample of at most 100k rows read whole-chunk.

A sparse X (CSR row blocks) is read and used as it is: the products with the centroids
visit its non-zeros only, the centroids stay dense (k × d on the driver, sent to the blocks
transposed, d × k, the layout the loop over a row's non-zeros gathers from), the seeding uses
‖x‖² − 2x·c + ‖c‖², and the inertia Σ‖x‖² + min_c(‖c‖² − 2x·c).

Cost per iteration: one pass over X (8nd bytes; sparse: its non-zeros), about 4ndk flops
(sparse: 4·nnz·k), moves k(d + 1) + 1 floats per block. Labels (8n bytes) are assembled on the driver at the end. The centroids
are checkpointed after an iteration (``io.checkpoint``): a resumed run skips the
initialisation and goes on from them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse

from arrayjob import api as la
from arrayjob.api import (
    EACH_ITERATION,
    ArrayInfo,
    InputError,
    Job,
    JobContext,
    JobResult,
    Pass,
    StagePlan,
    StorageOptions,
    Written,
    open_array_info,
    parse_uri,
    read_block,
    require,
    require_matrix,
)

SAMPLE_ROWS = 100_000


@dataclass(frozen=True)
class KMeansParams:
    k: int = field(metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    # or "random", or the URI of a (k, d) array (a relative path: as the spec's inputs)
    init: str = field(default="k-means++", metadata={"uri": ("k-means++", "random")})
    seed: int = 0
    max_iter: int = field(default=300, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    tol: float = field(default=1e-4, metadata={"check": lambda v: v >= 0 and np.isfinite(v), "expect": "a number >= 0"})


def nearest_centroid(X: la.BlockArray, k: int, transposed: bool = False,
                     ) -> tuple[la.BlockArray, la.BlockArray, la.BlockArray]:
    """The centroids (``la.value`` "centroids", bound with "centroid_sq" by ``centroid_values``),
    each row's scores ‖c‖² − 2x·c (‖x − c‖² − ‖x‖², scikit-learn's expansion) and its nearest
    centroid, (n, 1): the form ``kernels.rewrites`` runs as one loop over the rows.

    ``transposed``: the centroids held as Cᵀ, (d, k), the layout a loop over a sparse row's
    non-zeros reads (each non-zero gathers its column's k values, contiguous); bound so by
    ``centroid_values(..., transposed=True)`` once per iteration on the driver, not per block."""
    d = X.shape[1]
    C = la.value("centroids", (d, k) if transposed else (k, d))
    scores = la.value("centroid_sq", (k,)) - 2.0 * (X @ C if transposed else X @ C.T)
    return C, scores, scores.argmin(axis=1, keepdims=True)


def centroid_values(centroids: np.ndarray, transposed: bool = False) -> dict[str, np.ndarray]:
    """What ``nearest_centroid`` binds: the centroids ((k, d), or (d, k) ``transposed``) and
    their squared norms."""
    held = np.ascontiguousarray(centroids.T) if transposed else centroids
    return {"centroids": held, "centroid_sq": (centroids**2).sum(1)}


def kmeans_program(X: la.BlockArray, k: int, final: bool, sparse: bool = False) -> dict[str, la.BlockArray]:
    """One Lloyd step (``sums`` and ``counts`` per cluster), or the ``final`` pass (``labels``
    and ``inertia``). The step leaves the inertia out: the loop never reads it, and its
    n × d temporaries cost as much as the rest of the step.

    On a ``sparse`` X the inertia is Σ ‖x‖² + min_c (‖c‖² − 2 x·c), which visits the non-zeros
    only; on a dense one Σ ‖x − c‖², which does not lose digits to cancellation."""
    C, scores, labels = nearest_centroid(X, k, transposed=sparse)
    onehot = (labels == la.value("cluster_ids", (k,))) * 1.0  # a group sum, not a product
    if final:
        inertia = ((X * X).sum() + scores.min(axis=1).sum()) if sparse else la.square(X - onehot @ C).sum()
        return {"inertia": inertia, "labels": labels.sum(axis=1)}  # (n, 1) -> (n,)
    return {"sums": onehot.T @ X, "counts": onehot.sum(axis=0)}


class KMeans(Job):
    name = "kmeans"
    title = "k-means"
    inputs = ("X",)
    sparse_inputs = ("X",)
    row_input = "X"  # labels, one per row of X
    Params = KMeansParams
    params: KMeansParams

    def check_inputs(self) -> None:
        X = self.arrays["X"]
        require_matrix(X)
        require(self.params.k <= X.shape[0], f"params.k: {self.params.k} clusters but inputs.X has only {X.shape[0]} rows")
        if self.params.init not in ("k-means++", "random"):
            location = parse_uri(self.params.init, key="params.init")
            self.init_array = open_array_info("init", location, self.storage)
            shape = (self.params.k, X.shape[1])
            require(self.init_array.shape == shape,
                    f"params.init: expected a ({shape[0]}, {shape[1]}) array of centroids, got {self.init_array.shape}")

    def describe(self) -> str:
        X = self.arrays["X"]
        return f"{self.title}, k = {self.params.k}, on X {X.shape[0]:,} × {X.shape[1]:,}"

    def stages(self, workers: int) -> StagePlan:
        """Column statistics at load (for ``tol``), a Lloyd step per iteration, and the
        final pass (labels, which the workers write, and inertia)."""
        X = la.from_input(self.arrays["X"])
        return StagePlan((
            Pass("stats", "load", {"sum": X.sum(axis=0), "sum_sq": (X * X).sum(axis=0)}),
            Pass("step", "fit", kmeans_program(X, self.params.k, final=False, sparse=self.sparse), EACH_ITERATION),
            Pass("final", "fit", kmeans_program(X, self.params.k, final=True, sparse=self.sparse),
                 writes={"labels": Written((X.shape[0],), (self.arrays["X"].chunks[0],), "int64", self.arrays["X"])}),
        ))

    @property
    def sparse(self) -> bool:
        return self.arrays["X"].sparse is not None

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        X = self.arrays["X"]
        return [((self.params.k, X.shape[1]), "float64", None), ((X.shape[0],), "int64", X.chunks[0])]

    def initial(self, ctx: JobContext) -> np.ndarray:
        p = self.params
        if p.init not in ("k-means++", "random"):
            return ctx.read_whole(self.init_array).astype(np.float64)
        return seed_centres(self.arrays["X"], p.init, p.k, p.seed, ctx.storage)

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        n, d = self.arrays["X"].shape
        plan = self.stages(ctx.workers)
        step, final = plan["step"], plan["final"]
        ids = np.arange(p.k, dtype=np.float64)
        with ctx.stage("load"):
            ctx.load(step)
            s = ctx.compute(plan["stats"])
            variance = s["sum_sq"] / n - (s["sum"] / n) ** 2
            tol = p.tol * float(np.mean(variance))
            saved = ctx.restore()  # the centroids after an iteration, and whether they stopped
            if saved is None:
                centroids = self.initial(ctx)
                if not np.isfinite(centroids).all():
                    raise InputError("params.init: the initial centroids hold NaN or infinite values")
                iterations, done = 0, False
            else:
                centroids = saved.state["centroids"]
                iterations, done = int(saved.state["iteration"]), bool(saved.state["done"])
        with ctx.stage(plan.stage_of("step")):
            while not done and iterations < p.max_iter:
                r = ctx.compute(step, {**centroid_values(centroids, self.sparse), "cluster_ids": ids})
                counts = r["counts"]
                updated = np.where(counts[:, None] > 0, r["sums"] / np.maximum(counts, 1)[:, None], centroids)
                shift = float(((updated - centroids) ** 2).sum())
                centroids, iterations, done = updated, iterations + 1, shift <= tol
                ctx.iteration(iterations, p.max_iter, shift=shift, tol=tol)
                ctx.checkpoint(iterations, {"centroids": centroids, "iteration": iterations, "done": done})
            values = {**centroid_values(centroids, self.sparse), "cluster_ids": ids}
            arrays = {"centroids": centroids}
            if ctx.writes_result:  # labels (8n bytes) are written by the workers
                r = ctx.compute(ctx.writing(plan.pass_named("final")), values)
                ctx.count_writes(plan.pass_named("final"), r)
            else:
                r = ctx.compute(final, values)
                arrays["labels"] = r["labels"]
        inertia = float(r["inertia"])
        attrs = {"inertia": inertia, "iterations": iterations, "k": p.k}
        return JobResult(arrays, attrs, [f"{iterations} iterations: inertia {inertia:.10g}"])


def sample_rows(X: ArrayInfo, storage: StorageOptions, rng: np.random.Generator) -> Any:
    """Whole chunks of X, chosen at random, up to SAMPLE_ROWS rows (all of X if small): dense,
    or CSR rows for a sparse X."""
    n, chunk = X.shape[0], X.chunks[0]
    starts = rng.permutation(np.arange(0, n, chunk))
    take = starts[: max(1, -(-min(n, SAMPLE_ROWS) // chunk))]
    parts = [read_block(X, (slice(s, min(s + chunk, n)), slice(0, X.shape[1])), storage)[0] for s in sorted(take)]
    return scipy.sparse.vstack(parts, format="csr") if X.sparse is not None else np.concatenate(parts)


def seed_centres(X: ArrayInfo, init: str, k: int, seed: int, storage: StorageOptions) -> np.ndarray:
    """``k`` centres drawn from a sample of X (``sample_rows``) by ``init``: k-means++, or
    ``random`` rows; duplicates are checked as ``check_distinct`` says."""
    rng = np.random.default_rng(seed)
    sample = sample_rows(X, storage, rng)
    if init == "random":
        centres = _dense(sample[rng.choice(sample.shape[0], size=k, replace=False)])
    else:
        centres = kmeans_plus_plus(sample, k, rng)
    if len(np.unique(centres, axis=0)) < k:  # k × d: cheap; the sample only when it repeats
        check_distinct(sample, k, X.shape[0])
    return centres


def check_distinct(sample: Any, k: int, n: int) -> None:
    """Fewer distinct rows than k would leave duplicate centres (empty clusters): an error
    when the sample is all of X's ``n`` rows, else a warning (rows outside it may differ)."""
    distinct = _distinct_rows(sample)
    if distinct >= k:
        return  # random init drew a repeated row: the clusters may still separate
    if sample.shape[0] == n:
        raise InputError(f"params.k: {k} clusters but inputs.X has only {distinct} distinct rows")
    print(f"arrayjob: warning: params.k: {k} clusters but the {sample.shape[0]:,} rows sampled from inputs.X "
          f"hold only {distinct} distinct rows; some centroids will be duplicates", file=sys.stderr)


def kmeans_plus_plus(sample: Any, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding on ``sample`` (dense, or CSR rows): each next centre drawn with
    probability ∝ D(x)²."""
    m = sample.shape[0]
    if scipy.sparse.issparse(sample):
        row_sq = np.asarray(sample.multiply(sample).sum(axis=1)).ravel()

        def distances(c: np.ndarray) -> np.ndarray:  # ‖x‖² − 2 x·c + ‖c‖², non-zeros only
            return np.maximum(row_sq - 2.0 * (sample @ c) + c @ c, 0.0)
    else:
        def distances(c: np.ndarray) -> np.ndarray:
            return ((sample - c) ** 2).sum(1)
    centres = [_dense(sample[rng.integers(m)]).ravel()]
    closest = distances(centres[0])
    for _ in range(1, k):
        total = closest.sum()
        index = rng.choice(m, p=closest / total) if total > 0 else rng.integers(m)
        centres.append(_dense(sample[index]).ravel())
        closest = np.minimum(closest, distances(centres[-1]))
    return np.array(centres, dtype=np.float64)


def _dense(rows: Any) -> np.ndarray:
    return (rows.toarray() if scipy.sparse.issparse(rows) else np.asarray(rows)).astype(np.float64)


def _distinct_rows(sample: Any) -> int:
    if not scipy.sparse.issparse(sample):
        return len(np.unique(sample, axis=0))
    rows = scipy.sparse.csr_matrix(sample)
    rows.sum_duplicates()  # canonical: sorted column indices, no repeats
    rows.eliminate_zeros()
    return len({(rows.indices[a:b].tobytes(), rows.data[a:b].tobytes())
                for a, b in zip(rows.indptr[:-1], rows.indptr[1:], strict=True)})
