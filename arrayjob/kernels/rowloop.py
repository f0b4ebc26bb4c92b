"""Generated row loops: a row-parallel block program as one compiled pass over its rows.

SystemML's Row template, for the programs that fit it: one large row-carrying argument X
(n × d), everything else per row a scalar. ``X @ w`` becomes a dot product per row,
elementwise steps become scalar arithmetic, ``Xᵀ @ v`` and sums over rows become
accumulators. Each row of X is read from memory once and used while it is in registers,
instead of two BLAS matrix-vector calls and a numexpr pass per cache-sized piece. The
logistic loss and gradient of a 100,000 × 64 block: 12.5 ms as pieces, about one pass over
the block (4 ms) as a loop.

X may be a CSR block (``scipy.sparse``, ``Program.sparse``): then the loop over a row's
columns visits its non-zeros only (``row_layouts.CSRRows``), ``X @ w`` a sparse dot product
and ``Xᵀ @ v`` a scatter into a d-vector, and X is never made dense.

Steps that don't depend on the rows run before the loop and steps that need a finished sum
after it, both with NumPy. A program with any other kind of step (elementwise on X, a
product of X with a matrix, integer arithmetic) is not rewritten (``build`` returns None).

The loop is built as a Python ``ast`` tree: one ``for`` over the rows with a statement per
step, each elementwise step's expression made by its rule in ``SCALAR`` (op name -> a
function from argument nodes to an expression node). Rewrites (``REWRITES``) are functions
from a loop body to a loop body, applied before the function is assembled. The tree's source
(``ast.unparse``) is written to a file named by its hash and compiled by numba with its
on-disk cache, so each process compiles a program once and later processes load it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arrayjob.kernels.row_layouts import ROW_INDEX, CSCColumns, CSRRows, DenseRows, RowLayout
from arrayjob.kernels.row_layouts import call as _call
from arrayjob.kernels.row_layouts import load as _load
from arrayjob.kernels.row_layouts import store as _store
from arrayjob.planner.ops import COMPARISONS, ELEMENTWISE, Einsum, Map, Reduce


def _function(name: str) -> Callable[..., ast.expr]:
    return lambda *args: _call(name, *args)


def _binary(op: type[ast.operator]) -> Callable[[ast.expr, ast.expr], ast.expr]:
    return lambda a, b: ast.BinOp(a, op(), b)


def _compare(op: type[ast.cmpop]) -> Callable[[ast.expr, ast.expr], ast.expr]:
    return lambda a, b: ast.Compare(a, [op()], [b])


# The scalar form of each elementwise function of ir.UNARY, BINARY and TERNARY: op name -> a
# function from its argument nodes to its expression node. The _-prefixed functions are
# defined in HELPERS: NumPy's answers where math has none or differs (NaN, ±inf, out of domain).
SCALAR: dict[str, Callable[..., ast.expr]] = {
    "negative": lambda x: ast.UnaryOp(ast.USub(), x), "exp": _function("math.exp"),
    "log": _function("_log"), "log1p": _function("_log1p"), "expm1": _function("math.expm1"),
    "sqrt": _function("_sqrt"), "abs": _function("abs"), "square": lambda x: ast.BinOp(x, ast.Mult(), x),
    "tanh": _function("math.tanh"), "sin": _function("math.sin"), "cos": _function("math.cos"),
    "erf": _function("math.erf"), "reciprocal": lambda x: ast.BinOp(ast.Constant(1.0), ast.Div(), x),
    "sigmoid": _function("_sigmoid"),
    "add": _binary(ast.Add), "subtract": _binary(ast.Sub), "multiply": _binary(ast.Mult),
    "divide": _binary(ast.Div), "power": _binary(ast.Pow), "maximum": _function("_maximum"),
    "minimum": _function("_minimum"), "logaddexp": _function("_logaddexp"),
    "greater": _compare(ast.Gt), "less": _compare(ast.Lt), "greater_equal": _compare(ast.GtE),
    "less_equal": _compare(ast.LtE), "equal": _compare(ast.Eq), "not_equal": _compare(ast.NotEq),
    "where": lambda condition, a, b: ast.IfExp(condition, a, b),
}
# Reductions over the rows other than sums: reduction -> its elementwise step, and where the
# accumulator starts (max and min of no rows are NumPy errors; a block has rows).
EXTREMES = {"max": "maximum", "min": "minimum"}
START = {"scalar": 0.0, "max": -math.inf, "min": math.inf}
MATRIX, ROW, PRE, ACC, POST = "matrix", "row", "pre", "acc", "post"
FLOAT = "float64"

HELPERS = '''
import math
import numba
import numpy as np

jit = numba.njit(inline="always", error_model="numpy")

@jit
def _sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)

@numba.njit(error_model="numpy")
def _log1p_unit(e):
    # log1p for e in [0, 1] from log, within 2 ulps of NumPy's (Goldberg 1991, theorem 4):
    # glibc's log1p costs about twice its log, and the logistic loss calls it once per row.
    # Not inlined by numba, so the loop's fastmath cannot fold (1 + e) - 1 into e.
    u = 1.0 + e
    if u == 1.0:
        return e
    return math.log(u) * (e / (u - 1.0))

@jit
def _logaddexp(a, b):
    if a == b:
        return a + 0.6931471805599453
    if a != a or b != b:
        return a + b
    if a > b:
        return a + _log1p_unit(math.exp(b - a))
    return b + _log1p_unit(math.exp(a - b))

@jit
def _logaddexp_sigmoid(a, x):
    # (logaddexp(a, x), sigmoid(x)): the logistic loss and its derivative share one exp
    # when a == 0, as in log(1 + e^x) = max(x, 0) + log1p(e^-|x|)
    if a == 0.0 and x == x:
        e = math.exp(-abs(x))
        return (x if x > 0 else 0.0) + _log1p_unit(e), (1.0 / (1.0 + e) if x >= 0 else e / (1.0 + e))
    return _logaddexp(a, x), _sigmoid(x)

@jit
def _maximum(a, b):
    if a != a or b != b:
        return a + b
    return a if a >= b else b

@jit
def _minimum(a, b):
    if a != a or b != b:
        return a + b
    return a if a <= b else b

@jit
def _log(x):
    if x > 0 or x != x:
        return math.log(x)
    return -math.inf if x == 0 else math.nan

@jit
def _log1p(x):
    if x > -1 or x != x:
        return math.log1p(x)
    return -math.inf if x == -1 else math.nan

@jit
def _sqrt(x):
    return math.sqrt(x) if x >= 0 or x != x else math.nan
'''


class _Unfit(Exception):
    """The program is not a row loop."""


def build(program: Any, carrier: int) -> Callable[[list[Any]], None] | None:
    """A function that fills ``vals`` (the program's slots) with its outputs, or None."""
    try:
        return _RowLoop(program, carrier).runner()
    except _Unfit:
        return None


Rewrite = Callable[[list[ast.stmt]], list[ast.stmt]]


class _RowLoop:
    def __init__(self, program: Any, carrier: int, rewrites: Sequence[Rewrite] | None = None) -> None:
        self.kernel, self.shapes, self.dtypes = program.kernel, program.shapes, program.dtypes
        n_args = self.kernel.n_args
        shape, sparse = self.shapes[carrier], program.sparse
        if sparse - {carrier}:
            raise _Unfit  # a sparse argument is read in one place only: the carrier
        held_by_columns = carrier in sparse and program.formats.get(carrier) == "csc"
        self.layout: RowLayout = CSCColumns() if held_by_columns else CSRRows() if carrier in sparse else DenseRows()
        if len(shape) != 2 or self.dtypes[carrier] not in self.layout.dtypes:
            raise _Unfit
        self.carrier, (self.n, self.d) = carrier, shape
        self.role: dict[int, str] = {}
        for s in range(n_args):
            self.role[s] = MATRIX if s == carrier else ROW if self._per_row(s) else PRE
            if self.role[s] == ROW and self.dtypes[s] not in ("float64", "float32", "int64", "int32", "bool"):
                raise _Unfit
        self.body: list[ast.stmt] = []  # the loop body: per row, a statement or two per step
        self.accumulators: list[tuple[int, str]] = []  # (slot, "scalar" | "vector" | "max" | "min")
        self.dots: list[tuple[str, str]] = []  # X @ w: (target, w)
        self.scatters: list[str] = []  # Xᵀ @ v: target
        self.steps_pre: list[int] = []
        self.steps_post: list[int] = []
        for i, step in enumerate(self.kernel.steps):
            self._classify(n_args + i, step)
        if not self.accumulators:
            raise _Unfit  # nothing summed over the rows: the pieces are as good
        for o in self.kernel.outputs:
            if self.role[o] in (MATRIX, ROW):
                raise _Unfit
        for rewrite in REWRITES if rewrites is None else rewrites:
            self.body = rewrite(self.body)
        read = {node.id for stmt in self.body for node in ast.walk(stmt) if isinstance(node, ast.Name)}
        read.update(w for _, w in self.dots)  # read before the rows by a layout that sweeps columns
        self.rows = [s for s in range(n_args) if self.role[s] == ROW]
        self.pres = [s for s in range(len(self.shapes)) if self.role.get(s) == PRE and f"p{s}" in read]

    def _per_row(self, slot: int) -> bool:
        shape = self.shapes[slot]
        return shape == (self.n,) or shape == (self.n, 1)

    def _scalar_pre(self, slot: int) -> bool:
        return self.role[slot] == PRE and math.prod(self.shapes[slot]) == 1

    def _value(self, slot: int) -> ast.expr:
        """``slot`` read inside the loop: this row's element, a loop constant or a temporary."""
        role = self.role[slot]
        if role == ROW and slot < self.kernel.n_args:
            row = _load(ROW_INDEX)
            index = row if len(self.shapes[slot]) == 1 else ast.Tuple([row, ast.Constant(0)], ast.Load())
            return ast.Subscript(_load(f"a{slot}"), index, ast.Load())
        return _load(f"p{slot}" if role == PRE else f"t{slot}")

    def _classify(self, slot: int, step: Any) -> None:
        roles = [self.role[s] for s in step.inputs]
        if all(r == PRE for r in roles):
            self.role[slot] = PRE
            self.steps_pre.append(slot)
            return
        if any(r in (ACC, POST) for r in roles):
            if any(r in (MATRIX, ROW) for r in roles):
                raise _Unfit
            self.role[slot] = POST
            self.steps_post.append(slot)
            return
        attrs, target = step.attrs, f"t{slot}"
        if isinstance(attrs, Map):
            fn = attrs.fn
            if fn not in SCALAR or MATRIX in roles or not self._per_row(slot):
                raise _Unfit
            if any(r == PRE and not self._scalar_pre(s) for s, r in zip(step.inputs, roles, strict=True)):
                raise _Unfit
            if step.dtype not in (FLOAT, "bool") or (step.dtype == "bool") != (fn in COMPARISONS):
                raise _Unfit
            ins = [self.dtypes[s] for s in step.inputs]
            if fn != "where" and "bool" in ins:
                raise _Unfit  # arithmetic on booleans: NumPy's types, not ours
            self.role[slot] = ROW
            self.body.append(_assign(target, SCALAR[fn](*(self._value(s) for s in step.inputs))))
        elif isinstance(attrs, Einsum) and len(step.inputs) == 2:
            terms, out = attrs.terms
            (ra, rb), (sa, sb) = roles, step.inputs
            if rb == MATRIX:
                (ra, rb), (sa, sb), terms = (rb, ra), (sb, sa), terms[::-1]
            x, other = terms
            if ra != MATRIX or len(x) != 2 or x[0] == x[1] or self.dtypes[sb] != FLOAT:
                raise _Unfit
            if rb == PRE and other == x[1] and out == x[0] and self.shapes[sb] == (self.d,):
                self.role[slot] = ROW  # X @ w: a dot product per row
                self.dots.append((target, f"p{sb}"))
                self.body += self.layout.dot(target, f"p{sb}")
            elif rb == ROW and other == x[0] and out == x[1] and len(self.shapes[sb]) == 1:
                self.role[slot] = ACC  # Xᵀ @ v: accumulated
                self.accumulators.append((slot, "vector"))
                self.scatters.append(target)
                self.body += self.layout.scatter(target, self._value(sb))
            else:
                raise _Unfit
        elif isinstance(attrs, Reduce) and attrs.fn in EXTREMES and roles == [ROW] and step.dtype == FLOAT \
                and self.dtypes[step.inputs[0]] == FLOAT and self.shapes[slot] == ():
            # the largest (smallest) over the rows, NaN first as in NumPy: logreg's largest label
            self.role[slot] = ACC
            self.accumulators.append((slot, attrs.fn))
            self.body.append(_assign(target, SCALAR[EXTREMES[attrs.fn]](_load(target), self._value(step.inputs[0]))))
        elif isinstance(attrs, Reduce) and attrs.fn == "sum" and roles == [ROW] and step.dtype == FLOAT:
            source = step.inputs[0]
            if self.shapes[slot] == ():
                self.role[slot] = ACC
                self.accumulators.append((slot, "scalar"))
                self.body.append(_add_to(_store(target), self._value(source)))
            elif self._per_row(slot):  # (n, 1) -> (n,)
                self.role[slot] = ROW
                self.body.append(_assign(target, self._value(source)))
            else:
                raise _Unfit
        else:
            raise _Unfit

    # -- the generated function ---------------------------------------------------------------
    def tree(self) -> ast.Module:
        """HELPERS, then ``row_loop(X, a…, p…)`` (``row_loop(Xd, Xi, Xp, d, a…, p…)`` over a
        CSR block): one ``for`` over the rows, returning the accumulators."""
        params = [*self.layout.params, *(f"a{s}" for s in self.rows), *(f"p{s}" for s in self.pres)]
        shape = self.layout.header()
        zeros = [_assign(f"t{s}", _call("np.zeros", _load("d")) if kind == "vector" else _start(START[kind]))
                 for s, kind in self.accumulators]
        rows = ast.For(_store(ROW_INDEX), _call("range", _load("n")), self.body, [])
        before = self.layout.before_rows(self.dots, self.scatters)
        after = self.layout.after_rows(self.scatters)
        result = ast.Return(ast.Tuple([_load(f"t{s}") for s, _ in self.accumulators], ast.Load()))
        signature = ast.arguments(posonlyargs=[], args=[ast.arg(p) for p in params], kwonlyargs=[],
                                  kw_defaults=[], defaults=[])
        function = ast.FunctionDef("row_loop", signature, [shape, *zeros, *before, rows, *after, result], [_jit()])
        return ast.fix_missing_locations(ast.Module([*ast.parse(HELPERS).body, function], []))

    def source(self) -> str:
        return ast.unparse(self.tree()) + "\n"

    def runner(self) -> Callable[[list[Any]], None]:
        from arrayjob.kernels.primitives import evaluate

        loop = _compiled(self.source())
        rows, pres = self.rows, self.pres
        kernel, n_args = self.kernel, self.kernel.n_args
        accumulators = [s for s, _ in self.accumulators]
        pre_steps, post_steps = self.steps_pre, self.steps_post
        scalar = {s for s in pres if math.prod(self.shapes[s]) == 1}
        carrier, layout = self.carrier, self.layout

        def run(vals: list[Any]) -> None:
            for s in pre_steps:
                step = kernel.steps[s - n_args]
                vals[s] = evaluate(step, [vals[j] for j in step.inputs])
            args: list[Any] = layout.arguments(vals[carrier])
            args += [np.ascontiguousarray(vals[s]) for s in rows]
            args += [float(np.asarray(vals[s]).reshape(())) if s in scalar
                     else np.ascontiguousarray(vals[s], dtype=np.float64) for s in pres]
            for s, total in zip(accumulators, loop(*args), strict=True):
                vals[s] = np.asarray(total)
            for s in post_steps:
                step = kernel.steps[s - n_args]
                vals[s] = evaluate(step, [vals[j] for j in step.inputs])

        return run


def _start(value: float) -> ast.expr:
    """An accumulator's first value as a node (``math.inf``: ast.unparse writes inf as 1e309)."""
    if math.isinf(value):
        inf = ast.Attribute(_load("math"), "inf", ast.Load())
        return inf if value > 0 else ast.UnaryOp(ast.USub(), inf)
    return ast.Constant(value)


def _assign(target: str, value: ast.expr) -> ast.Assign:
    return ast.Assign([_store(target)], value)


def _add_to(target: ast.Name | ast.Subscript, value: ast.expr) -> ast.AugAssign:
    return ast.AugAssign(target, ast.Add(), value)


def _jit() -> ast.Call:
    """The loop's decorator: numba's on-disk cache, no GIL, NumPy's float errors, and sums
    that may be reassociated (vectorised)."""
    options = {"cache": ast.Constant(True), "nogil": ast.Constant(True), "error_model": ast.Constant("numpy"),
               "fastmath": ast.Set([ast.Constant("reassoc"), ast.Constant("contract")])}
    return ast.Call(ast.Attribute(_load("numba"), "njit", ast.Load()), [],
                    [ast.keyword(k, v) for k, v in options.items()])


# -- rewrites of the loop body ----------------------------------------------------------------
def _elementwise(stmt: ast.stmt, op: str) -> tuple[ast.expr, list[ast.expr]] | None:
    """(target, arguments) if ``stmt`` is ``target = op(arguments)`` as ``SCALAR`` writes it."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call)):
        return None
    args = stmt.value.args
    if len(args) != ELEMENTWISE[op].arity or ast.dump(stmt.value) != ast.dump(SCALAR[op](*args)):
        return None
    return stmt.targets[0], args


def share_exp(body: list[ast.stmt]) -> list[ast.stmt]:
    """``t = logaddexp(p, x)`` and ``u = sigmoid(x)`` of the same x with p a loop constant (a
    logistic loss and its gradient) become ``t, u = _logaddexp_sigmoid(p, x)`` where the first
    of the two was: one exp per row instead of two (``benchmarks/bench_profile.py kernel logreg``
    times the loop, and the loop with its exp and its log1p replaced by arithmetic)."""
    stored = {node.id for stmt in body for node in ast.walk(stmt)
              if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    sigmoid: dict[str, tuple[int, ast.expr]] = {}  # ast.dump(x) -> (where, u)
    for j, stmt in enumerate(body):
        if match := _elementwise(stmt, "sigmoid"):
            sigmoid[ast.dump(match[1][0])] = (j, match[0])
    out: list[ast.stmt | None] = list(body)
    for i, stmt in enumerate(body):
        if not (match := _elementwise(stmt, "logaddexp")):
            continue
        t, (a, b) = match
        for p, x in ((a, b), (b, a)):
            # p must be defined before the loop, as the pair may move up to where u was
            constant = isinstance(p, ast.Name) and p.id not in stored and p.id != ROW_INDEX
            if constant and ast.dump(x) in sigmoid:
                j, u = sigmoid.pop(ast.dump(x))
                pair = ast.Assign([ast.Tuple([t, u], ast.Store())], _call("_logaddexp_sigmoid", p, x))
                out[min(i, j)] = ast.copy_location(pair, body[min(i, j)])
                out[max(i, j)] = None
                break
    return [stmt for stmt in out if stmt is not None]


REWRITES: tuple[Rewrite, ...] = (share_exp,)
_LOADED: dict[str, Callable[..., Any]] = {}


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = Path(base) / "arrayjob" / "row-loops"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:  # a read-only home: compile in the temporary directory
        fallback = Path(tempfile.gettempdir()) / "arrayjob-row-loops"
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


def _compiled(source: str) -> Callable[..., Any]:
    """``row_loop`` from ``source``, compiled once per process and cached on disk by numba."""
    key = hashlib.sha1(source.encode()).hexdigest()[:16]
    if key in _LOADED:
        return _LOADED[key]
    path = _cache_dir() / f"row_loop_{key}.py"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(source)
        os.replace(partial, path)  # atomic: concurrent workers write the same text
    name = f"arrayjob_row_loop_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _LOADED[key] = module.row_loop
    return module.row_loop
