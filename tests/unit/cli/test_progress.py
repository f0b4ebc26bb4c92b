"""Watching a run: the plain lines off a terminal, one JSON object per event, --quiet.

The runs are ``arrayjob run`` on a small logistic regression, in-process on the session's Ray
with stderr not a terminal, so what a cron job or a log collector gets is what is checked; the
live view on a terminal is the installed ``arrayjob`` command as a process, its stderr a pty."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from arrayjob.cli.progress import PlainLines, Watch, number
from arrayjob.runtime.metrics import ProgressEvent, RunMetrics
from tests.harness.helpers import (
    logreg_data,
    run_cli,
    write_array,
    write_spec,
)

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


