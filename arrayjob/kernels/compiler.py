"""Compiled block programs: how a fused kernel makes one pass over its blocks.

Interpreted, a ``BlockKernel`` makes one NumPy call per step, and every intermediate is a
whole-block array written to memory and read back. Compiled (lazily, in the process that
runs the kernel, once per argument shapes and dtypes):

1. *Expressions.* Each maximal tree of elementwise steps whose intermediates have one use
   becomes one numexpr expression, evaluated in cache-sized pieces without temporaries.
   numexpr lacks some functions; they are rewritten in numerically stable forms::

       sigmoid(x)     = 1 / (1 + exp(-x))          (exp overflows to inf: the result is 0)
       logaddexp(a,b) = where(a == b, a + log 2, maximum(a, b) + log1p(exp(-|a - b|)))

   Steps numexpr can't do (erf, reductions, contractions, arithmetic on booleans or on
   integers) stay NumPy, as do one-operation expressions and small arrays, where NumPy is
   faster.
2. *Loops* (``rewrites``): products with a one-hot matrix ``E = (labels == ids) * 1``
   (``Eᵀ @ X``, ``E.sum(0)``, ``E @ C``) and arg-reductions over short rows run as compiled
   loops over the rows; E is never built. (Loops are used for blocks of at least
   ``LOOP_MIN_BYTES``: below, numba's one-time start costs more than they save.)
3. *Row sub-blocking* (SystemML's Row template, ``row_chunks``): a program row-parallel in
   its largest argument runs over cache-sized chunks of its rows, so the big argument is
   read from memory once even when two contractions use it (``X.T @ f(X @ w)``).
4. *Row loops* (``rowloop``): a row-parallel program whose only wide argument is the one
   cut into rows, everything else per row a scalar (the logistic loss and gradient), is
   generated as one numba loop over the rows instead of pieces.

A sparse argument (``scipy.sparse``, ``Program.sparse``) is never made dense here: it is no
leaf of a numexpr expression and never cut into row chunks. For any block with at least
``SPARSE_LOOP_MIN_BYTES`` of values and indices, as the wide argument of a row loop it is
read non-zeros only, as it is held: a CSR block row by row (one pass), a CSC block (a wide
matrix's, ``io.locations.HELD_BY_COLUMNS_ABOVE``) in two sweeps over its columns around the
rows (``row_layouts.CSCColumns``); and a CSR block is the X of k-means' loop rewrites
(``Program.csr``, ``rewrites``). Otherwise its steps run one SciPy call each (``kernels.sparse``).

``Program(kernel, args)`` is the compiled form; ``block_kernel.CompiledPrograms`` caches it.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from arrayjob.kernels import rowloop, sparse
from arrayjob.kernels.rewrites import packed, rewrites
from arrayjob.kernels.row_chunks import CompiledOp, RowChunking
from arrayjob.planner.ir import infer_shape
from arrayjob.planner.ops import (
    ELEMENTWISE,
    Einsum,
    Map,
    Op,
    keeps_sparse,
)

try:  # numexpr is a dependency; without it kernels run NumPy step by step
    from numexpr.necompiler import NumExpr
except ImportError:  # pragma: no cover
    NumExpr = None

# Compiled loops (``rewrites``, ``rowloop``) for blocks at least this big. A process pays
# about 0.85 s once to import numba and load a cached loop, and a loop saves about 0.1 ms
# per MB of block (logistic, K-means): worth it for the blocks of large jobs, not small ones.
LOOP_MIN_BYTES = 64 * 2**20
# ... or for a kernel whose largest input is at least this per worker (``BlockKernel.worker_bytes``):
# the tiling aims at about two blocks per worker, so without a memory budget this is the
# same rule; under one, the finer blocks of a big job keep its loops (without them a 51 MB
# block of the logistic kernel took 9.7 ms against 3.8, K-means' 21 against 6.5)
LOOP_MIN_WORKER_BYTES = 2 * LOOP_MIN_BYTES
# A sparse block runs as a row loop over its non-zeros whenever its program fits one,
# whatever LOOP_MIN_BYTES says: the alternative is a SciPy call per product, each a pass over
# the block. Only a block holding less than this (values and indices) is left to them,
# as numba's start would cost more than the loop saves.
SPARSE_LOOP_MIN_BYTES = 2**20
# A wide matrix's blocks are held as CSC (``io.locations.HELD_BY_COLUMNS_ABOVE``): the loop over
# CSR rows gathers from w and scatters into the gradient in the same pass and misses the cache
# twice per non-zero once both outgrow it (bench_micro.py sparse-loop, 1,000,000 × d, 30 a row,
# 2 cores: at d = 2^17 the loop took 100 ms against 112 for SciPy's products and NumPy's steps;
# at d = 2^20, 355–380 ms against 154–174). Over CSC the loop sweeps the columns instead
# (``row_layouts.CSCColumns``), at the cost of SciPy's two products (250,000 × 2^20, 1 thread,
# under load: 37.7 ms of CPU against 36.3).
MIN_EXPRESSION_SIZE = 2048  # elements; below this a NumPy call is cheaper than numexpr's
LOG2 = "0.6931471805599453"

# numexpr renderings from the op table (``ops.Elementwise.numexpr``): {i} is the i-th operand
TEMPLATES = {name: fn.numexpr for name, fn in ELEMENTWISE.items() if fn.numexpr is not None}
USES = {fn: tuple(t.count(f"{{{i}}}") for i in range(3)) for fn, t in TEMPLATES.items()}
NUMPY_IS_AS_FAST = set(TEMPLATES) - {"sigmoid"}  # for a single operation
NE_TYPES = {"bool": bool, "int32": np.int32, "int64": np.int64, "float64": np.float64}


class Program:
    """A ``BlockKernel`` compiled for one set of argument shapes and dtypes."""

    def __init__(self, kernel: Any, args: Sequence[Any]) -> None:
        from arrayjob.kernels.primitives import evaluate

        self.kernel = kernel
        n_args = kernel.n_args
        self.sparse = frozenset(s for s, a in enumerate(args) if sparse.issparse(a))
        self.formats: dict[int, str] = {s: args[s].format for s in self.sparse}
        shapes: list[tuple[int, ...]] = [tuple(np.shape(a)) for a in args]
        dtypes: list[str] = [str(np.asarray(a).dtype) if not hasattr(a, "dtype") else str(a.dtype) for a in args]
        for step in kernel.steps:
            ins = [shapes[i] for i in step.inputs]
            shapes.append(() if step.op is Op.CONST else infer_shape(step.op, ins, step.attrs))
            dtypes.append(step.dtype)
        self.shapes, self.dtypes = shapes, dtypes
        sizes = [sparse.nbytes(args[s]) if s in self.sparse else math.prod(shapes[s]) * np.dtype(dtypes[s]).itemsize
                 for s in range(n_args)]
        # the sparse arguments the loops read as they are: CSR blocks past the size rule
        self.csr = frozenset(s for s in self.sparse if _loops_pay(args[s]))
        loops = (max(sizes, default=0) >= LOOP_MIN_BYTES or getattr(kernel, "worker_bytes", 0) >= LOOP_MIN_WORKER_BYTES
                 or bool(self.csr))
        self.may_be_sparse = _may_be_sparse(kernel, self.sparse)
        self.rewrites = {i: r for i, r in (rewrites(kernel, shapes, dtypes, self.csr) if loops else {}).items()
                         if not self.may_be_sparse.intersection(set(r.inputs) - set(r.csr))}  # else dense arrays
        self.packed = packed(kernel, self.rewrites, shapes)  # in extra slots after the steps'
        for pack in self.packed:
            shapes.append(pack.shape)
            dtypes.append("float64")
        self.ops = _live(self._ops(evaluate), set(kernel.outputs))
        self.done_after = last_uses([op.inputs for op in self.ops], keep={*kernel.outputs, *range(n_args)})
        # chunks of a sparse block would go through NumPy's calls, which take dense arrays
        self.chunking = RowChunking.of(self) if len(self.ops) > 1 and not self.sparse else None
        if self.sparse:
            self.row_loop = self._sparse_row_loop(args)
        else:
            self.row_loop = rowloop.build(self, self.chunking.carrier) if loops and self.chunking is not None else None

    def _sparse_row_loop(self, args: Sequence[Any]) -> Callable[[list[Any]], None] | None:
        """The row loop over the non-zeros of the one sparse argument, unless its block is tiny."""
        if len(self.sparse) != 1:
            return None
        (carrier,) = self.sparse
        block = args[carrier]
        if carrier in self.csr or (block.format == "csc" and sparse.nbytes(block) >= SPARSE_LOOP_MIN_BYTES):
            return rowloop.build(self, carrier)
        return None

    # -- expressions ---------------------------------------------------------------------
    def _expressible(self, i: int) -> bool:
        step = self.kernel.steps[i]
        if NumExpr is None or not isinstance(step.attrs, Map) or step.attrs.fn not in TEMPLATES:
            return False
        slot = self.kernel.n_args + i
        if math.prod(self.shapes[slot]) < MIN_EXPRESSION_SIZE or self.may_be_sparse.intersection(step.inputs):
            return False
        ins = [self.dtypes[s] for s in step.inputs]
        if any(d not in NE_TYPES for d in ins):
            return False
        if ELEMENTWISE[step.attrs.fn].comparison:
            return step.dtype == "bool" and ("bool" not in ins or set(ins) == {"bool"})
        if step.dtype != "float64":
            return False
        if step.attrs.fn == "where":
            return ins[0] == "bool" and "bool" not in ins[1:]
        return "bool" not in ins

    def _ops(self, evaluate: Callable[[Any, list[Any]], Any]) -> list[CompiledOp]:
        ok = [self._expressible(i) for i in range(len(self.kernel.steps))]
        while True:  # roots numexpr rejects (or needn't do) go to NumPy, and the rest is redone
            ops, rejected = self._try_ops(ok, evaluate)
            if not rejected:
                return ops
            for i in rejected:
                ok[i] = False

    def _try_ops(self, ok: list[bool], evaluate: Callable[[Any, list[Any]], Any]) -> tuple[list[CompiledOp], list[int]]:
        kernel, n = self.kernel, self.kernel.n_args
        steps = kernel.steps
        uses: Counter[int] = Counter()
        consumers: dict[int, list[int]] = defaultdict(list)
        for i, step in enumerate(steps):
            for p, s in enumerate(step.inputs):
                uses[s] += USES[step.attrs.fn][p] if ok[i] else 1
                consumers[s].append(i)
        outputs = set(kernel.outputs)

        def inlined(slot: int) -> bool:
            i = slot - n
            return (i >= 0 and ok[i] and slot not in outputs and uses[slot] == 1
                    and all(ok[c] and self.shapes[n + c] == self.shapes[slot] for c in consumers[slot]))

        def const(slot: int) -> bool:
            return slot >= n and steps[slot - n].op is Op.CONST

        ops: list[CompiledOp] = []
        rejected: list[int] = []
        packs = {i: (n + len(steps) + p, pack) for p, pack in enumerate(self.packed) for i in pack.parts}
        emitted: set[int] = set()
        for i, step in enumerate(steps):
            slot = n + i
            if i in packs:
                at, pack = packs[i]
                if at not in emitted:  # the packed loop runs once, before its first part
                    emitted.add(at)
                    ops.append(CompiledOp(at, pack.inputs, Op.EINSUM, Einsum(pack.subscripts), pack.run))
                ops.append(CompiledOp(slot, (at,), "part", None, functools.partial(_part, pack.parts[i], at)))
                continue
            if i in self.rewrites:
                rewrite = self.rewrites[i]
                ops.append(CompiledOp(slot, rewrite.inputs, Op.EINSUM, Einsum(rewrite.subscripts), rewrite.run))
                continue
            if ok[i] and inlined(slot):
                continue
            if ok[i]:
                single = not any(inlined(s) for s in step.inputs)
                leaves: list[int] = []
                text = TEMPLATES[step.attrs.fn].format(
                    *[self._render(s, inlined, const, leaves) for s in step.inputs])
                op = None if single and step.attrs.fn in NUMPY_IS_AS_FAST else self._expression(slot, text, leaves)
                if op is None:
                    rejected.append(i)
                else:
                    ops.append(op)
                continue
            ops.append(_numpy_op(slot, step, evaluate))
        return ops, rejected

    def _render(self, slot: int, inlined: Callable[[int], bool], const: Callable[[int], bool],
                leaves: list[int]) -> str:
        n = self.kernel.n_args
        if slot >= n:
            step = self.kernel.steps[slot - n]
            if const(slot):
                value = step.attrs.value
                if isinstance(value, bool | int | float) and math.isfinite(value):
                    return repr(float(value)) if isinstance(value, float) else repr(value)
            elif inlined(slot):
                operands = [self._render(s, inlined, const, leaves) for s in step.inputs]
                return TEMPLATES[step.attrs.fn].format(*operands)
        if slot not in leaves:
            leaves.append(slot)
        return f"v{slot}"

    def _expression(self, slot: int, text: str, leaves: list[int]) -> CompiledOp | None:
        signature = [(f"v{s}", NE_TYPES[self.dtypes[s]]) for s in leaves]
        try:
            compiled = NumExpr(text, signature=signature)
            probe = compiled(*[np.zeros((1,) * len(self.shapes[s]), dtype=self.dtypes[s]) for s in leaves])
        except Exception:  # noqa: BLE001 - anything numexpr rejects runs on NumPy instead
            return None
        if str(probe.dtype) != self.dtypes[slot]:
            return None
        leaf_slots = tuple(leaves)

        def run(vals: list[Any]) -> Any:
            return compiled(*[vals[s] for s in leaf_slots])

        return CompiledOp(slot, leaf_slots, Op.MAP, None, run, expression=text)

    # -- running -------------------------------------------------------------------------
    def __call__(self, args: Sequence[Any]) -> list[Any]:
        vals: list[Any] = list(args) + [None] * (len(self.shapes) - len(args))
        if self.row_loop is not None:
            self.row_loop(vals)
        elif self.chunking is None:
            for op, done in zip(self.ops, self.done_after, strict=True):
                vals[op.out] = op.run(vals)
                for slot in done:  # whole-block intermediates: free them as soon as possible
                    vals[slot] = None
        else:
            self.chunking.run(vals)
        return [vals[o] for o in self.kernel.outputs]


def _loops_pay(block: Any) -> bool:
    """Whether a sparse block is read by compiled loops: a CSR one past SPARSE_LOOP_MIN_BYTES."""
    return getattr(block, "format", None) == "csr" and sparse.nbytes(block) >= SPARSE_LOOP_MIN_BYTES


def _may_be_sparse(kernel: Any, sparse: frozenset[int]) -> frozenset[int]:
    """The slots that may hold a sparse matrix: the sparse arguments and the steps on them
    that keep them sparse (``ops.keeps_sparse``, the planner's rule: X * 2, Xᵀ)."""
    found = set(sparse)
    if found:
        for i, step in enumerate(kernel.steps):
            if keeps_sparse(step.op, step.attrs, [s in found for s in step.inputs]):
                found.add(kernel.n_args + i)
    return frozenset(found)


def _part(part: Callable[[Any], Any], at: int, vals: list[Any]) -> Any:
    """One step's value out of a packed loop's result (``rewrites.Packed.parts``)."""
    return part(vals[at])


def _live(ops: list[CompiledOp], outputs: set[int]) -> list[CompiledOp]:
    """The ops an output depends on (a rewrite can leave its one-hot matrix unread)."""
    needed, kept = set(outputs), []
    for op in reversed(ops):
        if op.out in needed:
            needed.update(op.inputs)
            kept.append(op)
    return kept[::-1]


def last_uses(inputs: Sequence[Sequence[int]], keep: set[int]) -> list[tuple[int, ...]]:
    """For each step (given the slots each reads), the slots not read after it (except ``keep``)."""
    last: dict[int, int] = {}
    for i, slots in enumerate(inputs):
        for slot in slots:
            last[slot] = i
    done: list[list[int]] = [[] for _ in inputs]
    for slot, i in last.items():
        if slot not in keep:
            done[i].append(slot)
    return [tuple(d) for d in done]


def _numpy_op(slot: int, step: Any, evaluate: Callable[[Any, list[Any]], Any]) -> CompiledOp:
    inputs = tuple(step.inputs)

    def run(vals: list[Any]) -> Any:
        return evaluate(step, [vals[s] for s in inputs])

    return CompiledOp(slot, inputs, step.op, step.attrs, run)


# -- row sub-blocking ---------------------------------------------------------------------------

