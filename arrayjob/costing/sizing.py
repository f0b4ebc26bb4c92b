"""How many nodes a job runs on, chosen from its estimate.

``choose_nodes`` is the one place the count is chosen: ``arrayjob run`` asks the cluster's
autoscaler for it, ``arrayjob estimate`` prints it, and a deployment can size a cluster
with it. It prices the job's plan (``estimate_job``) at a few counts; nothing is read.

The rules, in order:

1. ``nodes`` given (``--nodes N``): that count.
2. ``deadline`` given (``--deadline 20m``): the cheapest count whose estimated wall time
   is within it, from the memory-bound count up to ``max_nodes`` (or ``SEARCH_LIMIT``).
3. Neither, no ``max_nodes``, and a local Ray (``cluster.address = "local"``): the job
   runs on this machine, so it is priced on one node; the line says how many would hold
   the plan in memory when one does not (fewer stream their inputs).
4. Otherwise the smallest count whose object stores hold the plan's peak per node with
   ``MEMORY_HEADROOM`` to spare, raised (a quarter more at a time, up to ``max_nodes``) while the parallel
   efficiency against that count stays at least ``MIN_EFFICIENCY``; never raised without
   ``max_nodes``.

``min_nodes`` is a floor on every rule; a count above ``max_nodes`` that the memory needs
is ``CapacityError`` (exit 7) naming the count, a deadline no count meets is
``CostLimitError`` (exit 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arrayjob.costing.estimate import MEMORY_HEADROOM, Estimate, estimate_job
from arrayjob.costing.history import History
from arrayjob.costing.prices import Instance, PriceTable
from arrayjob.costing.profile import MachineProfile
from arrayjob.errors import CapacityError, CostLimitError
from arrayjob.units import duration, size

MIN_EFFICIENCY = 0.8  # extra nodes pay for themselves while the job keeps this share of linear speed-up
LADDER_STEP = 1.25  # each count the raise tries is a quarter more than the last
SEARCH_LIMIT = 256  # the most nodes a choice considers when max_nodes does not bound it


@dataclass(frozen=True)
class PricedCount:
    """One node count, priced: what the choice compared."""

    nodes: int
    wall_seconds: float
    dollars: float
    peak_bytes: int  # the most the plan holds on any one node
    resident_fraction: float = 1.0  # of the inputs, kept in memory under the budget (the rest streamed)
    scale_up_seconds: float = 0.0  # of wall_seconds, waiting for the nodes the autoscaler adds

    def as_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "wall_seconds": round(self.wall_seconds, 3),
                "dollars": round(self.dollars, 6), "peak_bytes": self.peak_bytes,
                "resident_fraction": round(self.resident_fraction, 6),
                "scale_up_seconds": round(self.scale_up_seconds, 3)}


@dataclass(frozen=True)
class NodeChoice:
    """The node count chosen for a job, why, and the estimate at that count.

    ``rule`` is ``nodes`` (fixed by the caller), ``unsized`` (a local Ray, no sizing asked for),
    ``deadline``, ``memory`` (the smallest count
    whose object stores hold the plan) or ``efficiency`` (raised from it while the extra
    nodes pay for themselves). ``needed`` is the memory-bound count; ``fits`` whether the
    chosen count's object stores hold the plan.
    """

    nodes: int
    instance: Instance
    rule: str
    reason: str
    needed: int
    fits: bool
    estimate: Estimate
    priced: tuple[PricedCount, ...]

    @property
    def line(self) -> str:
        """The choice in one line, e.g. ``4 × r5.2xlarge: the smallest count whose ...``."""
        return f"{self.nodes} × {self.instance.name}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "node_type": self.instance.name, "rule": self.rule, "reason": self.reason,
                "needed": self.needed, "fits": self.fits, "priced": [p.as_dict() for p in self.priced]}


def usable_bytes(instance: Instance) -> int:
    """What a plan may hold in one node's object store: the rest is Ray's and the workers'."""
    return int(instance.object_store_bytes * MEMORY_HEADROOM)


