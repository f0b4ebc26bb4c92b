"""Block kernels: what a task runs. Pure NumPy on in-memory blocks, no I/O.

``BlockKernel`` evaluates a fused subgraph of the IR on one block of each of its inputs
and returns the blocks (or partial results) of the nodes it materialises. The planner
builds it; the runtime only calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from arrayjob.planner.ir import ELEMENTWISE


def add_partials(*partials: Any) -> Any:
    """Sum partial results: arrays, scalars, or tuples/dicts of them, elementwise."""
    first = partials[0]
    if isinstance(first, tuple):
        return tuple(add_partials(*parts) for parts in zip(*partials, strict=True))
    if isinstance(first, dict):
        return {k: add_partials(*(p[k] for p in partials)) for k in first}
    total = np.array(first, copy=True) if isinstance(first, np.ndarray) else first
    for p in partials[1:]:
        total = total + p
    return total


def max_partials(*partials: np.ndarray) -> np.ndarray:
    return np.maximum.reduce(np.stack([np.asarray(p) for p in partials]))


def min_partials(*partials: np.ndarray) -> np.ndarray:
    return np.minimum.reduce(np.stack([np.asarray(p) for p in partials]))


COMBINE = {"sum": add_partials, "einsum": add_partials, "max": max_partials, "min": min_partials}


@dataclass(frozen=True)
class Assemble:
    """Cut or glue blocks into the block a consumer needs (a re-tiling step).

    ``pieces[k]`` is ``(where the k-th argument's slice lands in the output, which part of
    the k-th argument to take)``, both as tuples of (start, stop) per axis.
    """

    shape: tuple[int, ...]
    dtype: str
    pieces: tuple[tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]], ...]

    def __call__(self, *blocks: np.ndarray) -> np.ndarray:
        if len(blocks) == 1 and all(s == (0, n) for s, n in zip(self.pieces[0][1], np.shape(blocks[0]), strict=True)) \
                and tuple(np.shape(blocks[0])) == self.shape:
            return blocks[0]
        out = np.empty(self.shape, dtype=self.dtype)
        for block, (dst, src) in zip(blocks, self.pieces, strict=True):
            out[tuple(slice(a, b) for a, b in dst)] = np.asarray(block)[tuple(slice(a, b) for a, b in src)]
        return out


@dataclass(frozen=True)
class Step:
    op: str
    attrs: tuple[Any, ...]
    inputs: tuple[int, ...]  # slots
    dtype: str


def _einsum(subscripts: str, *blocks: np.ndarray) -> np.ndarray:
    if len(blocks) == 2:
        # BLAS for the common pairwise contractions; einsum's C loop otherwise.
        return np.einsum(subscripts, *blocks, optimize=True)
    return np.einsum(subscripts, *blocks, optimize="greedy")


@dataclass(frozen=True)
class BlockKernel:
    """A straight-line program over slots: the arguments first, then one slot per step."""

    name: str
    n_args: int
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]  # slots returned, in order

    def __call__(self, *args: Any) -> Any:
        slots: list[Any] = list(args)
        for step in self.steps:
            slots.append(evaluate(step, [slots[i] for i in step.inputs]))
        if len(self.outputs) == 1:
            return slots[self.outputs[0]]
        return tuple(slots[o] for o in self.outputs)


def evaluate(step: Step, inputs: list[Any]) -> Any:
    if step.op == "const":
        return np.asarray(step.attrs[0], dtype=step.dtype)
    if step.op == "map":
        _, fn = ELEMENTWISE[step.attrs[0]]
        return np.asarray(fn(*inputs))
    if step.op == "reduce":
        fn, axes, keepdims = step.attrs
        x = inputs[0]
        if fn in ("argmax", "argmin"):
            result = getattr(np, fn)(x, axis=axes[0])
            return np.expand_dims(result, axes[0]) if keepdims else result
        return np.asarray(getattr(np, fn)(x, axis=axes, keepdims=keepdims))
    if step.op == "einsum":
        return _einsum(step.attrs[0], *inputs)
    if step.op == "transpose":
        return np.transpose(inputs[0], step.attrs[0])
    raise ValueError(f"unknown op {step.op!r}")
