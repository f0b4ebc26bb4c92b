"""The plan: what every pass reads and fills in (``planner.pipeline`` runs the passes).

A ``Plan`` starts as a graph and options; ``tile`` adds tilings and block lengths,
``fuse`` the fused kernels, ``place`` the physical plan with a node per task, ``cost``
its cost. Frozen dataclasses: a pass returns a new plan.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from arrayjob.planner.ir import Graph
from arrayjob.planner.physical import BlockGrid, PhysicalPlan

GiB = 2**30

# One core's rate of each kind of work (``cost.WORK_KINDS``), per second, as measured on the
# VM the shipped machine profile comes from (``costing.profile`` takes its defaults from
# here), and the GEMM rate that prices a kind without its own.
SHIPPED_WORK_RATES: Mapping[str, float] = {
    "elementwise": 1.2e9,
    "transcendental": 1.3e8,
    "contraction_bytes": 1.4e10,
    "contraction_flops": 5e10,
    "einsum_flops": 6e9,
    "qr_flops": 5.5e9,
    "triangular_solve_flops": 1.2e10,
    "edge_split": 2.3e7,
    "edge_build": 2.9e7,
    "sparse_product": 6e8,
    "sparse_product_large": 8.4e7,
    "result_bytes": 9e8,
}
SHIPPED_FLOPS_PER_S = 2e10
SHIPPED_TASK_SECONDS = 0.002


class WorkRates(Mapping[str, float]):
    """Work per second of one core, by kind (``cost.WORK_KINDS``), and ``default`` for a kind
    not listed. Frozen and hashable: it is part of the options plans are cached by.

    >>> WorkRates({"qr_flops": 5.5e9}, default=2e10).rate("einsum_flops")
    20000000000.0
    """

    __slots__ = ("_rates", "default")

    def __init__(self, rates: Mapping[str, float] = SHIPPED_WORK_RATES, default: float = SHIPPED_FLOPS_PER_S) -> None:
        self._rates = {kind: float(rate) for kind, rate in rates.items()}
        self.default = float(default)

    def rate(self, kind: str) -> float:
        return self._rates.get(kind, self.default)

    def __getitem__(self, kind: str) -> float:
        return self._rates[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rates)

    def __len__(self) -> int:
        return len(self._rates)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkRates) and (self._rates, self.default) == (other._rates, other.default)

    def __hash__(self) -> int:
        return hash((frozenset(self._rates.items()), self.default))

    def __repr__(self) -> str:
        return f"WorkRates({self._rates!r}, default={self.default!r})"


@dataclass(frozen=True)
class ClusterShape:
    """The planner's view of the cluster: how many nodes, workers each, and their memory."""

    nodes: int = 1
    workers_per_node: int = 2
    memory_per_node: int = 16 * GiB
    # what work costs in time, for placement to weigh compute against traffic as the
    # estimate does: one worker streaming through memory, one core's rate of each kind of
    # work, and one node's network (the shipped machine profile's rates; ``costing.estimate``
    # and ``runner`` pass the profile they price and run with: ``MachineProfile.placement_rates``)
    memory_bytes_per_s: float = 8e9
    network_bytes_per_s: float = 1e9
    work_rates: WorkRates = WorkRates()
    # what a task costs besides its work (scheduling, arguments, result): the fusion model
    # weighs a task saved against the bytes and work a fused kernel adds
    task_seconds: float = SHIPPED_TASK_SECONDS

    @property
    def workers(self) -> int:
        return self.nodes * self.workers_per_node


# Largest block the tiling makes of a stored array (it aims at ~2 blocks per worker). Measured
# on 2 cores, X 4,000,000 × 64 (2 GB) logistic loss+gradient: 64 / 128 / 256 / 512 MiB blocks
# 0.456 / 0.342 / 0.285 / 0.271 s per evaluation — with small blocks Ray's per-task cost and
# idle workers between waves dominate; past 256 MiB the gain is small and memory per task grows.
TARGET_BLOCK_BYTES = 256 * 2**20


@dataclass(frozen=True)
class PlanOptions:
    tiling: str = "greedy"
    fusion: str = "cost"
    placement: str = "lshs"
    cluster: ClusterShape = ClusterShape()
    target_block_bytes: int = TARGET_BLOCK_BYTES
    # the workers block sizes aim at, when not the cluster's: a job whose nodes change keeps
    # the tiling it read its inputs with, so only placement follows the nodes
    tiling_workers: int | None = None

    @property
    def workers_for_tiling(self) -> int:
        return max(1, self.tiling_workers or self.cluster.workers)


@dataclass(frozen=True)
class Tiling:
    """Which axes of an array are cut into blocks; ``()`` means one whole block."""

    axes: tuple[int, ...] = ()

    def describe(self, ndim: int) -> str:
        if not self.axes:
            return "whole"
        if ndim == 2 and self.axes == (0,):
            return "row"
        if ndim == 2 and self.axes == (1,):
            return "column"
        return "block" if len(self.axes) > 1 else f"axis {self.axes[0]}"


@dataclass(frozen=True)
class FusedKernel:
    """Graph nodes computed together, block by block, in one task per block."""

    name: str
    nodes: tuple[int, ...]  # topological order
    outputs: tuple[int, ...]  # the nodes it materialises


@dataclass(frozen=True)
class Plan:
    graph: Graph
    options: PlanOptions
    tilings: tuple[Tiling, ...] | None = None  # per node, after `tile`
    block_lengths: tuple[tuple[int, int], ...] = ()  # (axis class, block length), after `tile`
    kernels: tuple[FusedKernel, ...] | None = None  # after `fuse`
    physical: PhysicalPlan | None = None  # tasks with nodes, after `place`
    assembly: tuple[Any, ...] = ()  # how program outputs are assembled from task results
    cost: Any = None  # PlanCost, after `cost`
    stats: dict[str, float] = field(default_factory=dict, compare=False, hash=False)

    @functools.cached_property
    def _lengths(self) -> dict[int, int]:
        return dict(self.block_lengths)

    def grid(self, node: int) -> BlockGrid:
        """The block grid of ``node`` under its tiling."""
        assert self.tilings is not None, "grid() needs a tiled plan"
        n = self.graph.nodes[node]
        classes = self.graph.axis_classes.of_node(node, n.ndim)
        axes = self.tilings[node].axes
        block = tuple(
            min(self._lengths.get(c, s), s) if a in axes and s > 0 else max(s, 1)
            for a, (c, s) in enumerate(zip(classes, n.shape, strict=True))
        )
        return BlockGrid(n.shape, block)
