"""The NumPy primitives every kernel body is made of, on in-memory blocks: no I/O.

One IR step (``evaluate``), a block contraction as ``planner.contraction`` decides it,
combining partial results and assembling a re-tiled block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from arrayjob.kernels import sparse
from arrayjob.planner import contraction
from arrayjob.planner.ops import ELEMENTWISE, REDUCTIONS, Const, Einsum, Map, Reduce, Transpose
from arrayjob.planner.physical import Assemble, Combine, Step


def add_partials(*partials: Any) -> Any:
    """Sum partial results: arrays, scalars, or tuples/dicts of them, elementwise."""
    first = partials[0]
    if isinstance(first, tuple):
        return tuple(add_partials(*parts) for parts in zip(*partials, strict=True))
    if isinstance(first, dict):
        return {k: add_partials(*(p[k] for p in partials)) for k in first}
    total = np.array(first, copy=True) if isinstance(first, np.ndarray) else first
    for p in partials[1:]:
        if isinstance(total, np.ndarray) and total.shape == np.shape(p) and \
                total.dtype == np.result_type(total, p):
            total += p  # in place: a d-vector of partial gradients is not copied once per partial
        else:
            total = total + p
    return total


def max_partials(*partials: np.ndarray) -> np.ndarray:
    return np.maximum.reduce(np.stack([np.asarray(p) for p in partials]))


def min_partials(*partials: np.ndarray) -> np.ndarray:
    return np.minimum.reduce(np.stack([np.asarray(p) for p in partials]))


COMBINE = {"sum": add_partials, "max": max_partials, "min": min_partials}


def combine(kernel: Combine, *partials: Any) -> Any:
    return COMBINE[kernel.op](*partials)


def assemble(kernel: Assemble, *blocks: np.ndarray) -> np.ndarray:
    if any(sparse.issparse(b) for b in blocks):
        return sparse.assemble(kernel.shape, kernel.pieces, blocks)
    if len(blocks) == 1 and tuple(np.shape(blocks[0])) == kernel.shape and all(
            s == (0, n) for s, n in zip(kernel.pieces[0][1], np.shape(blocks[0]), strict=True)):
        return blocks[0]
    out = np.empty(kernel.shape, dtype=kernel.dtype)
    for block, (dst, src) in zip(blocks, kernel.pieces, strict=True):
        out[tuple(slice(a, b) for a, b in dst)] = np.asarray(block)[tuple(slice(a, b) for a, b in src)]
    return out


def einsum(subscripts: str, *blocks: np.ndarray) -> np.ndarray:
    """A block contraction, computed as ``planner.contraction`` decides from the shapes."""
    if len(blocks) >= 3:
        shapes = tuple(np.shape(b) for b in blocks)
        first = contraction.blas_pair(subscripts, shapes)
        pieces = contraction.pieces(subscripts, shapes) if first is not None else None
        if pieces is not None:
            big, rows, at = pieces
            n = np.shape(blocks[big])[0]
            parts = [einsum(subscripts, *(b[lo: lo + rows] if k == big else b for k, b in enumerate(blocks)))
                     for lo in range(0, n, rows)]
            return np.concatenate(parts, axis=at)
        if first is not None:
            (big, other, axes, swap), rest = first
            pair = np.tensordot(blocks[other], blocks[big], axes=axes[::-1]) if swap \
                else np.tensordot(blocks[big], blocks[other], axes=axes)
            remaining = [b for k, b in enumerate(blocks) if k not in (big, other)]
            return einsum(rest, pair, *remaining)
    if len(blocks) == 2:
        plan = contraction.pairwise(subscripts)
        if plan is not None:
            axes, perm = plan
            product = np.tensordot(blocks[0], blocks[1], axes=axes)
            return product if perm is None else product.transpose(perm)
        # BLAS for the other pairwise contractions; einsum's C loop otherwise.
        return np.einsum(subscripts, *blocks, optimize=True)
    return np.einsum(subscripts, *blocks, optimize="greedy")


def evaluate(step: Step, inputs: list[Any]) -> Any:
    """One step on NumPy (on SciPy, ``kernels.sparse``, when an operand is a sparse block)."""
    if any(sparse.issparse(x) for x in inputs):
        result = sparse.evaluate(step, inputs)
        if result is not NotImplemented:
            return result
        inputs = [sparse.dense(x) for x in inputs]
    attrs = step.attrs
    if isinstance(attrs, Const):
        return np.asarray(attrs.value, dtype=step.dtype)
    if isinstance(attrs, Map):
        return np.asarray(ELEMENTWISE[attrs.fn].numpy(*inputs))
    if isinstance(attrs, Reduce):
        reduction, x = REDUCTIONS[attrs.fn], inputs[0]
        if reduction.is_arg:
            result = reduction.numpy(x, axis=attrs.axes[0])
            return np.expand_dims(result, attrs.axes[0]) if attrs.keepdims else result
        return np.asarray(reduction.numpy(x, axis=attrs.axes, keepdims=attrs.keepdims))
    if isinstance(attrs, Einsum):
        return einsum(attrs.subscripts, *inputs)
    if isinstance(attrs, Transpose):
        return np.transpose(inputs[0], attrs.perm)
    raise ValueError(f"op {step.op!r} is not a block kernel step")
