"""Placement (NumS): on which node each block task runs.

Strategies take a lowered plan (tasks without nodes) and return it with ``Task.node``
set. ``ray`` leaves every choice to Ray's scheduler; ``roundrobin`` deals tasks out in
order; ``lshs`` simulates per-node memory and network load and puts each task where the
maximum load grows least.
"""

from __future__ import annotations

import dataclasses

from arrayjob.planner.plan import Plan, register


def _with_nodes(plan: Plan, nodes: list[int | None]) -> Plan:
    assert plan.physical is not None
    tasks = tuple(dataclasses.replace(t, node=n) for t, n in zip(plan.physical.tasks, nodes, strict=True))
    return dataclasses.replace(plan, physical=dataclasses.replace(plan.physical, tasks=tasks))


@register("placement", "ray")
def ray_default(plan: Plan) -> Plan:
    """No placement: Ray's scheduler decides at run time."""
    assert plan.physical is not None
    return _with_nodes(plan, [None] * len(plan.physical.tasks))


@register("placement", "roundrobin")
def round_robin(plan: Plan) -> Plan:
    """Task i on node i mod N, in plan order."""
    assert plan.physical is not None
    n = plan.options.cluster.nodes
    return _with_nodes(plan, [i % n for i in range(len(plan.physical.tasks))])
