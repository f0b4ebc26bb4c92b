"""Estimates that learn (issue 29): each shipped config run four times, each run's wall-time error.

    .venv/bin/python benchmarks/estimate_learning.py [--size quick|demo] [--runs 4] [--only logreg,kmeans]
                                                     [--json FILE] [--markdown FILE]

For every config in ``configs/`` (on its demo data: ``demo`` is the size its header names,
``quick`` the small data tests/integration/test_configs.py runs), run ``arrayjob run CONFIG --overwrite
--json`` as a user would, ``--runs`` times, in a history of its own (``ARRAYJOB_HISTORY`` in
a fresh directory: the first run has none), from the checkout (so the profile is the one
``arrayjob calibrate`` saved there, if any). Each run's estimate is the one it made before
it started, from the runs before it (``costing.history``); its error is report.json's
``estimate_error.wall_seconds``, (actual − estimate) / estimate. Target: within ±25 % from
the fourth run on. ``predict`` and ``predict_als`` score with the logreg and ALS demos' models, so those run first.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_harness import commit, machine_line

REPO = Path(__file__).resolve().parents[1]
ARRAYJOB = str(Path(sys.executable).parent / "arrayjob")
TARGET = 0.25
# quick: the demo data of tests/integration/test_configs.py, a little larger (a run is mostly Ray's start)
QUICK = {
    "logreg": "--rows 20000 --cols 8 --chunk-rows 2500",
    "logreg_multinomial": "--rows 20000 --cols 8 --chunk-rows 2500 --classes 4",
    "linreg": "--rows 20000 --cols 8 --chunk-rows 2500",
    "kmeans": "--rows 20000 --cols 4 --chunk-rows 2500 --k 8",
    "gmm": "--rows 20000 --cols 3 --chunk-rows 2500 --k 4",
    "tsqr": "--rows 20000 --cols 8 --chunk-rows 2500",
    "mttkrp": "--shape 40,30,20 --chunk-rows 8 --rank 4",
    "cp_als": "--shape 40,30,20 --chunk-rows 8 --rank 8",
    "pagerank": "--rows 3000 --edges 30000 --chunk-rows 7000",
    "pca": "--rows 20000 --cols 10 --chunk-rows 2500 --rank 8",
    "als": "--rows 3000 --cols 300 --chunk-rows 500 --nnz-per-row 10",
    "als_table": "--rows 3000 --cols 300 --chunk-rows 500 --nnz-per-row 10 --format parquet",
}
ALGORITHM = {"logreg_multinomial": "logreg", "als_table": "als"}
MODEL_OF = {"predict": "logreg", "predict_als": "als"}  # configs that score another config's published model


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def datagen_args(config: str, size: str) -> list[str] | None:
    """The demo data's datagen arguments; None for a config that reads another's output."""
    if config in MODEL_OF:
        return None
    if size == "quick":
        return shlex.split(QUICK[config])
    header = next(line for line in (REPO / "configs" / f"{config}.toml").read_text().splitlines()
                  if "arrayjob datagen" in line)
    words = shlex.split(header.split("arrayjob datagen", 1)[1].split("&&")[0])
    return words[2:]  # after the algorithm and the directory


LOCK = ""  # --lock FILE
RETRIES = 2  # a run whose Ray failed to start (exit 5, on a machine this loaded) is tried again


def run_once(config: str, env: dict[str, str]) -> dict:
    started = time.perf_counter()
    for attempt in range(RETRIES + 1):
        command = [ARRAYJOB, "run", str(REPO / "configs" / f"{config}.toml"), "--overwrite", "--json"]
        if LOCK:  # a machine shared with other Ray users: each run takes their lock, shared
            command = ["flock", "-s", LOCK, *command]
        out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        if out.returncode != 5 or attempt == RETRIES:
            break
        print(f"{config}: exit 5 ({out.stderr.strip().splitlines()[-1]}); again", flush=True)
        time.sleep(10)
    if out.returncode:
        raise SystemExit(f"{config}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
    report = json.loads(out.stdout)
    history = report["estimate"].get("history") or {}
    return {"config": config, "actual_seconds": report["wall_seconds"],
            "estimate_seconds": report["estimate"]["wall_seconds"],
            "error": report["estimate_error"]["wall_seconds"], "history": history.get("kind"),
            "history_runs": len(history.get("run_ids", [])),
            "iterations": report["result"].get("iterations"),
            "iterations_assumed": report["estimate"]["iterations"]["assumed"],
            "process_seconds": round(time.perf_counter() - started, 2), "load_average": os.getloadavg()[0]}


def markdown(rows: list[dict], runs: int) -> str:
    by: dict[str, list[dict]] = {}
    for row in rows:
        by.setdefault(row["config"], []).append(row)
    head = "| config | " + " | ".join(f"run {i + 1}" for i in range(runs)) + " | last run's estimate / actual |"
    lines = [head, "|" + "---|" * (runs + 2)]
    for config, done in by.items():
        cells = [f"{r['error']:+.0%}" if r["error"] is not None else "—" for r in done]
        last = done[-1]
        lines.append(f"| {config} | " + " | ".join(cells) + f" | {last['estimate_seconds']:.1f} s / "
                     f"{last['actual_seconds']:.1f} s |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["quick", "demo"], default="quick")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--only", default="", help="comma-separated configs [default: every config in configs/]")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--lock", default="", help="take this file's flock, shared, around each run")
    args = parser.parse_args()
    global LOCK
    LOCK = args.lock
    configs = sorted(p.stem for p in (REPO / "configs").glob("*.toml"))
    if args.only:
        configs = [c for c in configs if c in args.only.split(",")]
    for config, model in MODEL_OF.items():
        if config in configs and model not in configs:
            configs.insert(0, model)  # its model, fitted first
    root = Path(tempfile.mkdtemp(prefix="arrayjob-learning-"))
    env = {**os.environ, "ARRAYJOB_BUCKET": str(root / "bucket"), "ARRAYJOB_HISTORY": str(root / "history")}
    print(f"# commit {commit()}; size {args.size}; {machine_line()}; uptime: {uptime()}",
          flush=True)
    started = time.perf_counter()
    rows = []
    for config in configs:
        data = datagen_args(config, args.size)
        if data is not None:
            algorithm = ALGORITHM.get(config, config)
            subprocess.run([ARRAYJOB, "datagen", algorithm, str(root / "bucket" / "demo" / config), *data],
                           env=env, check=True, capture_output=True)
        for i in range(args.runs):
            row = run_once(config, env)
            row["run"] = i + 1
            rows.append(row)
            error = "n/a" if row["error"] is None else f"{row['error']:+.1%}"
            print(f"{config:<20} run {i + 1}: estimate {row['estimate_seconds']:7.2f} s, actual "
                  f"{row['actual_seconds']:7.2f} s, error {error:>8} (history: {row['history'] or 'none'}"
                  f"{', ' + str(row['history_runs']) + ' run(s)' if row['history'] else ''}; iterations "
                  f"{row['iterations_assumed']} assumed, {row['iterations']} done; load {row['load_average']:.1f})",
                  flush=True)
    table = markdown(rows, args.runs)
    after = [r for r in rows if r["run"] >= 4 and r["error"] is not None]
    met = sum(abs(r["error"]) <= TARGET for r in after)
    print(table)
    print(f"# from run 4 on: {met} of {len(after)} within ±{TARGET:.0%}; {time.perf_counter() - started:.0f} s; "
          f"uptime: {uptime()}")
    document = {"commit": commit(), "size": args.size, "machine": machine_line(), "rows": rows,
                "target": TARGET, "met_from_run_4": [met, len(after)]}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
