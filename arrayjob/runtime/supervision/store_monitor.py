"""What Ray's object stores really held during a job, read from the raylets.

The report's ``memory.peak_bytes_per_node`` is the plan replayed with the sizes tasks really
returned: what the job put in the stores, by the cost model's accounting. This reads the
stores themselves. Every ``period`` seconds, on a thread, each alive node's raylet is asked
for its object-store stats (Ray's ``GetNodeStats``, what ``ray memory --stats-only``
prints). The job gets the highest use seen on each node, and the bytes Ray spilled to local
disk and restored from it while the job ran (Ray's own spilling, which happens behind the
job's back when its stores overflow).

A sampled peak can miss a spike shorter than the period (0.25 s, longer on a cluster so large
that reading every node takes more than a tenth of that). It counts everything in a store:
on a shared cluster, other jobs' objects too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from arrayjob.runtime.metrics import ObjectStores

PERIOD = 0.25  # seconds between readings at least: one small RPC per node (about 1 ms of the driver's CPU)
NODES_EVERY = 2.0  # seconds between looks at which nodes are alive


def _node_stats(node: dict[str, Any]) -> Any:
    from ray._private.internal_api import node_stats

    return node_stats(node["NodeManagerAddress"], node["NodeManagerPort"], include_memory_info=False).store_stats


class StoreMonitor:
    """Reads every alive node's store each ``period`` seconds into ``reading`` until ``stop``."""

    def __init__(self, reading: ObjectStores, period: float = PERIOD) -> None:
        self.period = period
        self.reading = reading
        self._start: dict[str, tuple[int, int]] = {}  # spilled, restored when first read
        self._nodes: list[dict[str, Any]] = []
        self._looked = -NODES_EVERY
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="arrayjob-store-monitor", daemon=True)

    def start(self) -> StoreMonitor:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> ObjectStores:
        self._stop.set()
        self._thread.join(timeout=1.0)
        if not self._thread.is_alive():  # not held by a raylet that stopped answering
            self.sample()  # the last word: what is spilled by the end counts
        return self.reading

    def _run(self) -> None:
        pause = self.period
        while not self._stop.wait(pause):
            began = time.monotonic()
            self.sample()
            # a cluster of many nodes is read less often: the reading takes a tenth of the time at most
            pause = max(self.period, 9 * (time.monotonic() - began))

    def sample(self) -> None:
        """One reading of every alive node; a node that does not answer is skipped this time."""
        import ray

        now = time.monotonic()
        if now - self._looked >= NODES_EVERY:
            with suppress(Exception):  # Ray going away under the job: its own errors say so
                self._nodes = [n for n in ray.nodes() if n.get("Alive")]
            self._looked = now
        r = self.reading
        for node in self._nodes:
            try:
                stats = _node_stats(node)
            except Exception:  # noqa: BLE001 - a node that left, or a raylet that is busy: next time
                continue
            node_id = node["NodeID"]
            spilled, restored = int(stats.spilled_bytes_total), int(stats.restored_bytes_total)
            first = self._start.setdefault(node_id, (spilled, restored))
            r.peak_bytes[node_id] = max(r.peak_bytes.get(node_id, 0), int(stats.object_store_bytes_used))
            r.spilled_bytes[node_id] = spilled - first[0]
            r.restored_bytes[node_id] = restored - first[1]
        r.samples += 1


@contextmanager
def watching(reading: ObjectStores, period: float = PERIOD) -> Iterator[ObjectStores]:
    """Read the stores into ``reading`` while the block runs; complete once it has ended."""
    monitor = StoreMonitor(reading, period).start()
    try:
        yield monitor.reading
    finally:
        monitor.stop()
