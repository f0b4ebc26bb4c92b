"""L-BFGS whose whole state is a small record, so that a fit can stop and go on exactly.

Limited-memory BFGS (Nocedal & Wright, Numerical Optimization, 2nd ed., algorithm 7.4 and
7.5): the search direction is the two-loop recursion over the last ``memory`` pairs
(s, y) = (step, change of gradient), scaled by sᵀy / yᵀy of the newest pair; the step
length comes from SciPy's strong-Wolfe line search (``scipy.optimize.line_search``, the
algorithm of N&W 3.5/3.6). Everything is deterministic: the same state and the same
function give the same next state, bit for bit. So a run that saves ``LBFGSState`` after an
iteration and one that resumes from it reach the same result as a run never stopped, which
SciPy's L-BFGS-B, whose state lives in Fortran work arrays, cannot offer.

Stops when the gradient's 2-norm is at most ``tol``, after ``max_iter`` iterations, or when
no step along the steepest descent satisfies the Wolfe conditions (f cannot decrease at
machine precision). There is no test on the decrease of f: near a tight ``tol`` an
iteration lowers f by less than 64 eps relatively and still shrinks the gradient (SciPy's
``ftol`` test would stop there unconverged). Cost per iteration: one
evaluation of f and g most of the time (more when the line search brackets), and
O(memory · n) flops on the driver.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.optimize

Function = Callable[[np.ndarray], tuple[float, np.ndarray]]


@dataclass
class LBFGSState:
    """Where the fit is: the iterate, f and g there, the (s, y) pairs (oldest first), the
    iterations done, and whether the fit has stopped."""

    x: np.ndarray
    f: float
    g: np.ndarray
    s: np.ndarray  # (pairs, n)
    y: np.ndarray  # (pairs, n)
    iteration: int = 0
    done: bool = False

    @classmethod
    def start(cls, x: np.ndarray, fun: Function) -> LBFGSState:
        f, g = fun(x)
        empty = np.empty((0, len(x)))
        return cls(np.array(x, dtype=np.float64), float(f), np.array(g, dtype=np.float64), empty, empty.copy())

    def as_dict(self) -> dict[str, Any]:
        return {"x": self.x, "f": self.f, "g": self.g, "s": self.s, "y": self.y, "iteration": self.iteration,
                "done": self.done}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LBFGSState:
        return cls(np.asarray(state["x"]), float(state["f"]), np.asarray(state["g"]), np.asarray(state["s"]),
                   np.asarray(state["y"]), int(state["iteration"]), bool(state["done"]))


def direction(g: np.ndarray, s: np.ndarray, y: np.ndarray) -> np.ndarray:
    """−H g by the two-loop recursion over the pairs (s, y), oldest first (N&W algorithm 7.4).
    Without pairs, the steepest descent scaled to unit length (the first step's length is
    then the line search's to find)."""
    if len(s) == 0:
        return -g / max(1.0, float(np.linalg.norm(g)))
    q = g.copy()
    rho = 1.0 / np.einsum("ij,ij->i", y, s)
    alpha = np.empty(len(s))
    for i in range(len(s) - 1, -1, -1):
        alpha[i] = rho[i] * float(s[i] @ q)
        q -= alpha[i] * y[i]
    q *= float(s[-1] @ y[-1]) / float(y[-1] @ y[-1])
    for i in range(len(s)):
        beta = rho[i] * float(y[i] @ q)
        q += (alpha[i] - beta) * s[i]
    return -q


def _line_search(fun: Function, state: LBFGSState, d: np.ndarray) -> float | None:
    def f(x: np.ndarray) -> float:
        return fun(x)[0]

    def fprime(x: np.ndarray) -> np.ndarray:
        return fun(x)[1]

    with warnings.catch_warnings():  # a failed search is reported by its result (None), handled here
        warnings.filterwarnings("ignore", "The line search algorithm")
        alpha = scipy.optimize.line_search(f, fprime, state.x, d, gfk=state.g, old_fval=state.f)[0]
    return None if alpha is None else float(alpha)


def step(fun: Function, state: LBFGSState, *, tol: float, max_iter: int, memory: int = 10) -> LBFGSState:
    """One iteration from ``state``: the next state (``done`` set when the fit stops there)."""
    d = direction(state.g, state.s, state.y)
    s_hist, y_hist = state.s, state.y
    if float(state.g @ d) >= 0:  # not a descent direction (rounding in a flat region): forget the pairs
        s_hist, y_hist = s_hist[:0], y_hist[:0]
        d = direction(state.g, s_hist, y_hist)
    alpha = _line_search(fun, state, d)
    if alpha is None and len(s_hist):  # the pairs mislead: try the steepest descent once
        s_hist, y_hist = s_hist[:0], y_hist[:0]
        d = direction(state.g, s_hist, y_hist)
        alpha = _line_search(fun, state, d)
    if alpha is None:
        return LBFGSState(state.x, state.f, state.g, state.s, state.y, state.iteration, done=True)
    x = state.x + alpha * d
    f, g = fun(x)
    s, y = x - state.x, g - state.g
    if float(s @ y) > np.finfo(float).eps * float(y @ y):  # keep H positive definite
        s_hist = np.vstack([s_hist, s])[-memory:]
        y_hist = np.vstack([y_hist, y])[-memory:]
    iteration = state.iteration + 1
    done = iteration >= max_iter or float(np.linalg.norm(g)) <= tol or not np.any(s)
    return LBFGSState(x, float(f), np.array(g, dtype=np.float64), s_hist, y_hist, iteration, done)


def minimize(fun: Function, state: LBFGSState, *, tol: float, max_iter: int, memory: int = 10,
             on_iteration: Callable[[LBFGSState], None] = lambda state: None) -> LBFGSState:
    """Iterate from ``state`` until the fit stops; ``on_iteration`` sees each new state (to save it)."""
    if float(np.linalg.norm(state.g)) <= tol or state.iteration >= max_iter:
        state.done = True
    while not state.done:
        state = step(fun, state, tol=tol, max_iter=max_iter, memory=memory)
        on_iteration(state)
    return state
