"""The lazy array API every job is written against.

``BlockArray`` records operations instead of running them; ``Session.compute`` captures
the requested results as one IR graph, plans it (tiling, fusion, placement — cached by
structure) and runs the plan::

    X = from_zarr(info_X); y = from_zarr(info_y); w = value("w", (d,))
    z = X @ w
    loss = sum(logaddexp(0.0, -(2 * y - 1) * z))
    grad = X.T @ (sigmoid(z) - y)
    session.compute({"loss": loss, "grad": grad}, values={"w": w0})

Nothing touches data until ``compute``. Small results come back to the driver as NumPy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import string
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from arrayjob.io.locations import ArrayInfo, StorageOptions, TableTarget
from arrayjob.planner import ops
from arrayjob.planner.ir import Graph, Node, infer_shape, sparsity_of
from arrayjob.planner.kernel import Kernel, Work
from arrayjob.planner.ops import ELEMENTWISE, REDUCTIONS, Op, OpAttrs


class BlockArray:
    """A lazy n-d array: an op, its inputs, and the shape and dtype it will have."""

    __slots__ = ("op", "inputs", "shape", "dtype", "attrs", "data")
    __array_priority__ = 100  # so ndarray + BlockArray defers to BlockArray

    def __init__(self, op: Op, inputs: tuple[BlockArray, ...], shape: tuple[int, ...], dtype: str,
                 attrs: OpAttrs, data: np.ndarray | None = None) -> None:
        self.op, self.inputs, self.shape, self.dtype, self.attrs = op, inputs, tuple(shape), dtype, attrs
        self.data = data  # a from_numpy array's contents: bound at compute, never part of the graph

    def __repr__(self) -> str:
        return f"BlockArray({self.op}, shape={self.shape}, dtype={self.dtype})"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def T(self) -> BlockArray:  # noqa: N802 - NumPy's name
        return transpose(self)

    # arithmetic ------------------------------------------------------------------------
    def __add__(self, o: Any) -> BlockArray: return _map("add", self, o)
    def __radd__(self, o: Any) -> BlockArray: return _map("add", o, self)
    def __sub__(self, o: Any) -> BlockArray: return _map("subtract", self, o)
    def __rsub__(self, o: Any) -> BlockArray: return _map("subtract", o, self)
    def __mul__(self, o: Any) -> BlockArray: return _map("multiply", self, o)
    def __rmul__(self, o: Any) -> BlockArray: return _map("multiply", o, self)
    def __truediv__(self, o: Any) -> BlockArray: return _map("divide", self, o)
    def __rtruediv__(self, o: Any) -> BlockArray: return _map("divide", o, self)
    def __pow__(self, o: Any) -> BlockArray: return _map("power", self, o)
    def __neg__(self) -> BlockArray: return _map("negative", self)
    def __gt__(self, o: Any) -> BlockArray: return _map("greater", self, o)
    def __lt__(self, o: Any) -> BlockArray: return _map("less", self, o)
    def __ge__(self, o: Any) -> BlockArray: return _map("greater_equal", self, o)
    def __le__(self, o: Any) -> BlockArray: return _map("less_equal", self, o)
    def __ne__(self, o: Any) -> BlockArray: return _map("not_equal", self, o)  # type: ignore[override]
    def __eq__(self, o: Any) -> BlockArray: return _map("equal", self, o)  # type: ignore[override]
    __hash__ = object.__hash__
    def __matmul__(self, o: BlockArray) -> BlockArray: return matmul(self, o)
    def __rmatmul__(self, o: BlockArray) -> BlockArray: return matmul(asarray(o), self)

    # reductions ------------------------------------------------------------------------
    def sum(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> BlockArray:
        return _reduce("sum", self, axis, keepdims)

    def mean(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> BlockArray:
        axes = _axes(self, axis)
        count = int(np.prod([self.shape[a] for a in axes], dtype=np.int64))
        return _reduce("sum", self, axis, keepdims) * (1.0 / count)

    def max(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> BlockArray:
        return _reduce("max", self, axis, keepdims)

    def min(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> BlockArray:
        return _reduce("min", self, axis, keepdims)

    def argmax(self, axis: int, keepdims: bool = False) -> BlockArray:
        return _reduce("argmax", self, axis, keepdims)

    def argmin(self, axis: int, keepdims: bool = False) -> BlockArray:
        return _reduce("argmin", self, axis, keepdims)


# constructors ------------------------------------------------------------------------------


def from_zarr(info: ArrayInfo, check: Kernel | None = None) -> BlockArray:
    """A stored array; its blocks will be read by the workers, aligned with its chunks.

    ``check(block)``, if given, runs where each block is read and returns None or what is
    wrong with the block (e.g. labels outside {0, 1}); a problem fails the job with exit 2.
    """
    return BlockArray(Op.SOURCE, (), info.shape, info.dtype, ops.Source(info, check))


def cached(handle: str, shape: tuple[int, ...], dtype: str, block_shape: tuple[int, ...],
           block_bytes: int | None = None) -> BlockArray:
    """Blocks an executor keeps under ``handle`` (made by ``Session.persist``); ``block_bytes``
    sizes a block where the dtype cannot (object blocks: PageRank's graph)."""
    return BlockArray(Op.CACHED, (), shape, dtype, ops.Cached(handle, tuple(block_shape), block_bytes))


def value(name: str, shape: tuple[int, ...], dtype: str = "float64") -> BlockArray:
    """A small driver array, bound by name at ``compute`` time (weights, centroids, ...)."""
    return BlockArray(Op.VALUE, (), shape, str(np.dtype(dtype)), ops.Value(name))


def from_numpy(array: np.ndarray, name: str | None = None) -> BlockArray:
    """A small in-memory array, sent to the workers that need it when the program runs.

    Its contents stay out of the graph (only its name, shape and dtype are planned), so a
    program re-built with new contents under the same name reuses its plan.
    """
    array = np.ascontiguousarray(array)
    if name is None:
        name = "array-" + hashlib.sha1(array.tobytes() + str(array.dtype).encode()).hexdigest()[:12]
    return BlockArray(Op.VALUE, (), array.shape, str(array.dtype), ops.Value(name), data=array)


def bound_values(outputs: Sequence[BlockArray]) -> dict[str, np.ndarray]:
    """The contents of every ``from_numpy`` array the outputs depend on, by name."""
    found: dict[str, np.ndarray] = {}
    seen: set[int] = set()
    stack = list(outputs)
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.data is not None:
            assert isinstance(x.attrs, ops.Value)
            found[x.attrs.name] = x.data
        stack.extend(x.inputs)
    return found


def const(x: float | int | bool) -> BlockArray:
    scalar = np.asarray(x)
    return BlockArray(Op.CONST, (), (), str(scalar.dtype), ops.Const(scalar.item()))


def asarray(x: Any) -> BlockArray:
    if isinstance(x, BlockArray):
        return x
    if np.ndim(x) == 0:
        return const(x)
    raise TypeError("only scalars mix with BlockArrays; pass arrays with value(name, shape)")


# elementwise -------------------------------------------------------------------------------


def _result_dtype(fn: ops.Elementwise, inputs: Sequence[BlockArray]) -> str:
    if fn.comparison:
        return "bool"
    # NumPy's rules: a Python scalar takes part by kind only (bool * 1.0 is float64,
    # float32 * 2.0 stays float32)
    operands = [a.attrs.value if isinstance(a.attrs, ops.Const) else np.empty((), dtype=a.dtype)
                for a in inputs]
    if fn.name == "where":
        operands = operands[1:]
    if all(a.op is Op.CONST for a in inputs):
        operands.append(np.empty((), "float64"))
    dtype = np.result_type(*operands)
    if dtype.kind in "biu" and not fn.keeps_integers:
        dtype = np.dtype("float64")
    return str(dtype)


def _map(name: str, *args: Any) -> BlockArray:
    fn = ELEMENTWISE[name]
    inputs = tuple(asarray(a) for a in args)
    if len(inputs) != fn.arity:
        raise TypeError(f"{name} takes {fn.arity} arguments, got {len(inputs)}")
    attrs = ops.Map(name)
    shape = infer_shape(Op.MAP, [a.shape for a in inputs], attrs)
    return BlockArray(Op.MAP, inputs, shape, _result_dtype(fn, inputs), attrs)


def _unary(fn: str):
    def apply(x: Any) -> BlockArray:
        return _map(fn, x)

    apply.__name__ = fn
    apply.__doc__ = f"Elementwise {fn}."
    return apply


exp, log, log1p, expm1, sqrt, tanh, sigmoid, erf, square = (
    _unary(f) for f in ("exp", "log", "log1p", "expm1", "sqrt", "tanh", "sigmoid", "erf", "square")
)
absolute = _unary("abs")
negative = _unary("negative")


def maximum(a: Any, b: Any) -> BlockArray:
    return _map("maximum", a, b)


def minimum(a: Any, b: Any) -> BlockArray:
    return _map("minimum", a, b)


def logaddexp(a: Any, b: Any) -> BlockArray:
    return _map("logaddexp", a, b)


def where(condition: Any, a: Any, b: Any) -> BlockArray:
    return _map("where", condition, a, b)


# reductions --------------------------------------------------------------------------------


def _axes(x: BlockArray, axis: int | Sequence[int] | None) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a % x.ndim for a in axes))


