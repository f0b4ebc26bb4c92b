"""Benchmark sizes and their data: written once with ``arrayjob datagen``'s generators into a
local bucket directory (kept between runs, keyed by size), read by arrayjob and every peer.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from arrayjob.datagen import DatagenRequest, generate
from arrayjob.io.locations import StorageOptions, parse_uri

MiB = 2**20
GiB = 2**30


@dataclass(frozen=True)
class Size:
    name: str
    rows: int  # X: rows × cols float64 (logistic regression, TSQR, KMeans)
    cols: int
    chunk_rows: int
    pr_nodes: int  # PageRank: nodes and edges (R-MAT)
    pr_edges: int
    pr_chunk: int
    nx_nodes: int  # NetworkX, when the full graph is too slow for it
    nx_edges: int
    tensor: int  # MTTKRP: tensor × tensor × tensor
    tensor_chunk: int
    rank: int
    s3_bytes: int  # the array loaded from S3
    s3_chunk_rows: int  # rows of 64 float64 per S3 object
    iterations: int  # L-BFGS iterations, Lloyd iterations, PageRank iterations
    k: int = 8

    @property
    def x_bytes(self) -> int:
        return self.rows * self.cols * 8

    def describe(self) -> dict[str, str]:
        t = self.tensor
        return {
            "X": f"{self.rows:,} × {self.cols} float64 ({self.x_bytes / 1e9:.2f} GB, {self.chunk_rows:,}-row chunks)",
            "PageRank": f"{self.pr_nodes:,} nodes, {self.pr_edges:,} edges",
            "PageRank (NetworkX)": f"{self.nx_nodes:,} nodes, {self.nx_edges:,} edges",
            "MTTKRP": f"{t} × {t} × {t} ({t**3 * 8 / 1e6:,.0f} MB), rank {self.rank}",
            "S3 load": f"{self.s3_bytes / GiB:.3g} GiB, {self.s3_chunk_rows * 64 * 8 / MiB:g} MiB objects",
        }


SIZES = {
    # the sizes, for this machine class (2 cores, 24 GiB)
    "full": Size("full", rows=4_000_000, cols=64, chunk_rows=50_000, pr_nodes=1_000_000, pr_edges=10_000_000,
                 pr_chunk=1_000_000, nx_nodes=100_000, nx_edges=1_000_000, tensor=400, tensor_chunk=20, rank=32,
                 s3_bytes=GiB, s3_chunk_rows=32_768, iterations=10),
    # a few minutes, for development
    "quick": Size("quick", rows=500_000, cols=64, chunk_rows=25_000, pr_nodes=200_000, pr_edges=2_000_000,
                  pr_chunk=500_000, nx_nodes=20_000, nx_edges=200_000, tensor=200, tensor_chunk=10, rank=32,
                  s3_bytes=128 * MiB, s3_chunk_rows=8_192, iterations=5),
    # seconds: tests/system/benchmarks/test_bench.py runs the harness end to end at it
    "tiny": Size("tiny", rows=20_000, cols=16, chunk_rows=5_000, pr_nodes=2_000, pr_edges=20_000, pr_chunk=1_000,
                 nx_nodes=2_000, nx_edges=20_000, tensor=20, tensor_chunk=5, rank=4, s3_bytes=2 * MiB,
                 s3_chunk_rows=1_024, iterations=3, k=4),
}


def _request(path: Path | str, **kw: object) -> DatagenRequest:
    base: dict[str, object] = {"rows": 1, "cols": 1, "chunk_rows": 1, "seed": 0, "options": StorageOptions()}
    base.update(kw)
    options = base["options"]
    assert isinstance(options, StorageOptions)
    return DatagenRequest(location=parse_uri(str(path)), **base)  # type: ignore[arg-type]


def ensure(root: Path, name: str, algorithm: str, **kw: object) -> Path:
    """``root/name`` holds ``algorithm``'s demo data made with ``kw``; generated if missing or different."""
    where = root / name
    marker = where / "_bench.json"
    want = {"algorithm": algorithm, **{k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()}}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return where
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    generate(algorithm, _request(where, **kw))
    marker.write_text(json.dumps(want))
    return where


def prepare(size: Size, root: Path) -> dict[str, Path]:
    """Every local data set of ``size``; S3 data are written per run (the server is in memory)."""
    root = root / size.name
    t = size.tensor
    return {
        "logreg": ensure(root, "logreg", "logreg", rows=size.rows, cols=size.cols, chunk_rows=size.chunk_rows),
        "pagerank": ensure(root, "pagerank", "pagerank", rows=size.pr_nodes, edges=size.pr_edges,
                           chunk_rows=size.pr_chunk),
        "pagerank-nx": ensure(root, "pagerank-nx", "pagerank", rows=size.nx_nodes, edges=size.nx_edges,
                              chunk_rows=size.nx_edges),
        "mttkrp": ensure(root, "mttkrp", "mttkrp", shape=(t, t, t), chunk_rows=size.tensor_chunk, rank=size.rank),
        "demo": ensure(root / "demo-bucket" / "demo", "logreg", "logreg", rows=200_000, cols=32, chunk_rows=25_000),
    }


def write_s3_array(size: Size, endpoint: str, bucket: str) -> str:
    """A ``s3_bytes`` Zarr array of 64 float64 columns on the loopback server; returns its URI."""
    rows = size.s3_bytes // (64 * 8)
    options = StorageOptions(endpoint_url=endpoint)
    generate("tsqr", _request(f"s3://{bucket}/load", rows=rows, cols=64, chunk_rows=size.s3_chunk_rows,
                              options=options))
    return f"s3://{bucket}/load/A.zarr"
