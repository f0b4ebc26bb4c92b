"""Demo data generators: ``arrayjob datagen ALGORITHM URI ...`` writes Zarr v3 inputs.

Data are generated chunk by chunk with a seed per chunk, so the bytes depend only on
``seed`` and the shape, never on memory or parallelism, and the driver holds one slab
at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from arrayjob.errors import SpecError
from arrayjob.io.arrays import create_array
from arrayjob.io.storage import Location, StorageCounters, StorageOptions

SLAB_BYTES = 64 * 2**20


@dataclass(frozen=True)
class DatagenRequest:
    location: Location
    rows: int
    cols: int
    chunk_rows: int
    seed: int
    options: StorageOptions


def _chunk_rng(seed: int, chunk: int) -> np.random.Generator:
    return np.random.default_rng([seed, chunk])


def logreg(req: DatagenRequest) -> StorageCounters:
    """Two overlapping Gaussian classes (as in NumS's evaluation): x ~ N(±mu, I), |mu| = 1.

    Labels are balanced Bernoulli(1/2); the class means are ±1/sqrt(d) in every coordinate,
    so the classes overlap and the regularised logistic loss has a finite optimum.
    """
    counters = StorageCounters()
    X = create_array(req.location.join("X.zarr"), req.options, shape=(req.rows, req.cols),
                     chunks=(req.chunk_rows, req.cols), dtype="float64", counters=counters)
    y = create_array(req.location.join("y.zarr"), req.options, shape=(req.rows,),
                     chunks=(req.chunk_rows,), dtype="float64", counters=counters)
    mu = 1.0 / np.sqrt(req.cols)
    row_bytes = req.cols * 8
    chunks_per_slab = max(1, SLAB_BYTES // (req.chunk_rows * row_bytes))
    n_chunks = -(-req.rows // req.chunk_rows)
    for first in range(0, n_chunks, chunks_per_slab):
        blocks_x, blocks_y = [], []
        for chunk in range(first, min(first + chunks_per_slab, n_chunks)):
            rows = min(req.chunk_rows, req.rows - chunk * req.chunk_rows)
            rng = _chunk_rng(req.seed, chunk)
            labels = rng.integers(0, 2, size=rows).astype(np.float64)
            features = rng.standard_normal((rows, req.cols))
            features += ((2.0 * labels - 1.0) * mu)[:, None]
            blocks_x.append(features)
            blocks_y.append(labels)
        start = first * req.chunk_rows
        stop = start + sum(len(b) for b in blocks_y)
        X[start:stop] = np.concatenate(blocks_x)
        y[start:stop] = np.concatenate(blocks_y)
    return counters


GENERATORS: dict[str, Callable[[DatagenRequest], StorageCounters]] = {"logreg": logreg}


def generate(algorithm: str, req: DatagenRequest) -> StorageCounters:
    if algorithm not in GENERATORS:
        raise SpecError(f"datagen: no generator for {algorithm!r} (expected one of: {', '.join(sorted(GENERATORS))})")
    for name, value in (("--rows", req.rows), ("--cols", req.cols), ("--chunk-rows", req.chunk_rows)):
        if value < 1:
            raise SpecError(f"datagen: {name} must be >= 1, got {value}")
    return GENERATORS[algorithm](req)
