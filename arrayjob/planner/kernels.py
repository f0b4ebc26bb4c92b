"""Block kernels: what a task runs. NumPy and numexpr on in-memory blocks, no I/O.

``BlockKernel`` evaluates a fused subgraph of the IR on one block of each of its inputs
and returns the blocks (or partial results) of the nodes it materialises. The planner
builds it; the runtime only calls it. It is shipped to workers by pickling and compiled
there on first use (``blockprogram.Program``: numexpr expressions, row sub-blocking),
once per argument shapes and dtypes; ``interpret`` runs it one NumPy call per step.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from arrayjob.planner.ir import ELEMENTWISE, parse_einsum


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


# A contraction of three or more blocks whose first product is bigger than this runs in
# pieces along the big block's first axis, so each piece's product is still in cache when
# the rest contracts it: MTTKRP on a (100, 400, 400) block, rank 32, one thread, 44 ms
# whole, 38 ms in pieces of 5 slabs (``benchmarks/bench_micro.py mttkrp-gemm``).
PIECE_BYTES = 512 * 2**10


def _einsum(subscripts: str, *blocks: np.ndarray) -> np.ndarray:
    if len(blocks) >= 3:
        first = _blas_pair(subscripts, tuple(np.shape(b) for b in blocks))
        pieces = _pieces(subscripts, tuple(np.shape(b) for b in blocks)) if first is not None else None
        if pieces is not None:
            big, rows, at = pieces
            n = np.shape(blocks[big])[0]
            parts = [_einsum(subscripts, *(b[lo: lo + rows] if k == big else b for k, b in enumerate(blocks)))
                     for lo in range(0, n, rows)]
            return np.concatenate(parts, axis=at)
        if first is not None:
            (big, other, axes, swap), rest = first
            pair = np.tensordot(blocks[other], blocks[big], axes=axes[::-1]) if swap \
                else np.tensordot(blocks[big], blocks[other], axes=axes)
            remaining = [b for k, b in enumerate(blocks) if k not in (big, other)]
            return _einsum(rest, pair, *remaining)
    if len(blocks) == 2:
        contract = _pairwise(subscripts)
        if contract is not None:
            return contract(*blocks)
        # BLAS for the other pairwise contractions; einsum's C loop otherwise.
        return np.einsum(subscripts, *blocks, optimize=True)
    return np.einsum(subscripts, *blocks, optimize="greedy")


@functools.lru_cache(maxsize=512)
def _pieces(subscripts: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[int, int, int] | None:
    """(big block, rows per piece, the output axis pieces stack on) when the first product
    ``_blas_pair`` makes is over ``PIECE_BYTES`` and the big block's first axis is kept in
    the output and appears in no other block; else None."""
    (big, other, axes, _), _ = _blas_pair(subscripts, shapes)
    terms, out = parse_einsum(subscripts)
    label = terms[big][0]
    if 0 in axes[0] or label not in out or any(label in t for k, t in enumerate(terms) if k != big):
        return None
    row_bytes = 8 * math.prod(shapes[big][1:]) // math.prod(shapes[big][a] for a in axes[0]) \
        * math.prod(size for a, size in enumerate(shapes[other]) if a not in axes[1])
    rows = max(1, PIECE_BYTES // max(1, row_bytes))
    if rows >= shapes[big][0]:
        return None
    return big, rows, out.index(label)


@functools.lru_cache(maxsize=512)
def _blas_pair(subscripts: str, shapes: tuple[tuple[int, ...], ...]) -> Any:
    """For a contraction of three or more blocks: the largest block and a partner whose labels
    it shares are all summed away and lie at the start or the end of the large block's axes,
    so one GEMM on a free reshape contracts them. Returns ((big, partner, axes, partner
    first?), the subscripts of what remains with the pair's result first), or None.

    MTTKRP ``ijk,jf,kf->if`` on a (40, 400, 400) block: ``np.einsum(optimize=True)`` contracts
    j first (a copy of X, then einsum's C loop over f) in 25 ms; X(ij, k) @ C, then
    ``ijf,jf->if``, runs at GEMM speed."""
    terms, out = parse_einsum(subscripts)
    if any(len(set(t)) != len(t) for t in terms):
        return None
    big = max(range(len(terms)), key=lambda k: math.prod(shapes[k]))
    a = terms[big]
    for other, b in enumerate(terms):
        if other == big:
            continue
        shared = [label for label in a if label in b]
        elsewhere = set(out).union(*(t for k, t in enumerate(terms) if k not in (big, other)))
        if not shared or set(shared) & elsewhere:
            continue
        at_end, at_start = a.endswith("".join(shared)), a.startswith("".join(shared))
        if not (at_end or at_start):
            continue
        axes = ([a.index(x) for x in shared], [b.index(x) for x in shared])
        free_a, free_b = [x for x in a if x not in shared], [x for x in b if x not in shared]
        result = "".join(free_b + free_a) if at_start and not at_end else "".join(free_a + free_b)
        rest = [result] + [t for k, t in enumerate(terms) if k not in (big, other)]
        return (big, other, axes, at_start and not at_end), ",".join(rest) + "->" + out
    return None


@functools.lru_cache(maxsize=512)
def _pairwise(subscripts: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """``tensordot`` for a plain two-operand contraction (``ij,j->i``, ``ji,j->i``, ``ik,ij->kj``):
    BLAS without ``einsum``'s path search, which costs more than the product on small blocks."""
    terms, out = parse_einsum(subscripts)
    if len(terms) != 2:
        return None
    a, b = terms
    shared = [label for label in a if label in b]
    if any(len(set(t)) != len(t) for t in (a, b, out)) or set(shared) & set(out) \
            or set(a + b) - set(shared) != set(out):
        return None  # diagonals, batch labels or labels summed within one operand: einsum
    axes = ([a.index(label) for label in shared], [b.index(label) for label in shared])
    free = [label for label in a + b if label not in shared]
    perm = tuple(free.index(label) for label in out)
    if perm == tuple(range(len(perm))):
        return lambda x, y: np.tensordot(x, y, axes=axes)
    return lambda x, y: np.tensordot(x, y, axes=axes).transpose(perm)


Signature = tuple[tuple[tuple[int, ...], str], ...]
_COMPILED: OrderedDict[BlockKernel, dict[Signature, Any]] = OrderedDict()  # per process
_COMPILED_KERNELS = 256


@dataclass(frozen=True)
class BlockKernel:
    """A straight-line program over slots: the arguments first, then one slot per step."""

    name: str
    n_args: int
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]  # slots returned, in order

    def __call__(self, *args: Any) -> Any:
        from arrayjob.planner.blockprogram import Program

        signature = tuple((tuple(np.shape(a)), str(a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype))
                          for a in args)
        programs = self._programs()
        program = programs.get(signature)
        if program is None:
            program = programs[signature] = Program(self, args)
        return self._result(program(args))

    def interpret(self, *args: Any) -> Any:
        """One NumPy call per step, every intermediate materialised (the reference)."""
        from arrayjob.planner.blockprogram import last_uses

        slots: list[Any] = list(args)
        done_after = last_uses([step.inputs for step in self.steps], keep={*self.outputs, *range(self.n_args)})
        for step, done in zip(self.steps, done_after, strict=True):
            slots.append(evaluate(step, [slots[i] for i in step.inputs]))
            for slot in done:
                slots[slot] = None
        return self._result([slots[o] for o in self.outputs])

    def _result(self, values: list[Any]) -> Any:
        return values[0] if len(self.outputs) == 1 else tuple(values)

    def _programs(self) -> dict[Signature, Any]:
        # Cached on the instance, and by structure for the process: a worker unpickles a
        # fresh copy of the kernel for every task and must not compile it again.
        programs = self.__dict__.get("_compiled")
        if programs is None:
            programs = _COMPILED.pop(self, None) or {}
            _COMPILED[self] = programs
            while len(_COMPILED) > _COMPILED_KERNELS:
                _COMPILED.popitem(last=False)
            object.__setattr__(self, "_compiled", programs)
        return programs

    def __getstate__(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


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
