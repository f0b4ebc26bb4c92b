"""Write the ridge example's inputs: X (rows × cols, float64) and y = X·w + noise, as Zarr.

    python examples/ridge/datagen.py .arrayjob/bucket/demo/ridge --rows 200000 --cols 32
"""

from __future__ import annotations

import argparse

import numpy as np
import zarr


def generate(directory: str, rows: int, cols: int, chunk_rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, cols)) * rng.uniform(0.5, 3.0, cols)  # uneven scales
    y = X @ rng.standard_normal(cols) + 0.1 * rng.standard_normal(rows)
    for name, data, chunks in (("X", X, (chunk_rows, cols)), ("y", y, (chunk_rows,))):
        zarr.create_array(f"{directory}/{name}.zarr", shape=data.shape, chunks=chunks, dtype=data.dtype,
                          overwrite=True)[...] = data
    return X, y


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--cols", type=int, default=32)
    parser.add_argument("--chunk-rows", type=int, default=25_000)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    generate(a.directory, a.rows, a.cols, a.chunk_rows, a.seed)
    print(f"wrote X.zarr and y.zarr ({a.rows:,} × {a.cols}) under {a.directory}")
