"""`arrayjob plan`: shows tiling, kernels, tasks and cost from metadata alone."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.harness.helpers import logreg_data, run_cli, write_array, write_spec

STRATEGIES = ["--tiling", "naive", "--fusion", "none", "--placement", "roundrobin"]


@pytest.fixture
def spec(workdir):
    X, y = logreg_data(4000, 6)
    write_array("X.zarr", X, (500, 6))
    write_array("y.zarr", y, (500,))
    return str(write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out"))


def test_json_has_the_documented_keys(spec, capsys):
    code, out, err = run_cli(["plan", spec, "--format", "json", "--nodes", "3", *STRATEGIES], capsys)
    assert (code, err) == (0, "")
    doc = json.loads(out)
    X = next(a for a in doc["arrays"] if a["name"] == "X")
    assert X["shape"] == [4000, 6] and X["grid"] == [8, 1] and X["block"] == [500, 6]
    assert all({"name", "ops"} <= set(k) for k in doc["kernels"])
    assert doc["tasks"]["count"] == sum(doc["tasks"]["per_node"]) > 0
    cost = doc["cost"]
    assert cost["storage"]["bytes_read"] == 4000 * 6 * 8 + 4000 * 8
    assert {"bytes_read", "bytes_written"} <= set(cost["storage"])
    assert "bytes_between_nodes" in cost["network"]
    assert len(cost["memory"]["peak_bytes_per_node"]) == 3
    assert cost["memory"]["bytes_touched"] > 0 and cost["flops"] > 0


def test_plan_reads_no_data(spec, workdir, capsys):
    _, before, _ = run_cli(["plan", spec, "--format", "json", *STRATEGIES], capsys)
    for array in ("X.zarr", "y.zarr"):
        shutil.rmtree(workdir / array / "c")  # chunks gone, metadata kept
    code, after, _ = run_cli(["plan", spec, "--format", "json", *STRATEGIES], capsys)
    assert code == 0 and json.loads(after) == json.loads(before)
    assert not (workdir / "out").exists()


def test_stop_after_each_pass(spec, capsys):
    docs = {}
    for stop in ("tile", "fuse", "place", "cost"):
        code, out, _ = run_cli(["plan", spec, "--format", "json", "--stop-after", stop, *STRATEGIES], capsys)
        assert code == 0
        docs[stop] = json.loads(out)
    assert "grid" in docs["tile"]["arrays"][0] and docs["tile"]["kernels"] == []
    assert docs["fuse"]["kernels"] and "tasks" not in docs["fuse"]
    assert "tasks" in docs["place"] and "cost" not in docs["place"]
    assert "cost" in docs["cost"]


def test_text_and_dot(spec, capsys):
    code, out, _ = run_cli(["plan", spec, *STRATEGIES], capsys)
    assert code == 0 and "kernels (" in out and "storage read" in out and "between nodes" in out
    code, out, _ = run_cli(["plan", spec, "--format", "dot", *STRATEGIES], capsys)
    assert code == 0 and out.startswith("digraph plan {") and "cluster_0" in out and out.rstrip().endswith("}")


def test_unknown_strategy_is_a_usage_error(spec, capsys):
    code, _, err = run_cli(["plan", spec, "--tiling", "clever"], capsys)
    assert code == 2 and "'clever' is not one of" in err


def test_iterations_reuse_the_plan(workdir):
    """An iterative job builds the same graph every iteration: planned once, then a cache hit."""
    import time

    from arrayjob.io.locations import StorageOptions
    from arrayjob.runner import prepare
    from arrayjob.runtime.executor import LocalExecutor
    from arrayjob.runtime.session import Session
    from arrayjob.spec import load_spec

    X, y = logreg_data(2000, 5)
    write_array("X.zarr", X, (250, 5))
    write_array("y.zarr", y, (250,))
    job = prepare(load_spec(write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out")))
    session = Session(LocalExecutor(StorageOptions()))
    first = session.plan(job.program())
    start = time.perf_counter()
    again = [session.plan(job.program()) for _ in range(20)]
    assert all(p is first for p in again)  # the same Plan object: nothing re-planned
    assert (time.perf_counter() - start) / 20 < 0.05  # loose: the 5 ms figure is in docs/benchmarks.md
