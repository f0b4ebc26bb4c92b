"""A run held at a named point (``runtime.pause``): the points' names, a callback in the run's
process, and the file handshake with a test in another process; no Ray."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from arrayjob.runtime.metrics import RunMetrics
from arrayjob.runtime.supervision import pause


def a_run(metrics: RunMetrics, seen: list[str]) -> None:
    """What an iterative job tells its metrics: load, then a fit of three iterations, then the write."""
    with metrics.stage("load"):
        seen.append("loading")
    with metrics.stage("fit"):
        for i in range(1, 4):
            seen.append(f"iteration {i}")
            metrics.iteration(i, 3)
    with metrics.stage("write"):
        seen.append("writing")


def test_points_are_named_after_the_runs_progress():
    metrics, seen = RunMetrics(), []
    pause.hold(metrics, ["load", "load:end", "fit:2", "write", "fit:9"], lambda point: seen.append(f"held at {point}"))
    a_run(metrics, seen)
    assert seen == ["held at load", "loading", "held at load:end", "iteration 1", "iteration 2", "held at fit:2",
                    "iteration 3", "held at write", "writing"]


def test_unset_installs_nothing(monkeypatch):
    monkeypatch.delenv(pause.POINTS_ENV, raising=False)
    metrics = RunMetrics()
    pause.hold_from_environment(metrics)
    assert not metrics._listeners


@pytest.mark.timeout(30)
def test_another_process_releases_the_run_by_a_file(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(pause.POINTS_ENV, "fit:1")
    monkeypatch.setenv(pause.DIR_ENV, str(tmp_path))
    metrics, seen = RunMetrics(), []
    pause.hold_from_environment(metrics)
    run = threading.Thread(target=a_run, args=(metrics, seen))
    run.start()
    reached = tmp_path / "fit:1.reached"
    while not reached.exists():
        time.sleep(0.01)
    time.sleep(0.1)
    assert seen == ["loading", "iteration 1"] and run.is_alive()  # held
    assert reached.read_text().isdigit()  # its pid, to signal it
    (tmp_path / "fit:1.go").touch()
    run.join(10)
    assert seen[-1] == "writing"


def test_a_run_nobody_releases_goes_on_after_the_timeout(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv(pause.POINTS_ENV, "load")
    monkeypatch.setenv(pause.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(pause.TIMEOUT_ENV, "0.1")
    metrics, seen = RunMetrics(), []
    pause.hold_from_environment(metrics)
    a_run(metrics, seen)
    assert seen[-1] == "writing"
    assert "nobody released load in 0.1 s" in capsys.readouterr().err
