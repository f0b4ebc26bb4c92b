"""Demo data generators: ``arrayjob datagen ALGORITHM URI ...`` writes Zarr v3 inputs.

Data are generated chunk by chunk with a seed per chunk, so the bytes depend only on
``seed`` and the shape, never on memory or parallelism, and the driver holds one slab
(about 64 MiB) at a time. Every chunk carries a CRC32C checksum that reads verify.

With ``--nnz-per-row`` (or ``--density``), logreg, linreg and kmeans write X as a sparse CSR
group (AnnData's layout, ``io.sparse_writer``), a slab of rows at a time; y stays dense. ALS's
ratings R are such a group, so it needs one of the two; with ``--format parquet`` the same
ratings are written instead as a Parquet table ``ratings/part-*.parquet`` of (user, item,
rating) rows, a file per chunk of users; both write ``users.zarr``, every user's id, for
``predict`` with the fitted model. With ``--classes K`` (K > 2), logreg's labels are
0..K−1 (multinomial data).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from arrayjob.errors import SpecError
from arrayjob.io.arrays import create_array
from arrayjob.io.locations import Location, StorageCounters, StorageOptions
from arrayjob.io.output import probe_writable
from arrayjob.io.sparse_writer import CsrGroupWriter

SLAB_BYTES = 64 * 2**20


@dataclass(frozen=True)
class DatagenRequest:
    location: Location
    rows: int
    cols: int
    chunk_rows: int
    seed: int
    options: StorageOptions
    k: int = 8  # clusters (kmeans), components (gmm)
    rank: int = 8  # rank (tensors; factor columns; pca: the directions above the noise)
    shape: tuple[int, ...] = ()  # tensor shape (mttkrp, cp_als); rows × cols × cols if empty
    edges: int = 0  # edges (pagerank); 10 × rows if 0
    nnz_per_row: int = 0  # > 0: X sparse, with this many non-zeros in every row (logreg, linreg, kmeans; als's R)
    density: float = 0.0  # > 0: X sparse, with round(density × cols) non-zeros in every row
    classes: int = 2  # logreg's classes: more than 2 writes labels 0..classes − 1
    table: bool = False  # als: the ratings as a Parquet table of (user, item, rating) rows, not a CSR group


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def _write_rows(req: DatagenRequest, name: str, shape: tuple[int, ...], dtype: str,
                make: Callable[[int, int, np.random.Generator], np.ndarray], counters: StorageCounters,
                stream: int = 0) -> None:
    """Write array ``name`` chunk by chunk along its first axis; ``make(start, rows, rng)``."""
    chunks = (min(req.chunk_rows, shape[0]), *shape[1:])
    array = create_array(req.location.join(f"{name}.zarr"), req.options, shape=shape, chunks=chunks,
                         dtype=dtype, counters=counters, checksum=True)
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
    per_slab = max(1, SLAB_BYTES // max(1, chunks[0] * row_bytes))
    n_chunks = -(-shape[0] // chunks[0])
    for first in range(0, n_chunks, per_slab):
        parts = []
        for chunk in range(first, min(first + per_slab, n_chunks)):
            start = chunk * chunks[0]
            rows = min(chunks[0], shape[0] - start)
            parts.append(make(start, rows, _rng(req.seed, stream, chunk)))
        start = first * chunks[0]
        array[start: start + sum(len(p) for p in parts)] = np.concatenate(parts)


def _write_small(req: DatagenRequest, name: str, data: np.ndarray, counters: StorageCounters) -> None:
    array = create_array(req.location.join(f"{name}.zarr"), req.options, shape=data.shape,
                         chunks=data.shape, dtype=str(data.dtype), counters=counters, checksum=True)
    array[...] = data


def _labels_and_features(req: DatagenRequest, start: int, rows: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    labels = rng.integers(0, 2, size=rows).astype(np.float64)
    features = rng.standard_normal((rows, req.cols))
    features += ((2.0 * labels - 1.0) / np.sqrt(req.cols))[:, None]
    yield features
    yield labels


def logreg(req: DatagenRequest) -> StorageCounters:
    """Two overlapping Gaussian classes (as in NumS's evaluation): x ~ N(±mu, I), |mu| = 1.

    Labels are balanced Bernoulli(1/2); the class means are ±1/sqrt(d) in every coordinate,
    so the classes overlap and the regularised logistic loss has a finite optimum. With
    ``classes`` K > 2: ``multinomial``.
    """
    if req.classes > 2:
        return multinomial(req)
    counters = StorageCounters()
    _write_rows(req, "X", (req.rows, req.cols), "float64",
                lambda s, n, rng: next(_labels_and_features(req, s, n, rng)), counters)
    _write_rows(req, "y", (req.rows,), "float64",
                lambda s, n, rng: list(_labels_and_features(req, s, n, rng))[1], counters)
    return counters


def multinomial(req: DatagenRequest) -> StorageCounters:
    """K overlapping Gaussian classes: labels uniform on 0..K−1 (as floats), x ~ N(mu_y, I) with
    the class means mu_k drawn once (seeded) from N(0, I/d): |mu_k| about 1, so the classes
    overlap and the softmax loss has a finite optimum."""
    counters = StorageCounters()
    means = _rng(req.seed, 97).standard_normal((req.classes, req.cols)) / np.sqrt(req.cols)

    def labels(start: int, rows: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(0, req.classes, size=rows).astype(np.float64)

    def features(start: int, rows: int, rng: np.random.Generator) -> np.ndarray:
        y = labels(start, rows, _rng(req.seed, 1, start // req.chunk_rows)).astype(np.int64)
        return means[y] + rng.standard_normal((rows, req.cols))

    _write_rows(req, "X", (req.rows, req.cols), "float64", features, counters, stream=0)
    _write_rows(req, "y", (req.rows,), "float64", labels, counters, stream=1)
    return counters


def linreg(req: DatagenRequest) -> StorageCounters:
    """y = X w + 0.5 + noise, with X standard normal, w fixed by the seed, noise sd 0.1."""
    counters = StorageCounters()
    w = _rng(req.seed, 99).standard_normal(req.cols)

    def features(start: int, rows: int, rng: np.random.Generator) -> np.ndarray:
        return rng.standard_normal((rows, req.cols))

    def targets(start: int, rows: int, rng: np.random.Generator) -> np.ndarray:
        x = features(start, rows, _rng(req.seed, 0, start // req.chunk_rows))
        return x @ w + 0.5 + 0.1 * rng.standard_normal(rows)

    _write_rows(req, "X", (req.rows, req.cols), "float64", features, counters, stream=0)
    _write_rows(req, "y", (req.rows,), "float64", targets, counters, stream=1)
    return counters


def kmeans(req: DatagenRequest) -> StorageCounters:
    """Gaussian blobs: ``k`` centres in [-10, 10]^d, unit-variance points around a random one."""
    counters = StorageCounters()
    centres = _rng(req.seed, 99).uniform(-10, 10, size=(req.k, req.cols))

    def points(start: int, rows: int, rng: np.random.Generator) -> np.ndarray:
        return centres[rng.integers(0, req.k, size=rows)] + rng.standard_normal((rows, req.cols))

    _write_rows(req, "X", (req.rows, req.cols), "float64", points, counters)
    return counters


def gmm(req: DatagenRequest) -> StorageCounters:
    """A Gaussian mixture: ``k`` centres in [-10, 10]^d, uneven weights (Dirichlet(5, ..., 5)),
    and a covariance of its own per component, A Aᵀ with A standard normal scaled by
    s/√d, s drawn from [0.3, 1.5]: blobs of different sizes, shapes and orientations."""
    counters = StorageCounters()
    rng = _rng(req.seed, 99)
    k, d = req.k, req.cols
    centres = rng.uniform(-10, 10, size=(k, d))
    weights = rng.dirichlet(np.full(k, 5.0))
    factors = rng.standard_normal((k, d, d)) * (rng.uniform(0.3, 1.5, size=(k, 1, 1)) / np.sqrt(d))

    def points(start: int, rows: int, rng: np.random.Generator) -> np.ndarray:
        label = rng.choice(k, size=rows, p=weights)
        noise = rng.standard_normal((rows, d))
        out = centres[label]
        for c in range(k):  # one product per component: no rows × d × d temporary
            mine = label == c
            out[mine] += noise[mine] @ factors[c].T
        return out

    _write_rows(req, "X", (req.rows, req.cols), "float64", points, counters)
    return counters


def tsqr(req: DatagenRequest) -> StorageCounters:
    """A tall matrix A (rows × cols) of standard normal entries."""
    counters = StorageCounters()
    _write_rows(req, "A", (req.rows, req.cols), "float64",
                lambda s, n, rng: rng.standard_normal((n, req.cols)), counters)
    return counters


def pca(req: DatagenRequest) -> StorageCounters:
    """Low rank plus noise around a mean: x = μ + Σ_j z_j s_j v_j + 0.1 ε, with ``rank``
    orthonormal directions v_j fixed by the seed, scales s_j = 10 · 2^(−j/2) (a decaying
    spectrum) and z, ε standard normal; μ uniform in [−5, 5]^d. The top ``rank`` components
    stand clear of the noise."""
    counters = StorageCounters()
    rng = _rng(req.seed, 99)
    rank = min(req.rank, req.cols)
    directions = np.linalg.qr(rng.standard_normal((req.cols, rank)))[0].T * (10.0 * 2.0 ** (-np.arange(rank) / 2))[:, None]
    mean = rng.uniform(-5, 5, size=req.cols)

    def rows(start: int, n: int, rng: np.random.Generator) -> np.ndarray:
        return mean + rng.standard_normal((n, rank)) @ directions + 0.1 * rng.standard_normal((n, req.cols))

    _write_rows(req, "X", (req.rows, req.cols), "float64", rows, counters)
    return counters


def _tensor_shape(req: DatagenRequest) -> tuple[int, int, int]:
    shape = req.shape or (req.rows, req.cols, req.cols)
    if len(shape) != 3:
        raise SpecError(f"datagen: --shape must have 3 sizes (I,J,K), got {shape}")
    return shape


def _low_rank_tensor(req: DatagenRequest, counters: StorageCounters) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X = sum_f a_f ⊗ b_f ⊗ c_f + 1% noise, written slab by slab along the first mode."""
    shape = _tensor_shape(req)
    rng = _rng(req.seed, 99)
    A, B, C = (rng.standard_normal((s, req.rank)) for s in shape)
    scale = np.sqrt(req.rank)

    def slab(start: int, rows: int, rng: np.random.Generator) -> np.ndarray:
        block = np.einsum("if,jf,kf->ijk", A[start: start + rows], B, C)
        return block + 0.01 * scale * rng.standard_normal(block.shape)

    _write_rows(req, "X", shape, "float64", slab, counters)
    return A, B, C


def mttkrp(req: DatagenRequest) -> StorageCounters:
    """A low-rank tensor X plus noise, and factor matrices A, B, C (one per mode)."""
    counters = StorageCounters()
    shape = _tensor_shape(req)
    _low_rank_tensor(req, counters)
    rng = _rng(req.seed, 98)
    for name, size in zip("ABC", shape, strict=True):
        _write_small(req, name, rng.standard_normal((size, req.rank)), counters)
    return counters


def cp_als(req: DatagenRequest) -> StorageCounters:
    """A low-rank tensor X plus 1% noise (its rank is ``--rank``)."""
    counters = StorageCounters()
    _low_rank_tensor(req, counters)
    return counters


def pagerank(req: DatagenRequest) -> StorageCounters:
    """A power-law directed graph: R-MAT edges (a, b, c, d = 0.57, 0.19, 0.19, 0.05).

    ``rows`` is the number of nodes, ``edges`` the number of (source, target) pairs; ids are
    drawn over the next power of two and folded onto [0, rows).
    """
    counters = StorageCounters()
    n = req.rows
    edges = req.edges or 10 * n
    scale = max(1, int(np.ceil(np.log2(max(2, n)))))
    probs = np.array([0.57, 0.19, 0.19, 0.05])

    def chunk(start: int, rows: int, rng: np.random.Generator) -> np.ndarray:
        src = np.zeros(rows, dtype=np.int64)
        dst = np.zeros(rows, dtype=np.int64)
        for level in range(scale):
            quadrant = rng.choice(4, size=rows, p=probs)
            src |= (quadrant >> 1).astype(np.int64) << level
            dst |= (quadrant & 1).astype(np.int64) << level
        return np.stack([src % n, dst % n], axis=1)

    _write_rows(req, "edges", (edges, 2), "int64", chunk, counters)
    return counters


# -- sparse X --------------------------------------------------------------------------------


def _sparse_columns(rng: np.random.Generator, rows: int, nnz: int, cols: int) -> np.ndarray:
    """(rows, nnz) sorted distinct columns in [0, cols): a sorted draw from [0, cols - nnz]
    plus 0, 1, ..., nnz - 1 (distinct by construction, no rejection)."""
    return np.sort(rng.integers(0, cols - nnz + 1, size=(rows, nnz)), axis=1) + np.arange(nnz)


def _true_weights(req: DatagenRequest, nnz: int) -> np.ndarray:
    """A sparse weight vector (a tenth of the columns), scaled so that x·w has variance 1 for a
    row of ``nnz`` standard normal values."""
    rng = _rng(req.seed, 99)
    support = max(1, req.cols // 10)
    w = np.zeros(req.cols)
    w[rng.choice(req.cols, size=support, replace=False)] = rng.standard_normal(support)
    return w / np.sqrt(nnz * support / req.cols)


SparseRows = Callable[[int, int, np.random.Generator], tuple[np.ndarray, ...]]


def _write_sparse(req: DatagenRequest, nnz: int, make: SparseRows, counters: StorageCounters,
                  with_y: bool = True, name: str = "X") -> None:
    """X (or ``name``) as a CSR group of ``nnz`` values a row (and y dense), slab by slab of row
    chunks: ``make(start, rows, rng)`` gives a chunk's columns and values, (rows, nnz) each (and
    y). A chunk of X holds at most 64 MiB of values, fewer for ``chunk_rows`` rows."""
    n, chunk_rows = req.rows, max(1, min(req.chunk_rows, req.rows, SLAB_BYTES // (8 * nnz)))
    writer = CsrGroupWriter(req.location.join(f"{name}.zarr"), req.options, shape=(n, req.cols), nnz=n * nnz,
                            chunk_rows=chunk_rows, row_nnz=nnz, counters=counters)
    y = create_array(req.location.join("y.zarr"), req.options, shape=(n,), chunks=(chunk_rows,), dtype="float64",
                     counters=counters, checksum=True) if with_y else None
    # a slab's columns, values and their temporaries take about 8 times its 8-byte values
    per_slab = max(1, SLAB_BYTES // (8 * chunk_rows * nnz * 8))
    n_chunks = -(-n // chunk_rows)
    for first in range(0, n_chunks, per_slab):
        parts = [make(c * chunk_rows, min(chunk_rows, n - c * chunk_rows), _rng(req.seed, 0, c))
                 for c in range(first, min(first + per_slab, n_chunks))]
        columns, values, *targets = (np.concatenate(p) for p in zip(*parts, strict=True))
        writer.write(np.arange(len(columns) + 1, dtype=np.int64) * nnz, columns.ravel(), values.ravel())
        if y is not None:
            start = first * chunk_rows
            y[start: start + len(columns)] = targets[0]
    writer.close()


def sparse_logreg(req: DatagenRequest, nnz: int) -> StorageCounters:
    """Rows of ``nnz`` standard normal values at random columns; labels Bernoulli(sigmoid(2 x·w))
    for a true weight vector w nonzero on a tenth of the columns. With ``classes`` K > 2: labels
    drawn from softmax(2 x·w_k) (the largest of x·w_k plus Gumbel noise), one such w_k a class."""
    counters = StorageCounters()
    w = 2.0 * _true_weights(req, nnz)
    if req.classes > 2:
        w = np.stack([2.0 * _true_weights(dataclasses.replace(req, seed=req.seed + k), nnz) for k in range(req.classes)])

    def rows(start: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        columns, values = _sparse_columns(rng, n, nnz, req.cols), rng.standard_normal((n, nnz))
        if req.classes > 2:
            scores = np.einsum("ij,kij->ik", values, w[:, columns]) + rng.gumbel(size=(n, req.classes))
            return columns, values, scores.argmax(axis=1).astype(np.float64)
        margin = (values * w[columns]).sum(axis=1)
        return columns, values, (rng.random(n) < 1.0 / (1.0 + np.exp(-margin))).astype(np.float64)

    _write_sparse(req, nnz, rows, counters)
    return counters


def sparse_linreg(req: DatagenRequest, nnz: int) -> StorageCounters:
    """y = X w + 0.5 + noise (sd 0.1), X's rows ``nnz`` standard normal values at random
    columns, w nonzero on a tenth of the columns."""
    counters = StorageCounters()
    w = _true_weights(req, nnz)

    def rows(start: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        columns, values = _sparse_columns(rng, n, nnz, req.cols), rng.standard_normal((n, nnz))
        return columns, values, (values * w[columns]).sum(axis=1) + 0.5 + 0.1 * rng.standard_normal(n)

    _write_sparse(req, nnz, rows, counters)
    return counters


def sparse_kmeans(req: DatagenRequest, nnz: int) -> StorageCounters:
    """``k`` sparse centres (``nnz`` columns each, values in [-10, 10]); each point is a random
    centre plus unit-variance noise on that centre's columns."""
    counters = StorageCounters()
    rng = _rng(req.seed, 99)
    support = _sparse_columns(rng, req.k, nnz, req.cols)
    centres = rng.uniform(-10, 10, size=(req.k, nnz))

    def rows(start: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        label = rng.integers(0, req.k, size=n)
        return support[label], centres[label] + rng.standard_normal((n, nnz))

    _write_sparse(req, nnz, rows, counters, with_y=False)
    return counters


def als(req: DatagenRequest, nnz: int) -> StorageCounters:
    """Ratings R (users × items: ``rows`` × ``cols``) from low-rank factors plus noise: every
    user rates ``nnz`` distinct items at random, rᵤᵢ = xᵤ·yᵢ + 0.1 ε with ``rank`` factors
    whose entries are N(0, 1/√rank), so that x·y has variance 1 (ε standard normal); the item
    factors are fixed by the seed, each user's drawn with its chunk. And ``users``: the users'
    ids 0..rows − 1."""
    counters = StorageCounters()
    scale = req.rank ** -0.25
    items = _rng(req.seed, 99).standard_normal((req.cols, req.rank)) * scale

    def rows(start: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        users = rng.standard_normal((n, req.rank)) * scale
        columns = _sparse_columns(rng, n, nnz, req.cols)
        ratings = np.einsum("uk,ujk->uj", users, items[columns]) + 0.1 * rng.standard_normal((n, nnz))
        return columns, ratings

    if req.table:
        _write_ratings_table(req, nnz, rows, counters)
    else:
        _write_sparse(req, nnz, rows, counters, with_y=False, name="R")
    # every user's id, for predict with the fitted model (configs/predict_als.toml)
    _write_rows(req, "users", (req.rows,), "int64", lambda start, n, rng: np.arange(start, start + n), counters)
    return counters


def _write_ratings_table(req: DatagenRequest, nnz: int, make: SparseRows, counters: StorageCounters) -> None:
    """The ratings ``_write_sparse`` would write as R.zarr (the same chunks of users, the same
    seeds), as ``ratings/part-NNNNN.parquet``: columns user (int64), item (int64), rating
    (float64), one file per chunk of users, one row group each."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from arrayjob.io.backend import backend_for

    n, chunk_rows = req.rows, max(1, min(req.chunk_rows, req.rows, SLAB_BYTES // (8 * nnz)))
    backend = backend_for(req.location.join("ratings"), req.options)
    chunks = -(-n // chunk_rows)
    for c in range(chunks):
        start = c * chunk_rows
        columns, values = make(start, min(chunk_rows, n - start), _rng(req.seed, 0, c))
        users = np.repeat(np.arange(start, start + len(columns), dtype=np.int64), nnz)
        table = pa.table({"user": users, "item": columns.ravel().astype(np.int64), "rating": values.ravel()})
        sink = io.BytesIO()
        pq.write_table(table, sink, row_group_size=table.num_rows)
        data = sink.getvalue()
        backend.write_bytes(f"part-{c:0{max(5, len(str(chunks)))}d}.parquet", data)
        counters.bytes_written += len(data)
        counters.put_requests += 1


SPARSE_GENERATORS: dict[str, Callable[[DatagenRequest, int], StorageCounters]] = {
    "logreg": sparse_logreg, "linreg": sparse_linreg, "kmeans": sparse_kmeans, "als": als,
}
SPARSE_ONLY = ("als",)  # their input is a sparse matrix: --nnz-per-row or --density is needed


def _row_nnz(algorithm: str, req: DatagenRequest) -> int:
    """The non-zeros of every row of a sparse X (0: X dense)."""
    if not req.nnz_per_row and not req.density:
        if algorithm in SPARSE_ONLY:
            raise SpecError(f"datagen: {algorithm} writes a sparse matrix: give --nnz-per-row (or --density)")
        return 0
    if req.nnz_per_row and req.density:
        raise SpecError("datagen: give --nnz-per-row or --density, not both")
    if algorithm not in SPARSE_GENERATORS:
        raise SpecError(f"datagen: a sparse X (--nnz-per-row, --density) is made for {', '.join(SPARSE_GENERATORS)}, "
                        f"not {algorithm}")
    if req.density and not 0 < req.density <= 1:
        raise SpecError(f"datagen: --density must be in (0, 1], got {req.density}")
    nnz = req.nnz_per_row or max(1, round(req.density * req.cols))
    if not 1 <= nnz <= req.cols:
        raise SpecError(f"datagen: --nnz-per-row must be from 1 to --cols ({req.cols}), got {nnz}")
    return nnz


GENERATORS: dict[str, Callable[[DatagenRequest], StorageCounters]] = {
    "logreg": logreg, "linreg": linreg, "kmeans": kmeans, "gmm": gmm, "tsqr": tsqr, "mttkrp": mttkrp,
    "cp_als": cp_als, "pagerank": pagerank, "pca": pca,
}


def generate(algorithm: str, req: DatagenRequest) -> StorageCounters:
    if algorithm not in GENERATORS and algorithm not in SPARSE_ONLY:
        raise SpecError(f"datagen: no generator for {algorithm!r} "
                        f"(expected one of: {', '.join(sorted([*GENERATORS, *SPARSE_ONLY]))})")
    for name, value in (("--rows", req.rows), ("--cols", req.cols), ("--chunk-rows", req.chunk_rows),
                        ("--k", req.k), ("--rank", req.rank)):
        if value < 1:
            raise SpecError(f"datagen: {name} must be >= 1, got {value}")
    if req.classes < 2:
        raise SpecError(f"datagen: --classes must be >= 2, got {req.classes}")
    if req.table and algorithm != "als":
        raise SpecError(f"datagen: --format parquet is for als (its ratings as a table), not {algorithm}")
    if req.classes != 2 and algorithm != "logreg":
        raise SpecError(f"datagen: --classes is for logreg, not {algorithm}")
    if any(s < 1 for s in req.shape):
        raise SpecError(f"datagen: --shape sizes must be >= 1, got {req.shape}")
    nnz = _row_nnz(algorithm, req)
    probe_writable(req.location, req.options, "URI")  # one line (exit 4), not a failure mid-write
    if nnz:
        return SPARSE_GENERATORS[algorithm](req, nnz)
    return GENERATORS[algorithm](req)
