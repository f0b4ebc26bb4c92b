"""Watching a run: the run's events (``runtime.metrics.ProgressEvent``) as a person or a log
collector reads them.

- ``LiveView``: on a terminal, a view redrawn in place (rich): the stage, blocks loaded of
  total with bytes/s, iteration k of max with the objective and gradient norm, the time
  left by the estimate.
- ``PlainLines``: off a terminal, one line per stage, one per ``every_iterations``
  iterations or ``every_seconds`` seconds, and one per retry, node lost or joined, publish.
- ``JsonLines``: ``--log-format json``, one JSON object per event.

Each reads events only; ``Watch`` keeps what they share (the estimate, the last blocks and
iteration figures) and works out the time left.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from arrayjob.runtime.metrics import ProgressEvent
from arrayjob.units import duration, size

EVERY_ITERATIONS = 10  # plain lines: one per this many iterations ...
EVERY_SECONDS = 10.0  # ... or per this many seconds, whichever comes first


def number(value: float | None) -> str:
    """A figure to four significant digits, without a run of zeros or a raw exponent tail."""
    if value is None:
        return "–"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    return f"{value:.4g}" if 1e-3 <= abs(value) < 1e5 else f"{value:.2e}"


def iteration_figures(data: dict[str, Any]) -> str:
    """"objective 0.3123, gradient norm 2.81e-09", or the job's own convergence figures."""
    parts = []
    if data.get("objective") is not None:
        parts.append(f"objective {number(data['objective'])}")
    if data.get("gradient_norm") is not None:
        parts.append(f"gradient norm {number(data['gradient_norm'])}")
    for key in ("l1_change", "shift", "fit"):
        if data.get(key) is not None:
            parts.append(f"{key.replace('_', ' ')} {number(data[key])}")
    return ", ".join(parts)


@dataclass
class Watch:
    """What the consumers share: the estimate, the current stage and its figures."""

    stage: str | None = None
    stage_started: float = 0.0  # run seconds
    estimate: dict[str, Any] | None = None
    blocks: dict[str, Any] | None = None  # the last blocks event's data, in this stage
    iteration: dict[str, Any] | None = None  # the last iteration event's data, in this stage
    seconds: float = 0.0  # of the last event
    clock: float = field(default_factory=time.monotonic)  # when the last event came

    def see(self, event: ProgressEvent) -> None:
        self.seconds, self.clock = event.seconds, time.monotonic()
        if event.kind == "stage_start":
            self.stage, self.stage_started, self.blocks, self.iteration = event.stage, event.seconds, None, None
        elif event.kind == "estimate":
            self.estimate = event.data
        elif event.kind == "blocks":
            self.blocks = event.data
        elif event.kind == "iteration":
            self.iteration = event.data

    def now(self) -> float:
        """Run seconds now, from the last event and the time since."""
        return self.seconds + time.monotonic() - self.clock

    def bytes_per_second(self) -> float | None:
        if not self.blocks:
            return None
        elapsed = self.now() - self.stage_started
        return self.blocks["bytes_read"] / elapsed if elapsed > 0 else None

    def time_left(self) -> float | None:
        """Seconds left by the estimate: the predicted wall time of the stages still to come,
        plus what is left of this one (its prediction less the time spent; in an iterative
        stage, the iterations left of those the estimate assumed). None before the estimate."""
        if self.estimate is None:
            return None
        stages = self.estimate["stages"]
        names = [s["name"] for s in stages]
        if self.stage not in names:
            return float(self.estimate["wall_seconds"])
        at = names.index(self.stage)
        predicted = float(stages[at]["wall_seconds"])
        if self.iteration:
            assumed = max(int(self.estimate.get("iterations") or self.iteration["max_iter"]), 1)
            current = predicted * max(assumed - int(self.iteration["iteration"]), 0) / assumed
        else:
            current = max(predicted - (self.now() - self.stage_started), 0.0)
        return current + sum(float(s["wall_seconds"]) for s in stages[at + 1:])


def _event_line(event: ProgressEvent, watch: Watch) -> str | None:
    """The plain line of an event that always gets one, else None."""
    d: dict[str, Any] = event.data
    if event.kind == "stage_end":
        parts = [f"{event.stage} done in {duration(float(d['wall_seconds']))}"]
        if watch.blocks:
            b = watch.blocks
            parts.append(f"{b['loaded']:,}/{b['total']:,} blocks")
        if d.get("bytes_read"):
            wall = float(d["wall_seconds"])
            rate = f" ({size(int(d['bytes_read']) / wall)}/s)" if wall > 0 else ""
            parts.append(f"read {size(int(d['bytes_read']))}{rate}")
        if d.get("bytes_written"):
            parts.append(f"wrote {size(int(d['bytes_written']))}")
        if d.get("tasks"):
            parts.append(f"{int(d['tasks']):,} tasks")
        return ", ".join(parts)
    if event.kind == "retry":
        return f"{event.stage}: {d['count']} {d['what']} {'retry' if d['count'] == 1 else 'retries'}"
    where = f"{event.stage}: " if event.stage else ""  # between stages (a node seen as the job connects)
    if event.kind == "node_lost":
        return f"{where}node {d['node']} lost"
    if event.kind == "node_joined":
        return f"{where}node {d['node']} joined"
    if event.kind == "publish":
        return f"published run {d['run_id']} to {d['uri']}"
    return None


