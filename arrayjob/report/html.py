"""report.html: one self-contained page (inline SVG, no scripts) beside report.json.

Every number is shown with its unit and a sensible number of significant digits
(``report.figures``); every plot has a titled y axis with its unit, an x axis, and a legend.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from arrayjob.report.build import lookup
from arrayjob.report.figures import FIGURE_UNITS, nice_ticks, quantity, value

COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D")
STAGE_FILL = ("#f4f4f4", "#e9eef5")
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 680, 290, 76, 16, 30, 62


def _esc(x: object) -> str:
    return html.escape(str(x))


def _y(v: float, top: float) -> float:
    return HEIGHT - BOTTOM - (HEIGHT - BOTTOM - TOP) * (v / top if top else 0.0)


def _frame(title: str, ticks: list[float], unit: str, axis_label: str, *, zero: bool = False) -> list[str]:
    """An SVG's opening, title, y axis with ``ticks`` (labels in ``unit``) and its title. An
    all-``zero`` plot labels its zero line only: a scale would be made up."""
    top = ticks[-1]
    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
             f'aria-label="{_esc(title)}"><title>{_esc(title)}</title>',
             f'<text x="{LEFT}" y="16" font-weight="bold">{_esc(title)}</text>']
    for tick in ticks:
        y = _y(tick, top)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                     f'<text class="ytick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
                     f'{_esc(quantity(tick, unit)) if tick == 0 or not zero else ""}</text>')
    middle = (HEIGHT - BOTTOM + TOP) / 2
    parts.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#888"/>'
                 f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM}" stroke="#888"/>'
                 f'<text class="ylabel" x="14" y="{middle}" font-size="11" text-anchor="middle" '
                 f'transform="rotate(-90 14 {middle})">{_esc(axis_label)}</text>')
    return parts


def _legend(labels: list[str], colors: list[str] | None = None) -> str:
    colors = colors or [COLORS[i % len(COLORS)] for i in range(len(labels))]
    x: float = LEFT
    parts = ['<g class="legend">']
    for label, color in zip(labels, colors, strict=True):
        parts.append(f'<rect x="{x}" y="{HEIGHT - 16}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{x + 14}" y="{HEIGHT - 7}" font-size="11">{_esc(label)}</text>')
        x += 24 + 6.5 * len(label)
    return "".join(parts) + "</g>"


def _all_zero_note(series: dict[str, list[float]], what: str) -> str:
    if any(v for vs in series.values() for v in vs):
        return ""
    return (f'<text class="all-zero" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{(HEIGHT - BOTTOM + TOP) / 2}" '
            f'text-anchor="middle" font-size="12" fill="#666">all zero: {_esc(what)}</text>')


def bars(title: str, groups: list[str], series: dict[str, list[float]], unit: str, axis_label: str) -> str:
    """Grouped bar chart as SVG: one group per stage, one bar per series, a legend."""
    ticks = nice_ticks(max([v for vs in series.values() for v in vs] + [0.0]))
    top = ticks[-1]
    n_series = max(1, len(series))
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(groups))
    bar = slot * 0.8 / n_series
    parts = _frame(title, ticks, unit, axis_label, zero=not any(v for vs in series.values() for v in vs))
    for g, name in enumerate(groups):
        x0 = LEFT + g * slot + slot * 0.1
        for s, (label, values) in enumerate(series.items()):
            v = values[g] if g < len(values) else 0.0
            y = _y(v, top)
            parts.append(f'<rect class="bar" x="{x0 + s * bar:.1f}" y="{y:.1f}" width="{bar - 2:.1f}" '
                         f'height="{HEIGHT - BOTTOM - y:.1f}" fill="{COLORS[s % len(COLORS)]}"><title>{_esc(label)}, '
                         f'{_esc(name)}: {_esc(quantity(v, unit))}</title></rect>')
        parts.append(f'<text class="xtick" x="{x0 + slot * 0.4:.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="middle" '
                     f'font-size="11">{_esc(name)}</text>')
    parts.append(f'<text class="xlabel" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - BOTTOM + 30}" '
                 f'text-anchor="middle" font-size="11">stage</text>')
    parts.append(_all_zero_note(series, "nothing to show"))
    parts.append(_legend(list(series)))
    return "".join(parts) + "</svg>"


FAULT_LABELS = {"node_lost": ("node lost", "nodes lost"), "block_reconstructed": ("block rebuilt", "blocks rebuilt"),
                "task_retry": ("task retry", "task retries"), "storage_retry": ("storage retry", "storage retries")}


def fault_label(event: dict[str, Any]) -> str:
    """"node lost", "4 blocks rebuilt", "2 storage retries" for one fault event."""
    one, many = FAULT_LABELS.get(str(event.get("kind")), (str(event.get("kind")), str(event.get("kind"))))
    count = int(event.get("count", 1))
    return one if count == 1 and event.get("kind") == "node_lost" else f"{count} {one if count == 1 else many}"


def lines(title: str, x_max: float, series: dict[str, list[tuple[float, float]]], unit: str, axis_label: str, *,
          stages: Sequence[dict[str, Any]] = (), faults: Sequence[dict[str, Any]] = (),
          zero_means: str = "") -> str:
    """Step chart of series of (seconds, value) over the whole run, as SVG: the run's stages
    shaded and named behind it, each sample a dot, each fault a dashed mark at its time."""
    if not any(series.values()):
        return f'<p class="no-samples"><em>{_esc(title)}: no samples.</em></p>'
    x_max = max(x_max, *(x for pts in series.values() for x, _ in pts),
                *(float(f["seconds"]) for f in faults), 1e-9)
    ticks = nice_ticks(max([v for pts in series.values() for _, v in pts] + [0.0]))
    top = ticks[-1]

    def px(x: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * x / x_max

    parts = _frame(title, ticks, unit, axis_label, zero=not any(v for pts in series.values() for _, v in pts))
    for i, stage in enumerate(stages):  # behind the lines
        x0, x1 = px(float(stage["start_seconds"])), px(float(stage["start_seconds"]) + float(stage["wall_seconds"]))
        parts.insert(2, f'<g class="stage"><rect x="{x0:.1f}" y="{TOP}" width="{max(x1 - x0, 0.5):.1f}" '
                        f'height="{HEIGHT - BOTTOM - TOP}" fill="{STAGE_FILL[i % 2]}"/>'
                        + (f'<text x="{(x0 + x1) / 2:.1f}" y="{TOP + 12}" text-anchor="middle" font-size="9" '
                           f'fill="#777">{_esc(stage["name"])}</text>' if x1 - x0 > 28 else "")
                        + f'<title>{_esc(stage["name"])}: {_esc(quantity(float(stage["wall_seconds"]), "s"))}'
                          f'</title></g>')
    for s, (label, pts) in enumerate(series.items()):
        color = COLORS[s % len(COLORS)]
        steps: list[str] = []
        for k, (x, v) in enumerate(pts):
            if k:
                steps.append(f"{px(x):.1f},{_y(pts[k - 1][1], top):.1f}")
            steps.append(f"{px(x):.1f},{_y(v, top):.1f}")
        parts.append(f'<polyline class="series" fill="none" stroke="{color}" stroke-width="2" points="{" ".join(steps)}"/>')
        parts.extend(f'<circle cx="{px(x):.1f}" cy="{_y(v, top):.1f}" r="2.5" fill="{color}"><title>{_esc(label)} at '
                     f'{_esc(quantity(x, "s"))}: {_esc(quantity(v, unit))}</title></circle>' for x, v in pts)
    for fault in faults:
        x = px(float(fault["seconds"]))
        color = "#D62728" if fault.get("kind") in ("node_lost", "block_reconstructed") else "#FF7F0E"
        parts.append(f'<g class="fault"><line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" '
                     f'stroke="{color}" stroke-dasharray="4 3"/><text x="{x + 3:.1f}" y="{TOP + 24}" font-size="10" '
                     f'fill="{color}">{_esc(fault_label(fault))}</text><title>{_esc(fault_label(fault))} at '
                     f'{_esc(quantity(float(fault["seconds"]), "s"))}'
                     f'{_esc(" (" + str(fault["stage"]) + ")") if fault.get("stage") else ""}</title></g>')
    for tick in nice_ticks(x_max, count=6):
        if tick <= x_max:
            parts.append(f'<text class="xtick" x="{px(tick):.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="middle" '
                         f'font-size="10">{_esc(quantity(tick, "s"))}</text>')
    parts.append(f'<text class="xlabel" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - BOTTOM + 30}" '
                 f'text-anchor="middle" font-size="11">time since the run started</text>')
    parts.append(_all_zero_note({k: [v for _, v in pts] for k, pts in series.items()}, zero_means))
    parts.append(_legend(list(series)))
    return "".join(parts) + "</svg>"


COMPARED = ("wall_seconds", "storage.bytes_read", "storage.get_requests", "storage.bytes_written",
            "storage.put_requests", "network.bytes_between_nodes", "memory.peak_bytes_per_node", "tasks.count",
            "nodes.node_seconds", "dollars.total")


def _error(e: float | None) -> str:
    return "" if e is None else f"{e:+.0%}"


def _figure(report: dict[str, Any], doc: dict[str, Any] | None, key: str) -> str:
    v = lookup(doc or {}, key)
    if isinstance(v, list):
        v = max(v, default=0)
    return "" if v is None else quantity(v, FIGURE_UNITS.get(key, ""))


def estimate_table(report: dict[str, Any]) -> str:
    """Estimate beside actual. For an iterative job that stopped before the iterations the
    estimate assumed, the estimate for the iterations it ran stands beside the one made
    before the run, and the error is the rescaled one's: that is the model's error."""
    before = report.get("estimate") or {}
    rescaled = report.get("estimate_rescaled")
    assumed = lookup(before, "iterations.assumed")
    head = f"estimate before the run ({assumed} iterations)" if assumed else "estimate before the run"
    cols = [head]
    if rescaled:
        cols.append(f"estimate for the {lookup(rescaled, 'iterations.assumed')} iterations run")
    errors = (report.get("estimate_rescaled_error") if rescaled else report.get("estimate_error")) or {}
    rows = []
    for key in COMPARED:
        cells = [_figure(report, before, key)] + ([_figure(report, rescaled, key)] if rescaled else [])
        rows.append(f"<tr><td>{_esc(key)}</td>{''.join(f'<td>{_esc(c)}</td>' for c in cells)}"
                    f"<td>{_esc(_figure(report, report, key))}</td><td>{_esc(_error(errors.get(key)))}</td></tr>")
    error_head = "error (vs the estimate for the iterations run)" if rescaled else "error"
    return (f'<table class="estimate"><tr><th>figure</th>{"".join(f"<th>{_esc(c)}</th>" for c in cols)}'
            f"<th>actual</th><th>{_esc(error_head)}</th></tr>{''.join(rows)}</table>")


def _memory_series(report: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Object-store bytes per node over the run: nothing before the load, the input blocks
    held from the end of the load, each measured run's peak, held until the run ends."""
    timeline = report.get("timeline") or []
    node_ids = list((report.get("cluster") or {}).get("node_ids") or [])
    node_ids += sorted({n for t in timeline for n in t.get("memory_bytes_per_node", {})} - set(node_ids))
    held = (report.get("memory") or {}).get("input_block_bytes_per_node") or []
    load = next((s for s in report.get("stages", []) if s["name"] == "load" and "start_seconds" in s), None)
    end = max((float(s.get("start_seconds", 0)) + float(s["wall_seconds"]) for s in report.get("stages", [])),
              default=0.0)
    series = {}
    for i, node in enumerate(node_ids):
        pts: list[tuple[float, float]] = []
        if load is not None:
            pts = [(0.0, 0.0), (float(load["start_seconds"]), 0.0)]
            if i < len(held):
                pts.append((float(load["start_seconds"]) + float(load["wall_seconds"]), float(held[i])))
        pts += [(float(t["seconds"]), float(t.get("memory_bytes_per_node", {}).get(node, 0))) for t in timeline]
        if pts and end > pts[-1][0]:
            pts.append((end, pts[-1][1]))
        series[f"node {i}"] = pts
    return series