class _Pricer:
    """Estimates of one job by node count, each made once."""

    def __init__(self, job: Any, spec: Any, instance: Instance, prices: PriceTable, profile: MachineProfile,
                 iterations: int | None, nodes_up: int | None = None, history: History | None = None) -> None:
        self.job, self.spec, self.instance = job, spec, instance
        self.prices, self.profile, self.iterations = prices, profile, iterations
        self.history = history
        self.nodes_up = nodes_up  # None: the cluster does not grow for the job
        self.estimates: dict[int, Estimate] = {}

    def __call__(self, nodes: int) -> Estimate:
        if nodes not in self.estimates:
            added = 0 if self.nodes_up is None else max(0, nodes - self.nodes_up)
            self.estimates[nodes] = estimate_job(self.job, self.spec, nodes=nodes, instance=self.instance,
                                                 prices=self.prices, profile=self.profile,
                                                 iterations=self.iterations, nodes_added=added,
                                                 history=self.history)
        return self.estimates[nodes]

    def peak(self, nodes: int) -> int:
        return max(self(nodes).peak_bytes_per_node, default=0)

    def fits(self, nodes: int) -> bool:
        """Whether ``nodes`` hold the plan in memory: nothing streamed under the memory budget
        (a plan that streams runs on fewer nodes, re-reading every iteration) and the peak
        within the usable store."""
        estimate = self(nodes)
        return estimate.resident_fraction >= 1 and self.peak(nodes) <= usable_bytes(self.instance)

    def wall(self, nodes: int) -> float:
        return self(nodes).wall_seconds

    def working(self, nodes: int) -> float:
        """Wall time once the nodes are up: what more nodes shorten (they all start together,
        so waiting for them is the same at every count)."""
        estimate = self(nodes)
        return estimate.wall_seconds - estimate.scale_up_seconds

    def dollars(self, nodes: int) -> float:
        return self(nodes).dollars()["total"]

    def priced(self) -> tuple[PricedCount, ...]:
        return tuple(PricedCount(n, self.wall(n), self.dollars(n), self.peak(n), self(n).resident_fraction,
                                 self(n).scale_up_seconds) for n in sorted(self.estimates))


def _memory_count(price: _Pricer, floor: int, limit: int) -> int:
    """The smallest count from ``floor`` whose object stores hold the plan; past ``limit``,
    the first count found to hold it (a few more tried), or the lower bound if none is."""
    usable = usable_bytes(price.instance)
    # the plan's bytes spread evenly: no fewer nodes can hold it
    start = max(floor, 1, math.ceil(sum(price(1).peak_bytes_per_node) / max(1, usable)))
    # more nodes hold no more per node: probe counts at doubling steps, then halve the gap
    # between the last that failed and the first that fits (a count's estimate plans the job)
    last = max(limit, start + 8)
    failed, n, step = start - 1, start, 1
    while not price.fits(n):
        if n >= last:
            return start
        failed, n, step = n, min(last, n + step), step * 2
    while n - failed > 1:
        middle = (failed + n) // 2
        failed, n = (failed, middle) if price.fits(middle) else (middle, n)
    # a plan whose peak does not fall evenly with the count may fit below the even bound
    while n - 1 >= max(floor, 1) and price.fits(n - 1):
        n -= 1
    return n


def _ladder(start: int, limit: int) -> list[int]:
    """Counts above ``start`` to try, each a quarter more than the last, ending at ``limit``."""
    counts, n = [], start
    while n < limit:
        n = min(limit, max(n + 1, math.ceil(n * LADDER_STEP)))
        counts.append(n)
    return counts


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}×" if b > 0 else "∞×"


