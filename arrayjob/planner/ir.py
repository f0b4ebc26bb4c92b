"""The IR: an immutable graph of array operations, planned as a whole.

A ``Graph`` is a tuple of ``Node`` in topological order; a node names its inputs by
index, so graphs hash and compare by structure in linear time (the plan cache's key).
A node's ``op`` and typed ``attrs`` come from the one op vocabulary, ``planner.ops``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from arrayjob.planner.ops import (
    Blockwise,
    Einsum,
    Op,
    OpAttrs,
    Reduce,
    Source,
    Transpose,
    keeps_sparse,
)


@dataclass(frozen=True)
class Sparsity:
    """A node that is a sparse matrix: the bytes its non-zeros take, and ``rows``, the one
    axis it may be cut along (a CSR input's rows; the columns of its transpose)."""

    nbytes: int
    rows: int


@dataclass(frozen=True)
class Node:
    op: Op
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    attrs: OpAttrs
    sparse: Sparsity | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        if self.sparse is not None:
            return self.sparse.nbytes
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def is_leaf(self) -> bool:
        return self.op.is_leaf

    def label(self) -> str:
        """A short human name: ``exp``, ``sum(0)``, ``einsum(ij,j->i)``, ``X``."""
        return self.attrs.label()


def sparsity_of(op: Op, attrs: OpAttrs, shape: tuple[int, ...], inputs: Sequence[Node]) -> Sparsity | None:
    """Whether a node with these inputs is sparse (``ops.keeps_sparse``), and how."""
    if isinstance(attrs, Source):
        return None if attrs.array.sparse is None else Sparsity(attrs.array.nbytes, 0)
    sparse = [u.sparse for u in inputs]
    if not keeps_sparse(op, attrs, [s is not None for s in sparse]):
        return None
    if isinstance(attrs, Transpose):
        first = sparse[0]
        assert first is not None
        return Sparsity(first.nbytes, attrs.perm.index(first.rows))
    u, first = max(((u, s) for u, s in zip(inputs, sparse, strict=True) if s is not None), key=lambda p: p[1].nbytes)
    return Sparsity(first.nbytes, first.rows + len(shape) - u.ndim)


@dataclass(frozen=True)
class Graph:
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    @functools.cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        users: list[list[int]] = [[] for _ in self.nodes]
        for i, node in enumerate(self.nodes):
            for j in dict.fromkeys(node.inputs):
                users[j].append(i)
        return tuple(tuple(u) for u in users)

    @functools.cached_property
    def axis_classes(self) -> AxisClasses:
        return AxisClasses.of(self)


def blockwise_call(node: Node) -> tuple[object, ...]:
    """What identifies one call of a job's block function: its outputs (sibling
    ``blockwise`` nodes) share it and are computed by the same tasks."""
    assert isinstance(node.attrs, Blockwise)
    return node.attrs.kernel, node.inputs, node.attrs.in_rows


def broadcast_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    return tuple(int(s) for s in np.broadcast_shapes(*shapes))


def infer_shape(op: Op, shapes: list[tuple[int, ...]], attrs: OpAttrs) -> tuple[int, ...]:
    """The shape an op's result has, from its inputs' shapes (ops whose shapes are inferred)."""
    if op is Op.MAP:
        return broadcast_shape(shapes)
    if isinstance(attrs, Reduce):
        return tuple(1 if a in attrs.axes else s for a, s in enumerate(shapes[0])
                     if attrs.keepdims or a not in attrs.axes)
    if isinstance(attrs, Transpose):
        return tuple(shapes[0][p] for p in attrs.perm)
    if isinstance(attrs, Einsum):
        terms, out = attrs.terms
        sizes: dict[str, int] = {}
        for term, shape in zip(terms, shapes, strict=True):
            if len(term) != len(shape):
                raise ValueError(f"einsum {attrs.subscripts}: term {term!r} does not fit shape {shape}")
            for label, size in zip(term, shape, strict=True):
                if sizes.setdefault(label, size) != size:
                    raise ValueError(f"einsum {attrs.subscripts}: label {label!r} is {sizes[label]} and {size}")
        return tuple(sizes[label] for label in out)
    raise ValueError(f"op {op!r}: shape is declared, not inferred")


class AxisClasses:
    """Which axes of which nodes must be cut the same way for an op to need no data movement.

    Axes are joined by elementwise ops (aligned, non-broadcast axes), by einsum labels, by
    transposes and by reductions (kept axes). Each class has one length; the tiler picks
    one block length per class, so co-partitioned arrays line up block for block.
    """

    def __init__(self, parent: list[int], index: dict[tuple[int, int], int], length: list[int]):
        self._parent = parent
        self._index = index
        self.lengths = length

    @classmethod
    def of(cls, graph: Graph) -> AxisClasses:
        index: dict[tuple[int, int], int] = {}
        length: list[int] = []
        for i, node in enumerate(graph.nodes):
            for a, s in enumerate(node.shape):
                index[(i, a)] = len(length)
                length.append(s)
        parent = list(range(len(length)))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        def union(a: tuple[int, int], b: tuple[int, int]) -> None:
            ra, rb = find(index[a]), find(index[b])
            if ra != rb:
                parent[ra] = rb

        for i, node in enumerate(graph.nodes):
            attrs = node.attrs
            if node.op is Op.MAP:
                for j in node.inputs:
                    shape = graph.nodes[j].shape
                    offset = node.ndim - len(shape)
                    for a, s in enumerate(shape):
                        if s == node.shape[a + offset] and s != 1:
                            union((j, a), (i, a + offset))
            elif isinstance(attrs, Transpose):
                for a, p in enumerate(attrs.perm):
                    union((node.inputs[0], p), (i, a))
            elif isinstance(attrs, Reduce):
                kept = [a for a in range(graph.nodes[node.inputs[0]].ndim) if a not in attrs.axes]
                for out_axis, a in enumerate(kept if not attrs.keepdims else []):
                    union((node.inputs[0], a), (i, out_axis))
                if attrs.keepdims:
                    for a in kept:
                        union((node.inputs[0], a), (i, a))
            elif isinstance(attrs, Einsum):
                terms, out = attrs.terms
                where: dict[str, tuple[int, int]] = {label: (i, a) for a, label in enumerate(out)}
                for j, term in zip(node.inputs, terms, strict=True):
                    for a, label in enumerate(term):
                        if label in where:
                            union((j, a), where[label])
                        else:
                            where[label] = (j, a)
        roots = [find(x) for x in range(len(length))]
        return cls(roots, index, length)

    def of_axis(self, node: int, axis: int) -> int:
        """The class of ``axis`` of ``node`` (a stable integer)."""
        return self._parent[self._index[(node, axis)]]

    def of_node(self, node: int, ndim: int) -> tuple[int, ...]:
        return tuple(self.of_axis(node, a) for a in range(ndim))

    def length(self, cls: int) -> int:
        return self.lengths[cls]
