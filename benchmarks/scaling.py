"""The plan at scale: `arrayjob estimate --nodes N` for N = 1 … 256 simulated nodes, 1 TB of
input per shipped algorithm, LSHS against round-robin placement, and the planner's bytes
between nodes against communication lower bounds (issue #16).

    python benchmarks/scaling.py [--nodes 1,2,4,...,256] [--algorithms logreg,kmeans,...]
                                 [--markdown out.md] [--json out.json]

Metadata only: the arrays are `ArrayInfo`s (shape, dtype, chunks), never written; each job
is priced by `costing.estimate.estimate_job` exactly as `arrayjob estimate --nodes N
--iterations 1 --instance-type r5.2xlarge` prices it (one iteration, so per-iteration
figures read directly), with each placement strategy, and no ``[cluster] memory_budget``
limit (every block resident: the plan's own figures, not the block cache's).

Lower bounds, for operands row-partitioned over k nodes (blocks dealt cyclically, the
driver's values on node 0), counting bytes that must cross between nodes (results fetched
by the driver excluded, as in arrayjob's counts), in the manner of NumS (Elibol et al.,
Appendix A):

- elementwise X + Y, X and Y co-partitioned: 0.
- sum(X, axis=0), X (n, d): each of the k − 1 nodes other than the one finishing the sum
  holds a partial it must send: (k − 1) · d · 8.
- Xᵀ Y, X (n, d), Y (n, e): likewise (k − 1) · d · e · 8.
- one logistic-regression evaluation (loss and gradient): w to the k − 1 nodes without it,
  and their gradient partials (d + 1 values with the loss) back: (k − 1) · (2d + 1) · 8.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arrayjob import lazy  # noqa: E402
from arrayjob.catalog import get_job  # noqa: E402
from arrayjob.costing.estimate import estimate_job  # noqa: E402
from arrayjob.costing.prices import load_prices  # noqa: E402
from arrayjob.costing.profile import load_profile  # noqa: E402
from arrayjob.io.locations import ArrayInfo, parse_uri  # noqa: E402
from arrayjob.planner.cost import physical_cost  # noqa: E402
from arrayjob.planner.pipeline import make_plan  # noqa: E402
from arrayjob.planner.plan import ClusterShape, PlanOptions  # noqa: E402
from arrayjob.runtime.cluster import ClusterOptions  # noqa: E402
from arrayjob.units import size  # noqa: E402

TB = 10**12
NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PLACEMENTS = ("lshs", "roundrobin")
INSTANCE = "r5.2xlarge"
CHUNK_BYTES = 256 * 2**20  # stored chunks of about the planner's largest block
UNBOUNDED = 10**18  # [cluster] memory_budget in bytes: more than any plan here holds


def _array(name: str, shape: tuple[int, ...], chunk_rows: int, dtype: str = "float64") -> ArrayInfo:
    return ArrayInfo(name, parse_uri(f"/tmp/arrayjob-scaling/{name}.zarr"), shape, dtype,
                     (min(chunk_rows, shape[0]), *shape[1:]), 3)


def _rows(cols: int, itemsize: int = 8) -> tuple[int, int]:
    """Rows of a 1 TB (n, cols) array, and rows per chunk."""
    return TB // (cols * itemsize), max(1, CHUNK_BYTES // (cols * itemsize))


def jobs() -> dict[str, tuple[Any, Any]]:
    """Each shipped algorithm at 1 TB of input: (job, params)."""
    d = 1000
    n, chunk = _rows(d)
    X, y = _array("X", (n, d), chunk), _array("y", (n,), chunk)
    side = round(TB ** (1 / 3) / 2)  # a cube of 1 TB of float64: 5,000³
    T = _array("T", (side, side, side), max(1, CHUNK_BYTES // (side * side * 8)))
    rank = 8
    factors = {k: _array(k, (side, rank), side) for k in ("B", "C")}
    edges_n = TB // 16
    edges = _array("edges", (edges_n, 2), CHUNK_BYTES // 16, "int64")
    specs: dict[str, tuple[dict[str, ArrayInfo], dict[str, Any]]] = {
        "logreg": ({"X": X, "y": y}, {"max_iter": 1}),
        "linreg": ({"X": X, "y": y}, {}),
        "kmeans": ({"X": X}, {"k": 8, "max_iter": 1}),
        "tsqr": ({"A": X}, {}),
        "mttkrp": ({"X": T, **factors}, {"mode": 0}),
        "cp_als": ({"X": T}, {"rank": rank, "max_iter": 1}),
        "pagerank": ({"edges": edges}, {"n_nodes": 10**9, "max_iter": 1}),
    }
    out = {}
    for name, (arrays, params) in specs.items():
        cls = get_job(name)
        out[name] = (cls(cls.Params(**params), arrays), arrays)
    return out


def estimate_row(job: Any, name: str, nodes: int, placement: str) -> dict[str, Any]:
    prices = load_prices()
    # no memory budget: every block stays resident, so the figures are the plan's own (its peak
    # per node is what a budget would have to hold) and placement is compared alone
    spec = SimpleNamespace(name=name, planner=SimpleNamespace(tiling="greedy", fusion="cost", placement=placement),
                           cluster=ClusterOptions(memory_budget=UNBOUNDED))
    start = time.perf_counter()
    est = estimate_job(job, spec, nodes=nodes, instance=prices.instance(INSTANCE), prices=prices,
                       profile=load_profile(), iterations=1)
    return {"algorithm": name, "nodes": nodes, "placement": placement,
            "bytes_between_nodes": int(est.total("bytes_between_nodes")),
            "peak_bytes_per_node": max(est.peak_bytes_per_node, default=0),
            "wall_seconds": est.wall_seconds, "planning_seconds": time.perf_counter() - start}


def bounds(nodes: int) -> dict[str, tuple[int, dict[str, int]]]:
    """Per operator: its lower bound and the planner's bytes between nodes per placement."""
    d, e = 1000, 100
    n, chunk = _rows(d)
    X, Y = _array("X", (n, d), chunk), _array("Y", (n, d), chunk)
    Z = _array("Z", (n, e), chunk)  # co-partitioned with X: the same rows per chunk
    y = _array("y", (n,), chunk)
    x, yy, z, labels = lazy.from_zarr(X), lazy.from_zarr(Y), lazy.from_zarr(Z), lazy.from_zarr(y)
    w = lazy.value("w", (d,))
    margin = x @ w
    loss = lazy.sum(lazy.logaddexp(0.0, -margin * (2 * labels - 1)))
    grad = lazy.einsum("ij,i->j", x, lazy.sigmoid(margin) - labels)
    programs = {
        "elementwise X + Y": ([x + yy], 0),
        "sum(X, axis=0)": ([lazy.sum(x, axis=0)], (nodes - 1) * d * 8),
        "Xᵀ Z": ([lazy.einsum("ij,ik->jk", x, z)], (nodes - 1) * d * e * 8),
        "logreg evaluation": ([loss, grad], (nodes - 1) * (2 * d + 1) * 8),
    }
    out = {}
    for name, (outputs, bound) in programs.items():
        moved = {}
        for placement in PLACEMENTS:
            options = PlanOptions(placement=placement, cluster=ClusterShape(nodes=nodes, workers_per_node=8,
                                                                            memory_per_node=64 * 2**30))
            plan = make_plan(lazy.capture(outputs), options)
            assert plan.physical is not None
            moved[placement] = physical_cost(plan.physical, nodes).bytes_between_nodes
        out[name] = (bound, moved)
    return out


