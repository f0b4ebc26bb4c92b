"""Generated row loops (``planner/rowloop.py``) agree with the step-by-step NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from arrayjob import lazy as la
from arrayjob.planner import blockprogram, rowloop
from arrayjob.planner.ir import COMPARISONS, ELEMENTWISE
from tests.helpers import block_kernel

N, D = 200_000, 5  # large enough to be cut into pieces (where row loops apply)


def _data(scale=1.0):
    rng = np.random.default_rng(11)
    X = rng.standard_normal((N, D)) * scale
    X[:50] *= 1e3  # margins far into exp's overflow
    return {"X": X, "w": rng.standard_normal(D), "y": (rng.random(N) > 0.5) * 1.0, "b": np.float64(0.25),
            "yi": rng.integers(0, 2, N)}


@pytest.fixture(autouse=True)
def loops_on_small_blocks(monkeypatch):
    monkeypatch.setattr(blockprogram, "LOOP_MIN_BYTES", 0)


def test_small_blocks_keep_the_pieces(monkeypatch):
    monkeypatch.setattr(blockprogram, "LOOP_MIN_BYTES", 10 * N * D * 8)
    x, w = la.value("X", (N, D)), la.value("w", (D,))
    _check([x.T @ la.exp(x @ w)], _data(), fits=False)


def _check(outputs, values, *, fits=True):
    kernel, args = block_kernel(outputs, values)
    program = blockprogram.Program(kernel, args)
    assert (program.row_loop is not None) == fits
    with np.errstate(all="ignore"):
        want = kernel.interpret(*args)
        got = kernel(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                    strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-9, equal_nan=True)


def test_logistic_loss_and_gradient_is_one_loop():
    x, y, w, b = la.value("X", (N, D)), la.value("y", (N,)), la.value("w", (D,)), la.value("b", ())
    sign = 2.0 * y - 1.0
    margin = sign * (x @ w + b)
    dz = -sign * la.sigmoid(-margin)
    _check([la.sum(la.logaddexp(0.0, -margin)), x.T @ dz, la.sum(dz)], _data())


@pytest.mark.parametrize("shift", [0.0, 1.5])
def test_logaddexp_and_sigmoid_of_the_same_value_share_one_exp(shift):
    x, w, s = la.value("X", (N, D)), la.value("w", (D,)), la.value("s", ())
    z = x @ w
    outputs = [la.sum(la.logaddexp(s, z)), x.T @ la.sigmoid(z)]
    data = _data() | {"s": np.float64(shift)}
    data["X"][50:53] = [[np.inf] * D, [-np.inf] * D, [np.nan] * D]  # margins ±inf and NaN
    _check(outputs, data)
    kernel, args = block_kernel(outputs, data)
    carrier = next(i for i, a in enumerate(args) if np.ndim(a) == 2)
    source = rowloop._RowLoop(blockprogram.Program(kernel, args), carrier).source()
    assert "_logaddexp_sigmoid(p" in source and "_sigmoid(t" not in source


@pytest.mark.parametrize("fn", sorted(set(rowloop.SCALAR) - COMPARISONS - {"where"}))
def test_every_elementwise_function_matches_numpy_at_the_extremes(fn):
    x, w, y = la.value("X", (N, D)), la.value("w", (D,)), la.value("y", (N,))
    z = x @ w
    args = (z,) if ELEMENTWISE[fn][0] == 1 else (z, y - 0.5 * z)
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
