"""How a generated row loop (``rowloop``) reads its wide argument X: a dense array or CSR.

A layout is everything in the loop that depends on how X is stored: the function's
parameters for X, the statement that finds the row count ``n`` (and ``d``), the inner loop
over what X stores of row ``i``, and that element's value and column. ``X @ w`` and
``Xᵀ @ v`` are written once, over a layout (``rowloop._RowLoop``)::

    dense:  for c in range(d):                 t += X[i, c] * w[c]
    CSR:    for k in range(Xp[i], Xp[i + 1]):  t += Xd[k] * w[Xi[k]]

Over a CSR block (SystemML's Row template over sparse rows) the loop visits the non-zeros
only, in one pass over ``data`` and ``indices``, and nothing of X's dense shape is made.

Over a CSC block (``CSCColumns``: a wide matrix's row blocks are held by columns, ``io.
locations.HELD_BY_COLUMNS_ABOVE``) the same program is one compiled function of three loops:
a sweep over the columns makes every ``X @ w`` (w read in order, each product scattered into
an n-vector of the block's rows), the loop over the rows does the elementwise steps and sums,
and a second sweep over the columns makes every ``Xᵀ @ v`` (v gathered, each gradient entry
written once, in order). The vectors read at random are the block's n rows, not X's d
columns: at 2^20 columns w and the gradient (8 MB each) no longer fit a core's cache, and the
row loop over CSR, which gathers from one and scatters into the other per non-zero, took
twice as long as the two column sweeps (``benchmarks/bench_micro.py sparse-loop``).

A layout makes the statements of a product (``dot``, ``scatter``) and what runs before and
after the loop over the rows (``before_rows``, ``after_rows``). The ast builders the loop
generator shares with the layouts live here too.
"""

from __future__ import annotations

import ast
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

ROW_INDEX, COLUMN_INDEX, ELEMENT_INDEX = "i", "c", "k"


def load(name: str) -> ast.Name:
    return ast.Name(name, ast.Load())


def store(name: str) -> ast.Name:
    return ast.Name(name, ast.Store())


def call(function: str, *args: ast.expr) -> ast.Call:
    """``function(*args)``; ``function`` may be dotted (``math.exp``)."""
    module, _, name = function.rpartition(".")
    func: ast.expr = ast.Attribute(load(module), name, ast.Load()) if module else load(name)
    return ast.Call(func, list(args), [])


def item(array: str, index: ast.expr) -> ast.Subscript:
    """``array[index]``, read."""
    return ast.Subscript(load(array), index, ast.Load())


class RowLayout(ABC):
    """How X is stored, as the generated loop reads it."""

    params: ClassVar[tuple[str, ...]]  # the generated function's parameters for X
    dtypes: ClassVar[frozenset[str]]  # X's element types the loop takes

    @abstractmethod
    def header(self) -> ast.stmt:
        """Sets ``n`` (the rows) and ``d`` (the columns) if not a parameter."""

    @abstractmethod
    def over_row(self, *body: ast.stmt) -> ast.For:
        """``body`` once per element X stores of row ``i``."""

    @abstractmethod
    def value(self) -> ast.expr:
        """The element's value, inside ``over_row``."""

    @abstractmethod
    def column(self) -> ast.expr:
        """The element's column, inside ``over_row``."""

    @abstractmethod
    def arguments(self, X: Any) -> list[Any]:
        """The values of ``params`` for the block ``X``."""

    def dot(self, target: str, w: str) -> list[ast.stmt]:
        """In the loop over the rows: ``target`` = this row of X · the d-vector ``w``."""
        w_c = ast.Subscript(load(w), self.column(), ast.Load())
        product = ast.BinOp(self.value(), ast.Mult(), w_c)
        return [ast.Assign([store(target)], ast.Constant(0.0)),
                self.over_row(ast.AugAssign(store(target), ast.Add(), product))]

    def scatter(self, target: str, v: ast.expr) -> list[ast.stmt]:
        """In the loop over the rows: the d-vector ``target`` += this row of X × ``v``."""
        t_c = ast.Subscript(load(target), self.column(), ast.Store())
        return [self.over_row(ast.AugAssign(t_c, ast.Add(), ast.BinOp(self.value(), ast.Mult(), v)))]

    def before_rows(self, dots: list[tuple[str, str]], scatters: list[str]) -> list[ast.stmt]:
        """Before the loop over the rows, given every ``dot``'s (target, w) and ``scatter``'s target."""
        return []

    def after_rows(self, scatters: list[str]) -> list[ast.stmt]:
        """After the loop over the rows, given every ``scatter``'s target."""
        return []


class DenseRows(RowLayout):
    """X as an n × d array: every column ``c`` of row ``i``."""

    params = ("X",)
    dtypes = frozenset({"float64"})

    def header(self) -> ast.stmt:
        return ast.Assign([ast.Tuple([store("n"), store("d")], ast.Store())],
                          ast.Attribute(load("X"), "shape", ast.Load()))

    def over_row(self, *body: ast.stmt) -> ast.For:
        return ast.For(store(COLUMN_INDEX), call("range", load("d")), list(body), [])

    def value(self) -> ast.expr:
        return item("X", ast.Tuple([load(ROW_INDEX), load(COLUMN_INDEX)], ast.Load()))

    def column(self) -> ast.expr:
        return load(COLUMN_INDEX)

    def arguments(self, X: Any) -> list[Any]:
        return [np.ascontiguousarray(X)]


