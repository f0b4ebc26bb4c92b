"""Bigger than the object store (issue 17): a job's seconds per iteration with planned
residency, against the same job in memory and against Ray's own spilling, in one run.

    .venv/bin/python benchmarks/outofcore.py [--size full|quick] [--only logreg,kmeans,pagerank]
                                              [--json FILE] [--markdown FILE]

Each case is one `arrayjob run` process with its own private Ray (the store sizes differ),
on the same data (generated once into ``--workdir`` with `arrayjob datagen`):

- ``in memory``: Ray's default object store; everything resident.
- ``Ray's spilling``: the store capped (`cluster.object_store_memory`), the budget lifted
  past the input, so every block is kept and Ray spills what does not fit.
- ``planned, spill``: the store capped, the default budget (80 % of it): the planner keeps a
  fixed set resident and streams the rest from the nodes' own spill.
- ``planned, bucket``: the same with a profile whose local disk reads slower than storage,
  so streamed blocks are re-read from the input's storage.
- ``small disk`` (logreg, full size, as root): Ray's spilling and the planned case again with
  the temporary directory (Ray's session and spill, arrayjob's spill) on a 500 MB tmpfs of
  the run's own, smaller than X: spilling X is impossible; the planner streams from storage.

PageRank (an R-MAT graph whose kept CSR blocks are about twice the store) runs the first
three: its edges are streamed under the budget, and the graph it builds from them and keeps
between iterations (``Session.persist``) goes to the nodes' spill where it does not fit.

KMeans is also run by its peer, dask-ml (``benchmarks/dask_kmeans.py``: a local dask cluster
of 2 single-threaded workers, X persisted in them), with no memory cap and with each worker
capped at half the store, when dask-ml is installed (``make bench`` installs it).

Per iteration: the fit stage's seconds over the passes the job made over its input (logreg's
``evaluations``, KMeans' and PageRank's ``iterations``). Beside each, the estimate made for
the run and the report's resident fraction, bytes brought back and peak memory per node.
Sizes: ``full`` (the issue's: X 3,000,000 × 64 float64, 1.54 GB, store 600 MB; PageRank
2,500,000 nodes and 25,000,000 edges, about 0.3 GB of graph, store 150 MB) and ``quick``
(300,000 × 64, store 80 MB; 1,000,000 nodes, 12,000,000 edges, store 80 MB).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ARRAYJOB = str(Path(sys.executable).with_name("arrayjob"))

# PageRank's graph (CSR: 12 bytes per distinct edge) is about twice its own store, ``graph_store``
SIZES = {"full": {"rows": 3_000_000, "cols": 64, "chunk_rows": 100_000, "store": "600MB", "k": 8,
                  "graph_nodes": 2_500_000, "graph_edges": 25_000_000, "edge_chunk_rows": 1_000_000,
                  "graph_store": "150MB", "small_disk": "500M"},
         "quick": {"rows": 300_000, "cols": 64, "chunk_rows": 10_000, "store": "80MB", "k": 8,
                   "graph_nodes": 1_000_000, "graph_edges": 12_000_000, "edge_chunk_rows": 500_000,
                   "graph_store": "80MB"}}
ITERATIONS = {"logreg": 10, "kmeans": 10, "pagerank": 30}
CASE_TIMEOUT = 600  # seconds: Ray's spilling on a full disk may stall rather than fail
# dask-ml with its workers capped below X: they are killed for memory and, with distributed
# 2026.x, the client waits for them forever (2026-11-27: 600 s, then this timeout), where
# the in-memory case takes 15 s
DASK_TIMEOUT = 180
INPUT = {"logreg": "X.zarr", "kmeans": "X.zarr", "pagerank": "edges.zarr"}


def spec(path: Path, algorithm: str, data: Path, output: Path, size: dict) -> Path:
    if algorithm == "pagerank":
        inputs = f'edges = "{data}/edges.zarr"\n'
    else:
        inputs = f'X = "{data}/X.zarr"\n' + (f'y = "{data}/y.zarr"\n' if algorithm == "logreg" else "")
    # tol 0: every case makes the same number of passes
    params = {"logreg": 'solver = "lbfgs"\ntol = 1e-300\n', "kmeans": f"k = {size['k']}\ntol = 1e-300\n",
              "pagerank": "tol = 1e-300\n"}[algorithm]
    path.write_text(f'[job]\nname = "ooc-{algorithm}"\nalgorithm = "{algorithm}"\n\n[inputs]\n{inputs}\n'
                    f"[params]\n{params}max_iter = {ITERATIONS[algorithm]}\n\n[output]\nuri = \"{output}\"\n\n"
                    "[cluster]\nnum_cpus = 2\n\n[run]\ncheckpoint_every = 3600\n")
    return path


def run_case(spec_path: Path, cwd: Path, sets: list[str], disk: str | None = None) -> dict:
    """One ``arrayjob run``; with ``disk`` (a size), its temporary directory (Ray's session and
    spill, arrayjob's spill) is a tmpfs of that size of its own, in a mount namespace of its
    own (``unshare``: root only), so spilling X is impossible."""
    args = [ARRAYJOB, "run", str(spec_path), "--json", "--overwrite"]
    for s in sets:
        args += ["--set", s]
    if disk is not None:
        small = Path(tempfile.gettempdir()) / f"arrayjob-small-disk-{os.getpid()}"
        small.mkdir(exist_ok=True)
        args = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mount -t tmpfs -o size={disk} tmpfs "{small}" && TMPDIR="{small}" exec "$@"', "sh", *args]
    start = time.perf_counter()
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=CASE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": [f"did not finish in {CASE_TIMEOUT} s"], "seconds": CASE_TIMEOUT}
    finally:
        if disk is not None:
            small.rmdir()
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"], "seconds": seconds}
    report = json.loads(done.stdout)
    report["process_seconds"] = seconds
    return report


def units_size(text: str) -> int:
    sys.path.insert(0, str(REPO))
    from arrayjob.units import parse_bytes

    return parse_bytes(text)


def dask_kmeans(x: Path, k: int, memory_limit: str) -> dict:
    """``benchmarks/dask_kmeans.py`` in its own process (dask's own cluster); its figures, or why not."""
    try:
        import dask_ml  # noqa: F401
    except ImportError:
        return {"error": "dask-ml not installed (make bench installs it)"}
    try:
        done = subprocess.run([sys.executable, str(HERE / "dask_kmeans.py"), str(x), "--k", str(k),
                               "--iterations", str(ITERATIONS["kmeans"]), "--memory-limit", memory_limit],
                              capture_output=True, text=True, timeout=DASK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {DASK_TIMEOUT} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {"passes": out["iterations"], "fit_seconds": out["fit_seconds"],
            "seconds_per_pass": out["seconds_per_pass"], "load_seconds": out["load_seconds"],
            "memory_limit": memory_limit, "peer": True}


def summarize(name: str, report: dict, passes_key: str) -> dict:
    if "error" in report:
        return {"case": name, "error": report["error"][0]}
    fit = next(s for s in report["stages"] if s["name"] == "fit")
    passes = int(report["result"][passes_key])
    est = report["estimate"]
    est_fit = next(s for s in est["stages"] if s["name"] == "fit")
    memory, storage = report["memory"], report["storage"]
    return {
        "case": name, "passes": passes, "fit_seconds": fit["wall_seconds"],
        "seconds_per_pass": fit["wall_seconds"] / passes,
        "estimate_seconds_per_pass": est_fit["wall_seconds"] / max(1, est_fit["runs"]),
        "resident_fraction": memory["resident_fraction"], "estimate_resident_fraction": est["memory"]["resident_fraction"],
        "streamed_from": memory["streamed_from"],
        "brought_back_bytes": storage["bytes_reread"] + memory["spill_bytes_read"],
        "estimate_brought_back_per_pass": est["storage"].get("bytes_reread_per_iteration", 0),
        "peak_bytes_per_node": max(memory["peak_bytes_per_node"]), "budget_bytes": memory["budget_bytes"],
        "estimate_peak_bytes_per_node": max(est["memory"]["peak_bytes_per_node"]),
        "load_seconds": next(s for s in report["stages"] if s["name"] == "load")["wall_seconds"],
        "wall_seconds": report["wall_seconds"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), default="quick")
    parser.add_argument("--only", default="logreg,kmeans,pagerank")
    parser.add_argument("--workdir", type=Path, default=REPO / ".arrayjob" / "bench" / "outofcore")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    size = SIZES[args.size]
    work = args.workdir.resolve() / args.size
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for algorithm in args.only.split(","):
        data = work / algorithm
        if not (data / INPUT[algorithm]).exists():
            if algorithm == "pagerank":
                shape = ["--rows", str(size["graph_nodes"]), "--edges", str(size["graph_edges"]),
                         "--chunk-rows", str(size["edge_chunk_rows"])]
            else:
                shape = ["--rows", str(size["rows"]), "--cols", str(size["cols"]), "--chunk-rows", str(size["chunk_rows"]),
                         *(["--k", str(size["k"])] if algorithm == "kmeans" else [])]
            subprocess.run([ARRAYJOB, "datagen", algorithm, str(data), *shape], check=True)
        with tempfile.TemporaryDirectory() as tmp:
            cwd = Path(tmp)
            slow = Path(tmp) / "slow"
            (slow / ".arrayjob").mkdir(parents=True)
            sys.path.insert(0, str(REPO))
            from arrayjob.costing.profile import load_profile

            profile = load_profile()  # this checkout's calibrated profile, if saved, else the shipped one
            (cwd / ".arrayjob").mkdir(exist_ok=True)
            (cwd / ".arrayjob" / "profile.json").write_text(profile.to_json())
            slow_profile = dataclasses.replace(profile, spill_read_bytes_per_s=profile.storage_read_bytes_per_s / 10)
            (slow / ".arrayjob" / "profile.json").write_text(slow_profile.to_json())
            path = spec(cwd / f"{algorithm}.toml", algorithm, data, cwd / "out", size)
            store = size["graph_store"] if algorithm == "pagerank" else size["store"]
            cases = [
                ("in memory", cwd, []),
                ("Ray's spilling", cwd, [f"cluster.object_store_memory={store}", "cluster.memory_budget=1TB"]),
                ("planned, spill", cwd, [f"cluster.object_store_memory={store}"]),
                ("planned, bucket", slow, [f"cluster.object_store_memory={store}"]),
            ]
            if size.get("small_disk") and algorithm == "logreg" and os.geteuid() == 0 and shutil.which("unshare"):
                # spilling impossible: a temporary directory smaller than X, for Ray and for arrayjob
                small = [f"cluster.object_store_memory={store}"]
                cases += [("Ray's spilling, small disk", cwd, [*small, "cluster.memory_budget=1TB"], size["small_disk"]),
                          ("planned, small disk", cwd, small, size["small_disk"])]
            if algorithm == "pagerank":  # its edges stream from the spill or not at all: no bucket case
                cases = cases[:3]
            key = "evaluations" if algorithm == "logreg" else "iterations"
            for name, where, sets, *disk in cases:
                print(f"{algorithm}: {name} ...", file=sys.stderr, flush=True)
                row = summarize(name, run_case(path, where, sets, *disk), key)
                row["workload"] = algorithm
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        if algorithm == "kmeans":  # the peer: dask-ml, in memory and with workers capped to the store
            half = f"{units_size(size['store']) // 2}B"
            for name, limit in (("dask-ml, in memory", "auto"), ("dask-ml, workers capped", half)):
                print(f"{algorithm}: {name} ...", file=sys.stderr, flush=True)
                row = {"case": name, "workload": algorithm, **dask_kmeans(data / "X.zarr", size["k"], limit)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    load = os.getloadavg()
    result = {"size": args.size, "store": size["store"], "rows": size["rows"], "cols": size["cols"],
              "graph": f"{size['graph_nodes']:,} nodes, {size['graph_edges']:,} edges, store {size['graph_store']}",
              "load_average": load, "cases": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    table = markdown_table(result)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table)
    print(table)
    return 0


def markdown_table(result: dict) -> str:
    def mb(n: float) -> str:
        return f"{n / 1e6:,.0f} MB"

    lines = [f"X {result['rows']:,} × {result['cols']} float64 (PageRank: {result.get('graph', '-')}), "
             f"store {result['store']}, "
             f"load average {', '.join(f'{x:.1f}' for x in result['load_average'])}", "",
             "| workload | case | s / pass (estimate) | × in memory | resident (estimate) | brought back / pass "
             "(estimate), from | peak / node (budget) |", "|---|---|---|---|---|---|---|"]
    base = {r["workload"]: r.get("seconds_per_pass") for r in result["cases"] if r["case"] == "in memory"}
    for r in result["cases"]:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['case']} | failed: {r['error']} | | | | |")
            continue
        ratio = r["seconds_per_pass"] / base[r["workload"]] if base.get(r["workload"]) else float("nan")
        if r.get("peer"):  # dask-ml: its time only (its own cluster holds or spills X as it will)
            limit = "no cap" if r["memory_limit"] == "auto" else f"{r['memory_limit']} per worker"
            lines.append(f"| {r['workload']} | {r['case']} | {r['seconds_per_pass']:.3f} | {ratio:.2f} "
                         f"| - | - | {limit} |")
            continue
        # from the spill every pass brings its blocks back (the load wrote it); from the bucket
        # the first pass reads them and the others bring them back
        back = r["brought_back_bytes"] / max(1, r["passes"] - (r["streamed_from"] != "spill"))
        lines.append(
            f"| {r['workload']} | {r['case']} | {r['seconds_per_pass']:.3f} ({r['estimate_seconds_per_pass']:.3f}) "
            f"| {ratio:.2f} | {r['resident_fraction']:.0%} ({r['estimate_resident_fraction']:.0%}) "
            f"| {mb(back)} ({mb(r['estimate_brought_back_per_pass'])}), {r['streamed_from'] or '-'} "
            f"| {mb(r['peak_bytes_per_node'])} ({mb(r['budget_bytes'])}) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
