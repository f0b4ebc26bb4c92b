"""Loading a Zarr array from the loopback S3 server (arrayjob, zarr's own read, raw boto3 GETs
with 8 threads: the limit), and the end-to-end demo job as a process, Ray start included."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_context import Context
from bench_data import GiB, write_s3_array
from bench_harness import Row, Timing, repeat_timed
from bench_limits import raw_get, zarr_read

import arrayjob.lazy as la
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import StorageOptions, parse_uri

REPO = Path(__file__).resolve().parents[1]
BUCKET = "bench"


def s3_load(ctx: Context) -> list[Row]:
    assert ctx.s3 is not None
    s = ctx.size
    ctx.s3.create_bucket(BUCKET)
    uri = write_s3_array(s, ctx.s3.endpoint, BUCKET)
    storage = StorageOptions(endpoint_url=ctx.s3.endpoint)
    info = open_array_info("A", parse_uri(uri), storage)
    size = f"{info.nbytes / GiB:.3g} GiB, {info.chunks[0] * info.shape[1] * 8 / 2**20:g} MiB objects"
    what = "load the whole array"

    raw, nbytes = raw_get(ctx.s3.endpoint, BUCKET, "load/A.zarr/c/", ctx.repeat)
    # each stored chunk may end with its 4-byte CRC32C (arrays arrayjob writes carry one)
    chunks = math.prod(math.ceil(n / c) for n, c in zip(info.shape, info.chunks, strict=True))
    assert nbytes in (info.nbytes, info.nbytes + 4 * chunks), (nbytes, info.nbytes, chunks)
    ctx.limits.s3_get_bytes_per_s = nbytes / raw.median
    zr = zarr_read(ctx.s3.endpoint, uri, ctx.repeat)
    program = {"sum": la.from_zarr(info).sum(axis=0)}
    load, session = ctx.loaded_session(program, storage)
    read = session.executor.metrics.storage
    plan = session.plan(program)
    blocks = plan.physical.sources[0].grid.num_blocks
    del session

    def gbps(t: Timing) -> str:
        return f"{nbytes / t.median / 1e9:.2f} GB/s"

    return [
        Row("S3 load", size, "arrayjob", what, None, load.median, arrayjob=True, limit_s=raw.median,
            compute_runs=load.runs, note=f"{gbps(load)}; {blocks} block tasks on {ctx.workers} workers, "
                                         f"{read.get_requests} GETs, {read.bytes_read:,} bytes"),
        Row("S3 load", size, "zarr (zarr.open_array(...)[...])", what, None, zr.median, limit_s=raw.median,
            compute_runs=zr.runs, note=f"{gbps(zr)}; one process, zarr's async reads"),
        Row("S3 load", size, "raw boto3 GETs, 8 threads (the limit)", what, None, raw.median, limit_s=raw.median,
            compute_runs=raw.runs, note=f"{gbps(raw)}; one process"),
    ]


def end_to_end(root: Path, repeat: int) -> list[Row]:
    """``arrayjob run configs/logreg.toml --overwrite`` as a process, its own local Ray."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["ARRAYJOB_BUCKET"] = str(root)
    command = [str(Path(sys.executable).parent / "arrayjob"), "run", "configs/logreg.toml", "--overwrite", "--json"]
    reports: list[dict[str, Any]] = []

    def once() -> float:
        start = time.perf_counter()
        out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True)
        seconds = time.perf_counter() - start
        reports.append(json.loads(out.stdout))
        return seconds

    t = repeat_timed(once, repeat)
    stages = {name: float(np.median([next((s["wall_seconds"] for s in r["stages"] if s["name"] == name), 0.0)
                                     for r in reports[1:]]))
              for name in ("validate", "connect", "load", "fit", "write")}
    inner = float(np.median([r["wall_seconds"] for r in reports[1:]]))
    breakdown = ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
    iterations = reports[-1]["result"].get("iterations")
    return [Row("end-to-end demo job", "X 200,000 × 32 (make demo)", "arrayjob", "wall, process start to exit",
                stages["load"], t.median, arrayjob=True, compute_runs=t.runs,
                note=f"`arrayjob run configs/logreg.toml --overwrite`; report: {inner:.2f} s inside, {breakdown} "
                     f"(median s); {iterations} L-BFGS iterations; the rest is Python start-up, imports, "
                     f"Ray shutdown")]
