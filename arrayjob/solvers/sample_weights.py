"""Sample and class weights for the linear models, as scikit-learn defines them.

A row's weight rᵢ is its sample weight (the optional input ``weights``, default 1) times,
for ``logreg`` with ``class_weight = "balanced"``, its class's weight
``W / (K · Wₖ)`` (W = Σ sample weights, Wₖ = theirs over class k, K = the classes present:
scikit-learn's ``compute_class_weight("balanced", ..., sample_weight=...)``). The loss is the
weighted mean (1/Σrᵢ) Σ rᵢ lossᵢ, so the penalty keeps its meaning whatever the weights' scale:
scikit-learn's objective C·Σ rᵢ lossᵢ + penalty is ours times C·Σrᵢ, i.e. C = 1/(l2·Σrᵢ)
(``LogisticRegression``; Σrᵢ = n without weights, and with balanced class weights alone), and
``ElasticNet`` rescales its sample weights to sum to n, which makes its objective ours with the
same ``alpha``. Weights must be finite and ≥ 0 (checked where each block is read) and not all 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from arrayjob import api as la
from arrayjob.api import ArrayInfo, InputError, Kernel, require, require_numeric


def _check_weights(w: np.ndarray) -> str | None:
    if np.any(w < 0):
        return f"weights must be >= 0, found {w[w < 0][0].item()!r}"
    return None


CHECK_WEIGHTS = Kernel("check_weights", _check_weights)


def require_weights(arrays: Mapping[str, ArrayInfo]) -> None:
    """``weights``, if given, is a numeric (n,) vector beside X's n rows."""
    if "weights" not in arrays:
        return
    weights, n = arrays["weights"], arrays["X"].shape[0]
    require_numeric(weights)
    require(weights.shape in ((n,), (n, 1)),
            f"inputs.weights: expected shape ({n},) to match the rows of inputs.X {arrays['X'].shape}, "
            f"got {weights.shape}")


def sample_weights(arrays: Mapping[str, ArrayInfo]) -> la.BlockArray | None:
    """The ``weights`` input as an (n,) lazy vector, checked on the workers; None without it."""
    if "weights" not in arrays:
        return None
    w = la.from_input(arrays["weights"], check=CHECK_WEIGHTS)
    return w.sum(axis=1) if w.ndim == 2 else w


def total(weight_sum: float) -> float:
    """Σ of the weights, refused when 0 (nothing to fit)."""
    if not weight_sum > 0:
        raise InputError("inputs.weights: the weights sum to 0 (every row would be ignored)")
    return float(weight_sum)


def balanced(class_totals: np.ndarray) -> np.ndarray:
    """scikit-learn's balanced class weights from each class's total sample weight: W / (K·Wₖ)
    over the K classes present; 0 for a class with no weight (no row has it)."""
    present = class_totals > 0
    weights = np.zeros(len(class_totals))
    weights[present] = class_totals.sum() / (present.sum() * class_totals[present])
    return weights
