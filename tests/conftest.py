"""Shared fixtures: one real S3 server on loopback, one Ray instance and one multi-node Ray
cluster (in a harness process), each per session."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Credentials for the loopback S3 server; set before Ray starts so workers inherit them.
os.environ.update(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_DEFAULT_REGION="us-east-1",
    RAY_USAGE_STATS_ENABLED="0",
    RAY_AUTH_MODE="disabled",
    # each test's estimates come from the profile alone, whatever ran before it (and nothing is
    # written under the working directory); tests of the history point this at their own
    ARRAYJOB_HISTORY="off",
)
os.environ.pop("AWS_PROFILE", None)

from arrayjob.io.storage import quiet_async_teardown  # noqa: E402

quiet_async_teardown()
os.environ.pop("RAY_ADDRESS", None)

# The fake autoscaling cluster's tests stop every Ray in sight: collected only when
# tests/system/autoscale/run.sh runs them in a private namespace (`make test`, after the suite).
collect_ignore = [] if os.environ.get("ARRAYJOB_FAKE_CLUSTER") == "1" else ["system/autoscale"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on a free loopback port, reached through boto3/s3fs/zarr."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A fresh, empty bucket per test (names are unique, so tests never see each other's data)."""
    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray instance for the whole session; the runner reuses an initialised Ray."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def multinode_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One local multi-node Ray cluster for the session, in a harness process of its own
    (``tests/harness/cluster_harness.py``): the node-loss, node-change, signal and multi-node cases
    call functions there that add and kill worker nodes."""
    from tests.harness.cluster_harness import started

    with started(tmp_path_factory.mktemp("multinode-cluster")) as client:
        yield client


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ARRAYJOB_BUCKET", raising=False)
    return tmp_path


@pytest.fixture(autouse=True, scope="session")
def _quiet_s3_server_log() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)


@pytest.fixture
def put(tmp_path):
    """Write ``data`` as a Zarr array under ``tmp_path``; returns its ``ArrayInfo``."""
    from arrayjob.io.arrays import open_array_info
    from arrayjob.io.locations import StorageOptions, parse_uri
    from tests.harness.helpers import write_array

    def put(name, data, chunks):
        write_array(str(tmp_path / f"{name}.zarr"), data, chunks)
        return open_array_info(name, parse_uri(str(tmp_path / f"{name}.zarr")), StorageOptions())

    return put


@pytest.fixture
def data(workdir: Path) -> Path:
    """A small logistic-regression input under ``data/`` in the working directory."""
    from tests.harness.helpers import logreg_data, write_array

    X, y = logreg_data(200, 3)
    write_array("data/X.zarr", X, (50, 3))
    write_array("data/y.zarr", y, (50,))
    return workdir


# what a test needs, read off its fixtures: `make test-quick` leaves out every test that
# starts or joins Ray, or talks to the S3 server, whether or not it was marked by hand
_MARKED_BY_FIXTURE = {"ray_session": "ray", "s3_endpoint": "s3"}


def _xdist_group(item: pytest.Item) -> str | None:
    """The worker group of a test under ``pytest -n N --dist loadgroup`` (``make test``).

    "clusters": the tests that start clusters of many nodes, one after another on one worker:
    the multi-node cluster harness (one worker starts the one harness, and its calls follow
    each other) and then the fake autoscaling cluster (``autoscale``; last, see
    ``pytest_collection_modifyitems``). All three clusters beside each other on 2 cores, under
    other work, starved: the submit cases' jobs missed their 300 s while the autoscaler's nodes
    and the harness's started. The submit cases (``jobs``, a module fixture) run beside the
    harness. Then the tests that share a module's fixture (the submit cases, the signal cases'
    graph, the store monitor's data, ...), one group per module, so that the fixture is made
    once. Any other test goes wherever a worker is free."""
    names = getattr(item, "fixturenames", ())
    if "multinode_cluster" in names or item.get_closest_marker("autoscale"):
        return "clusters"
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(defs and defs[-1].scope in ("module", "class") for name, defs in definitions.items() if name in names):
        return item.nodeid.split("::")[0]
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker stops at once if xdist dropped the groups (it names a group's tests
    ``nodeid@group``; under pytest 9.2 it silently does not, pytest-xdist#1386): two workers
    would each start a multi-node cluster and make each module's fixture again."""
    if getattr(session.config.option, "loadgroup", False):
        lost = [item.nodeid for item in session.items
                if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid]
        if lost:
            message = (f"--dist loadgroup: xdist ignored the groups of {len(lost)} tests ({lost[0]}, ...); "
                       "pytest-xdist#1386: use pytest < 9.2")
            print(message, file=sys.stderr, flush=True)  # a worker's own error reaches no terminal
            raise pytest.UsageError(message)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # the fake autoscaling cluster's tests last, as make test ran them before: on their worker
    # after the harness, while the submit cases run beside the harness early on the other
    items.sort(key=lambda item: item.get_closest_marker("autoscale") is not None)
    for item in items:
        for fixture, marker in _MARKED_BY_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None:
                item.add_marker(marker)
        if item.get_closest_marker("xdist_group") is None and (group := _xdist_group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
