"""The integration tests of ``tests.unit.cli.test_progress``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.harness.helpers import (
    published,
    read_group,
)
from tests.unit.cli.test_progress import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    ARRAYJOB,
    LINE,
    STAGES,
    _event,
    arrayjob,
    small_job,
)


@pytest.mark.ray
def test_json_events_one_per_line(small_job, arrayjob):
    """--log-format json: every stderr line is one JSON object; with --json stdout is the report."""
    run = arrayjob("run", "job.toml", "--overwrite", "--log-format", "json", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)  # stdout: pure JSON
    events = [json.loads(line) for line in run.stderr.splitlines()]
    assert {e["job"] for e in events} == {"test-logreg"} and all(e["time"].endswith("Z") for e in events)
    kinds = [e["event"] for e in events]
    assert set(kinds) <= {"stage_start", "stage_end", "estimate", "blocks", "iteration", "publish"}, kinds

    starts = [e["stage"] for e in events if e["event"] == "stage_start"]
    ends = [e for e in events if e["event"] == "stage_end"]
    assert starts == [e["stage"] for e in ends] == STAGES == [s["name"] for s in report["stages"]]
    for end, stage in zip(ends, report["stages"], strict=True):
        assert end["tasks"] == stage["tasks"] and end["bytes_read"] == stage["storage.bytes_read"]
    seconds = [e["seconds"] for e in events]
    assert seconds == sorted(seconds)

    blocks = [e for e in events if e["event"] == "blocks"]
    assert blocks and all(b["stage"] == "load" and b["total"] == 8 for b in blocks)
    assert blocks[-1]["loaded"] == 8 and blocks[-1]["bytes_read"] == report["stages"][2]["storage.bytes_read"]

    iterations = [e for e in events if e["event"] == "iteration"]
    assert [e["iteration"] for e in iterations] == list(range(1, report["result"]["iterations"] + 1))
    assert all(e["stage"] == "fit" and e["max_iter"] == 12 for e in iterations)
    objectives = [e["objective"] for e in iterations]
    assert all(a >= b for a, b in zip(objectives, objectives[1:], strict=False))  # Newton never goes uphill
    assert iterations[-1]["objective"] == pytest.approx(report["result"]["objective"], rel=1e-12)
    assert iterations[-1]["gradient_norm"] == pytest.approx(report["result"]["gradient_norm"], rel=1e-6, abs=1e-12)

    estimate = next(e for e in events if e["event"] == "estimate")
    assert estimate["iterations"] == 12 and estimate["wall_seconds"] == report["estimate"]["wall_seconds"]
    publish = events[-1]
    assert publish["event"] == "publish" and publish["uri"] == str(small_job / "out")
    assert f"{small_job / 'out'}/{publish['prefix']}" == published(str(small_job / "out"))


@pytest.mark.ray
def test_plain_lines_off_a_terminal(small_job, arrayjob):
    """One line per stage, one per 10 iterations, the publish; each line parses, nothing else."""
    run = arrayjob("run", "job.toml", "--overwrite")
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    texts = []
    for line in lines:
        match = LINE.fullmatch(line)
        assert match, f"not a progress line: {line!r}"
        texts.append(match["text"])
    done = [t.split(" done in ")[0] for t in texts if " done in " in t]
    assert done == STAGES
    load = next(t for t in texts if t.startswith("load done"))
    assert re.search(r"8/8 blocks, read \d+\.\d kB \(\d+\.\d [kM]B/s\), 8 tasks", load), load
    iterations = [t for t in texts if " iteration " in t]
    # 12 iterations, a line per 10 (or per 10 s on a very slow machine: then more)
    assert iterations and iterations[0].startswith("fit: iteration ")
    assert re.fullmatch(r"fit: iteration 10/12: objective \S+, gradient norm \S+; about .+ left by the estimate",
                        next(t for t in iterations if "iteration 10/" in t))
    run_prefix = published(str(small_job / "out"))
    assert texts[-1] == f"published run {Path(run_prefix).name} to {small_job / 'out'}"
    assert "result:" in run.stdout  # the summary is still on stdout


@pytest.mark.ray
def test_quiet_prints_only_the_final_line(small_job, arrayjob):
    run = arrayjob("run", "job.toml", "--overwrite", "--quiet")
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    run_prefix = published(str(small_job / "out"))
    group = read_group(f"{run_prefix}/result.zarr")
    assert run.stdout.count("\n") == 1
    assert run.stdout.startswith(f"test-logreg: converged in {group.attrs['iterations']} iterations: objective ") \
        or run.stdout.startswith(f"test-logreg: did NOT converge in {group.attrs['iterations']} iterations: objective ")
    assert run.stdout.rstrip().endswith(f"result {run_prefix}/result.zarr (run {Path(run_prefix).name})")

    again = arrayjob("run", "job.toml", "-q")
    assert again.returncode == 0 and again.stderr == "" and again.stdout.count("\n") == 1
    assert "already complete" in again.stdout
