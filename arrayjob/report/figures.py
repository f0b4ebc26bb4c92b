"""The report page's figures: the unit of each, and each in its unit (``arrayjob.units``
formats every unit), with as many significant digits as the figure deserves (four at
most), never a raw float."""

from __future__ import annotations

import math

from arrayjob.units import dollars, duration, significant, size

# the unit of each figure the report compares
FIGURE_UNITS = {
    "wall_seconds": "s", "storage.bytes_read": "B", "storage.get_requests": "count", "storage.bytes_written": "B",
    "storage.put_requests": "count", "network.bytes_between_nodes": "B", "memory.peak_bytes_per_node": "B",
    "tasks.count": "count", "nodes.node_seconds": "s", "dollars.total": "$",
}


def quantity(x: float, unit: str) -> str:
    """``x`` in ``unit``: "s", "B" (decimal bytes), "count", "$", or a plain number."""
    if unit == "s":
        return duration(x)
    if unit == "B":
        return size(x)
    if unit == "count":
        return f"{round(x):,}"
    if unit == "$":
        return dollars(x)
    return significant(x) + (f" {unit}" if unit else "")


def value(x: object) -> str:
    """A result attribute: yes/no, thousands separators, four significant digits."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return significant(x)
    return str(x)


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """About ``count`` evenly spaced ticks from 0 past ``top``, at 1, 2 or 5 × 10ᵏ steps; an
    axis for an all-zero series is 0 to 1."""
    if not top > 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / (count - 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    n = math.ceil(top / step - 1e-9)
    return [round(k * step, 12) for k in range(n + 1)]
