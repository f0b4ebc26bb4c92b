"""report.html: one self-contained page (inline SVG, no scripts) beside report.json."""

from __future__ import annotations

import html
from typing import Any

from arrayjob.report.build import lookup

COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D")


def _esc(x: object) -> str:
    return html.escape(str(x))


def _fmt(x: float) -> str:
    if isinstance(x, float) and abs(x) < 100:
        return f"{x:.3g}"
    for unit in ("", "k", "M", "G", "T"):
        if abs(x) < 1000:
            return f"{x:.3g}{unit}"
        x /= 1000
    return f"{x:.3g}P"


def _frame(title: str, top: float, width: int, height: int, left: int, bottom: int) -> list[str]:
    """An SVG's opening, title and five labelled grid lines from 0 to ``top``."""
    parts = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">',
             f'<text x="{left}" y="16" font-weight="bold">{_esc(title)}</text>']
    for k in range(5):
        y = height - bottom - (height - bottom - 30) * k / 4
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{_fmt(top * k / 4)}</text>')
    return parts


def bars(title: str, groups: list[str], series: dict[str, list[float]], unit: str) -> str:
    """Grouped bar chart as SVG."""
    width, height, left, bottom = 640, 260, 60, 40
    top = max([v for vs in series.values() for v in vs] + [1e-12])
    n_series = max(1, len(series))
    slot = (width - left - 20) / max(1, len(groups))
    bar = slot * 0.8 / n_series
    parts = _frame(title, top, width, height, left, bottom)
    for g, name in enumerate(groups):
        x0 = left + g * slot + slot * 0.1
        for s, (label, values) in enumerate(series.items()):
            v = values[g] if g < len(values) else 0.0
            h = (height - bottom - 30) * v / top
            parts.append(f'<rect x="{x0 + s * bar:.1f}" y="{height - bottom - h:.1f}" width="{bar - 2:.1f}" '
                         f'height="{h:.1f}" fill="{COLORS[s % len(COLORS)]}"><title>{_esc(label)} {_esc(name)}: '
                         f'{_fmt(v)} {unit}</title></rect>')
        parts.append(f'<text x="{x0 + slot * 0.4:.1f}" y="{height - bottom + 14}" text-anchor="middle" '
                     f'font-size="11">{_esc(name)}</text>')
    for s, label in enumerate(series):
        parts.append(f'<rect x="{left + 140 * s}" y="{height - 14}" width="10" height="10" fill="{COLORS[s % len(COLORS)]}"/>'
                     f'<text x="{left + 140 * s + 14}" y="{height - 5}" font-size="11">{_esc(label)}</text>')
    parts.append(f'<text x="12" y="{(height - bottom) / 2}" font-size="11" transform="rotate(-90 12 {(height - bottom) / 2})">'
                 f'{_esc(unit)}</text></svg>')
    return "".join(parts)


FAULT_LABELS = {"node_lost": ("node lost", "nodes lost"), "block_reconstructed": ("block rebuilt", "blocks rebuilt"),
                "task_retry": ("task retry", "task retries"), "storage_retry": ("storage retry", "storage retries")}


def fault_label(event: dict[str, Any]) -> str:
    """"node lost", "4 blocks rebuilt", "2 storage retries" for one fault event."""
    one, many = FAULT_LABELS.get(str(event.get("kind")), (str(event.get("kind")), str(event.get("kind"))))
    count = int(event.get("count", 1))
    return one if count == 1 and event.get("kind") == "node_lost" else f"{count} {one if count == 1 else many}"


def lines(title: str, xs: list[float], series: dict[str, list[float]], unit: str,
          faults: list[dict[str, Any]] = ()) -> str:  # type: ignore[assignment]
    """Line chart (steps) of series over time, as SVG; each fault a red dashed mark at its time."""
    width, height, left, bottom = 640, 260, 60, 40
    if not xs:
        return f"<p><em>{_esc(title)}: no samples.</em></p>"
    x_max = max(xs[-1], *(float(f["seconds"]) for f in faults), 1e-9)
    top = max([v for vs in series.values() for v in vs] + [1e-12])
    parts = _frame(title, top, width, height, left, bottom)
    for s, (label, values) in enumerate(series.items()):
        points = " ".join(
            f"{left + (width - left - 20) * x / x_max:.1f},{height - bottom - (height - bottom - 30) * v / top:.1f}"
            for x, v in zip(xs, values, strict=False))
        parts.append(f'<polyline fill="none" stroke="{COLORS[s % len(COLORS)]}" stroke-width="2" points="{points}"/>')
        parts.append(f'<rect x="{left + 140 * s}" y="{height - 14}" width="10" height="10" fill="{COLORS[s % len(COLORS)]}"/>'
                     f'<text x="{left + 140 * s + 14}" y="{height - 5}" font-size="11">{_esc(label)}</text>')
    for fault in faults:
        x = left + (width - left - 20) * float(fault["seconds"]) / x_max
        color = "#D62728" if fault.get("kind") in ("node_lost", "block_reconstructed") else "#FF7F0E"
        parts.append(f'<g class="fault"><line x1="{x:.1f}" x2="{x:.1f}" y1="30" y2="{height - bottom}" stroke="{color}" '
                     f'stroke-dasharray="4 3"/><text x="{x + 3:.1f}" y="40" font-size="10" fill="{color}">'
                     f'{_esc(fault_label(fault))}</text><title>{_esc(fault_label(fault))} at {fault["seconds"]} s'
                     f'{_esc(" (" + str(fault["stage"]) + ")") if fault.get("stage") else ""}</title></g>')
    parts.append(f'<text x="{width - 10}" y="{height - bottom + 14}" text-anchor="end" font-size="11">'
                 f'{_fmt(x_max)} s</text><text x="{left}" y="{height - bottom + 14}" font-size="11">0 s</text>')
    parts.append(f'<text x="12" y="{(height - bottom) / 2}" font-size="11" transform="rotate(-90 12 {(height - bottom) / 2})">'
                 f'{_esc(unit)}</text></svg>')
    return "".join(parts)


