"""Fusion (KASEN, SystemML): which graph nodes are computed together in one kernel per block.

A kernel's nodes agree on how every shared axis class is cut, so they can be evaluated
block by block; a node that reduces over a cut axis yields a partial result and must be
one of the kernel's outputs (the partials are combined by a reduction tree).
"""

from __future__ import annotations

import dataclasses

from arrayjob.planner.plan import FusedKernel, Plan, register


def kernel_name(plan: Plan, nodes: tuple[int, ...]) -> str:
    labels = [plan.graph.nodes[i].label() for i in nodes]
    head = "+".join(dict.fromkeys(labels))
    return head if len(head) <= 48 else head[:45] + "..."


def outputs_of(plan: Plan, nodes: tuple[int, ...]) -> tuple[int, ...]:
    """The nodes of a group that are used outside it or returned by the program."""
    inside = set(nodes)
    program_outputs = set(plan.graph.outputs)
    return tuple(
        i for i in nodes
        if i in program_outputs or any(u not in inside for u in plan.graph.consumers[i])
    )


@register("fusion", "none")
def no_fusion(plan: Plan) -> Plan:
    """Every operation is its own kernel: every intermediate is materialised."""
    kernels = tuple(
        FusedKernel(kernel_name(plan, (i,)), (i,), (i,))
        for i, n in enumerate(plan.graph.nodes) if not n.is_leaf
    )
    return dataclasses.replace(plan, kernels=kernels)
