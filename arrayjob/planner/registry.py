"""Strategies by name: every pass's strategies have one signature, ``Plan -> Plan``.

A strategy module registers its strategies when it is imported (``planner.pipeline``
imports them all); the spec's choices, the CLI's options and the error for an unknown
name are all read from here, so a new strategy is one decorator.
"""

from __future__ import annotations

from collections.abc import Callable

from arrayjob.errors import SpecError
from arrayjob.planner.plan import Plan

Pass = Callable[[Plan], Plan]
KINDS = ("tiling", "fusion", "placement")
STRATEGIES: dict[str, dict[str, Pass]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str) -> Callable[[Pass], Pass]:
    def decorate(fn: Pass) -> Pass:
        STRATEGIES[kind][name] = fn
        return fn

    return decorate


def lookup(kind: str, name: str) -> Pass:
    try:
        return STRATEGIES[kind][name]
    except KeyError:
        raise SpecError(f"--{kind}: unknown strategy {name!r} (expected one of: "
                        f"{', '.join(sorted(STRATEGIES[kind]))})") from None
