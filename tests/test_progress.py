"""Watching a run: the plain lines off a terminal, one JSON object per event, --quiet.

The runs are ``arrayjob run`` on a small logistic regression, in-process on the session's Ray
with stderr not a terminal, so what a cron job or a log collector gets is what is checked; the
live view on a terminal is the installed ``arrayjob`` command as a process, its stderr a pty."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from arrayjob.cli.progress import PlainLines, Watch, number
from arrayjob.runtime.metrics import ProgressEvent, RunMetrics
from tests.helpers import logreg_data, published, read_group, run_cli, write_array, write_spec

ARRAYJOB = shutil.which("arrayjob", path=str(Path(sys.executable).parent)) or "arrayjob"
STAGES = ["validate", "connect", "load", "fit", "write"]
# "arrayjob: [   6.09 s] load done in 1.3 s, 8/8 blocks, read 52.8 MB (40.9 MB/s), 8 tasks"
LINE = re.compile(r"arrayjob: \[ *\d+\.\d\d s\] (?P<text>.+)")


@pytest.fixture(scope="module")
def small_job(tmp_path_factory) -> Path:
    """A logreg spec on 8 blocks that runs its full 12 iterations (tol 0)."""
    root = tmp_path_factory.mktemp("progress")
    X, y = logreg_data(4000, 6)
    write_array(str(root / "X.zarr"), X, (500, 6))
    write_array(str(root / "y.zarr"), y, (500,))
    write_spec(root / "job.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out",
               params='max_iter = 12\ntol = 1e-300\nsolver = "newton"\n')
    return root


@pytest.fixture
def arrayjob(small_job, ray_session, monkeypatch, capsys):
    """``arrayjob(*args)``: the command run in-process in the job's directory, as a finished process."""
    monkeypatch.chdir(small_job)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        code, out, err = run_cli(list(args), capsys)
        return subprocess.CompletedProcess(["arrayjob", *args], code, out, err)

    return run


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


def test_progress_on_stdout_is_refused_with_json(small_job, monkeypatch, capsys):
    monkeypatch.chdir(small_job)
    code, out, err = run_cli(["run", "job.toml", "--json", "--log-to", "stdout"], capsys)
    run = subprocess.CompletedProcess([], code, out, err)
    assert run.returncode == 2 and "--log-to stdout cannot be used with --json" in run.stderr
    assert run.stdout == ""


def _event(kind: str, seconds: float, stage: str | None = "fit", **data: object) -> ProgressEvent:
    return ProgressEvent(kind, seconds, stage, data)


def test_plain_lines_every_n_iterations_or_ten_seconds():
    """A line when 10 iterations have passed since the last, or 10 s, whichever comes first."""
    import io

    out = io.StringIO()
    lines = PlainLines(out, every_iterations=10, every_seconds=10.0)
    lines(_event("stage_start", 0.0))
    for k in range(1, 26):  # one iteration a second up to 20, then one every 6 s
        seconds = float(k) if k <= 20 else 20.0 + 6 * (k - 20)
        lines(_event("iteration", seconds, iteration=k, max_iter=100, objective=1.0 / k, gradient_norm=2.81e-9))
    told = [int(m) for m in re.findall(r"iteration (\d+)/100", out.getvalue())]
    # 10 and 20 by count; then 22 (32 s) and 24 (44 s) by the 10 s rule
    assert told == [10, 20, 22, 24]
    assert "gradient norm 2.81e-09" in out.getvalue()


def test_node_lines_name_the_stage_only_inside_one():
    import io

    out = io.StringIO()
    lines = PlainLines(out, every_iterations=10, every_seconds=10.0)
    lines(_event("node_joined", 10.3, stage=None, node="n1"))  # as the job connects, between stages
    lines(_event("node_lost", 12.0, node="n2"))
    text = out.getvalue()
    assert "] node n1 joined\n" in text and "] fit: node n2 lost\n" in text and "None" not in text

def test_time_left_by_the_estimate():
    watch = Watch()
    estimate = {"wall_seconds": 16.0, "iterations": 100,
                "stages": [{"name": "connect", "wall_seconds": 3.0}, {"name": "load", "wall_seconds": 2.0},
                           {"name": "fit", "wall_seconds": 10.0}, {"name": "write", "wall_seconds": 1.0}]}
    assert watch.time_left() is None
    watch.see(_event("estimate", 3.0, None, **estimate))
    assert watch.time_left() == 16.0  # not in a stage the estimate knows: all of it
    watch.see(_event("stage_start", 3.0, "fit"))
    watch.see(_event("iteration", 4.0, iteration=25, max_iter=100))
    assert watch.time_left() == pytest.approx(10.0 * 75 / 100 + 1.0)


def test_events_reach_every_listener_with_stage_and_kind():
    metrics = RunMetrics()
    seen: list[ProgressEvent] = []
    metrics.listen(seen.append)
    with metrics.stage("fit"):
        metrics.iteration(1, 5, objective=np.float64(0.5), gradient_norm=1e-3)
        metrics.fault("task_retry", 2)
    with pytest.raises(RuntimeError), metrics.stage("write"):
        raise RuntimeError("disk gone")
    assert [(e.kind, e.stage) for e in seen] == [("stage_start", "fit"), ("iteration", "fit"), ("retry", "fit"),
                                                ("stage_end", "fit"), ("stage_start", "write")]
    assert type(seen[1].data["objective"]) is float  # JSON-ready
    assert seen[2].data == {"what": "task", "count": 2}
    with pytest.raises(ValueError, match="unknown event kind"):
        metrics.emit("nonsense")


@pytest.mark.parametrize(("value", "shown"), [(7.0654, "7.065"), (2.81174715001897e-09, "2.81e-09"), (0.0, "0"),
                                              (123456.0, "1.23e+05"), (None, "–")])
def test_numbers_are_shown_to_four_significant_digits(value, shown):
    assert number(value) == shown


@pytest.mark.cli
@pytest.mark.ray
def test_live_view_on_a_terminal(small_job, ray_session):
    """stderr a terminal (a pty): the view is redrawn in place (rich), stage ends are kept as
    lines above it, and the view is cleared at the end; stdout (a pipe) keeps the summary.
    The installed command as a process, a driver of the session's Ray."""
    import pty
    import select

    import ray

    controller, terminal = pty.openpty()
    env = os.environ | {"COLUMNS": "120", "TERM": "xterm", "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    proc = subprocess.Popen([ARRAYJOB, "run", "job.toml", "--overwrite"], cwd=small_job, env=env,
                            stdout=subprocess.PIPE, stderr=terminal, text=True)
    os.close(terminal)
    seen = b""
    while True:
        ready, _, _ = select.select([controller], [], [], 240)
        if not ready:
            proc.kill()
            pytest.fail("no output from the live view for 240 s")
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the process is done with it
            break
        if not chunk:
            break
        seen += chunk
    out, _ = proc.communicate(timeout=60)
    os.close(controller)
    assert proc.returncode == 0, seen.decode(errors="replace")
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))
    assert "\x1b[1A" in seen.decode(errors="replace") or "\x1b[2K" in seen.decode(errors="replace")  # redrawn in place
    assert re.search(r"job\s+test-logreg\s+[\d.]+ s elapsed", shown)
    assert re.search(r"stage\s+(validate|connect|load|fit)", shown)
    for stage in STAGES:
        assert re.search(rf"\[ *\d+\.\d\d s\] {stage} done in ", shown), stage
    assert "published run " in shown
    assert "result:" in out and "arrayjob:" not in out
