"""Profile arrayjob's side of one benchmark workload, for the misses in docs/benchmarks.md.

    .venv/bin/python benchmarks/bench_profile.py run WORKLOAD [--size full] [--passes 20]
    .venv/bin/py-spy record --subprocesses --format raw -o prof.txt -- \\
        .venv/bin/python benchmarks/bench_profile.py run WORKLOAD
    .venv/bin/python benchmarks/bench_profile.py summarize prof.txt [--top 25]
    .venv/bin/python benchmarks/bench_profile.py graph-build EDGES.zarr --nodes N

``run`` loads the workload's data (as bench.py does) and then runs its per-iteration
program ``--passes`` times, printing the driver's time split (cProfile: capture + plan,
submit, waiting for results, assembling) and the workers' task seconds per kernel (Ray's
timeline). ``summarize`` folds py-spy's raw samples per process and prints the functions
with the most samples (self and inclusive), so driver overhead, kernel time and I/O are
told apart. WORKLOAD is one of: logreg, kmeans, pagerank, mttkrp, s3 (run), or logreg, kmeans, mttkrp, tsqr
(kernel).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import os
import pstats
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                  RAY_USAGE_STATS_ENABLED="0")
os.environ.pop("RAY_ADDRESS", None)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402


def _program(ctx, workload: str):  # type: ignore[no-untyped-def]
    """(program, values, storage) of one pass of ``workload``, as bench.py runs it."""
    import arrayjob.lazy as la
    from arrayjob.algorithms.kmeans import kmeans_program
    from arrayjob.algorithms.logreg import LogisticRegression, LogRegParams
    from arrayjob.algorithms.tensor import MTTKRP, MTTKRPParams
    from arrayjob.io.locations import StorageOptions

    s = ctx.size
    if workload == "logreg":
        job = LogisticRegression(LogRegParams(), {"X": ctx.info("logreg", "X"), "y": ctx.info("logreg", "y")})
        rng = np.random.default_rng(1)
        return job.program(ctx.workers), {"w": 0.1 * rng.standard_normal(s.cols), "b": 0.05}, None
    if workload == "kmeans":
        C = np.random.default_rng(2).standard_normal((s.k, s.cols))
        step = kmeans_program(la.from_zarr(ctx.info("logreg", "X")), s.k, final=False)
        return step, {"centroids": C, "centroid_sq": (C**2).sum(1), "cluster_ids": np.arange(s.k, dtype=float)}, None
    if workload == "tsqr":  # the pass that forms Q; trsm's time does not depend on R₁'s values
        from arrayjob.algorithms.tsqr import R1, TSQR, TSQRParams

        return TSQR(TSQRParams(), {"A": ctx.info("logreg", "X")}).program(ctx.workers), {R1: np.eye(s.cols)}, None
    if workload == "mttkrp":
        import zarr

        job = MTTKRP(MTTKRPParams(mode=0), {n: ctx.info("mttkrp", n) for n in "XBC"})
        values = {n: zarr.open_array(str(ctx.data["mttkrp"] / f"{n}.zarr"), mode="r")[...] for n in "BC"}
        return job.program(ctx.workers), values, None
    if workload == "s3":
        from bench_data import write_s3_array
        from bench_io import BUCKET

        from arrayjob.io.arrays import open_array_info
        from arrayjob.io.locations import parse_uri

        ctx.s3.create_bucket(BUCKET)
        uri = write_s3_array(s, ctx.s3.endpoint, BUCKET)
        storage = StorageOptions(endpoint_url=ctx.s3.endpoint)
        return {"sum": la.from_zarr(open_array_info("A", parse_uri(uri), storage)).sum(axis=0)}, {}, storage
    raise SystemExit(f"unknown workload {workload!r}")


class _Enough(Exception):
    """Ends a profiled job once py-spy has its samples."""


def _pagerank(ctx, args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    """The pagerank job as it runs; py-spy starts at the first iteration (the job's first
    compute bound to a "rank" value) and the iterations outlast it."""
    from arrayjob.algorithms.pagerank.job import PageRank, PageRankParams
    from arrayjob.api.job import JobContext
    from arrayjob.runtime.metrics import RunMetrics

    session, metrics = ctx.session(), RunMetrics()
    iterations = args.passes if not args.spy else 10_000
    job = PageRank(PageRankParams(n_nodes=ctx.size.pr_nodes, max_iter=iterations, tol=1e-300),
                   {"edges": ctx.info("pagerank", "edges")})
    compute, state = session.compute, {"spies": None, "start": 0.0, "n": 0, "t0": 0.0}

    def watched(outputs, values=None):  # type: ignore[no-untyped-def]
        if values and "rank" in values:
            if not state["t0"]:
                state["t0"] = time.time()
            if state["spies"] is None and args.spy:
                state["spies"] = _spy(args.spy, [os.getpid(), *_worker_pids()], args.spy_out)
                time.sleep(1.0)
                state["start"] = time.perf_counter()
            elif state["spies"] is not None and time.perf_counter() - state["start"] > args.spy + 1:
                raise _Enough
            state["n"] += 1
        return compute(outputs, values)

    session.compute = watched  # type: ignore[method-assign]
    with contextlib.suppress(_Enough):
        job.run(JobContext(session, metrics))
    fit = next(st.wall_seconds for st in metrics.stages if st.name == "fit")
    print(f"load {next(st.wall_seconds for st in metrics.stages if st.name == 'load'):.3f} s; "
          f"{state['n']} iterations, {fit / max(1, state['n']):.4f} s each (fit stage)")
    import ray

    _task_seconds(ray.timeline(), fit / max(1, state["n"]), state["n"], (state["t0"], time.time()))
    for p in state["spies"] or []:
        p.wait()
    if args.spy:
        print(f"py-spy: {args.spy_out}.<pid> (driver {os.getpid()}); fold with `summarize`")


def run(args: argparse.Namespace) -> None:
    import ray
    from bench_context import Context
    from bench_data import SIZES, prepare
    from bench_limits import Limits, LoopbackS3

    from arrayjob.runtime.cluster import ray_cluster
    from arrayjob.spec import ClusterOptions

    size = SIZES[args.size]
    data = prepare(size, Path(args.workdir))
    s3 = LoopbackS3() if args.workload == "s3" else None
    with ray_cluster(ClusterOptions(address="local", num_cpus=os.cpu_count() or 2)) as cluster:
        ctx = Context(size, 1, Limits(1.0, 1.0), cluster, data, s3)
        if args.workload == "pagerank":
            return _pagerank(ctx, args)
        program, values, storage = _program(ctx, args.workload)
        session = ctx.session(storage)
        start = time.perf_counter()
        session.load(program)
        print(f"load {time.perf_counter() - start:.3f} s")
        if args.workload == "s3":
            spies = _spy(args.spy, [os.getpid(), *_worker_pids()], args.spy_out) if args.spy else []
            time.sleep(1.0 if spies else 0.0)
            deadline = time.perf_counter() + args.spy
            for i in range(10_000):
                if (spies and time.perf_counter() > deadline) or (not spies and i >= args.passes):
                    break
                session = ctx.session(storage)
                start = time.perf_counter()
                session.load(program)
                print(f"load {time.perf_counter() - start:.3f} s")
            for p in spies:
                p.wait()
            return None
        session.compute(program, values)  # warm-up: plans, starts workers, compiles kernels
        if args.spy:
            spies = _spy(args.spy, [os.getpid(), *_worker_pids()], args.spy_out)
            time.sleep(1.0)  # py-spy attaches
            deadline = time.perf_counter() + args.spy
            while time.perf_counter() < deadline:
                session.compute(program, values)
            for p in spies:
                p.wait()
            print(f"py-spy: {args.spy_out}.<pid> (driver {os.getpid()}); fold with `summarize`")
        windows = []
        for _ in range(args.passes):  # unprofiled: where a pass's wall time goes
            begin = time.time()
            session.compute(program, values)
            windows.append((begin, time.time()))
        profile = cProfile.Profile()
        start, started = time.perf_counter(), time.time()
        profile.enable()
        for _ in range(args.passes):
            session.compute(program, values)
        profile.disable()
        wall = (time.perf_counter() - start) / args.passes
        print(f"{args.passes} passes: {wall:.4f} s per pass (driver wall, under cProfile)")
        _driver_split(profile, args.passes)
        events = ray.timeline()
        _task_seconds(events, wall, args.passes, (started, time.time()))
        _pass_timeline(events, windows)
    if s3 is not None:
        s3.stop()
    return None


def kernel(args: argparse.Namespace) -> None:
    """The first block task of the workload's plan, run in this process on 1 thread (as on a
    Ray worker) on its real block, beside NumPy primitives over the same bytes."""
    from bench_context import Context
    from bench_data import SIZES, prepare
    from bench_harness import timed
    from bench_limits import Limits
    from threadpoolctl import threadpool_limits

    from arrayjob import kernels
    from arrayjob.io.locations import StorageOptions
    from arrayjob.planner.physical import DriverValue, SourceBlock, TaskResult
    from arrayjob.planner.plan import ClusterShape, PlanOptions
    from arrayjob.runtime.cluster import ClusterInfo
    from arrayjob.runtime.executor import LocalExecutor, load_and_check
    from arrayjob.runtime.session import Session

    size = SIZES[args.size]
    ctx = Context(size, 1, Limits(1.0, 1.0), ClusterInfo("", ("n0",), 2, False), prepare(size, Path(args.workdir)))
    program, values, _ = _program(ctx, args.workload)
    session = Session(LocalExecutor(StorageOptions()), PlanOptions(cluster=ClusterShape(nodes=1, workers_per_node=2)))
    plan = session.plan(program)
    physical = plan.physical
    bound = session._bind(plan, values)
    task = next(t for t in physical.tasks if any(isinstance(a, SourceBlock) for a in t.args)
                and not any(isinstance(a, TaskResult) for a in t.args))
    block_args = []
    for a in task.args:
        if isinstance(a, SourceBlock):
            block_args.append(load_and_check(physical.source(a.array), a.index, StorageOptions())[0])
        elif isinstance(a, DriverValue):
            block_args.append(bound[a.name])
        else:
            raise SystemExit(f"task {task.id} has an argument this command cannot make: {a}")
    big = max((b for b in block_args if isinstance(b, np.ndarray)), key=lambda b: b.nbytes)
    print(f"task {task.id} ({task.kernel.name}); {len(physical.tasks)} tasks in the plan; its largest block "
          f"{big.shape} = {big.nbytes / 2**20:.1f} MiB")
    with threadpool_limits(1):
        t = timed(lambda: kernels.run(task.kernel.fn, *block_args), 5)
        rates = {"kernel": t.median, "one pass (sum)": timed(lambda: big.sum(), 5).median}
        if big.ndim == 2:
            v, u = np.ones(big.shape[1]), np.ones(big.shape[0])
            rates["X @ v (gemv)"] = timed(lambda: big @ v, 5).median
            rates["X.T @ u (gemv, transposed)"] = timed(lambda: big.T @ u, 5).median
        if args.workload == "tsqr":
            rates["numpy.linalg.qr of the block (1 thread)"] = timed(lambda: np.linalg.qr(big), 5).median
            rates["R only (numpy.linalg.qr mode='r')"] = timed(lambda: np.linalg.qr(big, mode="r"), 5).median
        if big.ndim == 3 and "B" in values:
            B, C = values["B"], values["C"]
            rates["einsum(optimize=True) on the block"] = timed(
                lambda: np.einsum("ijk,jf,kf->if", big, B, C, optimize=True), 5).median
            kr = (B[:, None, :] * C[None, :, :]).reshape(-1, B.shape[1])
            rates["unfolded block @ khatri-rao (one GEMM)"] = timed(
                lambda: big.reshape(big.shape[0], -1) @ kr, 5).median
        if args.workload == "logreg":
            rates.update(_row_loop_variants(task.kernel.fn, block_args))
    for name, sec in rates.items():
        print(f"  {name:40s} {sec * 1e3:8.2f} ms  {big.nbytes / sec / 1e9:6.2f} GB/s of the block")


def _row_loop_variants(kernel, block_args):  # type: ignore[no-untyped-def]
    """The block's generated row loop with its exp, then also its log1p, replaced by
    arithmetic: what the transcendental calls cost inside the loop."""
    from bench_harness import timed

    from arrayjob.kernels import compiler, rowloop

    program = compiler.Program(kernel, block_args)
    if program.chunking is None or program.row_loop is None:
        return {}
    loop = rowloop._RowLoop(program, program.chunking.carrier)
    source = loop.source()
    no_exp = source.replace("e = math.exp(-abs(x))", "e = abs(x) * 0.5")
    variants = {"row loop without exp": no_exp, "row loop without exp and log1p": no_exp.replace("+ _log1p_unit(e)", "+ e")}
    out = {}
    for name, text in variants.items():
        assert text != source, "the generated loop no longer has the shared exp"
        loop.source = lambda text=text: text  # type: ignore[method-assign]
        run = loop.runner()
        vals = list(block_args) + [None] * len(kernel.steps)
        out[name] = timed(lambda run=run, vals=vals: run(vals), 5).median
    return out


def _spy(seconds: float, pids: list[int], out: str) -> list[subprocess.Popen]:
    spy = str(Path(sys.executable).parent / "py-spy")
    return [subprocess.Popen([spy, "record", "--nonblocking", "--format", "raw", "-r", "200", "-d", str(int(seconds)),
                              "-p", str(pid), "-o", f"{out}.{pid}"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for pid in pids]


def _worker_pids() -> list[int]:
    import psutil

    agents = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
    # a Ray worker renames itself "ray::IDLE" or "ray::<task>"
    return [p.pid for p in psutil.Process().children(recursive=True)
            if p.cmdline() and p.cmdline()[0].startswith("ray::") and p.cmdline()[0] not in agents]


# driver functions whose cumulative time is reported, by what they stand for
DRIVER_PARTS = {
    "capture the graph": ("lazy.py", "capture"),
    "plan (cache lookup)": ("pipeline.py", "plan"),
    "bind driver values": ("session.py", "_bind"),
    "ray.put of driver values": ("worker.py", "put"),
    "submit tasks": ("ray_executor.py", "_submit"),
    "wait for results (ray.get)": ("worker.py", "get"),
    "measure (replay the plan)": ("ray_executor.py", "_measure"),
    "assemble outputs": ("lower.py", "assemble_outputs"),
}


def _driver_split(profile: cProfile.Profile, passes: int) -> None:
    stats = pstats.Stats(profile)
    total = stats.total_tt / passes  # type: ignore[attr-defined]
    print(f"driver, per pass (cProfile, {total:.4f} s profiled):")
    for label, (file, fn) in DRIVER_PARTS.items():
        cum = sum(v[3] for (f, _, name), v in stats.stats.items()  # type: ignore[attr-defined]
                  if f.endswith(file) and name == fn)
        print(f"  {label:32s} {cum / passes:8.4f} s")


def _task_seconds(events: list[dict], wall: float, passes: int, window: tuple[float, float]) -> None:
    """Worker seconds per pass in the profiled window (Ray's timeline): per task function, and
    per phase of a task (deserialising arguments, executing, storing outputs)."""
    per: dict[str, list[float]] = collections.defaultdict(list)
    lo, hi = window[0] * 1e6, window[1] * 1e6
    for e in events:
        if e.get("ph") != "X" or not lo <= e.get("ts", 0) <= hi:
            continue
        cat = str(e.get("cat", ""))
        if cat.startswith("task::"):
            per[f"task {e.get('name')}"].append(e["dur"] / 1e6)
        elif cat.startswith("task:"):
            per[f"  phase {cat}"].append(e["dur"] / 1e6)
    print(f"worker seconds per pass (Ray timeline; pass wall {wall:.4f} s × 2 workers = {2 * wall:.4f} s):")
    for name, durs in sorted(per.items()):
        print(f"  {name:50s} {len(durs) / passes:6.1f} tasks, {sum(durs) / passes:8.4f} s, "
              f"median {np.median(durs) * 1e3:8.2f} ms")


def _pass_timeline(events: list[dict], windows: list[tuple[float, float]]) -> None:
    """Where an unprofiled pass's wall time goes, from Ray's timeline: the driver's call to
    the first task executing, each worker's busy time (arguments, execution, results) and
    the time it waits between tasks, and the last task's end to the driver's return."""
    spans = sorted((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, (e.get("pid"), e.get("tid")))
                   for e in events if e.get("ph") == "X" and str(e.get("cat", "")).startswith("task::"))
    parts: dict[str, list[float]] = collections.defaultdict(list)
    for begin, end in windows:
        inside = [s for s in spans if begin <= s[0] and s[1] <= end]
        if not inside:
            continue
        parts["pass wall"].append(end - begin)
        parts["driver call -> first task starts"].append(inside[0][0] - begin)
        parts["last task ends -> driver returns"].append(end - max(s[1] for s in inside))
        for worker in {s[2] for s in inside}:
            mine = [s for s in inside if s[2] == worker]
            parts["a worker: in tasks"].append(sum(e - b for b, e, _ in mine))
            gaps = [later[0] - earlier[1] for earlier, later in zip(mine, mine[1:], strict=False)]
            parts["a worker: waiting between its tasks"].append(sum(gaps))
    if os.environ.get("SHOW_PASS"):
        begin, end = windows[len(windows) // 2]
        for b, e, worker in spans:
            if begin <= b and e <= end:
                print(f"    {worker}  {1e3 * (b - begin):7.2f} -> {1e3 * (e - begin):7.2f} ms")
    print(f"an unprofiled pass (median of {len(parts['pass wall'])}; Ray timeline):")
    for name, values in parts.items():
        print(f"  {name:40s} {np.median(values) * 1e3:8.2f} ms")


def _process_kind(frames: list[str], default: str) -> str:
    """The innermost process of a py-spy stack, by kind: the driver, a Ray worker, other."""
    procs = [f for f in frames if f.startswith("process ")]
    if not procs:
        return default
    cmd = procs[-1]
    if "default_worker.py" in cmd:
        return "Ray workers"
    if "bench_profile.py" in cmd or "bench.py" in cmd:
        return "driver"
    return re.sub(r'process \d+:"(\S*/)?(\S{0,40}).*', r"\2", cmd)


def summarize(args: argparse.Namespace) -> None:
    """Fold py-spy raw output ('frame;frame;... count' lines) by kind of process. Files named
    ``<out>.<pid>`` (``run --spy``) are the driver's when pid is ``--driver-pid``, else a worker's."""
    self_counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    for file in args.file:
        suffix = file.rsplit(".", 1)[-1]
        default = "Ray workers" if suffix.isdigit() and suffix != str(args.driver_pid) else "driver"
        for line in Path(file).read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            kind = _process_kind(frames, default)
            code = [re.sub(r" \((.*/)?([^/]*?)(:\d+)?\)$", r" (\2)", f) for f in frames if not f.startswith("process ")]
            if not code:
                continue
            n = int(count)
            totals[kind] += n
            self_counts[kind][code[-1]] += n
            for f in set(code):
                inclusive[kind][f] += n
    for kind, n in totals.most_common(args.processes):
        print(f"\n== {kind}: {n} samples")
        print("  self:")
        for fn, c in self_counts[kind].most_common(args.top):
            print(f"    {100 * c / n:5.1f}%  {fn}")
        print("  inclusive:")
        for fn, c in inclusive[kind].most_common(args.top):
            print(f"    {100 * c / n:5.1f}%  {fn}")


def graph_build(args: argparse.Namespace) -> None:
    """The pagerank job on a stored edges array (e.g. the one ``estimate_accuracy.py
    --sizes large`` writes: 4M nodes, 70M edges), 3 iterations, with each kernel's worker
    seconds from Ray's timeline (tasks carry their kernel's name), split into arguments,
    execution and storing the results: where the graph build's time goes."""
    import ray

    from arrayjob.algorithms.pagerank.job import PageRank, PageRankParams
    from arrayjob.api.job import JobContext
    from arrayjob.io.arrays import open_array_info
    from arrayjob.io.locations import StorageOptions, parse_uri
    from arrayjob.planner.plan import ClusterShape, PlanOptions
    from arrayjob.runtime.cluster import ray_cluster
    from arrayjob.runtime.metrics import RunMetrics
    from arrayjob.runtime.ray_executor import RayExecutor
    from arrayjob.runtime.session import Session
    from arrayjob.spec import ClusterOptions

    edges = open_array_info("edges", parse_uri(args.edges), StorageOptions())
    with ray_cluster(ClusterOptions(address="local", num_cpus=os.cpu_count() or 2)) as cluster:
        metrics = RunMetrics()
        session = Session(RayExecutor(StorageOptions(), cluster.node_ids, metrics),
                          PlanOptions(cluster=ClusterShape(nodes=1, workers_per_node=os.cpu_count() or 2)))
        job = PageRank(PageRankParams(n_nodes=args.nodes, max_iter=3, tol=1e-300), {"edges": edges})
        start = time.time()
        job.run(JobContext(session, metrics))
        print("stages: " + ", ".join(f"{st.name} {st.wall_seconds:.2f} s" for st in metrics.stages))
        events = [e for e in ray.timeline() if e.get("ph") == "X" and e.get("ts", 0) / 1e6 >= start]
    phases = [e for e in events if str(e.get("cat", "")).startswith("task:") and not e["cat"].startswith("task::")]
    seconds: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for task in (e for e in events if str(e.get("cat", "")).startswith("task::")):
        name = task["cat"][len("task::"):]
        seconds[name]["tasks"] += 1
        seconds[name]["total"] += task["dur"] / 1e6
        for phase in phases:
            if phase["tid"] == task["tid"] and task["ts"] <= phase["ts"] <= task["ts"] + task["dur"]:
                seconds[name][phase["cat"][len("task:"):]] += phase["dur"] / 1e6
    print(f"{'kernel':32s} {'tasks':>5s} {'worker s':>9s} {'args':>7s} {'execute':>8s} {'store':>7s}")
    for name, c in sorted(seconds.items(), key=lambda kv: -kv[1]["total"]):
        print(f"{name:32s} {int(c['tasks']):5d} {c['total']:9.2f} {c['deserialize_arguments']:7.2f} "
              f"{c['execute']:8.2f} {c['store_outputs']:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("workload", choices=["logreg", "kmeans", "pagerank", "mttkrp", "s3"])
    r.add_argument("--size", default="full")
    r.add_argument("--passes", type=int, default=20)
    r.add_argument("--workdir", default=str(HERE.parent / ".arrayjob" / "bench"))
    r.add_argument("--spy", type=float, default=0.0, help="also py-spy the driver and workers for this many s")
    r.add_argument("--spy-out", default="/tmp/bench-spy")
    k = sub.add_parser("kernel")
    k.add_argument("workload", choices=["logreg", "kmeans", "mttkrp", "tsqr"])
    k.add_argument("--size", default="full")
    k.add_argument("--workdir", default=str(HERE.parent / ".arrayjob" / "bench"))
    g = sub.add_parser("graph-build")
    g.add_argument("edges", help="a stored (E, 2) edges array, e.g. <bucket>/demo/pagerank/edges.zarr")
    g.add_argument("--nodes", type=int, required=True)
    s = sub.add_parser("summarize")
    s.add_argument("file", nargs="+")
    s.add_argument("--top", type=int, default=25)
    s.add_argument("--processes", type=int, default=4)
    s.add_argument("--driver-pid", type=int, default=-1)
    args = parser.parse_args()
    {"run": run, "kernel": kernel, "summarize": summarize, "graph-build": graph_build}[args.command](args)


if __name__ == "__main__":
    main()
