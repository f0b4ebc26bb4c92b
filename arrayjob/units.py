"""Quantities as people read them: one byte format for every table arrayjob prints."""

from __future__ import annotations


def size(n: float) -> str:
    """Bytes in decimal units, as storage bills and `ls -h --si` count them: 52.8 MB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


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
