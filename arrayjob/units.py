"""Quantities as people read and write them: the one formatter of each unit arrayjob prints
(``size``, ``duration``, ``dollars``, ``significant``) and the parsers of what the spec and
the CLI take (``parse_bytes``, ``parse_duration``).

>>> size(52_800_000), duration(0.376), duration(125), dollars(0.000041), significant(2.81e-9, 3)
('52.8 MB', '0.38 s', '2 min 05 s', '$0.000041', '2.8 × 10⁻⁹')
"""

from __future__ import annotations

import math

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


def duration(secs: float) -> str:
    """Seconds as people read them: 4.9 ms, 0.38 s, 7.07 s, 42.00 s, 2 min 05 s, 1 h 05 min
    (hundredths of a second below a minute, as the run's summary has always shown its wall
    time; milliseconds below a hundredth)."""
    if secs == 0:
        return "0 s"
    if abs(secs) < 0.00995:  # below what hundredths show
        return f"{significant(secs * 1000, 3)} ms"
    if abs(secs) < 59.995:
        return f"{secs:.2f} s"
    minutes, rest = divmod(round(secs), 60)
    return f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def dollars(x: float) -> str:
    """$0, $0.000041, $3.41: cents where they matter, two significant digits below a cent."""
    if x == 0:
        return "$0"
    if abs(x) >= 0.01:
        return f"${x:,.2f}"
    places = 1 - math.floor(math.log10(abs(x)))  # two significant digits, as a decimal
    return f"${x:.{places}f}".rstrip("0")


def size(n: float) -> str:
    """Bytes in decimal units, as storage bills and `ls -h --si` count them: 52.8 MB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(value: float | str) -> float:
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
