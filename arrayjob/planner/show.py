"""A plan, shown: the text table ``arrayjob plan`` prints, its JSON form, and Graphviz."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from arrayjob.io.locations import ArrayInfo
from arrayjob.planner.ops import Op, Source
from arrayjob.planner.physical import BlockGrid
from arrayjob.planner.plan import Plan
from arrayjob.units import size

NAMED = (Op.SOURCE, Op.VALUE)  # arrays shown by their own names


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return " × ".join(f"{s:,}" for s in shape) if shape else "scalar"


def array_name(plan: Plan, i: int) -> str:
    n = plan.graph.nodes[i]
    if n.op in NAMED:
        return n.label()
    return f"{n.label()}#{i}"


def arrays(plan: Plan) -> list[dict[str, Any]]:
    """Every array of the graph (not scalar constants) with its tiling and grid."""
    out = []
    for i, n in enumerate(plan.graph.nodes):
        if n.op is Op.CONST:
            continue
        entry: dict[str, Any] = {"name": array_name(plan, i), "op": n.op, "shape": list(n.shape), "dtype": n.dtype}
        if isinstance(n.attrs, Source):
            entry["uri"] = n.attrs.array.uri
            entry["chunks"] = list(n.attrs.array.chunks)
        if plan.tilings is not None:
            grid = plan.grid(i)
            entry["tiling"] = plan.tilings[i].describe(n.ndim)
            entry["grid"] = list(grid.grid_shape)
            entry["block"] = list(grid.block_shape)
        if isinstance(n.attrs, Source) and n.attrs.array.sparse is not None:
            entry["sparse"] = _sparse(n.attrs.array, plan.grid(i) if plan.tilings is not None else None)
        if isinstance(n.attrs, Source) and (table := n.attrs.array.table) is not None:
            entry["parquet"] = {"files": len(table.files), "row_groups": len(table.row_groups),
                                "columns": list(table.columns), "list_size": table.list_size,
                                "stored_bytes": table.compressed_bytes}
        out.append(entry)
    return out


def _sparse(info: ArrayInfo, grid: BlockGrid | None) -> dict[str, Any]:
    """A sparse input's non-zeros and bytes, and the least and most a block holds."""
    layout = info.sparse
    assert layout is not None
    entry: dict[str, Any] = {"format": layout.format, "nnz": layout.nnz, "nbytes": info.nbytes,
                             "density": layout.nnz / max(1, math.prod(info.shape))}
    if grid is not None:
        per_block = [layout.nnz_between(s[0].start, s[0].stop, info.chunks[0], info.shape[0])
                     for s in map(grid.selection, grid.indices())]
        entry["block_nnz"] = [min(per_block, default=0), max(per_block, default=0)]
    return entry


def kernels(plan: Plan) -> list[dict[str, Any]]:
    if plan.kernels is None:
        return []
    tasks_per_kernel: Counter[str] = Counter()
    if plan.physical is not None:
        for t in plan.physical.tasks:
            tasks_per_kernel[t.id.rsplit("[", 1)[0]] += 1  # lowering names tasks "<kernel>#<k>[<block>]"
    return [
        {
            "name": k.name,
            "ops": [plan.graph.nodes[i].label() for i in k.nodes],
            "outputs": [array_name(plan, i) for i in k.outputs],
            "tasks": tasks_per_kernel.get(f"{k.name}#{index}", 0),
        }
        for index, k in enumerate(plan.kernels)
    ]


