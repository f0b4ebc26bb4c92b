"""Numbers as a person reads them on the report page: a unit, and as many significant
digits as the figure deserves (four at most), never a raw float."""

from __future__ import annotations

import math

from arrayjob.units import size

# the unit of each figure the report compares
FIGURE_UNITS = {
    "wall_seconds": "s", "storage.bytes_read": "B", "storage.get_requests": "count", "storage.bytes_written": "B",
    "storage.put_requests": "count", "network.bytes_between_nodes": "B", "memory.peak_bytes_per_node": "B",
    "tasks.count": "count", "nodes.node_seconds": "s", "dollars.total": "$",
}

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def significant(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits, trailing zeros dropped; very small or large
    as ``2.81 × 10⁻⁹`` (one digit fewer: the exponent carries the scale)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    exponent = math.floor(math.log10(abs(x)))
    if -3 <= exponent < 6:
        text = f"{x:.{max(digits - 1 - exponent, 0)}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa = f"{x / 10**exponent:.{digits - 2}f}".rstrip("0").rstrip(".")
    return f"{mantissa} × 10{str(exponent).translate(_SUPERSCRIPT)}"


def seconds(x: float) -> str:
    """7.07 s, 12.3 ms, 2 min 05 s: three significant digits."""
    if x == 0:
        return "0 s"
    if abs(x) < 1:
        return f"{significant(x * 1000, 3)} ms"
    if abs(x) < 60:
        return f"{significant(x, 3)} s"
    minutes, secs = divmod(round(x), 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def dollars(x: float) -> str:
    """$0, $0.000041, $3.41: cents where they matter, two significant digits below a cent."""
    if x == 0:
        return "$0"
    if abs(x) >= 0.01:
        return f"${x:,.2f}"
    places = 1 - math.floor(math.log10(abs(x)))  # two significant digits, as a decimal
    return f"${x:.{places}f}".rstrip("0")


def quantity(x: float, unit: str) -> str:
    """``x`` in ``unit``: "s", "B" (decimal bytes), "count", "$", or a plain number."""
    if unit == "s":
        return seconds(x)
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
