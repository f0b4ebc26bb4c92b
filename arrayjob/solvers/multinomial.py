"""Multinomial logistic regression's loss, the softmax cross-entropy of K classes, in one pass.

For labels yᵢ ∈ {0, …, K−1}, coefficients W (K × d), intercepts b (K,) and row weights rᵢ:

    Z = X Wᵀ + b,   lseᵢ = log Σₖ exp Zᵢₖ,   lossᵢ = lseᵢ − Zᵢ,yᵢ,   P = exp(Z − lse)
    ∇_W Σ rᵢ lossᵢ = (r ∘ (P − Y))ᵀ X,   ∇_b = Σᵢ rᵢ (Pᵢ − Yᵢ)

with Y the one-hot of y, built on the workers as ``y == class ids`` (KMeans' one-hot). Z for all
K classes is one product with X, and the row max (for a stable log-sum-exp), the softmax, the
loss and the gradient are one lazy program: one read of each block of X per evaluation. Cost:
about 4ndK flops (sparse X: 4·nnz·K) and 6nK elementwise, K(d + 1) + 1 partial sums back per
block. θ is W row by row, then b: scikit-learn's ``coef_`` (K, d) and ``intercept_`` (K,).

Labels are checked where each block of y is read: integers in 0..K−1 (the first bad one named),
or, when K is to be found, integers ≥ 0 (``CHECK_INTEGER_LABELS``; the job finds the largest).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arrayjob import api as la
from arrayjob.api import Kernel


def _check_integer_labels(y: np.ndarray) -> str | None:
    bad = (y < 0) | (y != np.round(y))
    if np.any(bad):
        return f"labels must be integers >= 0, found {y[bad][0].item()!r}"
    return None


CHECK_INTEGER_LABELS = Kernel("check_integer_labels", _check_integer_labels)


@dataclass(frozen=True)
class ClassLabels:
    """The labels of ``classes`` classes: integers 0 … classes − 1."""

    classes: int

    def __call__(self, y: np.ndarray) -> str | None:
        bad = (y < 0) | (y >= self.classes) | (y != np.round(y))
        if np.any(bad):
            return f"labels must be integers 0 to {self.classes - 1}, found {y[bad][0].item()!r}"
        return None


def check_classes(classes: int) -> Kernel:
    return Kernel("check_class_labels", ClassLabels(classes))


def label_column(y: la.BlockArray) -> la.BlockArray:
    """y as an (n, 1) column (an (n,) vector times a (1,) one: no reshape in the lazy API)."""
    return y if y.ndim == 2 else la.einsum("i,k->ik", y, la.from_numpy(np.ones(1), name="one"))


def one_hot(y: la.BlockArray, classes: int) -> la.BlockArray:
    """(n, K): 1 where the row's label is the column's class."""
    return (label_column(y) == la.from_numpy(np.arange(classes, dtype=np.float64), name="class_ids")) * 1.0


def class_totals(y: la.BlockArray, classes: int, weights: la.BlockArray | None) -> dict[str, la.BlockArray]:
    """Each class's total sample weight (its row count without weights)."""
    Y = one_hot(y, classes)
    return {"totals": Y.sum(axis=0) if weights is None else la.einsum("ik,i->k", Y, weights)}


def row_weights(y: la.BlockArray, classes: int, weights: la.BlockArray | None,
                balanced: bool) -> la.BlockArray | None:
    """rᵢ: the sample weight times, when ``balanced``, the class's weight (the value
    ``class_weight``, (K,)); None when every row weighs 1."""
    if not balanced:
        return weights
    by_class = la.einsum("ik,k->i", one_hot(y, classes), la.value("class_weight", (classes,)))
    return by_class if weights is None else by_class * weights


