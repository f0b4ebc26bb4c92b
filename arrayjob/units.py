"""Quantities as people read them: one byte format for every table arrayjob prints."""

from __future__ import annotations


def size(n: float) -> str:
    """Bytes in decimal units, as storage bills and `ls -h --si` count them: 52.8 MB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError
