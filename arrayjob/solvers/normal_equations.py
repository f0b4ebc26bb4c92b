"""The normal equations of linear regression, factored once and checked: the system a
refined fit (``algorithms.linreg``, ``method = "refined"``) solves for its first coefficients and for
each correction, and the estimate of how fast refinement would converge on it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.linalg.lapack

# refined: the normal equations are refined while each step is expected to shrink the error
# at least this much (u·κ², times what centring from sums lost), else TSQR runs instead
REFINE_RATE_LIMIT = 1e-4
REFINE_MAX_STEPS = 4  # then TSQR


@dataclass(frozen=True)
class FactoredNormalEquations:
    """The normal equations of [X 1] (weighted, ridge on the coefficients only) from one pass's
    sums, the intercept eliminated by centring, the d × d system's columns scaled to unit
    diagonal and factored once by Cholesky (``factor`` is None if that failed); ``condition``
    estimates κ of the scaled X (LAPACK trcon of the factor, 1-norm); ``centring_loss``: how
    much larger a diagonal entry was before centring than after (its rounding grows so)."""

    gram: np.ndarray  # XᵀWX
    sum_x: np.ndarray  # XᵀW1
    total: float  # 1ᵀW1
    fit_intercept: bool
    scale: np.ndarray
    factor: tuple[np.ndarray, bool] | None
    condition: float
    centring_loss: float

    @classmethod
    def of(cls, gram: np.ndarray, sum_x: np.ndarray, total: float, l2: float,
           fit_intercept: bool) -> FactoredNormalEquations:
        ridge = total * l2 * np.eye(len(sum_x))
        system = (gram - np.outer(sum_x, sum_x) / total if fit_intercept else gram) + ridge
        diagonal = np.diag(system)
        before = np.diag(gram) + total * l2
        positive = diagonal > 0
        centring_loss = float(np.max(before[positive] / diagonal[positive], initial=1.0))
        scale = 1.0 / np.sqrt(np.where(positive, diagonal, 1.0))
        factor, condition = None, math.inf
        try:
            factor = scipy.linalg.cho_factor(system * scale[:, None] * scale[None, :])
            rcond, info = scipy.linalg.lapack.dtrcon(factor[0], norm="1", uplo="L" if factor[1] else "U")
            condition = 1.0 / rcond if info == 0 and rcond > 0 else math.inf
        except (np.linalg.LinAlgError, ValueError):
            factor = None
        return cls(gram, sum_x, total, fit_intercept, scale, factor, condition, centring_loss)

    def unsuitable(self) -> str | None:
        """Why refinement cannot be trusted here, if it cannot."""
        if self.factor is None or not np.all(np.isfinite(self.factor[0])):
            return "the normal equations are singular"
        rate = np.finfo(float).eps * self.condition**2 * max(1.0, self.centring_loss)
        if not rate <= REFINE_RATE_LIMIT:
            lost = f", centring lost {math.log10(self.centring_loss):.0f} digits" if self.centring_loss > 10 else ""
            return (f"X's condition number is about {self.condition:.1e}{lost}: refining the normal equations "
                    f"would gain under {-math.log10(REFINE_RATE_LIMIT):.0f} digits a step")
        return None

    def solve(self, rhs_x: np.ndarray, rhs_1: float) -> tuple[np.ndarray, float]:
        """The coefficients and intercept for the right-hand side (Xᵀ W v, 1ᵀ W v)."""
        assert self.factor is not None
        rhs = rhs_x - self.sum_x * rhs_1 / self.total if self.fit_intercept else rhs_x
        coef = self.scale * scipy.linalg.cho_solve(self.factor, self.scale * rhs)
        intercept = (rhs_1 - float(self.sum_x @ coef)) / self.total if self.fit_intercept else 0.0
        return coef, intercept

    def quadratic(self, coef: np.ndarray, intercept: float) -> float:
        """‖[X 1] δ‖² (weighted) for δ = (coef, intercept), from the sums."""
        return quadratic(self.gram, self.sum_x, self.total, coef, intercept)


def quadratic(gram: np.ndarray, sum_x: np.ndarray, total: float, coef: np.ndarray, intercept: float) -> float:
    """‖X·coef + intercept‖² (weighted) from XᵀWX, XᵀW1 and 1ᵀW1, without a pass over X."""
    return float(coef @ gram @ coef) + 2 * intercept * float(sum_x @ coef) + total * intercept**2