def softmax_program(X: la.BlockArray, y: la.BlockArray, classes: int, fit_intercept: bool,
                    rows: la.BlockArray | None) -> dict[str, la.BlockArray]:
    """Σ rᵢ lossᵢ and its gradient (``grad_W`` (K, d), ``grad_b`` (K,)) at the values ``W``, ``b``
    (and Σ rᵢ, ``weight_sum``, when ``rows`` weighs them)."""
    d = X.shape[1]
    Z = X @ la.value("W", (classes, d)).T
    if fit_intercept:
        Z = Z + la.value("b", (classes,))
    top = Z.max(axis=1, keepdims=True)
    E = la.exp(Z - top)
    total = E.sum(axis=1, keepdims=True)
    Y = one_hot(y, classes)
    per_row = (top + la.log(total) - (Z * Y).sum(axis=1, keepdims=True)).sum(axis=1)  # lseᵢ − Zᵢ,yᵢ
    D = E / total - Y
    if rows is None:
        out = {"loss": per_row.sum(), "grad_W": la.einsum("ik,ij->kj", D, X)}
        if fit_intercept:
            out["grad_b"] = D.sum(axis=0)
        return out
    out = {"loss": (rows * per_row).sum(), "grad_W": la.einsum("ik,i,ij->kj", D, rows, X)}
    if fit_intercept:
        out["grad_b"] = la.einsum("ik,i->k", D, rows)
    out["weight_sum"] = rows.sum()
    return out


def values(theta: np.ndarray, classes: int, d: int, fit_intercept: bool) -> dict[str, np.ndarray]:
    """The program's values at θ = (W row by row, b)."""
    bound = {"W": theta[: classes * d].reshape(classes, d)}
    if fit_intercept:
        bound["b"] = theta[classes * d:]
    return bound


def gradient(result: dict[str, np.ndarray], fit_intercept: bool) -> np.ndarray:
    """The program's gradient as θ is laid out."""
    parts = [np.ravel(result["grad_W"])]
    if fit_intercept:
        parts.append(np.ravel(result["grad_b"]))
    return np.concatenate(parts)


def least_penalty_shift(W: np.ndarray, l1: float, l2: float) -> np.ndarray:
    """The vector v minimising l1 Σₖ ‖Wₖ + v‖₁ + (l2/2) Σₖ ‖Wₖ + v‖²: the softmax is unchanged
    when every class's coefficients move by one v, so only the penalty varies along that move.

    Per feature j it is a convex, piecewise-quadratic function of vⱼ with kinks at −Wₖⱼ: its
    minimum is at a kink or at a stationary point of a piece (vⱼ = −(Σₖ Wₖⱼ + l1 (K − 2m)/l2)/K
    on the piece with m of the K terms negative), so every such point, each piece's clipped into
    it, is a candidate. vⱼ = 0 unless a move lowers the penalty by more than rounding. Cost:
    O(K² d) on the driver, no pass over X.
    """
    K, d = W.shape
    a = np.sort(W, axis=0)
    candidates = [np.zeros((1, d)), -a]
    if l2 > 0:
        m = np.arange(K + 1)[:, None]
        stationary = -(a.sum(axis=0) + l1 * (K - 2 * m) / l2) / K
        lower = np.vstack([np.full((1, d), -np.inf), a])  # −v between the m-th and (m+1)-th smallest
        upper = np.vstack([a, np.full((1, d), np.inf)])
        candidates.append(-np.clip(-stationary, lower, upper))
    v = np.vstack(candidates)
    shifted = W[None, :, :] + v[:, None, :]
    penalty = l1 * np.abs(shifted).sum(axis=1) + 0.5 * l2 * (shifted * shifted).sum(axis=1)
    best = penalty.argmin(axis=0)
    lower = penalty[best, np.arange(d)] < penalty[0] * (1 - 1e-13)  # by more than rounding
    return np.where(lower, v[best, np.arange(d)], 0.0)


@dataclass(frozen=True)
class LeastPenalty:
    """θ moved along the softmax's invariance to its least penalty (``least_penalty_shift``):
    OWL-QN's steps hardly move along it, where the L1 term's kinks meet a curvature of only K·l2."""

    classes: int
    d: int
    l1: float
    l2: float

    def __call__(self, theta: np.ndarray) -> np.ndarray:
        size = self.classes * self.d
        W = theta[:size].reshape(self.classes, self.d)
        v = least_penalty_shift(W, self.l1, self.l2)
        if not np.any(v):
            return theta
        return np.concatenate([(W + v).ravel(), theta[size:]])

