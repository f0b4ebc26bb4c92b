"""The integration tests of ``tests.unit.io.test_inputs_integrity``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json
import os

import boto3
import numpy as np
import pytest

from arrayjob.errors import InputError
from arrayjob.io.arrays import check_chunks_stored, open_array_info
from arrayjob.io.locations import StorageOptions, parse_uri
from tests.harness.helpers import (
    logreg_data,
    read_result,
    run_cli,
    write_array,
)
from tests.integration.algorithms.test_logreg import sklearn_fit
from tests.unit.io.test_inputs_integrity import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    L2,
    _flip,
    _one_error_line,
    _spec,
    _validate,
    _warning,
    _write,
    huge,
)


def test_datagen_checksums_verified_on_s3(s3_endpoint, s3_bucket, ray_session, tmp_path, capsys, monkeypatch):
    """datagen writes a crc32c codec into every array; a damaged chunk on S3 makes the run
    exit 2 naming the array and the chunk (not 1, "internal error")."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    base = f"s3://{s3_bucket}/demo"
    code, _, err = run_cli(["datagen", "logreg", base, "--rows", "400", "--cols", "3", "--chunk-rows", "100"], capsys)
    assert code == 0, err
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    for name in ("X", "y"):
        meta = json.loads(s3.get_object(Bucket=s3_bucket, Key=f"demo/{name}.zarr/zarr.json")["Body"].read())
        assert {"name": "crc32c"} in meta["codecs"]
    key = "demo/X.zarr/c/3/0"
    s3.put_object(Bucket=s3_bucket, Key=key, Body=_flip(s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read()))
    spec = _spec(tmp_path / "job.toml", {"X": f"{base}/X.zarr", "y": f"{base}/y.zarr"}, f"s3://{s3_bucket}/out",
                 storage=f'endpoint_url = "{s3_endpoint}"')
    code, _, err = run_cli(["run", str(spec)], capsys)
    line = _one_error_line(err)
    assert code == 2
    assert f"inputs.X: chunk (3, 0) (key 'c/3/0') of {base}/X.zarr is corrupt" in line and "CRC32C" in line


def test_first_and_last_chunk_checked_on_s3(s3_endpoint, s3_bucket):
    options = StorageOptions(endpoint_url=s3_endpoint)
    uri = f"s3://{s3_bucket}/A.zarr"
    write_array(uri, np.ones((40, 3)), (10, 3), endpoint=s3_endpoint)
    info = open_array_info("A", parse_uri(uri), options)
    check_chunks_stored(info, options)
    boto3.client("s3", endpoint_url=s3_endpoint).delete_object(Bucket=s3_bucket, Key="A.zarr/c/0/0")
    with pytest.raises(InputError, match=r"inputs\.A: chunk \(0, 0\) \(key 'c/0/0'\) of s3://.* is missing"):
        check_chunks_stored(info, options)
    check_chunks_stored(open_array_info("A", parse_uri(uri), options, missing_chunks="fill"), options)


def test_missing_chunk_is_an_input_error_and_fill_is_an_opt_in(data, ray_session, capsys):
    """A chunk file deleted from X: exit 2 naming the array, the chunk and the URI, nothing
    published (before: exit 0 and a model fitted on zeros). With missing_chunks = "fill" the
    run reads the chunk as zeros, as zarr does, and fits exactly that data."""
    os.remove(data / "data/X.zarr/c/1/0")
    spec = _spec(data / "job.toml", {"X": "data/X.zarr", "y": "data/y.zarr"}, "out")
    code, _, err = run_cli(["run", str(spec)], capsys)
    line = _one_error_line(err)
    assert code == 2
    assert "inputs.X: chunk (1, 0) (key 'c/1/0')" in line and str(data / "data/X.zarr") in line
    assert not (data / "out/_SUCCESS").exists()

    text = spec.read_text().replace('X = "data/X.zarr"', 'X = { uri = "data/X.zarr", missing_chunks = "fill" }')
    spec.write_text(text)
    code, _, err = run_cli(["run", str(spec)], capsys)
    assert code == 0, err
    X, y = logreg_data(200, 3)
    X[50:100] = 0.0  # what the sparse reading means
    coef, intercept = sklearn_fit(X, y, L2, True)
    result = read_result(str(data / "out"))
    np.testing.assert_allclose(result["coef"][:], coef, rtol=1e-5, atol=1e-7)


def test_missing_chunk_on_s3_is_an_input_error(s3_endpoint, s3_bucket, ray_session, tmp_path, capsys):
    X, y = logreg_data(200, 3)
    base = f"s3://{s3_bucket}/in"
    write_array(f"{base}/X.zarr", X, (50, 3), endpoint=s3_endpoint)
    write_array(f"{base}/y.zarr", y, (50,), endpoint=s3_endpoint)
    boto3.client("s3", endpoint_url=s3_endpoint).delete_object(Bucket=s3_bucket, Key="in/y.zarr/c/2")
    spec = _spec(tmp_path / "job.toml", {"X": f"{base}/X.zarr", "y": f"{base}/y.zarr"}, f"s3://{s3_bucket}/out",
                 storage=f'endpoint_url = "{s3_endpoint}"')
    code, _, err = run_cli(["run", str(spec)], capsys)
    line = _one_error_line(err)
    assert code == 2
    assert f"inputs.y: chunk (2,) (key 'c/2') of {base}/y.zarr is missing" in line
    listed = boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(Bucket=s3_bucket, Prefix="out/")
    assert not any(o["Key"].endswith("_SUCCESS") for o in listed.get("Contents", []))
