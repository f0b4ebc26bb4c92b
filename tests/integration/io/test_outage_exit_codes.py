"""A storage outage exits 4 (a scheduler retries later); wrong input exits 2 (it stays wrong)."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from arrayjob.errors import InputError, StorageError
from arrayjob.io.arrays import open_array_info
from arrayjob.io.backend import is_storage_outage
from arrayjob.io.locations import StorageOptions, parse_uri
from tests.harness.fault_proxy import FaultProxy
from tests.harness.helpers import write_array


def _closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_input_endpoint_is_a_storage_error() -> None:
    options = StorageOptions(endpoint_url=f"http://127.0.0.1:{_closed_port()}", region="us-east-1",
                             anon=True, max_attempts=2, retry_timeout=5.0)
    with pytest.raises(StorageError) as raised:
        open_array_info("X", parse_uri("s3://bucket/X.zarr"), options)
    assert raised.value.exit_code == 4
    assert "inputs.X" in str(raised.value)


@pytest.mark.parametrize("exc", [ConnectionRefusedError("refused"), ConnectionResetError("reset"), TimeoutError()])
def test_dropped_connections_are_outages(exc: BaseException) -> None:
    assert is_storage_outage(exc)


@pytest.mark.parametrize("exc", [FileNotFoundError("no such array"), PermissionError("403"), ValueError("bad name")])
def test_wrong_input_is_not_an_outage(exc: BaseException) -> None:
    assert not is_storage_outage(exc)


def test_missing_input_array_stays_exit_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as raised:
        open_array_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions())
    assert raised.value.exit_code == 2


def test_input_answering_503_after_the_retries_is_a_storage_error(s3_endpoint: str, s3_bucket: str) -> None:
    write_array(f"s3://{s3_bucket}/X.zarr", np.ones((4, 2)), (2, 2), endpoint=s3_endpoint)
    with FaultProxy(s3_endpoint, refuse=503) as proxy, pytest.raises(StorageError) as raised:
        options = StorageOptions(endpoint_url=proxy.url, region="us-east-1", max_attempts=2, retry_timeout=5.0)
        open_array_info("X", parse_uri(f"s3://{s3_bucket}/X.zarr"), options)
    assert raised.value.exit_code == 4
    assert "(after 2 attempts)" in str(raised.value)
