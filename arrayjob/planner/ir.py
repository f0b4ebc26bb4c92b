"""The IR: an immutable graph of array operations, planned as a whole.

A ``Graph`` is a tuple of ``Node`` in topological order; a node names its inputs by
index, so graphs hash and compare by structure in linear time (the plan cache's key).

Ops and their ``attrs``:

=========  ==================================  =============================================
op         attrs                               meaning
=========  ==================================  =============================================
source     (ArrayInfo,)                        a stored Zarr array
value      (name,)                             a driver array bound at run time (weights)
const      (python scalar,)                    a 0-d constant
map        (fn,)                               elementwise ``fn`` of its inputs, broadcast
reduce     (fn, axes, keepdims)                sum / max / min / argmax / argmin over axes
einsum     (subscripts,)                       contraction, e.g. "ij,j->i" (matmul, tensordot)
transpose  (perm,)                             a view with permuted axes
blockwise  (Kernel, output, in_rows, out_rows) output ``output`` of a job's block function
                                               applied to matching row blocks of its inputs
                                               (``in_rows``: rows per block of each input, or
                                               None for whole inputs; ``out_rows``: rows per
                                               block of this output, or None for whole)
cached     (handle, block_shape)               blocks kept by the executor (``Session.persist``)
store      (ArrayInfo, StorageOptions)         write the input's blocks into that Zarr array;
                                               the value is [bytes written, PUT requests]
=========  ==================================  =============================================
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

# Elementwise functions: name -> (arity, numpy implementation). Arity 0 means "any".
UNARY = {
    "negative": np.negative, "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1,
    "sqrt": np.sqrt, "abs": np.abs, "square": np.square, "tanh": np.tanh, "sin": np.sin,
    "cos": np.cos, "erf": None, "sigmoid": None, "reciprocal": np.reciprocal,
}
BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.true_divide,
    "power": np.power, "maximum": np.maximum, "minimum": np.minimum, "logaddexp": np.logaddexp,
    "greater": np.greater, "less": np.less, "greater_equal": np.greater_equal,
    "less_equal": np.less_equal, "equal": np.equal, "not_equal": np.not_equal,
}
TERNARY = {"where": np.where}
COMPARISONS = {"greater", "less", "greater_equal", "less_equal", "equal", "not_equal"}
REDUCTIONS = ("sum", "max", "min", "argmax", "argmin")
OPAQUE = ("blockwise", "store")  # ops whose shapes are declared, not inferred; never fused


def sigmoid(x: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    return expit(x)


def erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf as _erf

    return _erf(x)


UNARY["sigmoid"] = sigmoid
UNARY["erf"] = erf
ELEMENTWISE = {**{k: (1, f) for k, f in UNARY.items()}, **{k: (2, f) for k, f in BINARY.items()},
               **{k: (3, f) for k, f in TERNARY.items()}}


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    attrs: tuple[Any, ...] = ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def is_leaf(self) -> bool:
        return self.op in ("source", "value", "const", "cached")

    def label(self) -> str:
        """A short human name: ``exp``, ``sum(0)``, ``einsum(ij,j->i)``, ``X``."""
        if self.op == "source":
            return self.attrs[0].name
        if self.op in ("value", "map", "cached"):
            return str(self.attrs[0])
        if self.op == "const":
            return repr(self.attrs[0])
        if self.op == "reduce":
            return f"{self.attrs[0]}({','.join(map(str, self.attrs[1]))})"
        if self.op == "einsum":
            return f"einsum({self.attrs[0]})"
        return f"{self.op}{self.attrs[0] if self.attrs else ''}"


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

    def validate(self) -> None:
        """Inputs come before their users; every op's shape agrees with its inputs."""
        for i, node in enumerate(self.nodes):
            if any(not 0 <= j < i for j in node.inputs):
                raise ValueError(f"node {i} ({node.label()}): inputs {node.inputs} are not earlier nodes")
            if not node.is_leaf and node.op not in OPAQUE:
                expected = infer_shape(node.op, [self.nodes[j].shape for j in node.inputs], node.attrs)
                if expected != node.shape:
                    raise ValueError(f"node {i} ({node.label()}): shape {node.shape}, expected {expected}")
        for o in self.outputs:
            if not 0 <= o < len(self.nodes):
                raise ValueError(f"output {o} is not a node")


def broadcast_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    return tuple(int(s) for s in np.broadcast_shapes(*shapes))


def parse_einsum(subscripts: str) -> tuple[list[str], str]:
    lhs, _, out = subscripts.replace(" ", "").partition("->")
    return lhs.split(","), out


def infer_shape(op: str, shapes: list[tuple[int, ...]], attrs: tuple[Any, ...]) -> tuple[int, ...]:
    if op == "map":
        return broadcast_shape(shapes)
    if op == "reduce":
        _, axes, keepdims = attrs
        return tuple(1 if a in axes else s for a, s in enumerate(shapes[0]) if keepdims or a not in axes)
    if op == "transpose":
        return tuple(shapes[0][p] for p in attrs[0])
    if op == "einsum":
        terms, out = parse_einsum(attrs[0])
        sizes: dict[str, int] = {}
        for term, shape in zip(terms, shapes, strict=True):
            if len(term) != len(shape):
                raise ValueError(f"einsum {attrs[0]}: term {term!r} does not fit shape {shape}")
            for label, size in zip(term, shape, strict=True):
                if sizes.setdefault(label, size) != size:
                    raise ValueError(f"einsum {attrs[0]}: label {label!r} is {sizes[label]} and {size}")
        return tuple(sizes[label] for label in out)
    raise ValueError(f"unknown op {op!r}")


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
            if node.op == "map":
                for j in node.inputs:
                    shape = graph.nodes[j].shape
                    offset = node.ndim - len(shape)
                    for a, s in enumerate(shape):
                        if s == node.shape[a + offset] and s != 1:
                            union((j, a), (i, a + offset))
            elif node.op == "transpose":
                for a, p in enumerate(node.attrs[0]):
                    union((node.inputs[0], p), (i, a))
            elif node.op == "reduce":
                _, axes, keepdims = node.attrs
                kept = [a for a in range(graph.nodes[node.inputs[0]].ndim) if a not in axes]
                for out_axis, a in enumerate(kept if not keepdims else []):
                    union((node.inputs[0], a), (i, out_axis))
                if keepdims:
                    for a in kept:
                        union((node.inputs[0], a), (i, a))
            elif node.op == "einsum":
                terms, out = parse_einsum(node.attrs[0])
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
