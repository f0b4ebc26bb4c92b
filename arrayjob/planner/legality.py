"""What may be one kernel: the rules lowering enforces and the fusion model fuses by.

A fused kernel runs once per block of its iteration space. A node whose result still
depends on a class the kernel cuts but the node does not keep is a *partial* result:
each task holds one part, and a reduction tree combines them after the kernel. Hence:

- no node of the kernel reads a partial result (it would see one part);
- a partial result comes from an op whose partials combine (``ops.combine_of``: a sum, a
  max or min, a contraction);
- a partial result is an output of the kernel (its parts must leave to be combined);
- no node has two axes of a class the kernel cuts (one block index cannot cut both).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable


def doubled_axis_problem(nodes: Iterable[int], doubled: Callable[[int], Collection[int]],
                         cut: Collection[int], label: Callable[[int], str]) -> str | None:
    """``doubled(v)``: the classes ``v`` has on two axes; ``cut``: the classes the kernel cuts."""
    for v in nodes:
        if set(doubled(v)) & set(cut):
            return f"node {v} ({label(v)}) has two axes of a cut class"
    return None


def partial_problem(nodes: Iterable[int], inputs: Callable[[int], Iterable[int]],
                    is_partial: Callable[[int], bool], combinable: Callable[[int], bool],
                    outputs: Collection[int], label: Callable[[int], str]) -> str | None:
    """The rules on partial results, over ``nodes`` in topological order."""
    partial: set[int] = set()
    for v in nodes:
        for u in inputs(v):
            if u in partial:
                return f"node {v} ({label(v)}) uses partial result {u}"
        if is_partial(v):
            partial.add(v)
            if not combinable(v):
                return f"node {v} ({label(v)}) cannot combine partials"
            if v not in outputs:
                return f"partial node {v} ({label(v)}) must be an output"
    return None
