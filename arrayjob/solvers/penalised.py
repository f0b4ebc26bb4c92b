"""A linear model's penalised objective, evaluated on the cluster and minimised on the driver.

    F(θ) = (1/Σrᵢ) Σᵢ rᵢ lossᵢ(θ) + l1 ‖w‖₁ + (l2/2) ‖w‖²

θ holds the coefficients w (penalised: the first ``Penalty.penalised`` entries) and then the
intercepts (never penalised); rᵢ are the row weights (``solvers.sample_weights``; 1 without).
A job supplies ``sums(θ)``: Σ rᵢ lossᵢ, its gradient (and Hessian, for Newton) and Σ rᵢ from
one pass over its data; ``Evaluator`` scales them and adds the L2 term, caching the last point.
``fit`` minimises F by L-BFGS (``solvers.lbfgs``) when l1 = 0, else by OWL-QN (``solvers.owlqn``,
Andrew & Gao 2007, as Spark MLlib does), both from a checkpoint when a run resumes, and ticks
the checkpoints after each iteration: a resumed fit ends where an undisturbed one would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from arrayjob.api import Checkpoint, JobContext
from arrayjob.solvers import lbfgs, owlqn, sample_weights

# One pass over the data, its results as they come back: Σ rᵢ lossᵢ, its gradient, its Hessian
# (or None), Σ rᵢ
Totals = tuple[float, np.ndarray, np.ndarray | None, float]
Sums = Callable[[np.ndarray], Totals]


@dataclass(frozen=True)
class Penalty:
    """l1 ‖w‖₁ + (l2/2) ‖w‖² on θ's first ``penalised`` entries (the rest are intercepts)."""

    l1: float
    l2: float
    penalised: int

    def l1_weights(self, size: int) -> np.ndarray:
        """The L1 weight of each entry of θ (OWL-QN's c)."""
        c = np.zeros(size)
        c[: self.penalised] = self.l1
        return c

    def value(self, theta: np.ndarray) -> float:
        w = theta[: self.penalised]
        return float(self.l1 * np.abs(w).sum() + 0.5 * self.l2 * (w @ w))

    def moved(self, state: lbfgs.LBFGSState, x: np.ndarray) -> lbfgs.LBFGSState:
        """``state`` at ``x`` instead, where the loss is the same (only the penalty differs):
        F and ∇f there without a pass over the data."""
        if np.array_equal(x, state.x):
            return state
        g = state.g.copy()
        g[: self.penalised] += self.l2 * (x - state.x)[: self.penalised]
        f = state.f + self.value(x) - self.value(state.x)
        return lbfgs.LBFGSState(x, f, g, state.s, state.y, state.iteration, state.done)