def to_json(plan: Plan, header: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = dict(header or {})
    o = plan.options
    doc["strategies"] = {"tiling": o.tiling, "fusion": o.fusion, "placement": o.placement}
    doc["cluster"] = {"nodes": o.cluster.nodes, "workers_per_node": o.cluster.workers_per_node,
                      "memory_per_node": o.cluster.memory_per_node}
    doc["arrays"] = arrays(plan)
    doc["kernels"] = kernels(plan)
    if plan.physical is not None:
        kinds = Counter(_task_kind(t.kernel.name) for t in plan.physical.tasks)
        per_node = Counter(t.node for t in plan.physical.tasks)
        doc["tasks"] = {"count": len(plan.physical.tasks), "by_kind": dict(kinds),
                        "per_node": [per_node.get(n, 0) for n in range(o.cluster.nodes)]
                        if None not in per_node else None}
    if plan.cost is not None:
        doc["cost"] = plan.cost.as_dict()
    if plan.stats:
        doc["stats"] = dict(plan.stats)
    return doc


def _task_kind(kernel_name: str) -> str:
    if kernel_name == "assemble":
        return "assemble"
    if kernel_name.endswith("_partials"):
        return "combine"
    return "kernel"


def to_text(plan: Plan, title: str = "") -> str:
    doc = to_json(plan)
    lines = [title] if title else []
    s, c = doc["strategies"], doc["cluster"]
    lines.append(f"strategies: tiling {s['tiling']}, fusion {s['fusion']}, placement {s['placement']}; "
                 f"cluster {c['nodes']} node(s) × {c['workers_per_node']} workers")
    lines.append("")
    lines.append(f"{'array':<28} {'shape':>18} {'tiling':>8} {'grid':>8} {'block':>18}")
    for a in doc["arrays"]:
        if "tiling" not in a:
            lines.append(f"{a['name'][:28]:<28} {_fmt_shape(tuple(a['shape'])):>18}")
            continue
        grid = " × ".join(map(str, a["grid"])) or "1"
        lines.append(f"{a['name'][:28]:<28} {_fmt_shape(tuple(a['shape'])):>18} {a['tiling']:>8} "
                     f"{grid:>8} {_fmt_shape(tuple(a['block'])):>18}")
    for a in doc["arrays"]:
        if "sparse" in a:
            sp = a["sparse"]
            blocks = (f"; a block holds {sp['block_nnz'][0]:,} to {sp['block_nnz'][1]:,}"
                      if "block_nnz" in sp else "")
            lines.append(f"{a['name']}: sparse ({sp['format'].upper()}), {sp['nnz']:,} non-zeros "
                         f"({sp['density']:.3g} of the entries), {size(sp['nbytes'])} in memory{blocks}")
        if "parquet" in a:
            pq = a["parquet"]
            names = ", ".join(pq["columns"][:4]) + (", …" if len(pq["columns"]) > 4 else "")
            what = f"column {names} ({pq['list_size']} wide)" if pq["list_size"] else \
                f"{len(pq['columns'])} column(s) ({names})"
            lines.append(f"{a['name']}: Parquet, {pq['files']} file(s), {pq['row_groups']} row groups, {what}, "
                         f"{size(pq['stored_bytes'])} stored")
    if doc["kernels"]:
        lines.append("")
        lines.append(f"kernels ({len(doc['kernels'])}):")
        for k in doc["kernels"]:
            tasks = f", {k['tasks']} tasks" if plan.physical is not None else ""
            lines.append(f"  {k['name']}: {len(k['ops'])} ops ({', '.join(k['ops'])}) -> "
                         f"{', '.join(k['outputs'])}{tasks}")
    if "tasks" in doc:
        t = doc["tasks"]
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(t["by_kind"].items()))
        where = f"; per node {' '.join(map(str, t['per_node']))}" if t["per_node"] else "; nodes chosen by Ray"
        lines.append("")
        lines.append(f"tasks: {t['count']} ({kinds}){where}")
    if plan.cost is not None:
        lines.append("")
        lines.append(plan.cost.table())
    return "\n".join(lines)


def to_dot(plan: Plan) -> str:
    """Graphviz: one node per array op, kernels as clusters, leaves as boxes."""
    g = plan.graph
    lines = ["digraph plan {", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=10];']
    in_kernel: dict[int, int] = {}
    for k, kernel in enumerate(plan.kernels or ()):
        lines.append(f'  subgraph cluster_{k} {{ label="{kernel.name}"; style=rounded; color=gray50;')
        for i in kernel.nodes:
            in_kernel[i] = k
            lines.append(f'    n{i} [label="{_dot_label(plan, i)}"];')
        lines.append("  }")
    for i, n in enumerate(g.nodes):
        if i not in in_kernel:
            shape = "box" if n.op in NAMED else "plaintext"
            lines.append(f'  n{i} [label="{_dot_label(plan, i)}", shape={shape}];')
    for i, n in enumerate(g.nodes):
        for j in n.inputs:
            lines.append(f"  n{j} -> n{i};")
    lines.append("}")
    return "\n".join(lines)


def _dot_label(plan: Plan, i: int) -> str:
    n = plan.graph.nodes[i]
    text = f"{n.label()}\\n{_fmt_shape(n.shape)}"
    if plan.tilings is not None and n.op is not Op.CONST:
        text += f"\\n{plan.tilings[i].describe(n.ndim)} {' × '.join(map(str, plan.grid(i).grid_shape)) or '1'}"
    return text.replace('"', "'")


def render(plan: Plan, fmt: str, title: str = "", header: dict[str, Any] | None = None) -> str:
    if fmt == "json":
        return json.dumps(to_json(plan, header), indent=2)
    if fmt == "dot":
        return to_dot(plan)
    return to_text(plan, title)