def nodes_over_time(report: dict[str, Any]) -> str:
    """A sized cluster's worker nodes over time (a step chart from the joins and departures)
    and each node's span; empty for a run that did not size its cluster."""
    nodes = report.get("nodes") or {}
    events = nodes.get("events") or []
    if not events:
        return ""
    points, held = [(0.0, 0.0)], 0
    for e in events:
        held += 1 if e["kind"] == "join" else -1
        points.append((float(e["seconds"]), float(held)))
    wall = max(float(report.get("wall_seconds", 0.0)), points[-1][0])
    points.append((wall, float(held)))
    spans = "".join(f"<tr><td>{_esc(p['node_id'][-12:])}</td><td>{_esc(p['joined'])} s</td>"
                    f"<td>{_esc('' if p['left'] is None else p['left'])} s</td><td>{_esc(p['seconds'])}</td>"
                    f"<td>{'yes' if p.get('added') else 'no'}</td></tr>" for p in nodes.get("per_node") or [])
    return (f"<h2>Nodes</h2><p>{_esc(nodes.get('choice', ''))}</p>"
            f"{lines('Worker nodes in use', wall, {'nodes': points}, '', 'worker nodes in use')}"
            "<table><tr><th>node</th><th>joined</th><th>left</th><th>node-seconds</th><th>added</th></tr>"
            f"{spans}</table>")


