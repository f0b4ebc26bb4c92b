"""docs/benchmarks.md from the benchmarks' JSON results: one row per workload.

    .venv/bin/python benchmarks/table.py            # write docs/benchmarks.md
    .venv/bin/python benchmarks/table.py --check    # exit 1 if it is out of date

Each file in benchmarks/results/ is what a benchmark script writes with `--json`
(`rows` of bench_harness.Row, with the run's `commit` and `date`). A workload's row
shows arrayjob's figure, its best peer's (the fastest row counted as a peer), their
ratio and the target, and the command that measures it again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOC = REPO / "docs" / "benchmarks.md"

# Which script writes a results file, by the file name's first word.
SCRIPTS = {"bench": "benchmarks/bench.py", "sparse": "benchmarks/bench_sparse.py"}

HEADER = """# Benchmarks

One row per workload: arrayjob's figure, the best peer's on the same data in the same
run, their ratio, the target, and the command that measures it again, with the commit
and date of the run. This page is generated from `benchmarks/results/*.json` by
`benchmarks/table.py`; `make bench` refreshes both. The machine is 2 cores and 24 GiB,
shared: compare rows of one run with each other.

| workload | size | arrayjob | best peer | × best peer | target | command | commit | date |
|---|---|---|---|---|---|---|---|---|
"""


def _figure(row: dict[str, Any]) -> str:
    value = row.get("compute_s")
    return "—" if value is None else f"{value:.3g} ({row['unit']})"


def _command(path: Path, size: str) -> str:
    script = SCRIPTS[path.stem.split("-")[0]]
    return f"`.venv/bin/python {script} --size {size} --json {path.relative_to(REPO)}`"


def _target(row: dict[str, Any]) -> str:
    verdict = {True: "met", False: "missed", None: ""}[row.get("target_met")]
    return f"{verdict}: {row['target']}" if row.get("target") else verdict


def rows_of(path: Path) -> list[str]:
    """The table's rows from one results file, in the order the run measured them."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    date = str(doc["date"])[:10]
    lines = []
    for ours in (r for r in doc["rows"] if r.get("arrayjob")):
        same = [r for r in doc["rows"] if r["workload"] == ours["workload"] and r["unit"] == ours["unit"]]
        peers = [r for r in same if r.get("peer") and not r.get("arrayjob") and r.get("compute_s")]
        best = min(peers, key=lambda r: r["compute_s"]) if peers else None
        peer = f"{best['system']}: {_figure(best)}" if best else "—"
        ratio = "—" if ours.get("ratio_best_peer") is None else f"{ours['ratio_best_peer']:.2f}×"
        cells = [ours["workload"], ours["size"], f"{ours['system']}: {_figure(ours)}", peer, ratio,
                 _target(ours), _command(path, doc["size"]), f"`{doc['commit']}`", date]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


SCALE = RESULTS / "scale.json"  # benchmarks/scale.py's rows, a table of their own

SCALE_HEADER = """
## Planning at cluster sizes

`arrayjob estimate` (with `cluster.max_nodes` = the nodes, its sizing search included) and
`arrayjob plan --nodes N --workers-per-node 16` of a logistic regression over metadata-only
Zarr arrays (100 features, chunks of 1,000,000 rows), each command in a process of its own.
Targets: the 80 TB estimate at 1,000 nodes within 10 s and 1 GB, its plan within 5 s, the
0.8 TB estimate within 3 s. Measured by `.venv/bin/python benchmarks/scale.py --json
benchmarks/results/scale.json`{run}.

"""


def scale_table() -> str:
    """The scale benchmark's table, or nothing before it has run."""
    if not SCALE.exists():
        return ""
    doc = json.loads(SCALE.read_text(encoding="utf-8"))
    sys.path.insert(0, str(REPO / "benchmarks"))
    from scale import markdown  # the benchmark's own table

    run = f" at `{doc['commit']}` on {str(doc['date'])[:10]} ({doc['machine']})"
    return SCALE_HEADER.format(run=run) + markdown(doc["rows"])


def render() -> str:
    body = [line for path in sorted(RESULTS.glob("*.json")) if path != SCALE for line in rows_of(path)]
    return HEADER + "\n".join(body) + "\n" + scale_table()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if DOC.read_text(encoding="utf-8") != text:
            print("docs/benchmarks.md is out of date: run benchmarks/table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
