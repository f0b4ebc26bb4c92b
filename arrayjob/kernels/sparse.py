"""Block steps on sparse blocks (SciPy CSR row blocks of a sparse input), without densifying.

A step with a sparse operand runs here (``primitives.evaluate`` sends it): a contraction is
a SciPy sparse × dense product, or sparse × sparse for a Gram matrix; a vector that scales
a sparse operand's rows or columns (``einsum("ij,i,ik->jk", X, v, X)``) is folded into it
first; a map that keeps zeros (``ops.keeps_sparse``: multiply, square, abs, ...) acts on the
non-zeros; a sum reduces them. So a pass costs the non-zeros, never n × d. Any other step
(``X + 1``, ``exp(X)``, an arg-reduction) is dense by nature and densifies the block: the
jobs that take sparse input are written without such steps.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from arrayjob.planner.ops import (
    ELEMENTWISE,
    Einsum,
    Map,
    Op,
    Reduce,
    Transpose,
    keeps_sparse,
    parse_einsum,
)


def issparse(x: Any) -> bool:
    """A ``scipy.sparse`` matrix or array? Asked without importing SciPy (0.14 s in every
    worker): no sparse block exists in a process that has not imported it."""
    module = sys.modules.get("scipy.sparse")
    return module is not None and bool(module.issparse(x))


def nbytes(x: Any) -> int:
    """The bytes a block holds (a sparse one: its values and its index arrays)."""
    if issparse(x):
        arrays = [getattr(x, name, None) for name in ("data", "indices", "indptr", "row", "col")]
        return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))
    return int(np.asarray(x).nbytes)


def dense(x: Any) -> np.ndarray:
    return x.toarray() if issparse(x) else np.asarray(x)


def evaluate(step: Any, inputs: list[Any]) -> Any:
    """One step with at least one sparse operand, or NotImplemented for a step that is dense
    by nature (its operands are then densified)."""
    attrs = step.attrs
    if isinstance(attrs, Transpose):
        return inputs[0].T
    if isinstance(attrs, Map) and keeps_sparse(Op.MAP, attrs, [issparse(x) for x in inputs]):
        return _map(attrs.fn, inputs).astype(step.dtype, copy=False)
    if isinstance(attrs, Reduce) and attrs.fn == "sum":
        return _sum(inputs[0], attrs.axes, attrs.keepdims)
    if isinstance(attrs, Einsum):
        return einsum(attrs.subscripts, *inputs)
    return NotImplemented  # dense by nature: the caller densifies the operands


def _map(fn: str, inputs: list[Any]) -> Any:
    if fn == "multiply":
        a, b = inputs
        if a is b:  # X * X: its values squared
            return _mapped(a, np.square)
        if not issparse(a):
            a, b = b, a
        return a.multiply(b).asformat(a.format)
    (x,) = inputs
    return _mapped(x, ELEMENTWISE[fn].numpy)


def _mapped(x: Any, fn: Any) -> Any:
    """``fn`` of each value of ``x`` (a map that keeps zeros), on the same non-zeros. Where
    each entry is one element (canonical CSR or CSC, as SciPy makes and datagen writes), the
    index arrays are shared, not copied: a copy of a 500,000-row block's indices is 60 MB,
    and SciPy's X.multiply(X) merges the two index lists row by row (42 ms against 16 on such
    a block, ``benchmarks/bench_micro.py sparse-kmeans``). A block with repeated entries is
    summed first: the map is of the element, not of its parts."""
    if x.format not in ("csr", "csc") or not x.has_canonical_format:
        x = x.copy()
        x.sum_duplicates()
        x.data = fn(x.data)
        return x
    return type(x)((fn(x.data), x.indices, x.indptr), shape=x.shape, copy=False)


def _sum(x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    if set(axes) == {0, 1}:
        total = np.asarray(x.sum())
        return total.reshape(1, 1) if keepdims else total
    (axis,) = axes
    total = np.asarray(x.sum(axis=axis))  # (1, d) or (n, 1)
    return total if keepdims else total.reshape(-1)


def einsum(subscripts: str, *blocks: Any) -> np.ndarray:
    """A contraction with sparse operands (2-D), as SciPy products; the result is dense."""
    terms, out = parse_einsum(subscripts)
    operands = list(zip(terms, blocks, strict=True))
    operands = _fold_scalings(operands)
    if len(operands) == 1:
        (term, x), = operands
        return np.einsum(f"{term}->{out}", dense(x))
    if len(operands) == 2:
        product = _pair(operands[0], operands[1], out)
        if product is not None:
            term, value = product
            return np.einsum(f"{term}->{out}", value)
    return np.einsum(f"{','.join(t for t, _ in operands)}->{out}", *(dense(x) for _, x in operands), optimize=True)


def _fold_scalings(operands: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Multiply each dense vector whose label a sparse operand has into that operand: scaling
    its rows or columns, which keeps it sparse (einsum multiplies operands elementwise).

    Only while a pair would remain: a sparse matrix and a vector are one SciPy product
    (``_pair``), whereas folding the vector leaves a lone operand that ``einsum`` densifies
    (X @ w with X n × 2²⁰ asked for n × 2²⁰ × 8 bytes)."""
    operands = list(operands)
    while len(operands) > 2:
        for k, (term, x) in enumerate(operands):
            if issparse(x) or np.ndim(x) != 1:
                continue
            into = next((j for j, (t, s) in enumerate(operands) if issparse(s) and term in t), None)
            if into is None:
                continue
            t, s = operands[into]
            scale = np.asarray(x).reshape((-1, 1) if t.index(term) == 0 else (1, -1))
            operands[into] = (t, s.multiply(scale).asformat(s.format))
            del operands[k]
            break
        else:
            return operands
    return operands


