"""Tiling (Spartan): how every array in the graph is cut into blocks.

Two decisions. *Block lengths*, one per axis class (axes that must line up for an op to
move no data): chunk-aligned for stored arrays, sized so each class has about two blocks
per worker without a block exceeding the byte budget. *Tilings*, one per node: which of
its axes are cut; strategies search these to minimise communication.
"""

from __future__ import annotations

import dataclasses
import math

from arrayjob.io.arrays import ArrayInfo
from arrayjob.planner.ir import Graph
from arrayjob.planner.physical import BlockGrid
from arrayjob.planner.plan import Plan, PlanOptions, Tiling, register

TARGET_BLOCK_BYTES = 64 * 2**20


def block_lengths(graph: Graph, options: PlanOptions) -> dict[int, int]:
    """One block length per axis class.

    A class that holds an axis of a stored array is cut on that array's chunk boundaries
    (the largest such array decides); other classes get about two blocks per worker.
    """
    classes = graph.axis_classes
    workers = max(1, options.cluster.workers)
    anchor: dict[int, tuple[int, int, int]] = {}  # class -> (array bytes, chunk, other-axes bytes)
    for i, node in enumerate(graph.nodes):
        if node.op != "source":
            continue
        info: ArrayInfo = node.attrs[0]
        itemsize = node.nbytes // max(1, math.prod(node.shape)) if node.shape else 8
        for a, chunk in enumerate(info.chunks):
            c = classes.of_axis(i, a)
            other = itemsize * math.prod(s for b, s in enumerate(node.shape) if b != a)
            if c not in anchor or node.nbytes > anchor[c][0]:
                anchor[c] = (node.nbytes, max(1, chunk), other)
    lengths: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for a, size in enumerate(node.shape):
            c = classes.of_axis(i, a)
            if c in lengths:
                continue
            wanted = max(1, math.ceil(size / (2 * workers)))
            if c in anchor:
                _, chunk, other = anchor[c]
                by_budget = max(1, options.target_block_bytes // max(1, chunk * other))
                chunks = math.ceil(size / chunk)
                by_parallelism = max(1, math.ceil(chunks / (2 * workers)))
                lengths[c] = chunk * min(by_budget, by_parallelism)
            else:
                lengths[c] = wanted
    return lengths


def with_tilings(plan: Plan, tilings: tuple[Tiling, ...]) -> Plan:
    lengths = block_lengths(plan.graph, plan.options)
    return dataclasses.replace(plan, tilings=tilings, block_lengths=tuple(sorted(lengths.items())))


def candidates(graph: Graph, node: int, options: PlanOptions) -> list[Tiling]:
    """The tilings a node may take: whole (if it fits a node's memory), each axis, 2-D blocks."""
    n = graph.nodes[node]
    if n.op in ("const", "value") or n.ndim == 0:
        return [Tiling()]
    options_: list[Tiling] = [Tiling((a,)) for a in range(n.ndim) if n.shape[a] > 1]
    if n.ndim >= 2:
        options_ += [Tiling((a, b)) for a in range(n.ndim) for b in range(a + 1, n.ndim)
                     if n.shape[a] > 1 and n.shape[b] > 1]
    if n.nbytes <= options.cluster.memory_per_node // 4 or not options_:
        options_.insert(0, Tiling())
    return options_


@register("tiling", "naive")
def naive(plan: Plan) -> Plan:
    """Every array cut by rows (its first axis); driver values, scalars and arrays whose
    first axis shares its class with another axis (e.g. a Gram matrix) stay whole."""
    graph = plan.graph
    classes = graph.axis_classes

    def cuttable(i: int) -> bool:
        n = graph.nodes[i]
        if n.op in ("const", "value") or n.ndim == 0 or n.shape[0] <= 1:
            return False
        own = classes.of_node(i, n.ndim)
        return own.count(own[0]) == 1

    return with_tilings(plan, tuple(Tiling((0,)) if cuttable(i) else Tiling() for i in range(len(graph))))


# -- kept for jobs not yet on the lazy API -----------------------------------------------------


def row_grid(info: ArrayInfo, *, workers: int, block_rows: int | None = None,
             target_bytes: int = TARGET_BLOCK_BYTES) -> BlockGrid:
    """Row blocks of ``info`` (full width), aligned with its row chunks."""
    rows = info.shape[0]
    if block_rows is None:
        chunk_rows = max(1, info.chunks[0])
        row_bytes = max(1, info.nbytes // max(1, rows))
        chunks = math.ceil(rows / chunk_rows) if rows else 1
        by_budget = max(1, target_bytes // (chunk_rows * row_bytes))
        by_parallelism = max(1, math.ceil(chunks / (2 * max(1, workers))))
        block_rows = chunk_rows * min(by_budget, by_parallelism)
    return BlockGrid(info.shape, (max(1, min(block_rows, rows)), *info.shape[1:]))


def aligned_row_grid(info: ArrayInfo, like: BlockGrid) -> BlockGrid:
    """The grid of ``info`` whose row blocks line up with ``like`` (e.g. y with X)."""
    return BlockGrid(info.shape, (like.block_shape[0], *info.shape[1:]))
