"""Node loss, everywhere: every algorithm, a worker node killed during load, during the
fit and during the write, and a node that comes back; each run succeeds with the
undisturbed run's result and counts the lost node.

The matrix runs on a local 3-node ``ray.cluster_utils.Cluster`` in its own process
(``tests/node_loss.py``): a process talks to one Ray at a time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_in_own_session
from tests.node_loss import DEFAULT_CASES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("node-loss")
    out = workdir / "matrix.json"
    cmd = [sys.executable, str(REPO / "tests" / "node_loss.py"), "--workdir", str(workdir), "--out", str(out)]
    run_in_own_session(cmd, timeout=900, what="the node-loss matrix", cwd=REPO)
    return {case["case"]: case for case in json.loads(out.read_text())["cases"]}


@pytest.mark.multinode
@pytest.mark.timeout(960)
@pytest.mark.parametrize("case", DEFAULT_CASES)
def test_a_lost_node_changes_nothing_but_the_fault_count(matrix: dict[str, dict[str, Any]], case: str) -> None:
    result = matrix[case]
    assert result["ok"], result.get("error", "") + "\n" + result.get("traceback", "")
    assert result["killed_in"] is not None  # the node died while the run was going on
    assert result["max_rel_diff"] <= 1e-10, result
    undisturbed = matrix[f"{case.split(':')[0]}:undisturbed"]
    # the same iterations and convergence, the same objective
    assert result["attrs"].keys() == undisturbed["attrs"].keys()
    for key, value in undisturbed["attrs"].items():
        if isinstance(value, float):
            assert result["attrs"][key] == pytest.approx(value, rel=1e-10, abs=1e-300), key
        else:
            assert result["attrs"][key] == value, key
    assert result["faults"]["nodes_lost"] == 1, result["faults"]
    assert undisturbed["faults"]["nodes_lost"] == 0
    assert result["tasks"]["retries"] is not None