def choose_nodes(job: Any, spec: Any, *, instance: Instance, prices: PriceTable, profile: MachineProfile,
                 nodes: int | None = None, deadline: float | None = None, iterations: int | None = None,
                 min_nodes: int | None = None, max_nodes: int | None = None, local: bool | None = None,
                 nodes_up: int | None = 0, history: History | None = None,
                 max_nodes_from: str = "cluster.max_nodes") -> NodeChoice:
    """Choose how many ``instance`` nodes ``job`` runs on, from its estimate (see the module's
    rules). ``min_nodes``/``max_nodes`` default to the spec's ``[cluster]`` keys; ``deadline``
    is in seconds. ``local`` (default: ``cluster.address`` is ``"local"``): the job runs on
    this machine, which no count changes (rule 3).

    A cluster at an address that is sized (a count, a deadline or ``max_nodes``) grows by
    the nodes beyond the ``nodes_up`` worker nodes it has (default none: ``arrayjob estimate``
    does not connect), and each count's estimate waits for them to start
    (``estimate.node_startup_seconds``). ``nodes_up=None``: every count is up when the job
    starts (a cluster deployed at the chosen size). ``history`` (``costing.history``): each
    count's estimate is corrected by the recent runs of the spec. ``max_nodes_from`` names what
    set ``max_nodes`` in errors (the node type's ``max_workers``, when the cluster's is lower).

    >>> choice = choose_nodes(job, spec, instance=prices.instance("r5.2xlarge"), prices=prices,
    ...                       profile=load_profile(), max_nodes=16)   # doctest: +SKIP
    >>> choice.line                                                    # doctest: +SKIP
    '4 × r5.2xlarge: the smallest count whose object stores hold its peak of 61.2 GB per node ...'
    """
    floor = max(1, spec.cluster.min_nodes if min_nodes is None else min_nodes)
    ceiling = spec.cluster.max_nodes if max_nodes is None else max_nodes
    limit = ceiling or SEARCH_LIMIT
    if local is None:
        local = spec.cluster.address == "local"
    grows = not local and nodes_up is not None and (nodes is not None or deadline is not None or ceiling is not None)
    price = _Pricer(job, spec, instance, prices, profile, iterations, nodes_up if grows else None, history)
    usable = usable_bytes(instance)
    store = f"{size(usable)} usable of a {size(instance.object_store_bytes)} object store"

    if nodes is not None:
        if ceiling is not None and nodes > ceiling:
            raise CapacityError(f"--nodes {nodes} is above {max_nodes_from} ({ceiling})")
        fits = price.fits(nodes)
        needed = nodes if fits else _memory_count(price, 1, limit)
        reason = "fixed by --nodes" + ("" if fits else f"; its plan needs {size(price.peak(nodes))} on a node "
                                       f"({store}): {needed} nodes would hold it")
        return NodeChoice(nodes, instance, "nodes", reason, needed, fits, price(nodes), price.priced())

    if deadline is None and ceiling is None and local:
        fits = price.fits(floor)
        needed = floor if fits else _memory_count(price, floor, limit)
        reason = "a local Ray: the job runs on this machine"
        if not fits:
            reason += f"; {needed} nodes would hold its plan in memory, fewer stream their inputs"
        return NodeChoice(floor, instance, "unsized", reason, needed, fits, price(floor), price.priced())

    needed = _memory_count(price, floor, limit)
    peak = size(price.peak(needed))
    if ceiling is not None and needed > ceiling:
        raise CapacityError(f"the plan needs {needed} × {instance.name} to hold its peak of {peak} per node "
                            f"({store}), but {max_nodes_from} is {ceiling}")

    if deadline is not None:
        return _by_deadline(price, needed, limit, deadline)

    chosen, rejected = needed, None
    base = price.working(needed) * needed
    for n in _ladder(needed, limit) if ceiling else []:
        if base / (price.working(n) * n) < MIN_EFFICIENCY:
            rejected = n
            break
        chosen = n
    if chosen == needed:
        reason = f"the smallest count whose object stores hold its peak of {peak} per node ({store})"
        if needed == floor and floor > 1:
            reason = f"cluster.min_nodes; the plan's peak of {peak} per node fits ({store})"
    else:
        efficiency = base / (price.working(chosen) * chosen)
        reason = (f"{needed} would hold its peak of {peak} per node; {chosen} finish "
                  f"{_ratio(price.wall(needed), price.wall(chosen))} sooner at {efficiency:.0%} parallel efficiency")
    if rejected is not None:
        reason += (f"; {rejected} would finish {_ratio(price.wall(chosen), price.wall(rejected))} sooner for "
                   f"{_ratio(price.dollars(rejected), price.dollars(chosen))} the dollars")
    elif ceiling is None:
        reason += "; no cluster.max_nodes, so no more"
    elif chosen == ceiling:
        reason += f"; cluster.max_nodes is {ceiling}"
    rule = "memory" if chosen == needed else "efficiency"
    return NodeChoice(chosen, instance, rule, reason, needed, True, price(chosen), price.priced())


def _by_deadline(price: _Pricer, needed: int, limit: int, deadline: float) -> NodeChoice:
    """The cheapest count from ``needed`` to ``limit`` that the estimate finishes by ``deadline``:
    doubling until one does, then halving the gap to the last that did not."""
    low, n = needed - 1, needed
    while price.wall(n) > deadline:
        if n >= limit:
            raise CostLimitError(f"no node count up to {limit} meets --deadline {duration(deadline)} by the "
                                 f"estimate: {limit} × {price.instance.name} take about {duration(price.wall(n))}")
        low, n = n, min(limit, n * 2)
    high = n
    while high - low > 1:  # wall time falls with the count, near enough to bisect
        mid = (low + high) // 2
        if price.wall(mid) <= deadline:
            high = mid
        else:
            low = mid
    meeting = [p for p in price.priced() if p.wall_seconds <= deadline]
    best = min(meeting, key=lambda p: (p.dollars, p.nodes))
    reason = (f"the cheapest count the estimate finishes within {duration(deadline)} "
              f"(about {duration(best.wall_seconds)}, ${best.dollars:,.4f})")
    slower = [p for p in price.priced() if p.wall_seconds > deadline and p.nodes < best.nodes]
    if slower:
        last = max(slower, key=lambda p: p.nodes)
        reason += f"; {last.nodes} would take about {duration(last.wall_seconds)}"
    return NodeChoice(best.nodes, price.instance, "deadline", reason, needed, True, price(best.nodes), price.priced())


def relocation(profile: MachineProfile) -> Callable[[int], str]:
    """How a held block reaches the node its next use was placed on after the cluster's
    nodes changed: ``"move"`` (node to node) or ``"read"`` (again, from storage), whichever
    the machine profile prices lower for its bytes (a read pays a request too)."""

    def cheaper(nbytes: int) -> str:
        move = nbytes / profile.network_bytes_per_s
        read = nbytes / profile.storage_read_bytes_per_s + profile.request_seconds
        return "move" if move <= read else "read"

    return cheaper
