"""Generated row loops (``kernels/rowloop.py``) agree with the step-by-step NumPy reference."""

from __future__ import annotations

import ast

import numpy as np
import pytest
import scipy.special

from arrayjob import kernels
from arrayjob import lazy as la
from arrayjob.kernels import compiler, rowloop
from arrayjob.planner.ops import COMPARISONS, ELEMENTWISE
from tests.harness.helpers import block_kernel

N, D = 200_000, 5  # large enough to be cut into pieces (where row loops apply)


def _data(scale=1.0):
    rng = np.random.default_rng(11)
    X = rng.standard_normal((N, D)) * scale
    X[:50] *= 1e3  # margins far into exp's overflow
    return {"X": X, "w": rng.standard_normal(D), "y": (rng.random(N) > 0.5) * 1.0, "b": np.float64(0.25),
            "yi": rng.integers(0, 2, N)}


@pytest.fixture(autouse=True)
def loops_on_small_blocks(monkeypatch):
    monkeypatch.setattr(compiler, "LOOP_MIN_BYTES", 0)


def test_small_blocks_keep_the_pieces(monkeypatch):
    monkeypatch.setattr(compiler, "LOOP_MIN_BYTES", 10 * N * D * 8)
    x, w = la.value("X", (N, D)), la.value("w", (D,))
    _check([x.T @ la.exp(x @ w)], _data(), fits=False)


def _check(outputs, values, *, fits=True):
    kernel, args = block_kernel(outputs, values)
    program = compiler.Program(kernel, args)
    assert (program.row_loop is not None) == fits
    with np.errstate(all="ignore"):
        want = kernels.interpret(kernel, *args)
        got = kernels.run(kernel, *args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                    strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-9, equal_nan=True)


def _logistic():
    """The logistic loss and its gradient (``jobs/logreg.py``)."""
    x, y, w, b = la.value("X", (N, D)), la.value("y", (N,)), la.value("w", (D,)), la.value("b", ())
    sign = 2.0 * y - 1.0
    margin = sign * (x @ w + b)
    dz = -sign * la.sigmoid(-margin)
    return [la.sum(la.logaddexp(0.0, -margin)), x.T @ dz, la.sum(dz)]


def _shifted():
    """logaddexp and sigmoid of the same value, logaddexp's other argument not 0."""
    x, w, s = la.value("X", (N, D)), la.value("w", (D,)), la.value("s", ())
    z = x @ w
    return [la.sum(la.logaddexp(s, z)), x.T @ la.sigmoid(z)]


def _loop(outputs, values, rewrites=None):
    kernel, args = block_kernel(outputs, values)
    program = compiler.Program(kernel, args)
    return rowloop._RowLoop(program, program.chunking.carrier, rewrites)


def _row_loop(tree):
    return next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "row_loop")


def _calls(node):
    return [ast.unparse(call.func) for call in ast.walk(node) if isinstance(call, ast.Call)]


def test_logistic_loss_and_gradient_is_one_loop():
    _check(_logistic(), _data())


