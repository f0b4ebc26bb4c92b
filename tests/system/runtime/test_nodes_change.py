"""Nodes that come and go between iterations of a sized run: a node added during the fit is
planned on from the next program on; a node removed is survived (the node-loss machinery).

In the session's multi-node cluster harness (``tests/harness/nodes_change_run.py``,
``tests/harness/cluster_harness.py``): each run is held after an iteration of its fit while the node
joins or dies, so the change lands mid-fit whatever the machine's speed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from sklearn.linear_model import LogisticRegression

from tests.harness.helpers import read_result

pytestmark = pytest.mark.multinode


@pytest.fixture(scope="module")
def outcome(multinode_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("nodes-change")
    return root, multinode_cluster.call("tests.harness.nodes_change_run:run_cases", timeout=480, workdir=str(root))


def _matches_reference(root: Path, case: str) -> None:
    X = zarr.open_array(str(root / "data" / "X.zarr"))[:]
    y = zarr.open_array(str(root / "data" / "y.zarr"))[:]
    reference = LogisticRegression(C=1 / (1e-4 * len(y)), tol=1e-12, max_iter=10_000).fit(X, y)
    result = read_result(str(root / case))
    np.testing.assert_allclose(result["coef"][:], reference.coef_[0], rtol=1e-4, atol=1e-6)


@pytest.mark.timeout(600)
def test_a_node_added_mid_job_is_used_from_the_next_iteration(outcome):
    root, cases = outcome
    added = cases["added"]
    assert added["ok"] and added["changed"], added.get("error")
    report = added["report"]
    nodes = report["nodes"]
    assert nodes["requested"] == 2 and nodes["count"] == 3 and nodes["added"] == 1
    span = next(p for p in nodes["per_node"] if p["node_id"] == added["changed"])
    assert span["added"] and span["joined"] > 0
    # its kernel tasks: planned there from the program after it joined
    per_node = dict(zip(report["cluster"]["node_ids"], report["tasks"]["per_node"], strict=True))
    assert per_node[added["changed"]] > 0
    assert report["network"]["bytes_between_nodes"] > 0  # blocks moved to it (or read there)
    _matches_reference(root, "added")


@pytest.mark.timeout(600)
def test_a_node_removed_mid_job_is_survived(outcome):
    root, cases = outcome
    removed = cases["removed"]
    assert removed["ok"] and removed["changed"], removed.get("error")
    report = removed["report"]
    assert report["faults"]["nodes_lost"] == 1 and report["faults"]["lost_node_ids"] == [removed["changed"]]
    kinds = {(e["node"], e["kind"]) for e in report["nodes"]["events"]}
    assert (removed["changed"], "leave") in kinds
    _matches_reference(root, "removed")


@pytest.mark.timeout(600)
def test_kept_blocks_move_once_to_a_node_added_mid_job(outcome):
    """PageRank keeps its graph between iterations; after a node joins, the blocks the new plan
    puts elsewhere are moved there once, not fetched again by every iteration."""
    import networkx as nx

    root, cases = outcome
    kept = cases["kept"]
    assert kept["ok"] and kept["changed"], kept.get("error")
    report = kept["report"]
    nodes = report["cluster"]["node_ids"]
    per_node = dict(zip(nodes, report["tasks"]["per_node"], strict=True))
    peak = dict(zip(nodes, report["memory"]["peak_bytes_per_node"], strict=True))
    n = report["result"]["n_nodes"]
    assert per_node[kept["changed"]] > 0
    assert peak[kept["changed"]] > 2 * n  # it holds a block of the graph (16 bytes an edge), not just vectors
    joined = next(e["seconds"] for e in report["nodes"]["events"] if e["node"] == kept["changed"] and e["kind"] == "join")
    totals = [t["network_bytes"] for t in report["timeline"]]
    moved = [b - a for a, b in zip(totals, totals[1:], strict=False)]
    after = [m for t, m in zip(report["timeline"][1:], moved, strict=True) if t["seconds"] > joined]
    vector = 8 * n  # the rank vector, sent to each node but the one that has it
    assert len(after) > 10 and after[0] > len(nodes) * vector  # the first run after the join moves graph blocks
    assert all(m <= (len(nodes) - 1) * vector + 4096 for m in after[2:])  # later runs move only the vector
    # the result is NetworkX's
    edges = zarr.open_array(str(root / "graph" / "edges.zarr"))[:]
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from(map(tuple, edges.tolist()))
    reference = nx.pagerank(graph, alpha=0.99, tol=1e-15, max_iter=5000)
    rank = read_result(str(root / "kept"))["rank"][:]
    assert np.abs(rank - np.array([reference[i] for i in range(n)])).sum() <= 1e-6