def _left(watch: Watch) -> str:
    left = watch.time_left()
    return "" if left is None else f"; about {duration(left)} left by the estimate"


class PlainLines:
    """Off a terminal: one line per stage, per ``every_iterations`` iterations or
    ``every_seconds`` seconds, per retry, node lost or joined, and the publish."""

    def __init__(self, stream: TextIO, *, every_iterations: int = EVERY_ITERATIONS,
                 every_seconds: float = EVERY_SECONDS) -> None:
        self.stream = stream
        self.every_iterations = every_iterations
        self.every_seconds = every_seconds
        self.watch = Watch()
        self._told_iteration = 0
        self._told_at = 0.0

    def __call__(self, event: ProgressEvent) -> None:
        self.watch.see(event)
        line = _event_line(event, self.watch)
        data: dict[str, Any] = event.data
        if event.kind == "iteration":
            k = int(data["iteration"])
            if k - self._told_iteration >= self.every_iterations or event.seconds - self._told_at >= self.every_seconds:
                line = (f"{event.stage}: iteration {k}/{event.data['max_iter']}: "
                        f"{iteration_figures(event.data)}{_left(self.watch)}")
        if line is None:
            return
        if event.kind == "iteration":
            self._told_iteration = int(data["iteration"])
        self._told_at = event.seconds
        self.write(f"[{event.seconds:7.2f} s] {line}")

    def write(self, line: str) -> None:
        self.stream.write(f"arrayjob: {line}\n")
        self.stream.flush()

    def notice(self, line: str) -> None:
        self.write(line)

    def close(self) -> None:
        pass


class JsonLines:
    """``--log-format json``: one JSON object per event, with the wall-clock time and the job."""

    def __init__(self, stream: TextIO, job: str) -> None:
        self.stream = stream
        self.job = job

    def __call__(self, event: ProgressEvent) -> None:
        self.write(event.as_dict())

    def write(self, record: dict[str, Any]) -> None:
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self.stream.write(json.dumps({"time": stamp, "job": self.job, **record}) + "\n")
        self.stream.flush()

    def notice(self, line: str) -> None:
        """A line the run tells (waiting for another run, resumed from a checkpoint)."""
        self.write({"event": "notice", "message": line})

    def close(self) -> None:
        pass


class LiveView:
    """On a terminal: the run's state redrawn in place (rich), cleared when the run ends so the
    summary follows it; lines that always get one (stage ends, faults) are kept above it."""

    def __init__(self, stream: TextIO, job: str) -> None:
        from rich.console import Console
        from rich.live import Live

        self.job = job
        self.watch = Watch()
        self.console = Console(file=stream, stderr=True)
        self.live = Live(self, console=self.console, refresh_per_second=4, transient=True,
                         redirect_stdout=True, redirect_stderr=True)
        self.live.start()

    def __call__(self, event: ProgressEvent) -> None:
        self.watch.see(event)
        line = _event_line(event, self.watch)
        if line is not None:
            from rich.markup import escape

            self.console.print(f"[dim]\\[{event.seconds:7.2f} s][/dim] {escape(line)}", highlight=False)

    def notice(self, line: str) -> None:
        self.console.print(f"arrayjob: {line}", highlight=False, markup=False)

    def __rich__(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        w = self.watch
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column()
        grid.add_row("job", self.job, f"{duration(w.now())} elapsed")
        grid.add_row("stage", w.stage or "starting", f"{duration(w.now() - w.stage_started)}")
        if w.blocks:
            b, rate = w.blocks, w.bytes_per_second()
            grid.add_row("blocks", ProgressBar(total=b["total"], completed=b["loaded"], width=30),
                         f"{b['loaded']:,}/{b['total']:,}, {size(b['bytes_read'])}"
                         + (f" at {size(rate)}/s" if rate else ""))
        if w.iteration:
            it = w.iteration
            grid.add_row("iteration", ProgressBar(total=it["max_iter"], completed=it["iteration"], width=30),
                         f"{it['iteration']}/{it['max_iter']}: {iteration_figures(it)}")
        left = w.time_left()
        if left is not None:
            grid.add_row("time left", f"about {duration(left)}", "by the estimate")
        return grid

    def close(self) -> None:
        self.live.stop()


Consumer = PlainLines | JsonLines | LiveView


def consumer(stream: TextIO, *, job: str, log_format: str) -> Consumer:
    """The consumer for ``stream``: JSON lines if asked, a live view on a terminal, else plain lines."""
    if log_format == "json":
        return JsonLines(stream, job)
    if stream.isatty():
        return LiveView(stream, job)
    return PlainLines(stream)
