"""PageRank's graph: the transposed adjacency Aᵀ built from an edge list (or a CSR group) on
the workers, as CSR blocks of target rows (``algorithms.pagerank`` is the job that iterates on it).

The build: one pass counts each node's out-edges (``CountOutEdges``; of a CSR group, the
steps of its ``indptr``: ``csr_out_edges``), nodes are numbered anew by out-degree
(``degree_order``), each edge chunk is renumbered and sorted by target block
(``SplitByTarget``, ``SplitCSR``), every block's task slices its edges out of the sorted
chunks and makes a de-duplicated CSR block (``BuildBlock``); once the out-degrees are known
(``out_degree``) each block's columns are divided by them (``scale_block``).
``GraphWork`` declares what each of these block functions costs. The reasons and the
measurements are in ``algorithms.pagerank``'s module note.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse

from arrayjob.api import ArrayInfo, index_outside, index_outside_error

SPMV_CACHE_BYTES = 16 * 2**20  # a gathered vector above this misses the cache (half of a 32 MiB L3)


def _object_row(items: list[object]) -> np.ndarray:
    row = np.empty((1, len(items)), dtype=object)
    for i, item in enumerate(items):
        row[0, i] = item
    return row


@dataclass(frozen=True)
class GraphWork:
    """The declared work (``planner.cost.WORK_KINDS``) of PageRank's block functions:
    splitting a chunk of m edges by target block and building a CSR block of Aᵀ from its
    edges are each priced at their own calibrated rate (edges per second, the kernels
    themselves timed by ``calibrate``); scaling reads each nonzero and writes a new data
    array; the degree sum and the iteration's SpMV read each nonzero once and gather from a
    vector of ``vector`` floats (out of cache above ``SPMV_CACHE_BYTES``). Edges are taken to
    be spread evenly over the target blocks (nodes are dealt over them: ``degree_order``)."""

    kind: str  # count | split | split_csr | build | scale | product
    edges: float = 0.0  # per block of Aᵀ
    rows: int = 0  # rows of the block (the iteration's update)
    vector: int = 0  # length of the vector a product gathers from

    def __call__(self, shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
        if self.kind == "count":  # a bincount of the chunk's sources into a vector of ``vector`` counts
            return {"elementwise": shapes[0][0] + 2.0 * self.vector}
        if self.kind in ("split", "split_csr"):
            m = shapes[0][0]  # edges in the chunk
            return {"edge_split": m * (2.0 if self.kind == "split_csr" else 1.0)}  # csr: sources searched too
        if self.kind == "build":
            return {"edge_build": self.edges}
        if self.kind == "scale":  # a gather and a multiply per nonzero, and the new data array
            return {"elementwise": 3.0 * self.edges}
        product = "sparse_product_large" if 8 * self.vector > SPMV_CACHE_BYTES else "sparse_product"
        return {product: self.edges, "elementwise": 6.0 * self.rows}




def distinct(keys: np.ndarray) -> np.ndarray:
    """The distinct values of ``keys``, sorted: ``np.sort`` and a mask of changes. What
    ``np.unique`` returns, much faster here: on 17.5 M random int64 keys NumPy 2.4's
    ``np.unique`` takes 15.8 s and this 0.31 s (``benchmarks/bench_micro.py pagerank-build``)."""
    ordered = np.sort(keys)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


@dataclass(frozen=True)
class CountOutEdges:
    """Out-edges per node (with repeats) in one chunk of edges: a (1, n) row of counts."""

    n: int

    def __call__(self, edges: np.ndarray) -> np.ndarray:
        return np.bincount(np.asarray(edges[:, 0], dtype=np.int64), minlength=self.n).reshape(1, -1)


def degree_order(out_edges: np.ndarray, block: int) -> np.ndarray:
    """New node ids (``labels[old id]``) for blocks of ``block`` rows: nodes grouped by
    floor(log2(out-edges + 1)), the largest group first and id order within a group, then
    dealt round-robin over the blocks (block b holds ids ``b·block …``, the last block
    fewer). A NumPy stable sort of 16-bit keys is a radix sort: 1M nodes in a few ms."""
    n = len(out_edges)
    blocks = -(-n // block) if n else 0
    group = -np.floor(np.log2(np.asarray(out_edges, dtype=np.float64) + 1.0)).astype(np.int16)
    order = np.argsort(group, kind="stable")
    slots = (np.arange(blocks, dtype=np.int64) * block + np.arange(block, dtype=np.int64)[:, None]).ravel()
    labels = np.empty(n, dtype=id_dtype(n))
    labels[order] = slots[slots < n]
    return labels


def by_node_id(values: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``values`` indexed by new id (``degree_order``), put back in node-id order."""
    return values[labels]


def id_dtype(n: int) -> str:
    """The integer type the build moves node ids in: 32 bits when they fit (half the bytes
    stored and held between the split and the build)."""
    return "int32" if n <= np.iinfo(np.int32).max else "int64"


