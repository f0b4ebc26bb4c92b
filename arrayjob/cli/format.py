"""Human-readable figures for the terminal."""

from __future__ import annotations

from typing import Any

from arrayjob.units import size

__all__ = ["size", "summary"]


def summary(outcome: Any) -> str:
    """The few lines `arrayjob run` prints when it finishes."""
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
        f"{r['tasks']['count']:,} tasks on {r['cluster']['nodes']} node(s), {r['cluster']['cpus']} CPUs",
        f"  between nodes {size(r['network']['bytes_between_nodes'])}; peak object store per node "
        f"{', '.join(size(b) for b in r['memory']['peak_bytes_per_node'])}; "
        f"cost ${r['dollars'].get('total', 0):.4f} (estimated ${r.get('estimate', {}).get('dollars', {}).get('total', 0):.4f})",
        f"  result: {spec.output}/result.zarr (run {outcome.manifest['run_id']}); report.json, report.html",
    ]
    return "\n".join(lines)
