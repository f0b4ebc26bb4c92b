"""Write the column-statistics example's input: X (rows × cols, float64, columns of unlike
means and scales) as Zarr.

    python examples/colstats/datagen.py .arrayjob/bucket/demo/colstats --rows 200000 --cols 32
"""

from __future__ import annotations

import argparse

import numpy as np
import zarr


def generate(directory: str, rows: int, cols: int, chunk_rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1e3, 1e3, cols) + rng.standard_normal((rows, cols)) * rng.uniform(0.01, 10.0, cols)
    zarr.create_array(f"{directory}/X.zarr", shape=X.shape, chunks=(chunk_rows, cols), dtype=X.dtype,
                      overwrite=True)[...] = X
    return X


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--cols", type=int, default=32)
    parser.add_argument("--chunk-rows", type=int, default=25_000)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    generate(a.directory, a.rows, a.cols, a.chunk_rows, a.seed)
    print(f"wrote X.zarr ({a.rows:,} × {a.cols}) under {a.directory}")
