"""Tilings a program fixes itself, which every tiling strategy keeps.

``map_blocks`` fixes how its inputs and outputs are cut into row blocks (the job's block
function depends on it, e.g. TSQR's block height). Stored inputs of such a function are
cut the same way, so their blocks are read as they are needed.
"""

from __future__ import annotations

from arrayjob.planner.ir import Graph
from arrayjob.planner.ops import Blockwise, Cached, Op
from arrayjob.planner.plan import Tiling


def fixed_blocking(graph: Graph) -> tuple[dict[int, Tiling], dict[int, int]]:
    """(node -> tiling, axis class -> block length) that the program requires."""
    tilings: dict[int, Tiling] = {}
    lengths: dict[int, int] = {}
    classes = graph.axis_classes
    for i, node in enumerate(graph.nodes):
        if not isinstance(node.attrs, Blockwise):
            continue
        in_rows, out_rows = node.attrs.in_rows, node.attrs.out_rows
        if out_rows:
            tilings[i] = Tiling((0,))
            lengths.setdefault(classes.of_axis(i, 0), out_rows)
        else:
            tilings[i] = Tiling()
        for j, u in enumerate(node.inputs):
            rows = in_rows[j] if in_rows else None
            if rows and graph.nodes[u].op is Op.SOURCE:
                tilings[u] = Tiling((0,))
                lengths.setdefault(classes.of_axis(u, 0), rows)
    for i, node in enumerate(graph.nodes):
        if node.op is Op.STORE:
            tilings[i] = Tiling()
        elif isinstance(node.attrs, Cached):  # kept blocks are used as they are
            block = node.attrs.block_shape
            tilings[i] = Tiling(tuple(a for a, (b, s) in enumerate(zip(block, node.shape, strict=True)) if b < s))
            for a in tilings[i].axes:
                lengths.setdefault(classes.of_axis(i, a), block[a])
    return tilings, lengths