def _figures(report: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    est = report.get("estimate") or {}
    errors = report.get("estimate_error") or {}
    rows = []
    for key in ("wall_seconds", "storage.bytes_read", "storage.get_requests", "storage.bytes_written",
                "storage.put_requests", "network.bytes_between_nodes", "tasks.count", "nodes.node_seconds",
                "dollars.total"):
        rows.append((key, lookup(est, key), lookup(report, key), errors.get(key)))
    return rows


def nodes_over_time(report: dict[str, Any]) -> str:
    """A sized cluster's worker nodes over time (a step chart from the joins and departures)
    and each node's span; empty for a run that did not size its cluster."""
    nodes = report.get("nodes") or {}
    events = nodes.get("events") or []
    if not events:
        return ""
    xs, counts, held = [0.0], [0.0], 0
    for e in events:
        xs.append(float(e["seconds"]))
        counts.append(float(held))
        held += 1 if e["kind"] == "join" else -1
        xs.append(float(e["seconds"]))
        counts.append(float(held))
    xs.append(max(float(report.get("wall_seconds", xs[-1])), xs[-1]))
    counts.append(float(held))
    spans = "".join(f"<tr><td>{_esc(p['node_id'][-12:])}</td><td>{_esc(p['joined'])} s</td>"
                    f"<td>{_esc('' if p['left'] is None else p['left'])} s</td><td>{_esc(p['seconds'])}</td>"
                    f"<td>{'yes' if p.get('added') else 'no'}</td></tr>" for p in nodes.get("per_node") or [])
    return (f"<h2>Nodes</h2><p>{_esc(nodes.get('choice', ''))}</p>"
            f"{lines('Worker nodes in use', xs, {'nodes': counts}, 'nodes')}"
            "<table><tr><th>node</th><th>joined</th><th>left</th><th>node-seconds</th><th>added</th></tr>"
            f"{spans}</table>")


def render(report: dict[str, Any]) -> str:
    stages = [s["name"] for s in report.get("stages", [])]
    actual = [s.get("wall_seconds", 0.0) for s in report.get("stages", [])]
    est_stages = {s["name"]: s for s in (report.get("estimate") or {}).get("stages", [])}
    predicted = [est_stages.get(n, {}).get("wall_seconds", 0.0) for n in stages]
    timeline = report.get("timeline", [])
    xs = [t["seconds"] for t in timeline]
    nodes = sorted({n for t in timeline for n in t.get("memory_bytes_per_node", {})})
    memory = {f"node {i}": [t.get("memory_bytes_per_node", {}).get(n, 0) for t in timeline] for i, n in enumerate(nodes)}
    network = {"between nodes (cumulative)": [t.get("network_bytes", 0) for t in timeline]}
    rows = "".join(
        f"<tr><td>{_esc(k)}</td><td>{_esc('' if e is None else _fmt(e))}</td><td>{_esc('' if a is None else _fmt(a))}</td>"
        f"<td>{_esc('' if err is None else f'{err:+.0%}')}</td></tr>"
        for k, e, a, err in _figures(report))
    result = "".join(f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>" for k, v in (report.get("result") or {}).items())
    faults = report.get("faults") or {}
    events = list(faults.get("events") or [])
    fault_rows = "".join(f"<tr><td>{_esc(e['seconds'])} s</td><td>{_esc(e.get('stage') or '')}</td>"
                         f"<td>{_esc(fault_label(e))}</td><td>{_esc(e.get('node', ''))}</td></tr>" for e in events)
    fault_section = (f"<h2>Faults</h2><table><tr><th>when</th><th>stage</th><th>what</th><th>node</th></tr>"
                     f"{fault_rows}</table>") if events else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>arrayjob report: {_esc(report.get('job', ''))}</title>
<style>body{{font-family:Helvetica,Arial,sans-serif;max-width:760px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border-bottom:1px solid #ddd;padding:4px 10px;text-align:right}}
td:first-child,th:first-child{{text-align:left}}svg{{display:block;margin:1em 0;font-family:inherit}}</style></head>
<body><h1>{_esc(report.get('job', ''))}: {_esc(report.get('algorithm', ''))}</h1>
<p>{_esc(report.get('wall_seconds', ''))} s on {_esc((report.get('cluster') or {}).get('nodes', '?'))} node(s);
arrayjob {_esc(report.get('arrayjob_version', ''))}.</p>
<h2>Result</h2><table>{result}</table>
<h2>Estimate and actual</h2>
<table><tr><th>figure</th><th>estimate</th><th>actual</th><th>error</th></tr>{rows}</table>
{bars("Wall time per stage", stages, {"estimate": predicted, "actual": actual}, "seconds")}
{fault_section}
{nodes_over_time(report)}
<h2>Over time</h2>
{lines("Object-store memory per node", xs, memory, "bytes", events)}
{lines("Bytes moved between nodes", xs, network, "bytes", events)}
</body></html>
"""
