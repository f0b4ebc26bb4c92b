"""The nodes a sized run used and when (``runtime.metrics.NodeLog``), the autoscaler request
it makes, and how the report shows them; no Ray."""

from __future__ import annotations

import pytest

from arrayjob.costing.prices import Instance
from arrayjob.report.html import nodes_over_time
from arrayjob.runtime.metrics import NodeLog
from arrayjob.runtime.scaling import NodeRequest, worker_ids


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_joins_departures_and_release(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("arrayjob.runtime.metrics.time.perf_counter", clock)
    log = NodeLog(started=0.0)
    log.start({"a"})  # there before the job asked for any
    clock.now = 5.0
    log.observe({"a", "b", "c"})
    clock.now = 8.0
    log.observe({"a", "c"})  # b left
    clock.now = 10.0
    log.observe({"a", "c", "d"})
    clock.now = 12.0
    log.release()
    log.observe({"a", "c", "d", "e"})  # after the release: not the job's
    doc = log.as_dict()
    assert doc["count"] == 3 and doc["added"] == 3  # b, c, d; at most a, b, c or a, c, d at once
    spans = {p["node_id"]: (p["joined"], p["left"], p["seconds"], p["added"]) for p in doc["per_node"]}
    assert spans == {"a": (0.0, 12.0, 12.0, False), "b": (5.0, 8.0, 3.0, True), "c": (5.0, 12.0, 7.0, True),
                     "d": (10.0, 12.0, 2.0, True)}
    assert doc["node_seconds"] == pytest.approx(24.0)
    assert [(e["node"], e["kind"]) for e in doc["events"]] == [
        ("a", "join"), ("b", "join"), ("c", "join"), ("b", "leave"), ("d", "join"),
        ("a", "release"), ("c", "release"), ("d", "release")]
    page = nodes_over_time({"nodes": doc, "wall_seconds": 13.0})
    assert "Worker nodes in use" in page and page.count("<tr>") == 5
    assert nodes_over_time({"nodes": {"count": 1}}) == ""


def test_request_is_one_bundle_per_node_and_workers_have_cpus():
    request = NodeRequest(count=3, cpus=8, object_store_bytes=10**9, enough=2, node_type="r5.2xlarge", timeout=60)
    assert request.bundles() == [{"CPU": 8.0, "object_store_memory": 1e9}] * 3
    nodes = [{"NodeID": "head", "Alive": True, "Resources": {"CPU": 0.0}},
             {"NodeID": "w1", "Alive": True, "Resources": {"CPU": 1.0}},
             {"NodeID": "w2", "Alive": False, "Resources": {"CPU": 1.0}}]
    assert worker_ids(nodes) == {"w1"}


def test_node_request_asks_for_what_the_plan_puts_on_a_node(workdir):
    from arrayjob import runner
    from arrayjob.costing.prices import load_prices
    from arrayjob.costing.profile import load_profile
    from arrayjob.costing.sizing import choose_nodes, usable_bytes
    from arrayjob.spec import load_spec
    from tests.harness.helpers import logreg_data, write_array, write_spec

    X, y = logreg_data(4000, 6)
    write_array("X.zarr", X, (500, 6))
    write_array("y.zarr", y, (500,))
    path = write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out")
    spec = load_spec(path, ['cluster.address="auto"', "cluster.max_nodes=4", 'cluster.scale_timeout="2m"'])
    small = Instance("small", 0.1, 2, 1, object_store_gib=0.0002)  # ~215 kB stores: the 224 kB input needs 2
    job = runner.prepare(spec)
    choice = choose_nodes(job, spec, instance=small, prices=load_prices(), profile=load_profile())
    request = runner.node_request(choice, spec)
    assert (request.count, request.cpus, request.timeout) == (choice.nodes, 2, 120.0)
    assert request.enough == choice.needed >= 2
    assert 0 < request.object_store_bytes <= usable_bytes(small)
    assert runner.sizes_cluster(spec)


def test_nodes_started_for_the_request_count_from_it(monkeypatch):
    """A node that boots for the job's request is the job's (and billed) from the request,
    not from when Ray first saw it; one that joins later counts from its join."""
    clock = Clock()
    monkeypatch.setattr("arrayjob.runtime.metrics.time.perf_counter", clock)
    log = NodeLog(started=0.0)
    clock.now = 1.0
    log.start({"a"})  # the request
    clock.now = 4.0
    log.observe({"a", "b"})
    clock.now = 9.0
    log.observe({"a", "b", "c"})
    log.up()  # the wait is over
    clock.now = 15.0
    log.observe({"a", "b", "c", "d"})  # joined mid-job
    clock.now = 20.0
    log.release()
    spans = {p["node_id"]: (p["since"], p["seconds"]) for p in log.as_dict()["per_node"]}
    assert spans == {"a": (1.0, 19.0), "b": (1.0, 19.0), "c": (1.0, 19.0), "d": (15.0, 5.0)}
