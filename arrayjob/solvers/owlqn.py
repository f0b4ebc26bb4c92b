"""OWL-QN: L-BFGS for a smooth objective plus an L1 term, its whole state a small record.

Orthant-wise limited-memory quasi-Newton (Andrew & Gao, "Scalable training of L1-regularized
log-linear models", ICML 2007; the solver of Spark MLlib's L1 and elastic-net fits) minimises

    F(x) = f(x) + Σᵢ cᵢ |xᵢ|      (f smooth, cᵢ ≥ 0: ``l1`` per coordinate, 0 = unpenalised)

Each iteration: the pseudo-gradient ◇F (F's one-sided derivative of steepest descent; 0 where
x is at 0 and |∂f/∂xᵢ| ≤ cᵢ), the L-BFGS direction −H◇F from the pairs (s, y) of *f*'s
gradient (``lbfgs.direction``), components whose sign disagrees with −◇F set to 0, and a
backtracking line search along the projection onto the orthant the step starts in
(coordinates that would cross zero stop at zero: that is how coefficients become exactly 0),
accepting the first step with F(x⁺) ≤ F(x) + γ ◇F·(x⁺ − x), γ = 10⁻⁴ (the paper's). With
every cᵢ = 0 it is L-BFGS with a backtracking line search.

The state is ``lbfgs.LBFGSState`` (x, F(x), ∇f(x), the pairs, the iteration): the same state
and function give the same next state bit for bit, so a fit saved after an iteration and
resumed ends exactly where an undisturbed one does. Stops when ‖◇F‖ ≤ ``tol``, after
``max_iter`` iterations, or when no step decreases F (at machine precision). Cost per
iteration: one evaluation of f and ∇f when the full step is taken (one more per halving),
and O(memory · n) flops on the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from arrayjob.solvers import lbfgs
from arrayjob.solvers.lbfgs import Function, LBFGSState

SUFFICIENT_DECREASE = 1e-4  # γ of Andrew & Gao's line search
MAX_HALVINGS = 60  # 2⁻⁶⁰: below any step that changes F in double precision


def pseudo_gradient(x: np.ndarray, g: np.ndarray, c: np.ndarray) -> np.ndarray:
    """◇F at x for ∇f(x) = g and L1 weights c (Andrew & Gao, section 3.1)."""
    right, left = g + c, g - c  # F's derivatives going up and going down from xᵢ = 0
    at_zero = np.where(right < 0, right, np.where(left > 0, left, 0.0))
    return np.where(x > 0, right, np.where(x < 0, left, at_zero))


def objective(f: float, x: np.ndarray, c: np.ndarray) -> float:
    """F(x) = f + Σ cᵢ|xᵢ|."""
    return float(f + np.abs(x) @ c)


def start(x: np.ndarray, fun: Function, c: np.ndarray) -> LBFGSState:
    """The state at ``x`` before the first iteration (``f`` of it holds F, ``g`` holds ∇f)."""
    state = LBFGSState.start(x, fun)
    state.f = objective(state.f, state.x, c)
    return state


def step(fun: Function, state: LBFGSState, c: np.ndarray, *, tol: float, max_iter: int,
         memory: int = 10) -> LBFGSState:
    """One iteration from ``state``: the next state (``done`` set when the fit stops there)."""
    pg = pseudo_gradient(state.x, state.g, c)
    s_hist, y_hist = state.s, state.y
    found = _search(fun, state, c, pg, s_hist, y_hist)
    if found is None and len(s_hist):  # the pairs mislead: try the steepest descent once
        s_hist, y_hist = s_hist[:0], y_hist[:0]
        found = _search(fun, state, c, pg, s_hist, y_hist)
    if found is None:
        return LBFGSState(state.x, state.f, state.g, state.s, state.y, state.iteration, done=True)
    x, f, g = found
    s, y = x - state.x, g - state.g
    if float(s @ y) > np.finfo(float).eps * float(y @ y):  # keep H positive definite
        s_hist, y_hist = lbfgs.remember(s_hist, s, memory), lbfgs.remember(y_hist, y, memory)
    iteration = state.iteration + 1
    done = (iteration >= max_iter or float(np.linalg.norm(pseudo_gradient(x, g, c))) <= tol
            or not np.any(s))
    return LBFGSState(x, f, g, s_hist, y_hist, iteration, done)


def _search(fun: Function, state: LBFGSState, c: np.ndarray, pg: np.ndarray, s_hist: Sequence[np.ndarray],
            y_hist: Sequence[np.ndarray]) -> tuple[np.ndarray, float, np.ndarray] | None:
    """The backtracking line search along the projected direction: (x⁺, F(x⁺), ∇f(x⁺)), or
    None when no step decreases F enough."""
    d = lbfgs.direction(pg, s_hist, y_hist)
    d = np.where(d * pg < 0, d, 0.0)  # only where it descends along −◇F
    if not np.any(d):
        return None
    orthant = np.where(state.x != 0, np.sign(state.x), -np.sign(pg))
    alpha = 1.0
    for _ in range(MAX_HALVINGS):
        x = state.x + alpha * d
        x = np.where(np.sign(x) == orthant, x, 0.0)  # no coordinate crosses zero
        f, g = fun(x)
        big_f = objective(f, x, c)
        if big_f <= state.f + SUFFICIENT_DECREASE * float(pg @ (x - state.x)):
            return x, big_f, np.array(g, dtype=np.float64)
        alpha *= 0.5
    return None


def minimize(fun: Function, state: LBFGSState, c: np.ndarray, *, tol: float, max_iter: int, memory: int = 10,
             on_iteration: Callable[[LBFGSState], None] = lambda state: None,
             move: Callable[[LBFGSState], LBFGSState] | None = None) -> LBFGSState:
    """Iterate from ``state`` until the fit stops; ``on_iteration`` sees each new state (to save it).

    ``move``, if given, takes each state a step reached to one of no larger F (with F and ∇f
    there, found without evaluating f: a move along which f's data term does not change), which
    the next step starts from; the pairs stay the secants the steps measured."""
    if float(np.linalg.norm(pseudo_gradient(state.x, state.g, c))) <= tol or state.iteration >= max_iter:
        state.done = True
    while not state.done:
        reached = step(fun, state, c, tol=tol, max_iter=max_iter, memory=memory)
        if move is not None and not np.array_equal(reached.x, state.x):
            reached = move(reached)
            norm = float(np.linalg.norm(pseudo_gradient(reached.x, reached.g, c)))
            reached.done = reached.iteration >= max_iter or norm <= tol
        state = reached
        on_iteration(state)
    return state
