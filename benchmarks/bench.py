"""arrayjob against its peers and the machine's limits, side by side in one run (issue 6).

    .venv/bin/python benchmarks/bench.py [--size full|quick|tiny] [--only logreg,tsqr,...]
                                         [--repeat 3] [--json FILE] [--markdown FILE]
    make bench                          # the same, full size, JSON into .arrayjob/bench/

Every workload runs arrayjob and its peers on the same data in this process (one Ray
instance, started here): seconds are the median of ``--repeat`` runs after a warm-up; load
(storage to memory) and compute are timed apart. The limits are measured in the same run:
one read of X's bytes (memory bandwidth), GEMM FLOP rate, and raw parallel GETs (8 threads)
from the loopback S3 server this harness starts (moto). The end-to-end demo job runs first,
as its own process, before this process starts Ray.

Workloads: logreg (one loss-and-gradient evaluation, and L-BFGS iterations), tsqr, linreg
(its default method, tsqr, against its normal equations), kmeans,
pagerank, mttkrp, s3 (loading a Zarr array from S3), e2e (the demo job), spark (Spark MLlib on
the same X and y: benchmarks/bench_spark.py; one line when pyspark or Java is missing). Sizes: ``full``
(the issue's: X 4,000,000 × 64 float64, PageRank 1M nodes / 10M edges, MTTKRP 400³, 1 GiB
from S3), ``quick`` (a few minutes, for development) and ``tiny`` (seconds: tests/system/benchmarks/test_bench.py).
The JSON and Markdown are written again after every workload (``complete`` is true at the end),
so a crash keeps the rows before it. Data are generated once into
``--workdir`` (default .arrayjob/bench) and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Before Ray starts, so its workers inherit them: the loopback S3 credentials, and this
# directory on the path (the hand-written Ray peer's functions live in these modules).
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                  RAY_USAGE_STATS_ENABLED="0")
os.environ.pop("AWS_PROFILE", None)
os.environ.pop("RAY_ADDRESS", None)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
sys.path.insert(0, str(HERE))

from bench_data import SIZES, prepare  # noqa: E402
from bench_harness import Row, commit, finish, machine_line, markdown, versions  # noqa: E402
from bench_logreg import TUNING  # noqa: E402

WORKLOADS = ("logreg", "tsqr", "linreg", "kmeans", "pagerank", "mttkrp", "s3", "e2e", "spark")



def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated, of: {', '.join(WORKLOADS)}")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs after one warm-up (median reported)")
    parser.add_argument("--json", dest="json_path", help="write the table, limits and versions as JSON here")
    parser.add_argument("--markdown", dest="markdown_path", help="write the Markdown table here too")
    parser.add_argument("--workdir", default=str(REPO / ".arrayjob" / "bench"), help="generated data (kept)")
    parser.add_argument("--dask-chunk-mib", type=int, default=TUNING["dask_chunk_mib"],
                        help="dask chunk size (whole Zarr chunks)")
    parser.add_argument("--ray-block-mib", type=int, default=TUNING["ray_block_mib"],
                        help="the hand-written Ray peer's block size")
    args = parser.parse_args()
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = sorted(set(only) - set(WORKLOADS))
    if unknown:
        parser.error(f"--only: unknown workload(s) {', '.join(unknown)} (expected: {', '.join(WORKLOADS)})")
    if args.repeat < 3:
        log(f"--repeat {args.repeat}: fewer than 3 timed runs; the issue asks for >= 3")
    size = SIZES[args.size]
    started = time.perf_counter()
    log(f"size {size.name}: " + "; ".join(f"{k} {v}" for k, v in size.describe().items()))
    log(machine_line())

    TUNING.update(dask_chunk_mib=args.dask_chunk_mib, ray_block_mib=args.ray_block_mib)
    log("preparing data (generated once, then reused)")
    data = prepare(size, Path(args.workdir))
    rows: list[Row] = []
    state: dict[str, object] = {"limits": {"notes": "not measured yet"}, "s3_endpoint": None}

    def publish(complete: bool = False) -> None:
        """The rows so far, written whole after every workload (a crash keeps those before it)."""
        finish(rows)
        doc = {"size": size.name, "sizes": size.describe(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "commit": commit(), "machine": machine_line(), "versions": versions(), "limits": state["limits"],
               "repeat": args.repeat,
               "tuning": {"dask_chunk_mib": args.dask_chunk_mib, "ray_block_mib": args.ray_block_mib},
               "s3_endpoint": state["s3_endpoint"], "seconds": time.perf_counter() - started, "complete": complete,
               "rows": [r.as_dict() for r in rows]}
        if args.json_path:
            Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_path).write_text(json.dumps(doc, indent=1, default=str))
        if args.markdown_path:
            Path(args.markdown_path).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown_path).write_text(markdown(rows) + "\n")

    if "e2e" in only:  # before this process starts its Ray, so the job's own Ray has the machine
        from bench_io import end_to_end

        log("e2e: arrayjob run configs/logreg.toml --overwrite, as a process")
        rows += end_to_end(data["demo"].parent.parent, args.repeat)
        publish()
    if "spark" in only:  # the whole job from a cold process, each side's own, before this process's Ray
        from bench_spark import run_cold

        log("spark: the whole logreg job, `arrayjob run` and Spark MLlib, each a cold process")
        rows += run_cold(data["logreg"], size, args.repeat)
        publish()

    state["limits"], state["s3_endpoint"] = run_in_ray(size, data, only, args.repeat, rows, publish)
    publish(complete=True)
    limits = state["limits"]
    assert isinstance(limits, dict)
    print(f"\n## {size.name} size — {time.strftime('%Y-%m-%d %H:%M')}, commit {commit()}\n\n{machine_line()}\n")
    print(f"Limits: {limits['notes']}\n")
    print(markdown(rows))
    print(f"\n{time.perf_counter() - started:.0f} s in all; load average at the end {os.getloadavg()[0]:.2f}")
    if args.json_path:
        log(f"wrote {args.json_path}")
    return 0


def run_in_ray(size, data, only, repeat, rows, publish):  # type: ignore[no-untyped-def]
    """Everything that needs this process's Ray (and the S3 server): limits, then the workloads."""
    from bench_context import Context
    from bench_limits import Limits, LoopbackS3, gemm_rate, read_bandwidth

    from arrayjob.runtime.cluster import ray_cluster
    from arrayjob.spec import ClusterOptions

    s3 = LoopbackS3() if "s3" in only else None
    try:
        with ray_cluster(ClusterOptions(address="local", num_cpus=os.cpu_count() or 2)) as cluster:
            ctx = Context(size, repeat, Limits(0.0, 0.0), cluster, data, s3)
            log("limits: memory read bandwidth over X, GEMM rate")
            X, _ = ctx.numpy_array("logreg", "X")
            bandwidth, bw_note = read_bandwidth(X, repeat)
            flops, gemm_note = gemm_rate(repeat)
            ctx.limits = Limits(bandwidth, flops, notes=(bw_note, gemm_note))
            log(f"{bw_note}; {gemm_note}")
            import bench_graph_tensor
            import bench_io
            import bench_logreg
            import bench_matrix
            import bench_spark

            workloads = {"logreg": bench_logreg.logreg, **bench_matrix.WORKLOADS, **bench_graph_tensor.WORKLOADS,
                         "s3": bench_io.s3_load, "spark": bench_spark.versus_spark}
            for name in only:
                if name not in workloads:
                    continue
                if name in ("pagerank", "mttkrp", "s3"):
                    ctx.drop("numpy:logreg")  # X's peers' copy is no longer needed
                log(f"{name} …")
                start = time.perf_counter()
                got = workloads[name](ctx)
                rows += got
                publish()
                log(f"{name}: {time.perf_counter() - start:.0f} s — " +
                    "; ".join(f"{r.system} {r.compute_s:.4g} s" for r in got if r.compute_s))
            limits = {"read_bytes_per_s": ctx.limits.read_bytes_per_s, "gemm_flops_per_s": ctx.limits.gemm_flops_per_s,
                      "s3_get_bytes_per_s": ctx.limits.s3_get_bytes_per_s,
                      "notes": "; ".join(ctx.limits.notes) + (
                          f"; raw S3 GETs (8 threads) {ctx.limits.s3_get_bytes_per_s / 1e9:.2f} GB/s"
                          if ctx.limits.s3_get_bytes_per_s else "")}
    finally:
        if s3 is not None:
            s3.stop()
    return limits, s3.endpoint if s3 else None


if __name__ == "__main__":
    sys.exit(main())
