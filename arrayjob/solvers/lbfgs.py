"""L-BFGS whose whole state is a small record, so that a fit can stop and go on exactly.

Limited-memory BFGS (Nocedal & Wright, Numerical Optimization, 2nd ed., algorithm 7.4 and
7.5): the search direction is the two-loop recursion over the last ``memory`` pairs
(s, y) = (step, change of gradient), scaled by sᵀy / yᵀy of the newest pair. The step length
comes from a line search that tries the unit step first and gets f and ∇f from each trial
point in one evaluation (one pass over the data): it accepts a step that satisfies the weak
Wolfe conditions (N&W 3.6; c₁ = 10⁻⁴, c₂ = 0.9), or, where f has reached its rounding level,
the approximate Wolfe conditions of Hager & Zhang ("A new conjugate gradient method with
guaranteed descent and an efficient line search", 2005, eq. 4.2: f may rise by rounding if the
directional derivative has fallen enough), which go on lowering ∇f where differences of f are
noise. Otherwise it halves or doubles the step, by cubic interpolation between the bracket's
ends. Everything is deterministic: the same state and the same function give the same next
state, bit for bit. So a run that saves ``LBFGSState`` after an iteration and one that resumes
from it reach the same result as a run never stopped, which SciPy's L-BFGS-B, whose state
lives in Fortran work arrays, cannot offer.

Stops when the gradient's 2-norm is at most ``tol``, after ``max_iter`` iterations, or when
no step can lower f by more than rounding (``state.flat``: "no further decrease possible at
machine precision"): the quasi-Newton step's predicted decrease −½∇f·d is below f's rounding level
(``rounding``), checked before any evaluation, or the line search brackets a step of that
size without a decrease. So a ``tol`` below what the data can reach costs no backtracking at
the end. Cost per iteration: one evaluation of f and ∇f most of the time (a few more when
the line search brackets, mostly in the first iteration, whose step length is unknown), and
O(memory · n) flops on the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Function = Callable[[np.ndarray], tuple[float, np.ndarray]]


@dataclass
class LBFGSState:
    """Where the fit is: the iterate, f and g there, the (s, y) pairs (oldest first), the
    iterations done, and whether the fit has stopped."""

    x: np.ndarray
    f: float
    g: np.ndarray
    s: Sequence[np.ndarray]  # the pairs' n-vectors, oldest first (``remember``: no copy of them)
    y: Sequence[np.ndarray]
    iteration: int = 0
    done: bool = False
    flat: bool = False  # stopped because no step can lower f by more than rounding

    @classmethod
    def start(cls, x: np.ndarray, fun: Function) -> LBFGSState:
        f, g = fun(x)
        return cls(np.array(x, dtype=np.float64), float(f), np.array(g, dtype=np.float64), (), ())

    def as_dict(self) -> dict[str, Any]:
        n = len(self.x)
        return {"x": self.x, "f": self.f, "g": self.g, "s": np.asarray(self.s).reshape(len(self.s), n),
                "y": np.asarray(self.y).reshape(len(self.y), n), "iteration": self.iteration,
                "done": self.done, "flat": self.flat}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LBFGSState:
        s, y = (tuple(np.asarray(state[key], dtype=np.float64)) for key in ("s", "y"))  # rows of the saved (pairs, n)
        return cls(np.asarray(state["x"]), float(state["f"]), np.asarray(state["g"]), s, y, int(state["iteration"]),
                   bool(state["done"]), bool(state.get("flat", False)))


def remember(pairs: Sequence[np.ndarray], v: np.ndarray, memory: int) -> tuple[np.ndarray, ...]:
    """The last ``memory`` of ``pairs`` and ``v``: a new tuple of the same n-vectors (stacking them
    anew copied memory × n doubles an iteration: 26 ms at n = 2²⁰ on the driver, the workers idle)."""
    return (*pairs, v)[-memory:]


def direction(g: np.ndarray, s: Sequence[np.ndarray], y: Sequence[np.ndarray]) -> np.ndarray:
    """−H g by the two-loop recursion over the pairs (s, y), oldest first (N&W algorithm 7.4).
    Without pairs, the steepest descent scaled to unit length (the first step's length is
    then the line search's to find)."""
    if len(s) == 0:
        return -g / max(1.0, float(np.linalg.norm(g)))
    q = g.copy()
    rho = 1.0 / np.array([float(yi @ si) for yi, si in zip(y, s, strict=True)])
    alpha = np.empty(len(s))
    for i in range(len(s) - 1, -1, -1):
        alpha[i] = rho[i] * float(s[i] @ q)
        q -= alpha[i] * y[i]
    q *= float(s[-1] @ y[-1]) / float(y[-1] @ y[-1])
    for i in range(len(s)):
        beta = rho[i] * float(y[i] @ q)
        q += (alpha[i] - beta) * s[i]
    return -q


SUFFICIENT_DECREASE = 1e-4  # c₁ (Armijo)
CURVATURE = 0.9  # c₂ (weak Wolfe): loose, as quasi-Newton methods want (N&W 3.1)
MAX_TRIALS = 30  # evaluations one line search may make
ROUNDING_ULPS = 0.5  # a change of f below half a unit in the last place of |f| rounds away


def rounding(f: float) -> float:
    """The least change of f that rounding does not swallow: ``ROUNDING_ULPS`` units in the
    last place of |f|."""
    return ROUNDING_ULPS * np.finfo(float).eps * max(abs(f), np.finfo(float).tiny)


@dataclass(frozen=True)
class Trial:
    """A point on the search line: the step length, f and ∇f there, and f's slope along d."""

    alpha: float
    f: float
    g: np.ndarray
    slope: float


def _line_search(fun: Function, state: LBFGSState, d: np.ndarray) -> tuple[Trial | None, bool]:
    """A step along d that satisfies the (weak, or approximate) Wolfe conditions, or the
    longest step found that lowers f; or None, and whether that is because no step along d
    can change f by more than rounding."""
    f0, slope0 = state.f, float(state.g @ d)
    noise = rounding(f0)
    lo: Trial | None = None  # the longest step known to satisfy the decrease condition
    hi: Trial | None = None  # the shortest step known to fail it
    alpha = 1.0
    for _ in range(MAX_TRIALS):
        f, g = fun(state.x + alpha * d)
        trial = Trial(alpha, float(f), np.array(g, dtype=np.float64), float(np.asarray(g) @ d))
        decrease = trial.f <= f0 + SUFFICIENT_DECREASE * alpha * slope0 or (
            trial.f <= f0 + noise and trial.slope <= (1 - 2 * SUFFICIENT_DECREASE) * slope0)  # Hager–Zhang
        if decrease and trial.slope >= CURVATURE * slope0:
            return trial, False
        if decrease and (lo is None or alpha > lo.alpha):
            lo = trial
        elif not decrease:
            hi = trial
        if hi is not None and -(hi.alpha - (lo.alpha if lo else 0.0)) * slope0 <= noise:
            return (lo, False) if lo is not None and lo.f < f0 else (None, True)  # below what f resolves
        alpha = _next_alpha(lo, hi, f0, slope0)
    return (lo, False) if lo is not None and lo.f < f0 else (None, False)


def _next_alpha(lo: Trial | None, hi: Trial | None, f0: float, slope0: float) -> float:
    """The next step length: twice the longest good step while no step has failed; else the
    minimiser of the cubic through the bracket's ends (f and slope at each), kept inside the
    bracket's middle 80 % (bisection when the cubic has none)."""
    if hi is None:
        assert lo is not None
        return 2.0 * lo.alpha
    a0, f_a, s_a = (lo.alpha, lo.f, lo.slope) if lo else (0.0, f0, slope0)
    a1, f_b, s_b = hi.alpha, hi.f, hi.slope
    width = a1 - a0
    d1 = s_a + s_b - 3 * (f_a - f_b) / (a0 - a1)
    radicand = d1 * d1 - s_a * s_b
    if radicand >= 0 and np.isfinite(radicand):
        d2 = np.sqrt(radicand)
        denominator = s_b - s_a + 2 * d2
        if denominator != 0:
            t = a1 - width * (s_b + d2 - d1) / denominator
            if np.isfinite(t):
                return float(min(max(t, a0 + 0.1 * width), a1 - 0.1 * width))
    return a0 + 0.5 * width


def step(fun: Function, state: LBFGSState, *, tol: float, max_iter: int, memory: int = 10) -> LBFGSState:
    """One iteration from ``state``: the next state (``done`` set when the fit stops there)."""
    d = direction(state.g, state.s, state.y)
    s_hist, y_hist = state.s, state.y
    if float(state.g @ d) >= 0:  # not a descent direction (rounding in a flat region): forget the pairs
        s_hist, y_hist = s_hist[:0], y_hist[:0]
        d = direction(state.g, s_hist, y_hist)
    # the quasi-Newton step would lower f by about −½∇f·d: nothing to find below rounding
    if len(s_hist) and -0.5 * float(state.g @ d) <= rounding(state.f):
        return _stopped(state)
    found, flat = _line_search(fun, state, d)
    if found is None and not flat and len(s_hist):  # the pairs mislead: try the steepest descent once
        s_hist, y_hist = s_hist[:0], y_hist[:0]
        d = direction(state.g, s_hist, y_hist)
        found, flat = _line_search(fun, state, d)
    if found is None:
        return _stopped(state) if flat else LBFGSState(state.x, state.f, state.g, state.s, state.y, state.iteration,
                                                       done=True)
    x, g = state.x + found.alpha * d, found.g
    s, y = x - state.x, g - state.g
    if float(s @ y) > np.finfo(float).eps * float(y @ y):  # keep H positive definite
        s_hist, y_hist = remember(s_hist, s, memory), remember(y_hist, y, memory)
    iteration = state.iteration + 1
    done = iteration >= max_iter or float(np.linalg.norm(g)) <= tol or not np.any(s)
    return LBFGSState(x, found.f, g, s_hist, y_hist, iteration, done)


def _stopped(state: LBFGSState) -> LBFGSState:
    """``state``, stopped where no step lowers f by more than rounding."""
    return LBFGSState(state.x, state.f, state.g, state.s, state.y, state.iteration, done=True, flat=True)


def minimize(fun: Function, state: LBFGSState, *, tol: float, max_iter: int, memory: int = 10,
             on_iteration: Callable[[LBFGSState], None] = lambda state: None) -> LBFGSState:
    """Iterate from ``state`` until the fit stops; ``on_iteration`` sees each new state (to save it)."""
    if float(np.linalg.norm(state.g)) <= tol or state.iteration >= max_iter:
        state.done = True
    while not state.done:
        state = step(fun, state, tol=tol, max_iter=max_iter, memory=memory)
        on_iteration(state)
    return state