class CSRRows(RowLayout):
    """X as a CSR matrix (values ``Xd``, column indices ``Xi``, row pointers ``Xp``): the
    non-zeros ``k`` of row ``i``. Indices of either width, sorted or not, and repeated
    entries (summed, as SciPy does) are all read as they are. ``d`` is a parameter: the
    accumulators of ``Xᵀ @ v`` are d-vectors."""

    params = ("Xd", "Xi", "Xp", "d")
    dtypes = frozenset({"float64", "float32"})  # float32 values are widened per product

    def header(self) -> ast.stmt:
        rows = ast.BinOp(call("len", load("Xp")), ast.Sub(), ast.Constant(1))
        return ast.Assign([store("n")], rows)

    def over_row(self, *body: ast.stmt) -> ast.For:
        end = ast.BinOp(load(ROW_INDEX), ast.Add(), ast.Constant(1))
        span = call("range", item("Xp", load(ROW_INDEX)), item("Xp", end))
        return ast.For(store(ELEMENT_INDEX), span, list(body), [])

    def value(self) -> ast.expr:
        return item("Xd", load(ELEMENT_INDEX))

    def column(self) -> ast.expr:
        return item("Xi", load(ELEMENT_INDEX))

    def arguments(self, X: Any) -> list[Any]:
        X = X.tocsr()  # a CSR block as it is, a CSC one converted (one pass, nnz-sized)
        return [np.ascontiguousarray(X.data), _unsigned(X.indices), _unsigned(X.indptr), int(X.shape[1])]


class CSCColumns(RowLayout):
    """X as a CSC matrix (values ``Xd``, row indices ``Xi``, column pointers ``Xp``; ``n`` a
    parameter): the products are sweeps over the columns before and after the loop over the
    rows, which reads this row's ``X @ w`` from the first sweep's n-vector and leaves the
    ``v`` of each ``Xᵀ @ v`` in an n-vector for the second. Each sweep sums a product's terms
    in SciPy's order (a row's in column order; a column's in row order)."""

    params = ("Xd", "Xi", "Xp", "n")
    dtypes = frozenset({"float64", "float32"})

    def header(self) -> ast.stmt:
        return ast.Assign([store("d")], ast.BinOp(call("len", load("Xp")), ast.Sub(), ast.Constant(1)))

    def over_row(self, *body: ast.stmt) -> ast.For:
        raise NotImplementedError("a CSC block is read by columns (dot, scatter)")

    def over_column(self, *body: ast.stmt) -> ast.For:
        """``body`` once per element X stores of column ``c``."""
        end = ast.BinOp(load(COLUMN_INDEX), ast.Add(), ast.Constant(1))
        span = call("range", item("Xp", load(COLUMN_INDEX)), item("Xp", end))
        return ast.For(store(ELEMENT_INDEX), span, list(body), [])

    def value(self) -> ast.expr:
        return item("Xd", load(ELEMENT_INDEX))

    def column(self) -> ast.expr:
        return load(COLUMN_INDEX)

    def row(self) -> ast.expr:
        return item("Xi", load(ELEMENT_INDEX))

    def arguments(self, X: Any) -> list[Any]:
        X = X.tocsc()  # a CSC block as it is, a CSR one converted
        return [np.ascontiguousarray(X.data), _unsigned(X.indices), _unsigned(X.indptr), int(X.shape[0])]

    def dot(self, target: str, w: str) -> list[ast.stmt]:
        return [ast.Assign([store(target)], item(f"{target}_rows", load(ROW_INDEX)))]

    def scatter(self, target: str, v: ast.expr) -> list[ast.stmt]:
        here = ast.Subscript(load(f"{target}_rows"), load(ROW_INDEX), ast.Store())
        return [ast.Assign([here], v)]

    def before_rows(self, dots: list[tuple[str, str]], scatters: list[str]) -> list[ast.stmt]:
        made: list[ast.stmt] = [ast.Assign([store(f"{t}_rows")], call("np.zeros", load("n"))) for t, _ in dots]
        made += [ast.Assign([store(f"{t}_rows")], call("np.empty", load("n"))) for t in scatters]
        if not dots:
            return made
        adds = [ast.AugAssign(ast.Subscript(load(f"{t}_rows"), self.row(), ast.Store()), ast.Add(),
                              ast.BinOp(self.value(), ast.Mult(), item(w, self.column()))) for t, w in dots]
        return [*made, ast.For(store(COLUMN_INDEX), call("range", load("d")), [self.over_column(*adds)], [])]

    def after_rows(self, scatters: list[str]) -> list[ast.stmt]:
        if not scatters:
            return []
        sums = [ast.Assign([store(f"{t}_c")], ast.Constant(0.0)) for t in scatters]
        adds = [ast.AugAssign(store(f"{t}_c"), ast.Add(),
                              ast.BinOp(self.value(), ast.Mult(), item(f"{t}_rows", self.row()))) for t in scatters]
        writes = [ast.AugAssign(ast.Subscript(load(t), load(COLUMN_INDEX), ast.Store()), ast.Add(), load(f"{t}_c"))
                  for t in scatters]
        return [ast.For(store(COLUMN_INDEX), call("range", load("d")), [*sums, self.over_column(*adds), *writes], [])]


def _unsigned(index: np.ndarray) -> np.ndarray:
    """CSR's indices, never negative, seen as unsigned (no copy): numba tests a signed index
    for a wrap-around at every access. Xᵀ(Xw − y) as one loop over a 1,000,000 × 2^20 block,
    30 non-zeros a row, 1 thread: 0.69 s of CPU with int32 indices, 0.27 s seen as uint32."""
    index = np.ascontiguousarray(index)
    return index.view(np.dtype(f"u{index.dtype.itemsize}"))
