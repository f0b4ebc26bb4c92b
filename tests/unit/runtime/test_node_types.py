"""A cluster's worker node types read from the cluster (issue 29), without the fake cluster:
Ray's cluster config in a real GCS, a launcher config file, the monitor that names it; the
type a sized run plans for; a request no type can hold refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from arrayjob.costing.prices import load_prices
from arrayjob.costing.worker_type import check, worker_type
from arrayjob.errors import CapacityError
from arrayjob.runtime.node_types import (
    ClusterTypes,
    NodeType,
    monitor_config_path,
    types_from_config,
)

REPO = Path(__file__).resolve().parents[3]
FAKE = REPO / "tests" / "system" / "autoscale" / "fake_cluster.yaml"
SMALL = NodeType("fake.small", 1.0, None, 100_000_000, 6)


def test_worker_types_of_a_launcher_config():
    assert types_from_config(yaml.safe_load(FAKE.read_text())) == (SMALL,)  # the head (0 CPUs) left out
    config = {"max_workers": 9, "head_node_type": "head", "available_node_types": {
        "head": {"resources": {"CPU": 8}}, "big": {"resources": {"CPU": 16, "memory": 2**36}},
        "gpu": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": 2}}}
    assert types_from_config(config) == (NodeType("big", 16.0, 2**36, None, 9), NodeType("gpu", 4.0, None, None, 2))


def test_the_monitor_on_this_host_names_its_config(tmp_path):
    proc = tmp_path / "proc"
    config = tmp_path / "cluster.yaml"
    config.write_text(FAKE.read_text())
    for pid, args in {"12": ["python", "/x/ray/autoscaler/_private/monitor.py", "--gcs-address=10.0.0.1:6379",
                             f"--autoscaling-config={config}"],
                      "13": ["python", "other.py", "--gcs-address=127.0.0.1:7000"], "self": ["x"]}.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
    assert monitor_config_path("127.0.0.1:6379", proc) == config  # the port says which GCS it serves
    assert monitor_config_path("127.0.0.1:7000", proc) is None
    relative = proc / "14"
    relative.mkdir()
    (relative / "cmdline").write_bytes(b"python\0monitor.py\0--gcs-address=h:7001\0--autoscaling-config=cluster.yaml\0")
    (relative / "cwd").symlink_to(tmp_path)
    assert monitor_config_path("h:7001", proc) == tmp_path / "cluster.yaml"


def test_the_type_a_sized_run_plans_for():
    prices = load_prices(REPO / "tests" / "system" / "autoscale" / "prices.toml")
    types = ClusterTypes((SMALL, NodeType("fake.large", 4.0, 8 * 2**30, 2 * 10**9, 2)), "somewhere")
    unnamed = worker_type(types, prices, None)  # the largest type; the cluster's sizes, the table's dollars
    assert unnamed.instance.name == "fake.large" and unnamed.instance.vcpus == 4
    assert unnamed.instance.object_store_bytes == pytest.approx(2 * 10**9, abs=1)
    assert unnamed.instance.usd_per_hour == 0 and unnamed.max_workers == 2
    assert unnamed.note == ("node type fake.large is not in price table arrayjob-tests-fake-cluster: "
                            "priced at $0 an hour")
    named = worker_type(types, prices, "fake.small")
    assert (named.instance.usd_per_hour, named.instance.node_startup_seconds, named.note) == (0.1, 12.0, "")
    # a type the cluster does not list is the price table's, as without the cluster's types
    assert worker_type(types, prices, "local").instance == prices.instance("local")
    assert worker_type(ClusterTypes(), prices, None).instance == prices.instance("local")


def test_a_request_no_type_can_hold_is_refused_in_one_line():
    types = ClusterTypes((SMALL,), "the autoscaler's config fake_cluster.yaml")
    check(types, count=3, cpus=1, object_store_bytes=77_600_000, node_type="fake.small")  # fits: nothing said
    check(ClusterTypes(), count=3, cpus=64, object_store_bytes=10**12, node_type="x")  # types unknown: not judged
    with pytest.raises(CapacityError) as refused:
        check(types, count=1, cpus=2, object_store_bytes=150_000_000, node_type="local")
    assert refused.value.exit_code == 7
    assert str(refused.value) == (
        "the job asks the autoscaler for 1 × local node(s) of 2 CPUs and a 150.0 MB object store, which no worker "
        "type of the cluster can hold: fake.small (1 CPU, 100.0 MB object store, up to 6) (from the autoscaler's "
        "config fake_cluster.yaml)")
