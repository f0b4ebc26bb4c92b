"""Reduction trees: how partial results of one block are combined, built in one place.

Lowering combines a block's partials ``FAN_IN`` at a time, level by level; placement
rebuilds the same kind of tree per node and then across nodes; the fusion model and the
estimate count the tasks and bytes of such trees. All of them call ``combine_tree``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

FAN_IN = 8  # partials per combine task

T = TypeVar("T")


def combine_tree(parts: Sequence[T], combine: Callable[[list[T], int, bool], T], fan_in: int = FAN_IN) -> T:
    """Combine ``parts`` level by level, ``fan_in`` at a time; returns the root.

    ``combine(group, level, final)`` makes one combine step of two or more parts (``final``
    on the step that yields the root); a lone part at the end of a level passes through.
    """
    level, depth = list(parts), 0
    while len(level) > 1:
        depth += 1
        final = len(level) <= fan_in
        level = [group[0] if len(group) == 1 else combine(group, depth, final)
                 for group in (level[j: j + fan_in] for j in range(0, len(level), fan_in))]
    return level[0]


def tree_size(parts: int, block: int, fan_in: int = FAN_IN) -> tuple[int, int]:
    """Combine tasks and bytes touched (inputs and output) of ``combine_tree`` over ``parts``
    partials of ``block`` bytes each."""
    tasks = touched = 0

    def count(group: list[int], level: int, final: bool) -> int:
        nonlocal tasks, touched
        tasks += 1
        touched += (len(group) + 1) * block
        return 0

    if parts > 0:
        combine_tree([0] * parts, count, fan_in)
    return tasks, touched
