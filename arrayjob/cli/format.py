"""Human-readable figures for the terminal."""

from __future__ import annotations

from typing import Any

from arrayjob.units import dollars, duration, size

__all__ = ["final_line", "published_summary", "summary"]


FIGURES = (
    ("wall_seconds", "wall time", duration),
    ("storage.bytes_read", "storage read", size),
    ("storage.get_requests", "GET requests", lambda v: f"{v:,}"),
    ("storage.bytes_written", "storage written", size),
    ("storage.put_requests", "PUT requests", lambda v: f"{v:,}"),
    ("network.bytes_between_nodes", "between nodes", size),
    ("memory.peak_bytes_per_node", "peak memory per node", lambda v: ", ".join(size(b) for b in v)),
    ("tasks.count", "tasks", lambda v: f"{v:,}"),
    ("nodes.node_seconds", "node-seconds", lambda v: f"{v:.1f}"),
    ("dollars.total", "dollars", dollars),
)


def figures(report: dict[str, Any], *, table: bool) -> str:
    """The report's figures beside the estimate: a table for a terminal, else one per line.
    When an iterative job ran fewer iterations than the estimate assumed, the estimate for
    the iterations it ran stands beside it and the error is against that one."""
    from arrayjob.report.build import lookup

    estimate = report.get("estimate") or {}
    rescaled = report.get("estimate_rescaled")
    errors = (report.get("estimate_rescaled_error") if rescaled else report.get("estimate_error")) or {}
    rows = []
    for key, label, fmt in FIGURES:
        actual, predicted, error = lookup(report, key), lookup(estimate, key), errors.get(key)
        again = lookup(rescaled, key) if rescaled else None
        rows.append((label, "" if actual is None else fmt(actual), "" if predicted is None else fmt(predicted),
                     "" if again is None else fmt(again), "" if error is None else f"{error:+.0%}", key))
    ran = lookup(rescaled, "iterations.assumed") if rescaled else None
    if not table:
        return "\n".join(f"{key}={a} (estimate {e}" + (f"; for the {ran} iterations run {r}" if ran else "")
                         + f"{', ' + err if err else ''})" for _, a, e, r, err, key in rows)
    width = max(len(r[0]) for r in rows)
    if ran:
        head = f"{'for ' + str(ran) + ' iter.':>14}  "
        lines = [f"  {'':<{width}}  {'actual':>14}  {'estimate':>14}  {head}{'error':>6}"]
        lines += [f"  {label:<{width}}  {a:>14}  {e:>14}  {r:>14}  {err:>6}" for label, a, e, r, err, _ in rows]
    else:
        lines = [f"  {'':<{width}}  {'actual':>14}  {'estimate':>14}  {'error':>6}"]
        lines += [f"  {label:<{width}}  {a:>14}  {e:>14}  {err:>6}" for label, a, e, _, err, _ in rows]
    return "\n".join(lines)


def calibration_line(report: dict[str, Any]) -> list[str]:
    """"  estimate uncalibrated: ...how to calibrate", when the run's estimate used the shipped profile."""
    from arrayjob.costing.profile import UNCALIBRATED

    profile = (report.get("estimate") or {}).get("profile") or {}
    return [f"  estimate {UNCALIBRATED}"] if profile.get("calibrated") is False else []


def _nodes(report: dict[str, Any]) -> str:
    cluster = report["cluster"]
    n, lost = cluster["nodes"], cluster.get("nodes_lost", 0)
    return f"{n} node(s)" if not lost else f"{n} nodes, {lost} lost"


def faults_line(report: dict[str, Any]) -> list[str]:
    """"  faults: 1 node lost, 4 blocks rebuilt, 2 task retries, 7 storage retries", if any."""
    f = report.get("faults") or {}
    kinds = (("nodes_lost", "node lost", "nodes lost"), ("blocks_reconstructed", "block rebuilt", "blocks rebuilt"),
             ("task_retries", "task retry", "task retries"), ("storage_retries", "storage retry", "storage retries"))
    parts = [f"{f[key]} {one if f[key] == 1 else many}" for key, one, many in kinds if f.get(key)]
    return [f"  faults: {', '.join(parts)}"] if parts else []


def nodes_line(report: dict[str, Any]) -> list[str]:
    """"  nodes: asked for 3 × fake.small, used 3 at most (3 added), 70.8 node-seconds, $0.002 of compute",
    for a run that sized its cluster."""
    n = report.get("nodes") or {}
    if "requested" not in n:
        return []
    compute = (report.get("dollars") or {}).get("compute")
    return [f"  nodes: asked for {n['requested']} × {n['instance_type']}, used {n['count']} at most "
            f"({n['added']} added), {n['node_seconds']:.1f} node-seconds"
            + (f", {dollars(compute)} of compute" if compute is not None else "")]