def _reduce(fn: str, x: BlockArray, axis: int | Sequence[int] | None, keepdims: bool) -> BlockArray:
    reduction = REDUCTIONS[fn]
    axes = _axes(x, axis)
    if reduction.is_arg and len(axes) != 1:
        raise ValueError(f"{fn} needs exactly one axis")
    attrs = ops.Reduce(fn, axes, keepdims)
    shape = infer_shape(Op.REDUCE, [x.shape], attrs)
    dtype = "int64" if reduction.is_arg else (x.dtype if fn != "sum" or x.dtype != "bool" else "int64")
    return BlockArray(Op.REDUCE, (x,), shape, dtype, attrs)


def sum(x: BlockArray, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> BlockArray:  # noqa: A001
    return x.sum(axis, keepdims)


def mean(x: BlockArray, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> BlockArray:
    return x.mean(axis, keepdims)


# contractions ------------------------------------------------------------------------------


def transpose(x: BlockArray, axes: Sequence[int] | None = None) -> BlockArray:
    perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(a % x.ndim for a in axes)
    if perm == tuple(range(x.ndim)):
        return x
    return BlockArray(Op.TRANSPOSE, (x,), tuple(x.shape[p] for p in perm), x.dtype, ops.Transpose(perm))


def _result_type(*xs: BlockArray) -> str:
    return str(np.result_type(*[np.empty((), dtype=x.dtype) for x in xs]))


def einsum(subscripts: str, *operands: BlockArray) -> BlockArray:
    """A contraction in explicit form (``"ijk,jf,kf->if"``); transposed operands fold in."""
    operands = tuple(asarray(o) for o in operands)
    terms, _, out = subscripts.replace(" ", "").partition("->")
    if not _:
        raise ValueError("einsum needs explicit output subscripts ('...->...')")
    terms_list = terms.split(",")
    folded = []
    for term, x in zip(terms_list, operands, strict=True):
        while isinstance(x.attrs, ops.Transpose):  # a view: relabel instead of moving data
            perm = x.attrs.perm
            term = "".join(term[perm.index(a)] for a in range(len(perm)))
            x = x.inputs[0]
        folded.append((term, x))
    subscripts = ",".join(t for t, _ in folded) + "->" + out
    inputs = tuple(x for _, x in folded)
    attrs = ops.Einsum(subscripts)
    shape = infer_shape(Op.EINSUM, [x.shape for x in inputs], attrs)
    return BlockArray(Op.EINSUM, inputs, shape, _result_type(*inputs), attrs)


def matmul(a: BlockArray, b: BlockArray) -> BlockArray:
    if a.ndim not in (1, 2) or b.ndim not in (1, 2):
        raise ValueError(f"matmul of {a.shape} and {b.shape}: only 1-D and 2-D operands")
    left = "ij"[2 - a.ndim:] if a.ndim == 2 else "j"
    right = "jk" if b.ndim == 2 else "j"
    out = ("i" if a.ndim == 2 else "") + ("k" if b.ndim == 2 else "")
    return einsum(f"{left},{right}->{out}", a, b)


def tensordot(a: BlockArray, b: BlockArray, axes: int | tuple[Sequence[int], Sequence[int]] = 2) -> BlockArray:
    if isinstance(axes, int):
        axes_a, axes_b = list(range(a.ndim - axes, a.ndim)), list(range(axes))
    else:
        axes_a, axes_b = [x % a.ndim for x in axes[0]], [x % b.ndim for x in axes[1]]
    letters = iter(string.ascii_letters)
    la = [next(letters) for _ in range(a.ndim)]
    lb = [next(letters) for _ in range(b.ndim)]
    for x, y in zip(axes_a, axes_b, strict=True):
        lb[y] = la[x]
    out = [c for i, c in enumerate(la) if i not in axes_a] + [c for i, c in enumerate(lb) if i not in axes_b]
    return einsum(f"{''.join(la)},{''.join(lb)}->{''.join(out)}", a, b)


# job-supplied block functions and stored outputs --------------------------------------------


def map_blocks(kernel: Kernel, *arrays: BlockArray,
               outputs: Sequence[tuple[tuple[int, ...], str, int | None] | tuple[tuple[int, ...], str, int | None, int]],
               block_rows: Sequence[int | None] | None = None,
               cost: Callable[[Sequence[tuple[int, ...]]], Work] | None = None) -> tuple[BlockArray, ...]:
    """Apply ``kernel.fn`` to matching row blocks of ``arrays``; one lazy array per output.

    Input ``j`` is cut into row blocks of ``block_rows[j]`` rows (all inputs into the same
    number of blocks), or passed whole when ``block_rows`` is None. ``outputs`` declares each
    result as (shape, dtype, rows per block — None for a whole, single-block result), and for
    an object result the bytes of one of its blocks, which its dtype cannot tell the cost
    model and the memory budget (PageRank's graph blocks: a CSR matrix each). The
    function returns a tuple when there are several outputs. Blocks are fixed by the job,
    so the planner never re-tiles these arrays (dask's ``map_blocks``, NumS's ``map``).

    ``cost(shapes)`` declares what one call does, from the shapes of its arguments, as work
    by kind (``planner.cost.WORK_KINDS``), e.g. ``lambda s: {"qr_flops": qr_flops(*s[0])}``
    for a QR; the estimate prices each kind at its calibrated rate. Undeclared block
    functions are counted as one elementwise operation per input element.
    """
    if cost is not None:
        kernel = dataclasses.replace(kernel, cost=cost)
    rows = tuple(block_rows) if block_rows is not None else None
    if rows is not None:
        counts = {-(-a.shape[0] // r) for a, r in zip(arrays, rows, strict=True) if r}
        if len(counts) != 1:
            raise ValueError(f"map_blocks {kernel.name}: inputs are not cut into the same number of blocks")
    return tuple(
        BlockArray(Op.BLOCKWISE, tuple(arrays), out[0], str(np.dtype(out[1])),
                   ops.Blockwise(kernel, i, rows, out[2], out[3] if len(out) > 3 else None))
        for i, out in enumerate(outputs)
    )


def store(x: BlockArray, target: ArrayInfo | TableTarget, options: StorageOptions) -> BlockArray:
    """Write ``x`` into the existing Zarr array ``target``, block by block, on the workers;
    or, into a ``TableTarget``, as a Parquet dataset of one file per block (``io.table_writer``).

    Computes to [bytes written, PUT requests] (a Parquet target: and [bytes read, GET
    requests], its id column's). ``target``'s chunks must tile ``x``'s blocks.
    """
    if tuple(target.shape) != x.shape:
        raise ValueError(f"store: {target.uri} has shape {target.shape}, the array has {x.shape}")
    counts = 4 if isinstance(target, TableTarget) else 2
    return BlockArray(Op.STORE, (x,), (counts,), "int64", ops.Store(target, options))


# capturing a graph -------------------------------------------------------------------------


def capture(outputs: Sequence[BlockArray]) -> Graph:
    """The IR graph of ``outputs``: topologically ordered, common subexpressions merged."""
    nodes: list[Node] = []
    by_key: dict[Node, int] = {}
    by_id: dict[int, int] = {}

    def visit(x: BlockArray) -> int:
        # iterative post-order: programs of thousands of ops must not hit the recursion limit
        stack: list[tuple[BlockArray, bool]] = [(x, False)]
        while stack:
            item, ready = stack.pop()
            if id(item) in by_id:
                continue
            if not ready:
                stack.append((item, True))
                stack.extend((i, False) for i in reversed(item.inputs) if id(i) not in by_id)
                continue
            inputs = tuple(by_id[id(i)] for i in item.inputs)
            sparse = sparsity_of(item.op, item.attrs, item.shape, [nodes[u] for u in inputs])
            node = Node(item.op, inputs, item.shape, item.dtype, item.attrs, sparse)
            index = by_key.get(node)
            if index is None:
                index = by_key[node] = len(nodes)
                nodes.append(node)
            by_id[id(item)] = index
        return by_id[id(x)]

    outs = tuple(visit(o) for o in outputs)
    return Graph(tuple(nodes), outs)


__all__ = [
    "BlockArray", "absolute", "asarray", "bound_values", "capture", "const", "einsum", "erf", "exp", "expm1",
    "from_numpy", "from_zarr", "log", "log1p", "logaddexp", "matmul", "maximum", "mean", "minimum", "negative",
    "sigmoid", "sqrt", "square", "sum", "tanh", "tensordot", "transpose", "value", "where",
]
