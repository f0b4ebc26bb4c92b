"""Human-readable figures for the terminal."""

from __future__ import annotations

from typing import Any

from arrayjob.units import size

__all__ = ["size", "summary"]


FIGURES = (
    ("wall_seconds", "wall time", lambda v: f"{v:.2f} s"),
    ("storage.bytes_read", "storage read", size),
    ("storage.get_requests", "GET requests", lambda v: f"{v:,}"),
    ("storage.bytes_written", "storage written", size),
    ("storage.put_requests", "PUT requests", lambda v: f"{v:,}"),
    ("network.bytes_between_nodes", "between nodes", size),
    ("memory.peak_bytes_per_node", "peak memory per node", lambda v: ", ".join(size(b) for b in v)),
    ("tasks.count", "tasks", lambda v: f"{v:,}"),
    ("nodes.node_seconds", "node-seconds", lambda v: f"{v:.1f}"),
    ("dollars.total", "dollars", lambda v: f"${v:.4f}"),
)


def figures(report: dict[str, Any], *, table: bool) -> str:
    """The report's figures beside the estimate: a table for a terminal, else one per line."""
    from arrayjob.report.build import lookup

    estimate = report.get("estimate") or {}
    errors = report.get("estimate_error") or {}
    rows = []
    for key, label, fmt in FIGURES:
        actual, predicted, error = lookup(report, key), lookup(estimate, key), errors.get(key)
        rows.append((label, "" if actual is None else fmt(actual), "" if predicted is None else fmt(predicted),
                     "" if error is None else f"{error:+.0%}", key))
    if not table:
        return "\n".join(f"{key}={a} (estimate {e}{', ' + err if err else ''})" for _, a, e, err, key in rows)
    width = max(len(r[0]) for r in rows)
    lines = [f"  {'':<{width}}  {'actual':>14}  {'estimate':>14}  {'error':>6}"]
    lines += [f"  {label:<{width}}  {a:>14}  {e:>14}  {err:>6}" for label, a, e, err, _ in rows]
    return "\n".join(lines)


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


def memory_line(report: dict[str, Any]) -> list[str]:
    """"  memory: 31% of the inputs resident within a 480.0 MB budget; 10.8 GB brought back from the spill", when
    the budget streamed anything."""
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
    stages = ", ".join(f"{s['name']} {s['wall_seconds']:.2f} s" for s in r["stages"])
    st = r["storage"]
    lines = [f"{spec.name}: {outcome.description}"]
    lines += [f"  {line}" for line in outcome.result.summary]
    lines += [
        f"  wall {r['wall_seconds']:.2f} s: {stages}",
        f"  read {size(st['bytes_read'])} in {st['get_requests']:,} requests, "
        f"wrote {size(st['bytes_written'])} in {st['put_requests']:,} requests; "
        f"{r['tasks']['count']:,} tasks on {_nodes(r)}, {r['cluster']['cpus']} CPUs",
        *memory_line(r),
        *faults_line(r),
        f"  result: {spec.output.join(outcome.manifest['prefix'])}/result.zarr (run {outcome.manifest['run_id']}); "
        "report.json, report.html beside it",
        figures(r, table=table),
    ]
    return "\n".join(lines)