def memory_line(report: dict[str, Any]) -> list[str]:
    """"  memory: 31% of the inputs resident within a 480.0 MB budget; 10.8 GB brought back from the spill", when
    the budget streamed anything; what Ray spilled on its own, when a store overflowed."""
    m = report["memory"]
    spilled = m.get("ray_spilled_bytes", 0)
    ray_spilling = [f"  memory: Ray spilled {size(spilled)} to its nodes' disks and restored "
                    f"{size(m.get('ray_restored_bytes', 0))}: an object store overflowed (its peak "
                    f"{size(max(m.get('store_peak_bytes_per_node') or [0]))})"] if spilled else []
    return _budget_line(report) + ray_spilling


def _budget_line(report: dict[str, Any]) -> list[str]:
    m, st = report["memory"], report["storage"]
    peak, budget = max(m["peak_bytes_per_node"], default=0), m.get("budget_bytes")
    if budget is not None and peak > budget:  # blocks the budget does not govern (PageRank's kept graph)
        return [f"  memory: peak {size(peak)} over the {size(budget)} budget: intermediates and blocks kept "
                "between programs (PageRank's graph) are not streamed"]
    if m.get("streamed_from") is None:
        return []
    back = st.get("bytes_reread", 0) + m.get("spill_bytes_read", 0)
    return [f"  memory: {m['resident_fraction']:.0%} of the inputs resident within a {size(m['budget_bytes'])} budget "
            f"(peak {size(max(m['peak_bytes_per_node'], default=0))}); {size(back)} brought back from the "
            f"{m['streamed_from']}"]


def summary(outcome: Any, *, table: bool = False) -> str:
    """What `arrayjob run` prints when it finishes."""
    spec = outcome.spec
    if outcome.skipped:
        m = outcome.manifest
        return (f"{spec.name}: already complete at {spec.output} "
                f"(run {m.get('run_id', '?')}, {m.get('committed_at', '?')}); --overwrite to run again")
    r = outcome.report
    stages = ", ".join(f"{s['name']} {duration(s['wall_seconds'])}" for s in r["stages"])
    st = r["storage"]
    lines = [f"{spec.name}: {outcome.description}"]
    lines += [f"  {line}" for line in outcome.result.summary]
    lines += [
        f"  wall {duration(r['wall_seconds'])}: {stages}",
        f"  read {size(st['bytes_read'])} in {st['get_requests']:,} requests, "
        f"wrote {size(st['bytes_written'])} in {st['put_requests']:,} requests; "
        f"{r['tasks']['count']:,} tasks on {_nodes(r)}, {r['cluster']['cpus']} CPUs",
        *memory_line(r),
        *faults_line(r),
        *nodes_line(r),
        f"  result: {spec.output.join(outcome.manifest['prefix'])}/result.zarr (run {outcome.manifest['run_id']}); "
        "report.json, report.html beside it",
        figures(r, table=table),
        *calibration_line(r),
    ]
    return "\n".join(lines)


def final_line(outcome: Any) -> str:
    """`arrayjob run --quiet`'s one line: what was fitted, how long it took, where it is."""
    spec = outcome.spec
    if outcome.skipped:
        return summary(outcome)
    r, m = outcome.report, outcome.manifest
    fit = outcome.result.summary[0] if outcome.result.summary else outcome.description
    return (f"{spec.name}: {fit}; wall {duration(r['wall_seconds'])}; "
            f"result {spec.output.join(m['prefix'])}/result.zarr (run {m['run_id']})")


def _figure(value: Any) -> str:
    """A result attribute as people read it: 4 significant digits, thousands separated."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value).lower() if isinstance(value, bool) else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}" if value == 0 or 1e-3 <= abs(value) < 1e5 else f"{value:.3e}"


def published_summary(output: Any, manifest: dict[str, Any], report: dict[str, Any], *, table: bool = False) -> str:
    """What `arrayjob show` prints: the published run's summary, from its report.json."""
    r = report
    st = r["storage"]
    stages = ", ".join(f"{s['name']} {duration(s['wall_seconds'])}" for s in r["stages"])
    result = ", ".join(f"{k.replace('_', ' ')} {_figure(v)}" for k, v in (r.get("result") or {}).items())
    prefix = manifest.get("prefix", "")
    where = output.join(prefix) if prefix else output
    lines = [
        f"{r['job']}: {r['algorithm']}, run {manifest.get('run_id', '?')}, published {manifest.get('committed_at', '?')}"
        f" by arrayjob {manifest.get('arrayjob_version', '?')}",
        f"  result: {result}" if result else "  result: (no figures)",
        f"  wall {duration(r['wall_seconds'])}: {stages}",
        f"  read {size(st['bytes_read'])} in {st['get_requests']:,} requests, "
        f"wrote {size(st['bytes_written'])} in {st['put_requests']:,} requests; "
        f"{r['tasks']['count']:,} tasks on {_nodes(r)}, {r['cluster']['cpus']} CPUs",
        *faults_line(r),
        f"  files: {where}/result.zarr; report.json, report.html beside it",
        figures(r, table=True) if table else figures(r, table=False).replace("\n", "\n  ").join(["  ", ""]),
        *calibration_line(r),
    ]
    return "\n".join(lines)