def _pair(a: tuple[str, Any], b: tuple[str, Any], out: str) -> tuple[str, np.ndarray] | None:
    """``a`` × ``b`` contracted over the one label they share that the output lacks, as one
    SciPy product: (the labels of the result, the dense result), or None if not of that form."""
    (ta, xa), (tb, xb) = a, b
    if not issparse(xa):
        (ta, xa), (tb, xb) = (tb, xb), (ta, xa)
    if not issparse(xa) or len(ta) != 2 or len(set(ta)) != 2:
        return None
    shared = [label for label in ta if label in tb]
    if len(shared) != 1 or shared[0] in out or tb.count(shared[0]) != 1:
        return None
    (c,) = shared
    left = xa if ta[1] == c else xa.T  # the contracted label last
    free = ta[0] if ta[1] == c else ta[1]
    if issparse(xb):
        if len(tb) != 2:
            return None
        right = xb if tb[0] == c else xb.T
        other = tb[1] if tb[0] == c else tb[0]
        return free + other, dense(left @ right)
    y = np.moveaxis(np.asarray(xb), tb.index(c), 0)
    rest = tb.replace(c, "")
    if y.ndim == 1:  # SciPy's matrix × vector: faster than × an (n, 1) matrix
        return free, np.asarray(left @ y)
    product = left @ y.reshape(y.shape[0], -1)
    return free + rest, np.asarray(product).reshape((left.shape[0], *y.shape[1:]))


def assemble(shape: tuple[int, ...], pieces: Any, blocks: tuple[Any, ...]) -> Any:
    """Row blocks of a sparse matrix put together (a block cut into other rows than read)."""
    import scipy.sparse

    parts = [_csr(b)[src[0][0]: src[0][1], src[1][0]: src[1][1]] for b, (_, src) in zip(blocks, pieces, strict=True)]
    order = np.argsort([dst[0][0] for dst, _ in pieces])
    result = scipy.sparse.vstack([parts[i] for i in order], format="csr")
    assert result.shape == shape
    return result


def _csr(x: Any) -> Any:
    import scipy.sparse

    return scipy.sparse.csr_matrix(x)
