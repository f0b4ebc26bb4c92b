"""What really happened during a run, counted where it happens."""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from arrayjob.io.storage import StorageCounters


@dataclass
class Stage:
    name: str
    wall_seconds: float = 0.0
    tasks: int = 0
    storage: StorageCounters = field(default_factory=StorageCounters)


@dataclass
class RunMetrics:
    """Counters for one job run. Stages are timed by the driver; tasks and bytes by the executor."""

    stages: list[Stage] = field(default_factory=list)
    storage: StorageCounters = field(default_factory=StorageCounters)
    tasks: int = 0
    block_bytes_by_node: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _current: Stage | None = None

    @contextmanager
    def stage(self, name: str) -> Iterator[Stage]:
        stage = Stage(name)
        self.stages.append(stage)
        outer, self._current = self._current, stage
        start = time.perf_counter()
        try:
            yield stage
        finally:
            stage.wall_seconds = time.perf_counter() - start
            self._current = outer

    def count_tasks(self, n: int) -> None:
        self.tasks += n
        if self._current is not None:
            self._current.tasks += n

    def count_storage(self, counters: StorageCounters) -> None:
        self.storage.add(counters)
        if self._current is not None:
            self._current.storage.add(counters)

    def hold_block(self, node: str, nbytes: int) -> None:
        self.block_bytes_by_node[node] += nbytes


def driver_peak_rss_bytes() -> int:
    """Peak resident memory of this (driver) process; Linux reports kilobytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