@dataclass(frozen=True)
class SplitByTarget:
    """One chunk of edges, renumbered (``labels``, from ``degree_order``), sorted by the
    target block each edge belongs to: (the sorted (m, 2) edges, a (1, blocks + 1) row of where each
    block's edges start). The build of block b takes rows ``offsets[b]:offsets[b + 1]``
    of every chunk's sorted edges. Plain integer arrays, so Ray stores them by a copy and
    the build reads them in place, where per-block pieces in object arrays were pickled
    at every step between the split and the build."""

    n: int
    block: int

    def __call__(self, edges: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        edges = labels[edges]
        blocks = -(-self.n // self.block)
        owner = edges[:, 1] // self.block
        if blocks <= np.iinfo(np.int16).max:  # NumPy's stable sort of 16-bit keys is a radix sort
            owner = owner.astype(np.int16)
        order = np.argsort(owner, kind="stable")
        offsets = np.searchsorted(owner[order], np.arange(blocks + 1)).astype(np.int64)
        return edges[order], offsets.reshape(1, -1)


@dataclass(frozen=True)
class SplitCSR:
    """Like ``SplitByTarget`` for a chunk of the ``indices`` of ``matrix``, a CSR group of the
    adjacency (``io.sparse``, read as a pattern): sources come from its ``indptr`` (whole, on
    every block) and the chunk's first position. A target outside [0, n) is refused naming its
    row, as ``io.sparse`` names one in a block it reads."""

    n: int
    block: int
    matrix: ArrayInfo

    def __call__(self, indices: np.ndarray, start: np.ndarray, indptr: np.ndarray,
                 labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        positions = int(start[0]) + np.arange(len(indices))
        sources = np.searchsorted(indptr, positions, side="right") - 1
        outside = index_outside(indices, self.n)
        if outside is not None:
            raise index_outside_error(self.matrix, int(sources[outside]), int(indices[outside]), self.n)
        edges = np.stack([sources, np.asarray(indices, dtype=np.int64)], axis=1)
        return SplitByTarget(self.n, self.block)(edges, labels)


def csr_out_edges(indptr: np.ndarray) -> np.ndarray:
    """Out-edges per node (with repeats) of a CSR adjacency: its ``indptr``'s steps."""
    return np.diff(np.asarray(indptr, dtype=np.int64))


@dataclass(frozen=True)
class BuildBlock:
    """The CSR block of Aᵀ for one target block (rows = targets, columns = sources) from
    every chunk's sorted edges (``SplitByTarget``; chunks of ``chunk`` edges)."""

    n: int
    block: int
    chunk: int

    def __call__(self, block_id: np.ndarray, edges: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        b = int(np.asarray(block_id).reshape(-1)[0])
        parts = [edges[c * self.chunk + offsets[c, b]: c * self.chunk + offsets[c, b + 1]]
                 for c in range(offsets.shape[0])]
        mine = np.concatenate(parts) if parts else np.empty((0, 2), dtype=edges.dtype)
        first = b * self.block
        keys = distinct(mine[:, 1].astype(np.int64) * self.n + mine[:, 0])  # each (target, source) once, sorted
        shape = (min(self.block, self.n - first), self.n)
        indptr = np.zeros(shape[0] + 1, dtype=np.int64)  # keys are sorted by target: CSR directly
        np.cumsum(np.bincount(keys // self.n - first, minlength=shape[0]), out=indptr[1:])
        matrix = scipy.sparse.csr_matrix((np.ones(len(keys)), keys % self.n, indptr), shape=shape)
        return _object_row([GraphBlock(first, matrix)])


@dataclass(frozen=True)
class GraphBlock:
    """Rows ``first …`` of Aᵀ (targets × sources); after ``scale_block``, columns divided by
    the sources' out-degrees, with the block's dangling targets marked."""

    first: int
    matrix: scipy.sparse.csr_matrix
    dangling: np.ndarray | None = None


def scale_block(blocks: np.ndarray, inverse_degree: np.ndarray, dangling: np.ndarray) -> np.ndarray:
    (g,) = blocks.ravel()
    rows = slice(g.first, g.first + g.matrix.shape[0])
    m = g.matrix  # columns scaled in place of a product with diag(inverse_degree): same matrix, 9× faster
    scaled = scipy.sparse.csr_matrix((m.data * inverse_degree[m.indices], m.indices, m.indptr), shape=m.shape)
    return _object_row([GraphBlock(g.first, scaled, dangling[rows].copy())])


def out_degree(blocks: np.ndarray) -> np.ndarray:
    """Partial out-degrees (edges per source) from one block of Aᵀ."""
    (g,) = blocks.ravel()
    return np.asarray(g.matrix.sum(axis=0)).reshape(1, -1)


def id_range(edges: np.ndarray) -> np.ndarray:
    return np.array([[edges.min(initial=0), edges.max(initial=-1)]], dtype=np.int64)