@pytest.mark.parametrize("fn", ["max", "min"])
def test_the_largest_label_beside_the_loss_keeps_the_loop(fn):
    """logreg asks for y.max() in the same pass when K is to be found: the loop keeps it as an
    accumulator (NaN wins, as in NumPy) instead of giving the block back to the pieces."""
    y = la.value("y", (N,))
    extreme = getattr(y, fn)()
    data = _data()
    _check([*_logistic(), extreme], data)
    data["y"][N // 2] = np.nan
    _check([*_logistic(), extreme], data)
    loop = _loop([*_logistic(), extreme], data)
    assert "_" + rowloop.EXTREMES[fn] in _calls(_row_loop(loop.tree()))


@pytest.mark.parametrize("shift", [0.0, 1.5])
def test_logaddexp_and_sigmoid_of_the_same_value_share_one_exp(shift):
    data = _data() | {"s": np.float64(shift)}
    data["X"][50:53] = [[np.inf] * D, [-np.inf] * D, [np.nan] * D]  # margins ±inf and NaN
    _check(_shifted(), data)
    calls = _calls(_row_loop(_loop(_shifted(), data).tree()))
    assert calls.count("_logaddexp_sigmoid") == 1 and "_sigmoid" not in calls and "_logaddexp" not in calls


def test_every_elementwise_function_of_the_ir_has_a_scalar_rule():
    assert set(rowloop.SCALAR) == set(ELEMENTWISE)


def test_the_logistic_loop_is_one_pass_over_the_rows():
    tree = _loop(_logistic(), _data()).tree()
    compile(tree, "<row loop>", "exec")
    function = _row_loop(tree)
    (rows,) = [s for s in function.body if isinstance(s, ast.For)]
    assert ast.unparse(rows.iter) == "range(n)"
    # X @ w per row, then Xᵀ @ dz accumulated: each a loop over the columns
    columns = [s for s in rows.body if isinstance(s, ast.For)]
    assert [ast.unparse(s.iter) for s in columns] == ["range(d)", "range(d)"]
    body = ast.Module(rows.body, [])
    assert sorted(_calls(body)) == ["_logaddexp_sigmoid", "range", "range"]
    ops = {type(node.op).__name__ for node in ast.walk(body) if isinstance(node, ast.BinOp | ast.UnaryOp)}
    assert ops == {"Add", "Sub", "Mult", "USub"}
    # the loss, the gradient and its sum: summed over the rows and returned
    summed = {ast.unparse(s.target.value if isinstance(s.target, ast.Subscript) else s.target)
              for s in ast.walk(body) if isinstance(s, ast.AugAssign)}
    returned = [ast.unparse(e) for e in function.body[-1].value.elts]
    assert len(returned) == 3 and set(returned) < summed


def test_share_exp_pairs_the_two_calls_where_the_first_was():
    body = ast.parse("u = _sigmoid(x)\nv = u * 2.0\nt = _logaddexp(p, x)\ns = _logaddexp(u, x)").body
    assert ast.unparse(rowloop.share_exp(body)) == "t, u = _logaddexp_sigmoid(p, x)\nv = u * 2.0\ns = _logaddexp(u, x)"
    body = ast.parse("u = _sigmoid(x)\nt = _logaddexp(v, x)\nv = x * 2.0").body  # v is not a loop constant
    assert rowloop.share_exp(body) == body


@pytest.mark.parametrize("rewrite", rowloop.REWRITES, ids=lambda r: r.__name__)
@pytest.mark.parametrize(("program", "shift"), [(_logistic, 0.0), (_shifted, 0.0), (_shifted, 1.5)])
def test_a_rewrite_changes_the_loop_and_not_its_results(rewrite, program, shift):
    special = [np.inf, -np.inf, np.nan, 0.0, 800.0, -800.0]
    data = _data() | {"s": np.float64(shift)}  # rows 0-49: margins far into exp's overflow
    data["X"][50:50 + len(special)] = 1.0
    data["X"][50:50 + len(special), 0] = special
    plain, rewritten = _loop(program(), data, rewrites=()), _loop(program(), data, rewrites=(rewrite,))
    assert ast.dump(plain.tree()) != ast.dump(rewritten.tree())
    kernel, args = block_kernel(program(), data)
    runs = plain.runner(), rewritten.runner()
    # the whole block, then each special row alone (in a sum, one NaN would hide the others)
    for rows in [slice(None), *(slice(k, k + 1) for k in range(50, 50 + len(special)))]:
        block = [a[rows] if np.ndim(a) and len(a) == N else a for a in args]
        results = []
        for run in runs:
            vals = block + [None] * len(kernel.steps)
            with np.errstate(all="ignore"):
                run(vals)
            results.append([vals[o] for o in kernel.outputs])
        for a, b in zip(*results, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=0, equal_nan=True, err_msg=f"rows {rows}")


@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_the_loops_logaddexp_is_numpys_to_a_few_ulps_value_by_value(shift):
    """logaddexp's log1p is taken from log (``_log1p_unit``): each value, compiled with the
    row loop's own decorator (its fastmath), over z whose e^-|z| spans (0, 1]."""
    n = 1500
    z = np.concatenate([-np.geomspace(1e-12, 740, n // 3), np.geomspace(1e-12, 740, n // 3),
                        np.linspace(-3, 3, n - 2 * (n // 3))])
    function = ast.parse("def row_loop(z, s, loss, slope):\n"
                         "    for i in range(len(z)):\n"
                         "        loss[i], slope[i] = _logaddexp_sigmoid(s, z[i])\n"
                         "    return (loss, slope)\n").body[0]
    function.decorator_list = [rowloop._jit()]
    source = ast.unparse(ast.fix_missing_locations(ast.Module([*ast.parse(rowloop.HELPERS).body, function], [])))
    loss, slope = rowloop._compiled(source + "\n")(z, shift, np.empty(n), np.empty(n))
    np.testing.assert_allclose(loss, np.logaddexp(shift, z), rtol=5e-16, atol=0)
    np.testing.assert_allclose(slope, scipy.special.expit(z), rtol=5e-16, atol=1e-300)


@pytest.mark.parametrize("fn", sorted(set(rowloop.SCALAR) - COMPARISONS - {"where"}))
def test_every_elementwise_function_matches_numpy_at_the_extremes(fn):
    x, w, y = la.value("X", (N, D)), la.value("w", (D,)), la.value("y", (N,))
    z = x @ w
    args = (z,) if ELEMENTWISE[fn].arity == 1 else (z, y - 0.5 * z)
    if fn == "power":
        args = (la._map("abs", z), y + 0.5)
    v = la._map(fn, *args)
    _check([la.sum(v), x.T @ v], _data())


def test_comparisons_and_where_with_integer_per_row_arguments():
    x, w, yi = la.value("X", (N, D)), la.value("w", (D,)), la.value("yi", (N,), "int64")
    z = x @ w
    v = la.where(z > yi, z * yi, -z) + la.where(z <= 0.0, 1.0, 2.0)
    _check([la.sum(v), x.T @ v], _data())


def test_programs_outside_the_template_keep_the_pieces():
    x, w = la.value("X", (N, D)), la.value("w", (D,))
    _check([(x * x).sum(axis=0), x.T @ (x @ w)], _data(), fits=False)  # elementwise on X
    C = la.value("C", (3, D))
    values = {**_data(), "C": np.ones((3, D))}
    _check([(x @ C.T).sum(axis=0), x.T @ (x @ w)], values, fits=False)  # X times a matrix
