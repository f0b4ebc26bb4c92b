"""How a generated row loop (``rowloop``) reads its wide argument X: a dense array or CSR.

A layout is everything in the loop that depends on how X is stored: the function's
parameters for X, the statement that finds the row count ``n`` (and ``d``), the inner loop
over what X stores of row ``i``, and that element's value and column. ``X @ w`` and
``Xᵀ @ v`` are written once, over a layout (``rowloop._RowLoop``)::

    dense:  for c in range(d):                 t += X[i, c] * w[c]
    CSR:    for k in range(Xp[i], Xp[i + 1]):  t += Xd[k] * w[Xi[k]]

Over a CSR block (SystemML's Row template over sparse rows) the loop visits the non-zeros
only, in one pass over ``data`` and ``indices``, and nothing of X's dense shape is made.
The ast builders the loop generator shares with the layouts live here too.
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


def _unsigned(index: np.ndarray) -> np.ndarray:
    """CSR's indices, never negative, seen as unsigned (no copy): numba tests a signed index
    for a wrap-around at every access. Xᵀ(Xw − y) as one loop over a 1,000,000 × 2^20 block,
    30 non-zeros a row, 1 thread: 0.69 s of CPU with int32 indices, 0.27 s seen as uint32."""
    index = np.ascontiguousarray(index)
    return index.view(np.dtype(f"u{index.dtype.itemsize}"))
