"""The integration tests of ``tests.unit.runtime.test_faults``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from arrayjob.errors import InputError, StorageError
from arrayjob.io.locations import StorageOptions
from tests.harness.fault_proxy import FaultProxy
from tests.harness.helpers import CrashOnce, logreg_data, write_array, write_spec
from tests.unit.runtime.test_faults import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    REPO,
    _logreg_on_s3,
    _report_with_faults,
    _run,
)


@pytest.mark.s3
def test_a_missing_input_bucket_is_named(tmp_path: Path, s3_endpoint: str) -> None:
    from arrayjob.io.backend import storage_retries
    from arrayjob.runner import prepare
    from arrayjob.spec import load_spec

    spec = write_spec(tmp_path / "spec.toml", inputs={"X": "s3://no-such-bucket-3f9/X.zarr",
                                                      "y": "s3://no-such-bucket-3f9/y.zarr"},
                      output=str(tmp_path / "out"))
    retries = storage_retries()
    with pytest.raises(InputError, match=r"^inputs\.X: bucket 'no-such-bucket-3f9' does not exist"):
        prepare(load_spec(str(spec), [f"storage.endpoint_url={json.dumps(s3_endpoint)}"]))
    assert storage_retries() == retries  # a 404 is final: once it was retried to max_attempts (10 s)


@pytest.mark.s3
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_refused_chunk_read_names_the_chunk_and_the_status(tmp_path: Path, s3_endpoint: str,
                                                            s3_bucket: str) -> None:
    spec = _logreg_on_s3(tmp_path, s3_bucket, s3_endpoint)
    # a chunk in the middle: read by a worker
    with FaultProxy(s3_endpoint, refuse=403, refuse_paths="/X.zarr/c/1/") as proxy, \
            pytest.raises(StorageError) as failed:
        _run(spec, proxy.url)
    message = str(failed.value)
    assert message.startswith("inputs.X: reading chunk c/1/0") and f"of s3://{s3_bucket}/X.zarr failed: " in message
    assert message.endswith("GET 403 Forbidden") and "\n" not in message
    assert failed.value.exit_code == 4
    # the first chunk: refused already when the run checks that the first and last exist
    with FaultProxy(s3_endpoint, refuse=403, refuse_paths="/X.zarr/c/0/") as proxy, \
            pytest.raises(StorageError) as failed:
        _run(spec, proxy.url)
    assert str(failed.value) == f"inputs.X: checking chunk c/0/0 of s3://{s3_bucket}/X.zarr failed: HEAD 403 Forbidden"


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_retried_task_is_counted(tmp_path: Path) -> None:
    import ray

    import arrayjob.lazy as la
    from arrayjob.io.arrays import open_array_info
    from arrayjob.io.locations import parse_uri
    from arrayjob.planner.physical import Kernel
    from arrayjob.planner.plan import ClusterShape, PlanOptions
    from arrayjob.runtime.ray_executor import RayExecutor
    from arrayjob.runtime.session import Session

    X, _ = logreg_data(400, 3)
    write_array(str(tmp_path / "X.zarr"), X, (100, 3))
    info = open_array_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions())
    marker = tmp_path / "crashed"
    node_ids = tuple(n["NodeID"] for n in ray.nodes() if n["Alive"])
    executor = RayExecutor(StorageOptions(), node_ids)
    session = Session(executor, PlanOptions(cluster=ClusterShape(nodes=1)))
    Xa = la.from_zarr(info, check=Kernel("crash_once", CrashOnce(str(marker))))
    out = session.compute({"s": Xa.sum(axis=0)})
    np.testing.assert_allclose(out["s"], X.sum(axis=0), rtol=1e-12)
    assert marker.exists()
    # one crash per worker that found no marker: two workers may both have crashed
    assert 1 <= executor.metrics.faults.task_retries <= 2
    assert executor.metrics.faults.events[0]["kind"] == "task_retry"


@pytest.mark.s3
def test_botocore_retries_are_counted(s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bucket region lookup (botocore, standard retry mode) retries with max_attempts and counts it."""
    import boto3

    from arrayjob.io._s3 import _bucket_region
    from arrayjob.io.backend import storage_retries

    with FaultProxy(s3_endpoint, slow_every=2, slow_at=1) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        before = storage_retries()
        assert _bucket_region(boto3.Session(), s3_bucket, StorageOptions(max_attempts=3)) == "us-east-1"
        assert storage_retries() - before == 1 == proxy.slowed
    with FaultProxy(s3_endpoint, slow_every=1, slow_at=0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        _bucket_region(boto3.Session(), s3_bucket, StorageOptions(max_attempts=2))
        assert proxy.requests == 2  # botocore tried twice, as configured


@pytest.mark.s3
def test_result_writes_are_retried(s3_endpoint: str, s3_bucket: str) -> None:
    """Zarr's metadata and chunk writes (``set``, batched ``_set_many``) go through the retries."""
    from arrayjob.io.arrays import write_group
    from arrayjob.io.backend import storage_retries
    from arrayjob.io.locations import parse_uri
    from tests.harness.helpers import read_group

    arrays = {"a": np.arange(6.0), "b": np.eye(3)}
    with FaultProxy(s3_endpoint, slow_every=2, slow_at=1, drop_every=5, drop_at=3) as proxy:
        before = storage_retries()
        write_group(parse_uri(f"s3://{s3_bucket}/r.zarr"), StorageOptions(endpoint_url=proxy.url), arrays, {"k": 1})
        assert storage_retries() - before == proxy.slowed + proxy.dropped > 0
    group = read_group(f"s3://{s3_bucket}/r.zarr", s3_endpoint)
    assert dict(group.attrs) == {"k": 1}
    for name, value in arrays.items():
        np.testing.assert_array_equal(group[name][...], value)


@pytest.mark.s3
def test_retries_stop_at_max_attempts(tmp_path: Path, s3_endpoint: str, s3_bucket: str) -> None:
    from arrayjob.io.arrays import open_array_info
    from arrayjob.io.backend import backend_for, storage_retries
    from arrayjob.io.locations import parse_uri

    write_array(f"s3://{s3_bucket}/X.zarr", np.ones((8, 2)), (4, 2), endpoint=s3_endpoint)
    location = parse_uri(f"s3://{s3_bucket}/X.zarr")
    with FaultProxy(s3_endpoint, slow_every=2, slow_at=1) as proxy:  # every other request: 503
        before = storage_retries()
        open_array_info("X", location, StorageOptions(endpoint_url=proxy.url, max_attempts=3))
        assert storage_retries() - before == proxy.slowed > 0
    with FaultProxy(s3_endpoint, slow_every=1, slow_at=0) as proxy, \
            pytest.raises(StorageError, match=r"503 Service Unavailable \(after 2 attempts\)"):  # every request: 503
        open_array_info("X", location, StorageOptions(endpoint_url=proxy.url, max_attempts=2))
    with FaultProxy(s3_endpoint, slow_every=1, slow_at=0) as proxy:
        backend = backend_for(location, StorageOptions(endpoint_url=proxy.url, max_attempts=4))
        with pytest.raises(OSError, match=r"GET \S+/X.zarr/zarr.json: 503 Service Unavailable \(after 4 attempts\)"):
            backend.read_bytes("zarr.json")
        assert proxy.requests == 4


@pytest.mark.s3
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_storage_retries_are_counted_and_the_result_is_unchanged(tmp_path: Path, s3_endpoint: str,
                                                                 s3_bucket: str) -> None:
    spec = _logreg_on_s3(tmp_path, s3_bucket, s3_endpoint)
    calm = _run(spec, s3_endpoint)
    assert calm.report["faults"]["storage_retries"] == 0
    spec = _logreg_on_s3(tmp_path, s3_bucket, s3_endpoint, out="out-proxy")
    with FaultProxy(s3_endpoint, slow_every=9, drop_every=23) as proxy:
        stormy = _run(spec, proxy.url)
    assert proxy.slowed > 0 and proxy.dropped > 0
    faults = stormy.report["faults"]
    # every refused or dropped read of an input was tried again, by the driver or a worker, and
    # counted (the publish step's requests come after report.json is written: not in it)
    inputs = [f for f in proxy.faulted if "/X.zarr/" in f or "/y.zarr/" in f]
    assert faults["storage_retries"] >= len(inputs) > 0, "; ".join(proxy.faulted)
    assert calm.result.attrs["objective"] == stormy.result.attrs["objective"]
    assert calm.result.attrs["iterations"] == stormy.result.attrs["iterations"]
    np.testing.assert_array_equal(calm.result.arrays["coef"], stormy.result.arrays["coef"])
    assert stormy.report["tasks"]["retries"] == 0  # storage retries are not task retries
