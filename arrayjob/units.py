"""Quantities as people read them: one byte format for every table arrayjob prints."""

from __future__ import annotations


def size(n: float) -> str:
    """Bytes in decimal units, as storage bills and `ls -h --si` count them: 52.8 MB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def seconds(value: float | str) -> float:
    """A duration as the spec and CLI take it: a number of seconds, or ``"90s"``, ``"10m"``,
    ``"1.5h"``. ``ValueError`` if it is none of these or not positive."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, int | float):
        number = float(value)
    else:
        text = value.strip().lower()
        unit = next((u for u in sorted(_DURATION_UNITS, key=len, reverse=True) if text.endswith(u)), "")
        try:
            number = float(text[: len(text) - len(unit)].strip()) * _DURATION_UNITS.get(unit, 1.0)
        except ValueError:
            raise ValueError(f"expected a duration like 90s, 10m or 1.5h, got {value!r}") from None
    if not 0 < number < float("inf"):
        raise ValueError(f"expected a positive duration, got {value!r}")
    return number


def duration(secs: float) -> str:
    """Seconds as people read them: 45 s, 12 min, 1.5 h."""
    if secs < 90:
        return f"{secs:.0f} s" if secs >= 10 else f"{secs:.1f} s"
    if secs < 5400:
        return f"{secs / 60:.0f} min"
    return f"{secs / 3600:.1f} h"
