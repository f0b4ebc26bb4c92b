"""Fused vs unfused block kernels on >= 1 GB: Black-Scholes and the logistic loss and gradient.

Each program is planned with ``--fusion none`` and ``--fusion cost`` over row blocks of its
inputs (64 MiB, as the default tiling budget makes them); the input blocks are made in memory
and the plan's tasks (kernels, and the trees combining partial results) are run in this
process, in plan order, each task result dropped after its last use — no storage, no Ray, so
the table shows the kernels alone. Each time is the median of 3 runs after a warm-up run
(which compiles the fused kernels).

Columns: ``unfused`` one kernel per operation (every intermediate materialised between
tasks); ``fused/numpy`` the fused kernels interpreted one NumPy call per step
(``BlockKernel.interpret``); ``fused`` the fused kernels compiled (numexpr expressions, row
sub-blocking); ``speedup`` = unfused / fused.

    .venv/bin/python benchmarks/fusion.py [--gb 1] [--threads 1] [--cols 32]

``--threads`` caps BLAS and numexpr threads (1 = one core per task, as on a Ray worker).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _threads_from_argv() -> str:
    # thread counts must be in the environment before NumPy and numexpr are imported
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "1"


THREADS = _threads_from_argv()
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = THREADS
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import arrayjob.lazy as la  # noqa: E402
from arrayjob import kernels  # noqa: E402
from arrayjob.io.locations import ArrayInfo, parse_uri  # noqa: E402
from arrayjob.planner.lower import assemble_outputs  # noqa: E402
from arrayjob.planner.physical import (  # noqa: E402
    BlockKernel,  # noqa: E402
    SourceBlock,
    TaskResult,
)
from arrayjob.planner.pipeline import estimate, fuse, place  # noqa: E402
from arrayjob.planner.plan import ClusterShape, Plan, PlanOptions, Tiling  # noqa: E402
from arrayjob.planner.tiling import with_tilings  # noqa: E402

MiB = 2**20


def source(name: str, shape: tuple[int, ...], chunks: tuple[int, ...]) -> la.BlockArray:
    """A stored array as the planner sees it (nothing is written: blocks are made in memory)."""
    info = ArrayInfo(name, parse_uri(f"/nonexistent/{name}.zarr"), shape, "float64", chunks, 3)
    return la.from_zarr(info)


def row_tiling(plan: Plan) -> Plan:
    """Cut the classes holding a stored array's rows, nothing else."""
    g = plan.graph
    classes = g.axis_classes
    rows = {classes.of_axis(i, 0) for i, n in enumerate(g.nodes) if n.op == "source"}
    return with_tilings(plan, tuple(
        Tiling(tuple(a for a in range(n.ndim) if classes.of_axis(i, a) in rows and n.shape[a] > 1))
        if n.op not in ("const", "value") else Tiling()
        for i, n in enumerate(g.nodes)))


def make_plan(outputs: dict[str, la.BlockArray], fusion: str) -> Plan:
    options = PlanOptions(fusion=fusion, placement="roundrobin", cluster=ClusterShape(nodes=1, workers_per_node=2))
    return estimate(place(fuse(row_tiling(Plan(la.capture(list(outputs.values())), options)))))


def black_scholes(gb: float) -> tuple[dict[str, la.BlockArray], dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]], dict[str, Any]]:
    import math

    n = int(gb * 1e9 / (3 * 8))
    chunk = MiB
    S, X, T = (source(c, (n,), (chunk,)) for c in "SXT")
    r, v = 0.02, 0.3
    cdf = lambda x: 0.5 * (1.0 + la.erf(x * (1 / math.sqrt(2))))  # noqa: E731
    sqrt_t = la.sqrt(T)
    d1 = (la.log(S / X) + (r + 0.5 * v * v) * T) / (v * sqrt_t)
    d2 = d1 - v * sqrt_t
    discounted = X * la.exp(-r * T)
    outputs = {"call": S * cdf(d1) - discounted * cdf(d2), "put": discounted * cdf(-d2) - S * cdf(-d1)}
    data = {"S": lambda g, s: g.uniform(5, 30, s), "X": lambda g, s: g.uniform(1, 100, s),
            "T": lambda g, s: g.uniform(0.25, 10, s)}
    return outputs, data, {}


