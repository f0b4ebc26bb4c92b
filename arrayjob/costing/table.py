"""The estimate as people read it: an infracost-style table and a one-line summary."""

from __future__ import annotations

from arrayjob.costing.estimate import Estimate
from arrayjob.costing.profile import UNCALIBRATED
from arrayjob.units import dollars, duration, size


def table(est: Estimate, choice: str = "") -> str:
    """The estimate as a table; ``choice`` is the node-count line (``NodeChoice.line``)."""
    d = est.dollars()
    rows: list[tuple[str, str, str, str]] = []

    def stage_rows(title: str, items: list[tuple[str, str, str, str]]) -> None:
        rows.append((title, "", "", ""))
        for i, (name, qty, unit, cost) in enumerate(items):
            rows.append((("└─ " if i == len(items) - 1 else "├─ ") + name, qty, unit, cost))

    by = {s.name: s for s in est.stages}
    load, write = by["load"], by["write"]
    fit = est.stages[est.stages.index(load) + 1]  # the job's compute stage (validate may come first)
    if "validate" in by:  # what opening the inputs read: a sparse input's indptr, Parquet footers
        stage_rows("validate", [
            ("Storage read (metadata)", size(by["validate"].bytes_read), "", ""),
            ("GET requests", f"{by['validate'].get_requests:,}", "requests", ""),
        ])
    if est.scale_up_seconds:
        stage_rows("scale up", [(f"Start {est.nodes_added} × {est.instance.name} (autoscaler)",
                                 f"{est.scale_up_seconds:.1f}", "s", "")])
    stage_rows("connect", [("Start or reach Ray", f"{by['connect'].wall_seconds:.1f}", "s", "")])
    stage_rows("load", [
        ("Storage read", size(load.bytes_read), "", ""),
        ("GET requests", f"{load.get_requests:,}", "requests", dollars(d["get_requests"])),
        ("Wall time", f"{load.wall_seconds:.2f}", "s", ""),
    ])
    streaming = [("Re-read from storage", size(fit.bytes_reread), "", "")] if fit.bytes_reread else []
    if fit.spill_bytes_read:
        streaming.append(("Read back from spill", size(fit.spill_bytes_read), "", ""))
    stage_rows(f"{fit.name} ({fit.runs:,} passes)", [
        *streaming,
        ("Between nodes", size(fit.bytes_between_nodes), "", ""),
        ("Memory touched", size(fit.bytes_touched), "", ""),
        ("FLOPs", f"{fit.flops:.3g}", "flop", ""),
        ("Tasks", f"{fit.tasks:,}", "tasks", ""),
        ("Wall time", f"{fit.wall_seconds:.2f}", "s", ""),
    ])
    stage_rows("write", [
        ("Storage written", size(write.bytes_written), "", ""),
        ("PUT requests", f"{write.put_requests:,}", "requests", dollars(d["put_requests"])),
        ("Wall time", f"{write.wall_seconds:.2f}", "s", ""),
    ])
    rows.append((f"compute: {est.nodes} × {est.instance.name}", f"{est.node_seconds / 3600:.4f}", "node-hours",
                 dollars(d["compute"])))
    width = max(len(r[0]) for r in rows) + 2
    lines = [f" {'Name':<{width}}{'Quantity':>12}  {'Unit':<12}{'Cost':>10}"]
    lines += [f" {n:<{width}}{q:>12}  {u:<12}{c:>10}" for n, q, u, c in rows]
    lines.append("")
    lines.append(f" {'OVERALL TOTAL':<{width}}{'':>12}  {'':<12}{dollars(d['total']):>10}")
    lines.append("─" * (width + 37))
    peak = max(est.peak_bytes_per_node, default=0)
    lines.append(f" Peak memory per node: {size(peak)} (of {est.instance.memory_gib:g} GiB; "
                 f"budget {size(est.budget_bytes)} of the object store)")
    if est.resident_fraction < 1:
        source = next((r.source for r in est.residencies if r.streams), "bucket")
        lines.append(f" Resident: {est.resident_fraction:.0%} of the inputs; streamed from the {source}, "
                     f"{size(est.reread_per_iteration)} brought back per iteration "
                     f"(about {duration(est.reread_seconds_per_iteration)})")
    if choice:
        lines.append(f" Nodes: {choice}")
    lines += [f" Assumes: {a}" for a in est.assumptions()]
    if est.history is not None and est.history.line():
        lines.append(f" History: {est.history.line()}")
    if not est.profile.calibrated:
        lines.append(f" Estimate {UNCALIBRATED}")
    lines.append("")
    lines.append(summary(est))
    return "\n".join(lines)


def summary(est: Estimate) -> str:
    load = next(s for s in est.stages if s.name == "load")
    return (f"This job will read {size(load.bytes_read)} in {load.get_requests:,} requests and run about "
            f"{duration(est.wall_seconds)} on {est.nodes} × {est.instance.name}: about {dollars(est.dollars()['total'])}.")