class Evaluator:
    """θ -> (smooth objective, gradient, Hessian or None): the loss's weighted mean plus
    (l2/2)‖w‖² (the L1 term is the solver's); one cluster pass per new θ, the last one cached."""

    def __init__(self, sums: Sums, penalty: Penalty, evaluations: int = 0) -> None:
        self.sums, self.penalty = sums, penalty
        self.last: tuple[np.ndarray, float, np.ndarray, np.ndarray | None] | None = None
        self.evaluations = evaluations  # passes so far
        self.weight_sum = float("nan")

    def resume(self, theta: np.ndarray, loss: float, grad: np.ndarray, hess: np.ndarray | None,
               evaluations: int, weight_sum: float) -> None:
        """Be as after ``evaluations`` passes, the last at ``theta`` (a checkpoint's state)."""
        self.last = (np.array(theta), loss, np.array(grad), hess)
        self.evaluations, self.weight_sum = evaluations, weight_sum

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray | None]:
        if self.last is not None and np.array_equal(self.last[0], theta):
            return self.last[1], self.last[2].copy(), self.last[3]
        return self.take(theta, self.sums(theta))

    def take(self, theta: np.ndarray, totals: Totals) -> tuple[float, np.ndarray, np.ndarray | None]:
        """F's smooth part at θ from a pass's ``totals`` (made here, or by the job's first pass)."""
        self.evaluations += 1
        total, grad, hess, weight_sum = totals
        self.weight_sum = sample_weights.total(weight_sum)
        k, l2 = self.penalty.penalised, self.penalty.l2
        w = theta[:k]
        loss = float(total) / self.weight_sum + 0.5 * l2 * float(w @ w)
        grad = np.asarray(grad, dtype=np.float64) / self.weight_sum
        grad[:k] += l2 * w
        if hess is not None:
            hess = np.asarray(hess, dtype=np.float64) / self.weight_sum
            hess[np.arange(k), np.arange(k)] += l2
        self.last = (theta.copy(), loss, grad.copy(), hess)
        return loss, grad, hess

    def smooth(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """(f, ∇f) for the quasi-Newton solvers."""
        loss, grad, _ = self(theta)
        return loss, grad


@dataclass(frozen=True)
class Fit:
    """Where a fit stopped: θ, F(θ), the norm of F's (pseudo-)gradient, the norm it had to reach,
    and how it got there."""

    theta: np.ndarray
    objective: float
    gradient_norm: float
    target: float
    iterations: int
    solver: str  # "lbfgs" or "owlqn"
    flat: bool = False  # L-BFGS stopped where no step lowers F by more than rounding

    @property
    def converged(self) -> bool:
        return self.gradient_norm <= self.target


def fit(evaluate: Evaluator, x0: np.ndarray, *, saved: Checkpoint | None, tol: float, max_iter: int,
        ctx: JobContext, relative: bool = False,
        invariance: Callable[[np.ndarray], np.ndarray] | None = None) -> Fit:
    """Minimise F from ``x0``, or from ``saved`` (the run's checkpoint): L-BFGS without an L1
    term, else OWL-QN, until the norm of F's (pseudo-)gradient is at most ``tol`` (``relative``:
    ``tol`` times its norm at ``x0``). The whole state is checkpointed after each iteration, when due.

    ``invariance``, if given, moves θ to the least penalty along a direction in which the loss
    does not change (multinomial: ``multinomial.LeastPenalty``); OWL-QN applies it after each
    step (L-BFGS from 0 never leaves that least penalty: its gradient has no part along it)."""
    c = evaluate.penalty.l1_weights(len(x0))
    solver = "owlqn" if evaluate.penalty.l1 > 0 else "lbfgs"

    def norm(state: lbfgs.LBFGSState) -> float:  # without L1 the pseudo-gradient is the gradient (20 ms less at 2²⁰)
        g = owlqn.pseudo_gradient(state.x, state.g, c) if solver == "owlqn" else state.g
        return float(np.linalg.norm(g))

    if saved is not None:
        state = lbfgs.LBFGSState.from_dict(saved.state)
        target = float(saved.state.get("target", tol))  # absent from checkpoints made before it was kept
        # the cache at the iterate (f without its L1 term): no solver evaluates there again
        evaluate.resume(state.x, state.f - float(np.abs(state.x) @ c), state.g, None, int(saved.state["evaluations"]),
                        float(saved.state.get("weight_sum", np.nan)))
    else:
        state = owlqn.start(x0, evaluate.smooth, c) if solver == "owlqn" else lbfgs.LBFGSState.start(x0, evaluate.smooth)
        target = tol * norm(state) if relative else tol

    def save(state: lbfgs.LBFGSState) -> None:
        ctx.iteration(state.iteration, max_iter, objective=state.f, gradient_norm=norm(state))
        ctx.checkpoint(state.iteration, state.as_dict() | {"evaluations": evaluate.evaluations, "target": target,
                                                           "weight_sum": evaluate.weight_sum})

    if solver == "owlqn":
        penalty = evaluate.penalty
        move = None if invariance is None else (lambda state: penalty.moved(state, invariance(state.x)))
        state = owlqn.minimize(evaluate.smooth, state, c, tol=target, max_iter=max_iter, on_iteration=save, move=move)
    else:
        state = lbfgs.minimize(evaluate.smooth, state, tol=target, max_iter=max_iter, on_iteration=save)
    return Fit(state.x, state.f, norm(state), target, state.iteration, solver, state.flat)
