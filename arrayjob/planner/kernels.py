"""Generic block kernels the planner inserts (reductions); pure NumPy, no I/O."""

from __future__ import annotations

from typing import Any

import numpy as np


def add_partials(*partials: Any) -> Any:
    """Sum partial results: arrays, scalars, or tuples/dicts of them, elementwise."""
    first = partials[0]
    if isinstance(first, tuple):
        return tuple(add_partials(*parts) for parts in zip(*partials, strict=True))
    if isinstance(first, dict):
        return {k: add_partials(*(p[k] for p in partials)) for k in first}
    total = np.array(first, copy=True) if isinstance(first, np.ndarray) else first
    for p in partials[1:]:
        total = total + p
    return total
