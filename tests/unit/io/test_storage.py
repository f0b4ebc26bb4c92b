"""One conformance suite for every storage backend (local directory, S3 on loopback)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from arrayjob.errors import InputError, LeaseHeldError, SpecError, StorageError
from arrayjob.io.arrays import open_array_info, read_block, write_group
from arrayjob.io.locations import Location, StorageOptions, parse_uri
from arrayjob.io.output import JobOutput, published
from tests.harness.helpers import write_array


@pytest.fixture(params=["local", "s3"])
def backend(request, tmp_path):
    """(base URI, StorageOptions, endpoint) for a fresh, empty place in each backend."""
    if request.param == "local":
        return str(tmp_path / "bucket"), StorageOptions(), None
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}", StorageOptions(endpoint_url=endpoint), endpoint


class TestStorageBackend:
    def test_metadata_only_on_driver(self, backend):
        base, options, endpoint = backend
        data = np.arange(60.0).reshape(20, 3)
        write_array(f"{base}/A.zarr", data, (8, 3), endpoint=endpoint)
        info = open_array_info("A", parse_uri(f"{base}/A.zarr"), options)
        assert (info.shape, info.dtype, info.chunks, info.zarr_format) == ((20, 3), "float64", (8, 3), 3)

    @pytest.mark.parametrize("zarr_format", [2, 3])
    def test_block_reads_count_whole_chunk_requests(self, backend, zarr_format):
        base, options, endpoint = backend
        data = np.arange(60.0).reshape(20, 3)
        write_array(f"{base}/A.zarr", data, (8, 3), endpoint=endpoint, zarr_format=zarr_format)
        info = open_array_info("A", parse_uri(f"{base}/A.zarr"), options)
        block, counters = read_block(info, (slice(8, 16), slice(0, 3)), options)
        np.testing.assert_array_equal(block, data[8:16])
        again, counters2 = read_block(info, (slice(16, 20), slice(0, 3)), options)
        np.testing.assert_array_equal(again, data[16:20])
        # one chunk GET per block once the array is open; uncompressed-or-not, bytes are counted
        assert counters2.get_requests == 1 and counters2.bytes_read > 0

    def test_missing_array_is_an_input_error(self, backend):
        base, options, _ = backend
        with pytest.raises(InputError, match=r"^inputs.Q: no Zarr array at "):
            open_array_info("Q", parse_uri(f"{base}/nothing.zarr"), options)

    def test_group_round_trip_with_plain_zarr(self, backend):
        base, options, endpoint = backend
        location = parse_uri(f"{base}/res.zarr")
        write_group(location, options, {"coef": np.arange(4.0), "intercept": np.ones(1)}, {"objective": 0.5})
        group = zarr.open_group(f"{base}/res.zarr", mode="r",
                                storage_options={"endpoint_url": endpoint} if endpoint else None)
        np.testing.assert_array_equal(group["coef"][:], np.arange(4.0))
        assert group.attrs["objective"] == 0.5 and group.metadata.zarr_format == 3

    def test_output_is_published_only_when_complete(self, backend):
        base, options, _ = backend
        out = JobOutput(parse_uri(f"{base}/out"), options, "digest-1")
        assert out.completed() is None
        assert out.take(overwrite=False) is None
        write_group(out.staging.join("result.zarr"), options, {"a": np.ones(3)}, {})
        out.write_json("report.json", {"x": 1})
        assert out.completed() is None  # staged, not published
        manifest = out.commit()
        out.release()
        assert {f["path"] for f in manifest["files"]} >= {"report.json", "result.zarr/zarr.json"}
        assert manifest["prefix"] == f"runs/{out.run_id}"
        assert published(parse_uri(f"{base}/out"), options) == out.staging
        out.abandon()  # a failure after publishing (cleaning up, the report) keeps what _SUCCESS names
        assert out.backend.list(f"runs/{out.run_id}")
        done = JobOutput(parse_uri(f"{base}/out"), options, "digest-1").check_rerun(overwrite=False)
        assert done is not None and done.manifest["run_id"] == out.run_id
        with pytest.raises(SpecError, match="holds a complete result of a different spec"):
            JobOutput(parse_uri(f"{base}/out"), options, "digest-2").check_rerun(overwrite=False)

    def test_overwrite_replaces_and_leaves_no_staging(self, backend):
        base, options, _ = backend
        dead = JobOutput(parse_uri(f"{base}/out"), options, "d")  # a run that died while writing
        dead.write_json("report.json", {"value": 0.0})
        for value in (1.0, 2.0):
            out = JobOutput(parse_uri(f"{base}/out"), options, "d")
            assert out.take(overwrite=True) is None
            write_group(out.staging.join("result.zarr"), options, {"a": np.full(2, value)}, {})
            out.write_json("report.json", {"value": value})
            out.commit()
            out.release()
        backend = out.backend
        assert json.loads(backend.read_bytes(f"runs/{out.run_id}/report.json")) == {"value": 2.0}
        assert {key.split("/")[0] for key in backend.list()} == {"_SUCCESS", "runs"}  # no lease left
        assert {key.split("/")[1] for key in backend.list("runs")} == {out.run_id}
        assert json.loads(backend.read_bytes("_SUCCESS"))["run_id"] == out.run_id

    def test_commit_needs_the_lease(self, backend):
        base, options, _ = backend
        out = JobOutput(parse_uri(f"{base}/out"), options, "d")
        out.write_json("report.json", {})
        with pytest.raises(LeaseHeldError, match="holds no lease"):
            out.commit()
        assert out.completed() is None

    def test_a_layout_before_runs_is_replaced(self, backend):
        """An output published by an older arrayjob (files at the top, no "prefix") stays
        readable, and the first run in the new layout removes the old files."""
        base, options, _ = backend
        location = parse_uri(f"{base}/out")
        old = JobOutput(location, options, "d").backend
        old.write_bytes("report.json", b"{}")
        old.write_bytes("_SUCCESS", json.dumps({"run_id": "old", "spec_sha256": "d",
                                                "files": [{"path": "report.json", "bytes": 2}]}).encode())
        assert published(location, options) == location
        out = JobOutput(location, options, "d")
        assert out.take(overwrite=True) is None
        out.write_json("report.json", {"new": True})
        out.commit()
        out.release()
        assert set(old.list()) == {"_SUCCESS", f"runs/{out.run_id}/report.json"}


def test_uri_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_uri("s3://bucket/a/b/") == Location("s3", "bucket/a/b")
    assert parse_uri("file:///x/y") == Location("file", "/x/y")
    assert parse_uri("rel/dir") == Location("file", str(tmp_path / "rel/dir"))
    assert str(parse_uri("s3://bucket/k").join("result.zarr")) == "s3://bucket/k/result.zarr"
    with pytest.raises(SpecError, match="names no bucket"):
        parse_uri("s3:///key")


def test_unreachable_endpoint_is_one_line(tmp_path):
    options = StorageOptions(endpoint_url="http://127.0.0.1:9", max_attempts=3)
    with pytest.raises(StorageError, match=r"^inputs.X: cannot read s3://bucket/X.zarr: GET http://127.0.0.1:9/bucket/X.zarr/\S+: "
                       r"error sending request \(after 3 attempts\)$"):
        open_array_info("X", parse_uri("s3://bucket/X.zarr"), options)


