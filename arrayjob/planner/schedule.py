"""How long a node's tasks take on its workers: each task goes to the least-busy worker.

One rule, used by the placement (LSHS weighs each candidate node by when its tasks end) and
by the estimate (a stage's length): a few big blocks on more workers than blocks, or an
odd block count, leave workers idle, which an even spread over the workers would not show.
"""

from __future__ import annotations


class WorkerSchedule:
    """Per node, when each of its workers is free, as tasks are handed out in order."""

    def __init__(self, nodes: int, workers_per_node: int) -> None:
        self.workers = [[0.0] * max(1, workers_per_node) for _ in range(max(1, nodes))]
        self.busy = [0.0] * max(1, nodes)  # seconds of work given to each node

    def add(self, node: int, seconds: float) -> float:
        """Run a task of ``seconds`` on ``node``'s least-busy worker; returns when it ends."""
        workers = self.workers[node % len(self.workers)]
        i = min(range(len(workers)), key=workers.__getitem__)
        workers[i] += seconds
        self.busy[node % len(self.workers)] += seconds
        return workers[i]

    def free(self, node: int) -> float:
        """When ``node``'s first worker is free."""
        return min(self.workers[node % len(self.workers)])

    def end(self, node: int) -> float:
        """When ``node``'s last task ends."""
        return max(self.workers[node % len(self.workers)])

    @property
    def makespan(self) -> float:
        return max(max(w) for w in self.workers)


def makespan(items: list[tuple[int, float]], nodes: int, workers_per_node: int) -> float:
    """How long tasks ``(node, seconds)``, in order, take on ``nodes`` × ``workers_per_node``."""
    schedule = WorkerSchedule(nodes, workers_per_node)
    for node, seconds in items:
        schedule.add(node, seconds)
    return schedule.makespan
