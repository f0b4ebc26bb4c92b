"""Planning and estimating at cluster sizes, from metadata alone.

    .venv/bin/python benchmarks/scale.py --json benchmarks/results/scale.json
    .venv/bin/python benchmarks/scale.py --chunks 100 1000 --nodes 1 64 --timeout 60

Each case is a logistic regression over a Zarr array created with a shape and chunks and no
chunk written (100 features, chunks of 1,000,000 rows: 800 MB each), so `plan` and
`estimate` read metadata only and their figures are exact for the size. For each number of
chunks and of nodes it runs, in a process of its own:

- `arrayjob estimate` with `cluster.max_nodes` = the nodes (the sizing search included);
- `arrayjob plan --nodes N --workers-per-node 16 --format json`;

and records the wall time, the peak RSS, and the plan's tasks and bytes between nodes per
pass. A case that outlasts `--timeout` is recorded
as such, not waited for.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zarr

REPO = Path(__file__).resolve().parents[1]
ARRAYJOB = str(Path(sys.executable).with_name("arrayjob"))
ROWS_PER_CHUNK, FEATURES = 1_000_000, 100
NODE_TYPE, WORKERS_PER_NODE = "r5.4xlarge", 16


def make_case(root: Path, chunks: int, nodes: int) -> Path:
    """Metadata-only X and y of ``chunks`` chunks under ``root``, and a spec sized at ``nodes``."""
    data = root / f"c{chunks}"
    if not (data / "y.zarr" / "zarr.json").exists():
        rows = chunks * ROWS_PER_CHUNK
        zarr.create_array(str(data / "X.zarr"), shape=(rows, FEATURES), chunks=(ROWS_PER_CHUNK, FEATURES),
                          dtype="f8", overwrite=True)
        zarr.create_array(str(data / "y.zarr"), shape=(rows,), chunks=(ROWS_PER_CHUNK,), dtype="f8",
                          overwrite=True)
    spec = data / f"spec-{nodes}.toml"
    spec.write_text(f"""[job]
name = "scale-{chunks}"
algorithm = "logreg"
[inputs]
X = "{data / 'X.zarr'}"
y = "{data / 'y.zarr'}"
[params]
l2 = 1e-4
[output]
uri = "{data / 'out'}"
[cluster]
address = "auto"
max_nodes = {nodes}
node_type = "{NODE_TYPE}"
""", encoding="utf-8")
    return spec


def timed(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run ``argv``: its wall seconds, peak RSS (from ``os.wait4``), exit code and output, or
    only ``timed_out_after_s`` past ``timeout``."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=out, stderr=err, cwd=REPO, text=True)
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                child.kill()
                os.wait4(child.pid, 0)
                return {"wall_s": None, "timed_out_after_s": timeout}
            time.sleep(0.05)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return {"wall_s": round(wall, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
                "exit": os.waitstatus_to_exitcode(status), "stdout": out.read(), "stderr": err.read().strip()[-300:]}


def pass_figures(plan_json: str) -> dict[str, Any]:
    """The tasks of the plan's pass and the bytes it moves between nodes."""
    doc = json.loads(plan_json)
    return {"tasks_per_pass": doc["tasks"]["count"],
            "between_nodes_bytes_per_pass": doc["cost"]["network"]["bytes_between_nodes"]}


def run_case(root: Path, chunks: int, nodes: int, timeout: float) -> dict[str, Any]:
    spec = make_case(root, chunks, nodes)
    estimate = timed([ARRAYJOB, "estimate", str(spec)], timeout)
    plan = timed([ARRAYJOB, "plan", str(spec), "--nodes", str(nodes), "--workers-per-node",
                  str(WORKERS_PER_NODE), "--format", "json"], timeout)
    row: dict[str, Any] = {"chunks": chunks, "nodes": nodes, "bytes": chunks * ROWS_PER_CHUNK * FEATURES * 8,
                           "estimate_s": estimate.get("wall_s"), "estimate_rss_mb": estimate.get("peak_rss_mb"),
                           "plan_s": plan.get("wall_s"), "plan_rss_mb": plan.get("peak_rss_mb")}
    for name, result in (("estimate", estimate), ("plan", plan)):
        if result.get("wall_s") is None:
            row[f"{name}_timed_out_after_s"] = timeout
        elif result["exit"] != 0:
            row[f"{name}_error"] = result["stderr"]
    if plan.get("exit") == 0:
        row.update(pass_figures(plan["stdout"]))
    summary = [line for line in (estimate.get("stdout") or "").splitlines() if line.startswith("This job")]
    row["estimate_summary"] = summary[-1] if summary else None
    return row


def _cell(value: Any, timeout_key: str, row: dict[str, Any]) -> str:
    if row.get(timeout_key) is not None:
        return f"> {row[timeout_key]:g} s"
    return "—" if value is None else f"{value:g}"


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| X | chunks | nodes | estimate (s) | estimate RSS (MB) | plan (s) | plan RSS (MB) | tasks per pass |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['bytes'] / 1e12:g} TB | {r['chunks']:,} | {r['nodes']:,} | "
                     f"{_cell(r['estimate_s'], 'estimate_timed_out_after_s', r)} | {r['estimate_rss_mb'] or '—'} | "
                     f"{_cell(r['plan_s'], 'plan_timed_out_after_s', r)} | {r['plan_rss_mb'] or '—'} | "
                     f"{r.get('tasks_per_pass') or '—'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 64, 1_000])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per command")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="arrayjob-scale-") as tmp:
        for chunks in args.chunks:
            for nodes in args.nodes:
                row = run_case(Path(tmp), chunks, nodes, args.timeout)
                print(json.dumps({k: v for k, v in row.items() if k != "estimate_summary"}), flush=True)
                rows.append(row)
    print(markdown(rows))
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=REPO).stdout.strip()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"commit": commit, "date": dt.datetime.now(dt.timezone.utc).isoformat(),
                                         "machine": f"{os.cpu_count()} cores", "rows": rows}, indent=1) + "\n",
                             encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
