"""Generated row loops: a row-parallel block program as one compiled pass over its rows.

SystemML's Row template, for the programs that fit it: one large row-carrying argument X
(n × d), everything else per row a scalar. ``X @ w`` becomes a dot product per row,
elementwise steps become scalar arithmetic, ``Xᵀ @ v`` and sums over rows become
accumulators. Each row of X is read from memory once and used while it is in registers,
instead of two BLAS matrix-vector calls and a numexpr pass per cache-sized piece. The
logistic loss and gradient of a 100,000 × 64 block: 12.5 ms as pieces, about one pass over
the block (4 ms) as a loop.

Steps that don't depend on the rows run before the loop and steps that need a finished sum
after it, both with NumPy. A program with any other kind of step (elementwise on X, a
product of X with a matrix, integer arithmetic) is not rewritten (``build`` returns None).

The generated source is written to a file named by its hash and compiled by numba with its
on-disk cache, so each process compiles a program once and later processes load it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from arrayjob.planner.ir import parse_einsum

MATRIX, ROW, PRE, ACC, POST = "matrix", "row", "pre", "acc", "post"
FLOAT = "float64"
# scalar forms of the elementwise functions; helpers are defined in the generated module
SCALAR = {
    "negative": "(-{0})", "exp": "math.exp({0})", "log": "_log({0})", "log1p": "_log1p({0})",
    "expm1": "math.expm1({0})", "sqrt": "_sqrt({0})", "abs": "abs({0})", "square": "({0}*{0})",
    "tanh": "math.tanh({0})", "sin": "math.sin({0})", "cos": "math.cos({0})", "erf": "math.erf({0})",
    "reciprocal": "(1.0/{0})", "sigmoid": "_sigmoid({0})",
    "add": "({0}+{1})", "subtract": "({0}-{1})", "multiply": "({0}*{1})", "divide": "({0}/{1})",
    "power": "({0}**{1})", "maximum": "_maximum({0},{1})", "minimum": "_minimum({0},{1})",
    "logaddexp": "_logaddexp({0},{1})",
    "greater": "({0}>{1})", "less": "({0}<{1})", "greater_equal": "({0}>={1})", "less_equal": "({0}<={1})",
    "equal": "({0}=={1})", "not_equal": "({0}!={1})", "where": "({1} if {0} else {2})",
}
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

@jit
def _logaddexp(a, b):
    if a == b:
        return a + 0.6931471805599453
    if a != a or b != b:
        return a + b
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))

@jit
def _logaddexp_sigmoid(a, x):
    # (logaddexp(a, x), sigmoid(x)): the logistic loss and its derivative share one exp
    # when a == 0, as in log(1 + e^x) = max(x, 0) + log1p(e^-|x|)
    if a == 0.0 and x == x:
        e = math.exp(-abs(x))
        return (x if x > 0 else 0.0) + math.log1p(e), (1.0 / (1.0 + e) if x >= 0 else e / (1.0 + e))
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


class _RowLoop:
    def __init__(self, program: Any, carrier: int) -> None:
        self.kernel, self.shapes, self.dtypes = program.kernel, program.shapes, program.dtypes
        n_args = self.kernel.n_args
        shape = self.shapes[carrier]
        if len(shape) != 2 or self.dtypes[carrier] != FLOAT:
            raise _Unfit
        self.carrier, (self.n, self.d) = carrier, shape
        self.role: dict[int, str] = {}
        for s in range(n_args):
            self.role[s] = MATRIX if s == carrier else ROW if self._per_row(s) else PRE
            if self.role[s] == ROW and self.dtypes[s] not in ("float64", "float32", "int64", "int32", "bool"):
                raise _Unfit
        self.lines: list[str] = []  # the loop body
        self.accumulators: list[tuple[int, str]] = []  # (slot, "scalar" | "vector")
        self.steps_pre: list[int] = []
        self.steps_post: list[int] = []
        for i, step in enumerate(self.kernel.steps):
            self._classify(n_args + i, step)
        if not self.accumulators:
            raise _Unfit  # nothing summed over the rows: the pieces are as good
        self._share_exp()
        for o in self.kernel.outputs:
            if self.role[o] in (MATRIX, ROW):
                raise _Unfit

    def _per_row(self, slot: int) -> bool:
        shape = self.shapes[slot]
        return shape == (self.n,) or shape == (self.n, 1)

    def _scalar_pre(self, slot: int) -> bool:
        return self.role[slot] == PRE and math.prod(self.shapes[slot]) == 1

    def _name(self, slot: int) -> str:
        role = self.role[slot]
        if role == ROW and slot < self.kernel.n_args:
            return f"a{slot}[i]" if len(self.shapes[slot]) == 1 else f"a{slot}[i, 0]"
        if role == PRE:
            return f"p{slot}"
        return f"t{slot}"

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
        op = step.op
        if op == "map":
            fn = step.attrs[0]
            if fn not in SCALAR or MATRIX in roles or not self._per_row(slot):
                raise _Unfit
            if any(r == PRE and not self._scalar_pre(s) for s, r in zip(step.inputs, roles, strict=True)):
                raise _Unfit
            if step.dtype not in (FLOAT, "bool") or (step.dtype == "bool") != (fn in _COMPARISONS):
                raise _Unfit
            ins = [self.dtypes[s] for s in step.inputs]
            if fn != "where" and "bool" in ins:
                raise _Unfit  # arithmetic on booleans: NumPy's types, not ours
            self.role[slot] = ROW
            self.lines.append(f"t{slot} = " + SCALAR[fn].format(*(self._name(s) for s in step.inputs)))
        elif op == "einsum" and len(step.inputs) == 2:
            terms, out = parse_einsum(step.attrs[0])
            (ra, rb), (sa, sb) = roles, step.inputs
            if rb == MATRIX:
                (ra, rb), (sa, sb), terms = (rb, ra), (sb, sa), terms[::-1]
            x, other = terms
            if ra != MATRIX or len(x) != 2 or x[0] == x[1] or self.dtypes[sb] != FLOAT:
                raise _Unfit
            if rb == PRE and other == x[1] and out == x[0] and self.shapes[sb] == (self.d,):
                self.role[slot] = ROW  # X @ w: a dot product per row
                self.lines += [f"t{slot} = 0.0", "for c in range(d):", f"    t{slot} += X[i, c] * p{sb}[c]"]
            elif rb == ROW and other == x[0] and out == x[1] and len(self.shapes[sb]) == 1:
                self.role[slot] = ACC  # Xᵀ @ v: accumulated
                self.accumulators.append((slot, "vector"))
                self.lines += ["for c in range(d):", f"    t{slot}[c] += X[i, c] * {self._name(sb)}"]
            else:
                raise _Unfit
        elif op == "reduce" and step.attrs[0] == "sum" and roles == [ROW] and step.dtype == FLOAT:
            source = step.inputs[0]
            if self.shapes[slot] == ():
                self.role[slot] = ACC
                self.accumulators.append((slot, "scalar"))
                self.lines.append(f"t{slot} += {self._name(source)}")
            elif self._per_row(slot):  # (n, 1) -> (n,)
                self.role[slot] = ROW
                self.lines.append(f"t{slot} = {self._name(source)}")
            else:
                raise _Unfit
        else:
            raise _Unfit

    def _share_exp(self) -> None:
        """``t = _logaddexp(p, x)`` and ``u = _sigmoid(x)`` of the same x (a logistic loss
        and its gradient) become one ``_logaddexp_sigmoid`` call: one exp per row instead
        of two (``benchmarks/bench_profile.py kernel logreg`` times the loop, and the loop
        with its exp and its log1p replaced by arithmetic)."""
        sigmoid = {m.group(2): (i, m.group(1)) for i, line in enumerate(self.lines)
                   if (m := re.fullmatch(r"(t\d+) = _sigmoid\((t\d+|a\d+\[i(?:, 0)?\])\)", line))}
        for i, line in enumerate(self.lines):
            m = re.fullmatch(r"(t\d+) = _logaddexp\((p\d+|t\d+|a\d+\[i(?:, 0)?\]),(p\d+|t\d+|a\d+\[i(?:, 0)?\])\)", line)
            if not m:
                continue
            for other, x in ((m.group(2), m.group(3)), (m.group(3), m.group(2))):
                if x in sigmoid and other.startswith("p"):  # a loop constant, defined before any line
                    j, out = sigmoid.pop(x)
                    first = min(i, j)
                    self.lines[first] = f"{m.group(1)}, {out} = _logaddexp_sigmoid({other},{x})"
                    self.lines[max(i, j)] = "pass"
                    break

    # -- the generated function ---------------------------------------------------------------
    def source(self) -> str:
        n_args = self.kernel.n_args
        rows = [s for s in range(n_args) if self.role[s] == ROW]
        pres = sorted({s for s in range(len(self.shapes)) if self.role.get(s) == PRE
                       and any(f"p{s}" in line for line in self.lines)})
        params = ["X", *(f"a{s}" for s in rows), *(f"p{s}" for s in pres)]
        body = [f"def row_loop({', '.join(params)}):", "    n, d = X.shape"]
        for slot, kind in self.accumulators:
            body.append(f"    t{slot} = " + ("0.0" if kind == "scalar" else "np.zeros(d)"))
        body.append("    for i in range(n):")
        body += [f"        {line}" for line in self.lines]
        body.append(f"    return ({''.join(f't{s}, ' for s, _ in self.accumulators)})")
        self.params = (rows, pres)
        return HELPERS + "\n\n@numba.njit(cache=True, nogil=True, error_model='numpy', fastmath={'reassoc', 'contract'})\n" \
            + "\n".join(body) + "\n"

    def runner(self) -> Callable[[list[Any]], None]:
        from arrayjob.kernels.block import evaluate

        loop = _compiled(self.source())
        rows, pres = self.params
        kernel, n_args = self.kernel, self.kernel.n_args
        accumulators = [s for s, _ in self.accumulators]
        pre_steps, post_steps = self.steps_pre, self.steps_post
        scalar = {s for s in pres if math.prod(self.shapes[s]) == 1}

        def run(vals: list[Any]) -> None:
            for s in pre_steps:
                step = kernel.steps[s - n_args]
                vals[s] = evaluate(step, [vals[j] for j in step.inputs])
            X = np.ascontiguousarray(vals[self.carrier])
            args = [np.ascontiguousarray(vals[s]) for s in rows]
            args += [float(np.asarray(vals[s]).reshape(())) if s in scalar
                     else np.ascontiguousarray(vals[s], dtype=np.float64) for s in pres]
            for s, total in zip(accumulators, loop(X, *args), strict=True):
                vals[s] = np.asarray(total)
            for s in post_steps:
                step = kernel.steps[s - n_args]
                vals[s] = evaluate(step, [vals[j] for j in step.inputs])

        return run


_COMPARISONS = {"greater", "less", "greater_equal", "less_equal", "equal", "not_equal"}
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
