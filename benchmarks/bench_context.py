"""What every workload gets: the size, the limits, the data, the one Ray of this process, and
arrayjob sessions on it (planner defaults: greedy tiling, cost fusion, LSHS placement)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from bench_data import Size
from bench_harness import Timing, repeat_timed, stopwatch
from bench_limits import Limits, LoopbackS3

from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import ArrayInfo, StorageOptions, parse_uri
from arrayjob.lazy import BlockArray
from arrayjob.planner.plan import PlanOptions
from arrayjob.runtime.cluster import ClusterInfo, cluster_shape
from arrayjob.runtime.metrics import RunMetrics
from arrayjob.runtime.session import Session


@dataclass
class Context:
    size: Size
    repeat: int
    limits: Limits
    cluster: ClusterInfo
    data: dict[str, Path]
    s3: LoopbackS3 | None = None
    cache: dict[str, Any] = field(default_factory=dict)  # peers' in-memory data, shared by workloads

    @property
    def workers(self) -> int:
        return self.cluster.cpus

    def options(self, block_bytes: int | None = None) -> PlanOptions:
        """The planner defaults; ``block_bytes`` overrides the tiling's block target (64 MiB)."""
        options = PlanOptions(tiling="greedy", fusion="cost", placement="lshs", cluster=cluster_shape(self.cluster))
        return options if block_bytes is None else dataclasses.replace(options, target_block_bytes=block_bytes)

    def session(self, storage: StorageOptions | None = None, block_bytes: int | None = None) -> Session:
        from arrayjob.runtime.ray_executor import RayExecutor

        executor = RayExecutor(storage or StorageOptions(), self.cluster.node_ids, RunMetrics())
        return Session(executor, self.options(block_bytes))

    def info(self, dataset: str, array: str, storage: StorageOptions | None = None) -> ArrayInfo:
        return open_array_info(array, parse_uri(str(self.data[dataset] / f"{array}.zarr")), storage or StorageOptions())

    def loaded_session(self, program: dict[str, BlockArray], storage: StorageOptions | None = None,
                       block_bytes: int | None = None) -> tuple[Timing, Session]:
        """arrayjob's load (storage to worker memory): a fresh session per run, so every run reads
        every block; returns the median and the last session, loaded, for the computes."""
        last: list[Session] = []

        def once() -> float:
            last.clear()  # drops the previous session's blocks before the next read
            session = self.session(storage, block_bytes)
            seconds = stopwatch(lambda: session.load(program))
            last.append(session)
            return seconds

        t = repeat_timed(once, self.repeat)
        return t, last[0]

    def numpy_array(self, dataset: str, array: str) -> tuple[np.ndarray, Timing]:
        """A peer's load: zarr's own read of the whole array into NumPy (timed once per array)."""
        key = f"numpy:{dataset}/{array}"
        if key not in self.cache:
            import zarr

            path = str(self.data[dataset] / f"{array}.zarr")
            held: list[np.ndarray] = []

            def once() -> float:
                held.clear()
                z = zarr.open_array(path, mode="r")
                return stopwatch(lambda: held.append(z[...]))

            t = repeat_timed(once, self.repeat)
            self.cache[key] = (held[0], t)
        return self.cache[key]

    def drop(self, prefix: str) -> None:
        for key in [k for k in self.cache if k.startswith(prefix)]:
            del self.cache[key]


def rows_per_block(chunk_rows: int, row_bytes: int, target_bytes: int, total_rows: int, min_blocks: int = 4) -> int:
    """Whole storage chunks per block, about ``target_bytes`` each, and at least ``min_blocks``
    blocks where the storage chunks allow (dask's advice: chunks of ~100 MB, and at least as
    many chunks as threads, a few times over)."""
    chunks = max(1, round(target_bytes / (chunk_rows * row_bytes)))
    most = max(1, -(-total_rows // chunk_rows) // min_blocks)  # chunks per block for min_blocks blocks
    return min(total_rows, min(chunks, most) * chunk_rows)

