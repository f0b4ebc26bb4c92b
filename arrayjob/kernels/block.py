"""Running the kernel bodies the planner describes, on in-memory blocks: no I/O.

A ``BlockKernel`` evaluates a fused subgraph of the IR on one block of each of its inputs
and returns the blocks (or partial results) of the nodes it materialises. It arrives on a
worker by pickling and is compiled there on first use (``blockprogram.Program``: numexpr
expressions, row loops, row sub-blocking), once per argument shapes and dtypes;
``interpret`` runs it one NumPy call per step (the reference the tests compare with).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from arrayjob.planner import contraction
from arrayjob.planner.ir import ELEMENTWISE
from arrayjob.planner.physical import Assemble, BlockKernel, Combine, Step


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


COMBINE = {"sum": add_partials, "max": max_partials, "min": min_partials}


def combine(kernel: Combine, *partials: Any) -> Any:
    return COMBINE[kernel.op](*partials)


def assemble(kernel: Assemble, *blocks: np.ndarray) -> np.ndarray:
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
    """One step on NumPy."""
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
        return einsum(step.attrs[0], *inputs)
    if step.op == "transpose":
        return np.transpose(inputs[0], step.attrs[0])
    raise ValueError(f"unknown op {step.op!r}")


Signature = tuple[tuple[tuple[int, ...], str], ...]


class CompiledPrograms:
    """The programs compiled in this process, by kernel structure and argument signature.

    The key is the whole ``BlockKernel`` (its steps, constants included) and the shapes and
    dtypes of the arguments: everything a compiled program depends on. A worker unpickles
    a fresh copy of the kernel for every task and must not compile it again; the least
    recently used kernels are dropped past ``capacity``.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._programs: OrderedDict[BlockKernel, dict[Signature, Any]] = OrderedDict()

    def get(self, kernel: BlockKernel, args: tuple[Any, ...]) -> Any:
        from arrayjob.kernels.blockprogram import Program

        signature = tuple((tuple(np.shape(a)), str(a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype))
                          for a in args)
        programs = self._programs.pop(kernel, None) or {}
        self._programs[kernel] = programs
        while len(self._programs) > self.capacity:
            self._programs.popitem(last=False)
        program = programs.get(signature)
        if program is None:
            program = programs[signature] = Program(kernel, args)
        return program


PROGRAMS = CompiledPrograms()  # this worker process's


def run_block_kernel(kernel: BlockKernel, *args: Any) -> Any:
    return _result(kernel, PROGRAMS.get(kernel, args)(args))


def interpret(kernel: BlockKernel, *args: Any) -> Any:
    """One NumPy call per step, every intermediate materialised (the reference)."""
    from arrayjob.kernels.blockprogram import last_uses

    slots: list[Any] = list(args)
    done_after = last_uses([step.inputs for step in kernel.steps], keep={*kernel.outputs, *range(kernel.n_args)})
    for step, done in zip(kernel.steps, done_after, strict=True):
        slots.append(evaluate(step, [slots[i] for i in step.inputs]))
        for slot in done:
            slots[slot] = None
    return _result(kernel, [slots[o] for o in kernel.outputs])


def _result(kernel: BlockKernel, values: list[Any]) -> Any:
    return values[0] if len(kernel.outputs) == 1 else tuple(values)