def _ratio(moved: int, bound: int) -> str:
    if bound == 0:
        return "= 0" if moved == 0 else "> 0"
    return f"{moved / bound:.2f}×"


def markdown(rows: list[dict[str, Any]], bound_rows: dict[int, dict[str, tuple[int, dict[str, int]]]]) -> str:
    lines = ["| algorithm | nodes | between nodes, LSHS | round-robin | peak per node, LSHS | round-robin "
             "| wall, LSHS | round-robin |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["algorithm"], r["nodes"], r["placement"]): r for r in rows}
    for (alg, n, placement), r in by.items():
        if placement != "lshs":
            continue
        rr = by.get((alg, n, "roundrobin"), {})
        lines.append(f"| {alg} | {n} | {size(r['bytes_between_nodes'])} | {size(rr.get('bytes_between_nodes', 0))} "
                     f"| {size(r['peak_bytes_per_node'])} | {size(rr.get('peak_bytes_per_node', 0))} "
                     f"| {r['wall_seconds']:.1f} s | {rr.get('wall_seconds', 0):.1f} s |")
    lines += ["", "| operator | nodes | lower bound | LSHS | (÷ bound) | round-robin | (÷ bound) |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for n, ops in bound_rows.items():
        for op, (bound, moved) in ops.items():
            lines.append(f"| {op} | {n} | {size(bound)} | {size(moved['lshs'])} | {_ratio(moved['lshs'], bound)} "
                         f"| {size(moved['roundrobin'])} | {_ratio(moved['roundrobin'], bound)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default=",".join(map(str, NODES)))
    parser.add_argument("--algorithms", default="")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.nodes.split(",")]
    wanted = set(args.algorithms.split(",")) if args.algorithms else None
    rows = []
    for name, (job, _) in jobs().items():
        if wanted and name not in wanted:
            continue
        for n in counts:
            for placement in PLACEMENTS:
                row = estimate_row(job, name, n, placement)
                rows.append(row)
                print(json.dumps(row), flush=True)
    bound_rows = {n: bounds(n) for n in counts if n > 1}
    for n, ops in bound_rows.items():
        for op, (bound, moved) in ops.items():
            print(json.dumps({"operator": op, "nodes": n, "bound": bound, **moved}), flush=True)
    text = markdown(rows, bound_rows)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "bounds": {str(n): v for n, v in bound_rows.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