def logistic(gb: float, cols: int) -> tuple[dict[str, la.BlockArray], dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]], dict[str, Any]]:
    n = int(gb * 1e9 / (cols * 8))
    chunk = max(1, MiB // cols)
    X, y = source("X", (n, cols), (chunk, cols)), source("y", (n,), (chunk,))
    w = la.value("w", (cols,))
    z = X @ w
    outputs = {"loss": la.sum(la.logaddexp(0.0, -(2 * y - 1) * z)), "grad": X.T @ (la.sigmoid(z) - y)}
    data = {"X": lambda g, s: g.standard_normal(s), "y": lambda g, s: (g.random(s) > 0.5).astype(np.float64)}
    return outputs, data, {"w": np.linspace(-0.2, 0.2, cols)}


def source_blocks(plan: Plan, data: dict[str, Callable[..., np.ndarray]]) -> dict[SourceBlock, np.ndarray]:
    assert plan.physical is not None
    rng = np.random.default_rng(0)
    blocks = {}
    for s in plan.physical.sources:
        for idx in s.grid.indices():
            shape = tuple(sl.stop - sl.start for sl in s.grid.selection(idx))
            blocks[SourceBlock(s.array.name, idx)] = data[s.array.name](rng, shape)
    return blocks


def run(plan: Plan, blocks: dict[SourceBlock, np.ndarray], values: dict[str, Any], interpret: bool) -> list[Any]:
    """Run the plan's tasks in order, dropping each result after its last use."""
    assert plan.physical is not None
    tasks = plan.physical.tasks
    keep = {o.task for o in plan.physical.outputs}
    last: dict[str, int] = {}
    for i, task in enumerate(tasks):
        for arg in task.args:
            if isinstance(arg, TaskResult):
                last[arg.task] = i
    results: dict[str, tuple[Any, ...]] = {}
    for i, task in enumerate(tasks):
        args = [blocks[a] if isinstance(a, SourceBlock) else results[a.task][a.output] if isinstance(a, TaskResult)
                else values[a.name] for a in task.args]
        fn = task.kernel.fn
        out = kernels.interpret(fn, *args) if interpret and isinstance(fn, BlockKernel) else kernels.run(fn, *args)
        results[task.id] = out if task.num_outputs > 1 else (out,)
        for arg in task.args:
            if isinstance(arg, TaskResult) and last[arg.task] == i and arg.task not in keep:
                results.pop(arg.task, None)
    return [results[o.task][o.output] for o in plan.physical.outputs]


def timed(variants: dict[str, Callable[[], Any]], repeats: int = 3) -> dict[str, tuple[float, float, Any]]:
    """Median wall and CPU seconds of each variant, run round-robin so that they share whatever
    else the machine is doing; a warm-up run first compiles the kernels and faults pages in."""
    results = {name: fn() for name, fn in variants.items()}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            results[name] = fn()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name]), results[name]) for name in variants}


def row(name: str, outputs: dict[str, la.BlockArray], data: dict[str, Callable[..., np.ndarray]],
        values: dict[str, Any]) -> str:
    """Plan, run and time one program; the table row."""
    none, cost = make_plan(outputs, "none"), make_plan(outputs, "cost")
    assert none.physical is not None and cost.physical is not None
    blocks = source_blocks(cost, data)
    times = timed({
        "unfused": lambda: run(none, blocks, values, interpret=False),
        "fused/numpy": lambda: run(cost, blocks, values, interpret=True),
        "fused": lambda: run(cost, blocks, values, interpret=False),
    })
    reference = assemble_outputs(none, times["unfused"][2])
    for variant in ("fused/numpy", "fused"):
        for a, b in zip(reference, assemble_outputs(cost, times[variant][2]), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9)
    n_blocks = len(blocks) // len(cost.physical.sources)
    cells = " ".join(f"{times[v][0]:6.2f} ({times[v][1]:5.2f})" for v in ("unfused", "fused/numpy", "fused"))
    speedup = f"{times['unfused'][0] / times['fused'][0]:5.2f}x ({times['unfused'][1] / times['fused'][1]:4.2f}x)"
    return (f"{name:28s} {n_blocks:6d} {none.cost.tasks:>4d}/{cost.cost.tasks:<5d} "
            f"{none.cost.bytes_touched / 1e9:>5.1f}/{cost.cost.bytes_touched / 1e9:<5.2f}  {cells} {speedup}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="input data per program, in GB (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="BLAS and numexpr threads (default 1)")
    parser.add_argument("--cols", type=int, default=32, help="columns of X in the logistic program (default 32)")
    args = parser.parse_args()
    programs = {"Black-Scholes": black_scholes(args.gb), f"logistic loss+grad (d={args.cols})": logistic(args.gb, args.cols)}
    load = os.getloadavg()[0]
    print(f"{args.gb:g} GB per program, {args.threads} thread(s), median of 3 after a warm-up; "
          f"load average {load:.1f} on {os.cpu_count()} cores\n")
    header = (f"{'program':28s} {'blocks':>6s} {'tasks':>10s} {'GB touched':>11s}  "
              f"{'unfused s':>13s} {'fused/numpy s':>13s} {'fused s':>13s} {'speedup':>13s}")
    print(header)
    print(f"{'':28s} {'':6s} {'none/fused':>10s} {'none/fused':>11s}  " + "  wall (cpu)  " * 4)
    print("-" * len(header))
    for name, (outputs, data, values) in programs.items():
        print(row(name, outputs, data, values), flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")

if __name__ == "__main__":
    main()
