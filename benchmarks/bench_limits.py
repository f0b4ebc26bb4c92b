"""The physical limits, measured in the same run: memory read bandwidth, GEMM FLOP rate, and
raw parallel GET throughput from the loopback S3 server.

The S3 clients (raw boto3 GETs, zarr's own read) run in a child process, as arrayjob's
readers run in Ray worker processes: in the process that serves S3 (moto's threaded
server) they would share its GIL and measure less than the endpoint delivers.

    python benchmarks/bench_limits.py raw-get --endpoint URL --bucket B --prefix P [--threads 8]
    python benchmarks/bench_limits.py zarr-read --endpoint URL --uri s3://B/P
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from bench_harness import Timing, repeat_timed, stopwatch, timed

os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
os.environ.pop("AWS_PROFILE", None)


@dataclass
class Limits:
    read_bytes_per_s: float  # one pass over memory, the best of 1 and 2 threads
    gemm_flops_per_s: float  # float64 GEMM, the best of 1 and 2 BLAS threads
    s3_get_bytes_per_s: float | None = None  # raw boto3 GETs, 8 threads, from the loopback server
    notes: tuple[str, ...] = ()

    def read_seconds(self, nbytes: float) -> float:
        return nbytes / self.read_bytes_per_s

    def flop_seconds(self, flops: float) -> float:
        return flops / self.gemm_flops_per_s

    def bound(self, nbytes: float, flops: float) -> float:
        """The roofline: whichever of one pass over the bytes and the flops takes longer."""
        return max(self.read_seconds(nbytes), self.flop_seconds(flops))


def read_bandwidth(x: np.ndarray, repeat: int) -> tuple[float, str]:
    """Bytes per second of one pass over ``x`` (a sum: SIMD, no writes), 1 or 2 threads."""
    flat = x.reshape(-1)
    halves = np.array_split(flat, 2)
    with ThreadPoolExecutor(2) as pool:
        one = timed(lambda: flat.sum(), repeat)
        two = timed(lambda: list(pool.map(np.sum, halves)), repeat)
    best = min(one.median, two.median)
    return x.nbytes / best, (f"read {x.nbytes / 2**30:.2f} GiB: 1 thread {x.nbytes / one.median / 1e9:.1f} GB/s, "
                             f"2 threads {x.nbytes / two.median / 1e9:.1f} GB/s")


def gemm_rate(repeat: int, n: int = 2048) -> tuple[float, str]:
    from threadpoolctl import threadpool_limits

    a = np.random.default_rng(0).standard_normal((n, n))
    rates = {}
    for threads in (1, 2):
        with threadpool_limits(threads, user_api="blas"):
            rates[threads] = 2 * n**3 / timed(lambda: a @ a, repeat).median
    return max(rates.values()), f"GEMM {n}²: 1 thread {rates[1] / 1e9:.1f} GFLOP/s, 2 threads {rates[2] / 1e9:.1f}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoopbackS3:
    """moto's threaded S3 server on a free loopback port, for the life of the benchmark."""

    def __init__(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)

    def stop(self) -> None:
        self.server.stop()


def _child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def raw_get(endpoint: str, bucket: str, prefix: str, repeat: int, threads: int = 8) -> tuple[Timing, int]:
    """Median seconds to GET every object under ``prefix`` with ``threads`` threads (child process)."""
    r = _child(["raw-get", "--endpoint", endpoint, "--bucket", bucket, "--prefix", prefix,
                "--threads", str(threads), "--repeat", str(repeat)])
    return Timing(r["median"], r["runs"]), r["bytes"]


def zarr_read(endpoint: str, uri: str, repeat: int) -> Timing:
    r = _child(["zarr-read", "--endpoint", endpoint, "--uri", uri, "--repeat", str(repeat)])
    return Timing(r["median"], r["runs"])


def _raw_get_main(a: argparse.Namespace) -> dict[str, Any]:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=a.endpoint, config=Config(max_pool_connections=2 * a.threads))
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=a.bucket, Prefix=a.prefix):
        keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("zarr.json")]
    got = [0]

    def get(key: str) -> int:
        return len(client.get_object(Bucket=a.bucket, Key=key)["Body"].read())

    def once() -> float:
        with ThreadPoolExecutor(a.threads) as pool:
            start = time.perf_counter()
            got[0] = sum(pool.map(get, keys))
            return time.perf_counter() - start

    t = repeat_timed(once, a.repeat)
    return {"median": t.median, "runs": t.runs, "bytes": got[0], "objects": len(keys)}


def _zarr_read_main(a: argparse.Namespace) -> dict[str, Any]:
    import zarr

    def once() -> float:
        array = zarr.open_array(a.uri, mode="r", storage_options={"endpoint_url": a.endpoint})
        return stopwatch(lambda: array[...])

    t = repeat_timed(once, a.repeat)
    return {"median": t.median, "runs": t.runs}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["raw-get", "zarr-read"])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket")
    parser.add_argument("--prefix")
    parser.add_argument("--uri")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    ns = parser.parse_args()
    print(json.dumps(_raw_get_main(ns) if ns.what == "raw-get" else _zarr_read_main(ns)))
