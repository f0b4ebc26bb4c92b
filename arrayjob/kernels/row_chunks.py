"""Row sub-blocking (SystemML's Row template): a compiled block program run over chunks of
its largest argument's rows.

When a program (``compiler.Program``) is row-parallel in its largest argument — every step
either carries that argument's rows or doesn't depend on them, and rows are only summed
away (sum, max, min, contractions) — it runs over chunks of about ``CHUNK_BYTES`` of row
data: each chunk's intermediates stay in cache, so the big argument is read from memory
once even when two contractions use it (``X.T @ f(X @ w)``). Reductions over rows are
accumulated across chunks, steps that don't depend on the rows run once before the loop,
and steps that need a finished reduction run after it. ``RowChunking.of`` decides whether
and how; ``RowChunking.run`` runs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from arrayjob.planner.ops import Einsum, Op, OpAttrs, Reduce, Transpose, combine_of

try:  # numexpr is a dependency; without it kernels run NumPy step by step
    from numexpr import set_num_threads
except ImportError:  # pragma: no cover
    set_num_threads = None

# Row data per chunk, all row-carrying slots together. Measured on a 2-core AMD EPYC (1 MiB
# L2 per core, 32 MiB L3) with 64 MiB blocks of the Black-Scholes and logistic kernels: 2-8 MiB
# are within a few percent of each other and 10-25% faster than whole blocks; 128-512 KiB
# chunks lose it again to per-chunk Python and BLAS call overhead.
CHUNK_BYTES = 2 * 2**20
MIN_CHUNK_ROWS = 64


@dataclass
class CompiledOp:
    """One executable step: a NumPy step or a numexpr expression over leaf slots."""

    out: int
    inputs: tuple[int, ...]  # slots read
    kind: Op | str  # Op.MAP for expressions, else the step's op; "part" for a slice of a packed result
    attrs: OpAttrs | None  # the step's (None for an expression or a part)
    run: Callable[[list[Any]], Any]
    expression: str | None = None  # the numexpr expression, over leaf slots ``v<slot>``


class StepProgram(Protocol):
    """What chunking reads of a compiled program (``compiler.Program``)."""

    @property
    def kernel(self) -> Any: ...
    @property
    def shapes(self) -> Sequence[tuple[int, ...]]: ...
    @property
    def dtypes(self) -> Sequence[str]: ...
    @property
    def ops(self) -> Sequence[CompiledOp]: ...


PRE, LOOP, ACC, POST = "pre", "loop", "acc", "post"
ACCUMULATE = {"sum": np.add, "max": np.maximum, "min": np.minimum}  # by ops.combine_of


class _Conflict(Exception):
    """The program is not row-parallel in the chosen argument."""


@dataclass
class RowChunking:
    carrier: int  # the argument whose rows are cut
    rows: int  # chunk length
    length: int  # rows in all
    pre: list[CompiledOp]
    loop: list[CompiledOp]
    post: list[CompiledOp]
    loop_args: list[tuple[int, int]]  # (slot, row axis)
    accumulate: list[tuple[int, str]]  # (slot, combine fn)
    loop_outputs: list[tuple[int, int]]  # (slot, row axis)

    @classmethod
    def of(cls, program: StepProgram) -> RowChunking | None:
        n = program.kernel.n_args
        shapes = program.shapes
        candidates = [s for s in range(n) if len(shapes[s]) >= 1 and shapes[s][0] > 1]
        if not candidates:
            return None
        carrier = max(candidates, key=lambda s: math.prod(shapes[s]) * np.dtype(program.dtypes[s]).itemsize)
        try:
            role, axis, combine = _roles(program, carrier)
        except _Conflict:
            return None
        length = shapes[carrier][0]
        row_bytes = sum(math.prod(shapes[s]) * np.dtype(program.dtypes[s]).itemsize
                        for s, r in role.items() if r == LOOP) / length
        rows = max(MIN_CHUNK_ROWS, int(CHUNK_BYTES // max(row_bytes, 1)))
        loop = [op for op in program.ops if role[op.out] in (LOOP, ACC)]
        if rows * 2 > length or len(loop) < 2:
            return None
        outputs = set(program.kernel.outputs)
        return cls(
            carrier=carrier, rows=rows, length=length,
            pre=[op for op in program.ops if role[op.out] == PRE], loop=loop,
            post=[op for op in program.ops if role[op.out] == POST],
            loop_args=[(s, axis[s]) for s in range(n) if role.get(s) == LOOP],
            accumulate=[(op.out, combine[op.out]) for op in loop if role[op.out] == ACC],
            loop_outputs=[(s, axis[s]) for s in outputs if role[s] == LOOP],
        )

    def run(self, vals: list[Any]) -> None:
        # numexpr's threads cost more to wake than a cache-sized chunk takes to compute
        # (measured: Black-Scholes 25% slower with 2 threads than with 1)
        threads = set_num_threads(1) if set_num_threads is not None else 1
        try:
            self._run(vals)
        finally:
            if set_num_threads is not None and threads != 1:
                set_num_threads(threads)

    def _run(self, vals: list[Any]) -> None:
        for op in self.pre:
            vals[op.out] = op.run(vals)
        totals: dict[int, Any] = {}
        buffers: dict[int, np.ndarray] = {}
        local = list(vals)
        for start in range(0, self.length, self.rows):
            stop = min(start + self.rows, self.length)
            for slot, axis in self.loop_args:
                local[slot] = vals[slot][(slice(None),) * axis + (slice(start, stop),)]
            for op in self.loop:
                local[op.out] = op.run(local)
            for slot, fn in self.accumulate:
                part = local[slot]
                totals[slot] = part if slot not in totals else ACCUMULATE[fn](totals[slot], part)
            for slot, axis in self.loop_outputs:
                part = np.asarray(local[slot])
                if slot not in buffers:
                    shape = list(part.shape)
                    shape[axis] = self.length
                    buffers[slot] = np.empty(shape, dtype=part.dtype)
                buffers[slot][(slice(None),) * axis + (slice(start, stop),)] = part
        for slot, total in totals.items():
            vals[slot] = np.asarray(total)
        for slot, buffer in buffers.items():
            vals[slot] = buffer
        for op in self.post:
            vals[op.out] = op.run(vals)


def _row_axes(program: StepProgram, carrier: int) -> dict[int, int]:
    """The axis of each slot that runs along the carrier's rows (slots without one are absent).

    Axes are joined as ``ir.AxisClasses`` joins them (aligned equal-length axes of a map,
    equal einsum labels, kept axes of a reduction, transposed axes), on the actual shapes.
    """
    shapes = program.shapes
    parent: dict[tuple[int, int], tuple[int, int]] = {}

    def find(x: tuple[int, int]) -> tuple[int, int]:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: tuple[int, int], b: tuple[int, int]) -> None:
        parent[find(a)] = find(b)

    for op in program.ops:
        out = shapes[op.out]
        if op.kind is Op.MAP:
            for s in op.inputs:
                offset = len(out) - len(shapes[s])
                for a, size in enumerate(shapes[s]):
                    if size == out[a + offset] and size != 1:
                        union((s, a), (op.out, a + offset))
        elif isinstance(op.attrs, Einsum):
            terms, result = op.attrs.terms
            where = {label: (op.out, a) for a, label in enumerate(result)}
            for term, s in zip(terms, op.inputs, strict=True):
                for a, label in enumerate(term):
                    if label in where:
                        union((s, a), where[label])
                    else:
                        where[label] = (s, a)
        elif isinstance(op.attrs, Reduce):
            kept = [a for a in range(len(shapes[op.inputs[0]])) if a not in op.attrs.axes]
            for k, a in enumerate(kept):
                union((op.inputs[0], a), (op.out, a if op.attrs.keepdims else k))
        elif isinstance(op.attrs, Transpose):
            for k, a in enumerate(op.attrs.perm):
                union((op.inputs[0], a), (op.out, k))
    rows = find((carrier, 0))
    found: dict[int, int] = {}
    for slot in range(len(shapes)):
        along = [a for a in range(len(shapes[slot])) if find((slot, a)) == rows]
        if len(along) > 1:
            raise _Conflict
        if along:
            found[slot] = along[0]
    return found


def _roles(program: StepProgram, carrier: int) -> tuple[dict[int, str], dict[int, int], dict[int, str]]:
    """Each slot's role: PRE (no rows), LOOP (its row axis), ACC (rows summed away), POST."""
    axis = _row_axes(program, carrier)
    role: dict[int, str] = {s: LOOP if s in axis else PRE for s in range(program.kernel.n_args)}
    combine: dict[int, str] = {}
    for op in program.ops:
        kinds = {role[s] for s in op.inputs}
        if op.out in axis:
            if kinds & {ACC, POST}:
                raise _Conflict  # a chunk would need a finished reduction
            role[op.out] = LOOP
        elif LOOP in kinds:  # the op sums the rows away
            fn = combine_of(op.kind, op.attrs) if isinstance(op.kind, Op) and op.attrs is not None else None
            if fn not in ACCUMULATE or kinds & {ACC, POST}:
                raise _Conflict
            role[op.out], combine[op.out] = ACC, fn
        else:
            role[op.out] = POST if kinds & {ACC, POST} else PRE
    return role, axis, combine