def render(report: dict[str, Any]) -> str:
    stages = report.get("stages", [])
    names = [s["name"] for s in stages]
    actual = [float(s.get("wall_seconds", 0.0)) for s in stages]
    wall_series: dict[str, list[float]] = {}
    for label, doc in (("estimate before the run", report.get("estimate")),
                       ("estimate for the iterations run", report.get("estimate_rescaled"))):
        if doc:
            by_name = {s["name"]: s for s in doc.get("stages", [])}
            wall_series[label] = [float(by_name.get(n, {}).get("wall_seconds", 0.0)) for n in names]
    wall_series["actual"] = actual
    timed = [s for s in stages if "start_seconds" in s]
    wall = float(report.get("wall_seconds", 0.0))
    timeline = report.get("timeline") or []
    network = {"between nodes, so far": [(0.0, 0.0)] + [(float(t["seconds"]), float(t.get("network_bytes", 0)))
                                                         for t in timeline]} if timeline else {}
    result = "".join(f"<tr><td>{_esc(k.replace('_', ' '))}</td><td>{_esc(value(v))}</td></tr>"
                     for k, v in (report.get("result") or {}).items())
    faults = report.get("faults") or {}
    events = list(faults.get("events") or [])
    fault_rows = "".join(f"<tr><td>{_esc(quantity(float(e['seconds']), 's'))}</td><td>{_esc(e.get('stage') or '')}</td>"
                         f"<td>{_esc(fault_label(e))}</td><td>{_esc(e.get('node', ''))}</td></tr>" for e in events)
    fault_section = (f"<h2>Faults</h2><table><tr><th>when</th><th>stage</th><th>what</th><th>node</th></tr>"
                     f"{fault_rows}</table>") if events else ""
    nodes = (report.get("cluster") or {}).get("nodes", "?")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>arrayjob report: {_esc(report.get('job', ''))}</title>
