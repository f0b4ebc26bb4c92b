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
_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """``"600MB"`` -> 600_000_000, ``"1.5 GiB"`` -> 1_610_612_736, an int as is.

    Decimal units as ``size`` prints them (kB, MB, GB, TB) and binary ones (KiB, MiB, GiB,
    TiB), case-insensitive; raises ``ValueError`` for anything else or a size below 1 byte.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        value = float(text)
    else:
        body = text.strip().lower().replace(" ", "")
        number = body.rstrip("kmgtib")
        unit = body[len(number):]
        if unit not in _BYTE_UNITS or not number:
            raise ValueError(f"not a size: {text!r}")
        try:
            value = float(number) * _BYTE_UNITS[unit]
        except ValueError:
            raise ValueError(f"not a size: {text!r}") from None
    if not value >= 1 or value != value or value == float("inf"):
        raise ValueError(f"not a size: {text!r}")
    return int(value)
