"""Named points a run can be held at, so that a test acts on a live run (kills a node, adds
one, sends a signal) at a known moment instead of racing a timer with data sized to last.

A point is named after the run's own progress events (``RunMetrics.emit``):

- ``<stage>``: the stage starts (``load``, ``fit``, ``write``, …), before its work;
- ``<stage>:end``: the stage's work is done, before the next stage starts;
- ``<stage>:<k>``: iteration ``k`` (counted from 1) of an iterative job is done.

A test in another process names the points in the environment of the run:

    ARRAYJOB_TEST_PAUSE_AT=fit:2 ARRAYJOB_TEST_PAUSE_DIR=/tmp/p arrayjob run spec.toml

At the point the run writes ``<dir>/<point>.reached`` (its pid) and waits until the test
creates ``<dir>/<point>.go``, then goes on; each named point holds the run once. A test
in the run's own process passes a callback instead (``hold``). Unset, nothing is installed:
no listener, no cost.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path

from arrayjob.runtime.metrics import ProgressEvent, RunMetrics

POINTS_ENV = "ARRAYJOB_TEST_PAUSE_AT"  # tests only: comma-separated point names
DIR_ENV = "ARRAYJOB_TEST_PAUSE_DIR"  # where <point>.reached and <point>.go are
TIMEOUT_ENV = "ARRAYJOB_TEST_PAUSE_TIMEOUT"  # seconds to wait for <point>.go (300): a lost test never hangs a run


def point_of(event: ProgressEvent) -> str | None:
    """The name of the point ``event`` marks, if it marks one."""
    if event.stage is None:
        return None
    if event.kind == "stage_start":
        return event.stage
    if event.kind == "stage_end":
        return f"{event.stage}:end"
    if event.kind == "iteration":
        return f"{event.stage}:{event.data['iteration']}"
    return None


def hold(metrics: RunMetrics, points: Collection[str], action: Callable[[str], None]) -> None:
    """Call ``action(point)`` in the run's thread the first time the run reaches each of
    ``points``; the run goes on when it returns."""
    waiting = set(points)

    def listener(event: ProgressEvent) -> None:
        point = point_of(event)
        if point in waiting:
            waiting.discard(point)
            action(point)

    metrics.listen(listener)


def hold_from_environment(metrics: RunMetrics) -> None:
    """Hold the run at the points ``ARRAYJOB_TEST_PAUSE_AT`` names, if it names any."""
    names = os.environ.get(POINTS_ENV)
    if not names:
        return
    where = Path(os.environ.get(DIR_ENV) or ".")
    timeout = float(os.environ.get(TIMEOUT_ENV) or 300)
    hold(metrics, [n.strip() for n in names.split(",") if n.strip()], lambda point: _wait(where, point, timeout))


def _wait(where: Path, point: str, timeout: float) -> None:
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{point}.reached").write_text(str(os.getpid()))
    go = where / f"{point}.go"
    deadline = time.monotonic() + timeout
    while not go.exists():
        if time.monotonic() > deadline:
            print(f"arrayjob: {POINTS_ENV}: nobody released {point} in {timeout:g} s; going on", file=sys.stderr)
            return
        time.sleep(0.02)