<style>body{{font-family:Helvetica,Arial,sans-serif;max-width:760px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border-bottom:1px solid #ddd;padding:4px 10px;text-align:right}}td{{white-space:nowrap}}
th{{font-weight:600;vertical-align:bottom}}td:first-child,th:first-child{{text-align:left}}
svg{{display:block;margin:1em 0;font-family:inherit}}</style></head>
<body><h1>{_esc(report.get('job', ''))}: {_esc(report.get('algorithm', ''))}</h1>
<p class="headline">{_esc(quantity(wall, 's'))} on {_esc(nodes)} node(s); arrayjob {_esc(report.get('arrayjob_version', ''))}.</p>
<h2>Result</h2><table class="result">{result}</table>
<h2>Estimate and actual</h2>
{estimate_table(report)}
{bars("Wall time per stage", names, wall_series, "s", "wall time (seconds)")}
{fault_section}
{nodes_over_time(report)}
<h2>Over time</h2>
{lines("Object-store memory per node", wall, _memory_series(report), "B", "object-store memory (bytes)",
       stages=timed, faults=events, zero_means="no blocks held")}
{lines("Bytes moved between nodes", wall, network, "B", "bytes moved (cumulative)", stages=timed, faults=events,
       zero_means="every task ran where its inputs were" + (" (one node)" if nodes == 1 else ""))}
</body></html>
"""
