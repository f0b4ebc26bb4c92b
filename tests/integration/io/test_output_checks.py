"""The integration tests of ``tests.unit.io.test_output_checks``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import boto3
import pytest

from tests.unit.io.test_output_checks import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    ARRAYJOB,
    NO_RAY,
    _can_mount,
    arrayjob,
    assert_one_line,
    files,
    in_tmpfs,
    logreg,
    logreg_spec,
    needs_mount,
    process,
    published_output,
)


@pytest.mark.s3
def test_datagen_into_a_missing_bucket_or_onto_a_file_is_one_line_exit_4(tmp_path, s3_endpoint, s3_bucket, arrayjob):
    """datagen checks where it writes first, as run does: one line, exit 4, nothing written."""
    run = arrayjob("datagen", "logreg", "s3://no-such-bucket-x/demo", "--rows", "100", cwd=tmp_path,
                   env={"AWS_ENDPOINT_URL": s3_endpoint})
    assert_one_line(run, 4, f"URI: s3://no-such-bucket-x/demo is not writable: the bucket 'no-such-bucket-x' "
                            f"does not exist (at {s3_endpoint})")
    (tmp_path / "file").write_text("x")
    run = arrayjob("datagen", "logreg", str(tmp_path / "file"), "--rows", "100", cwd=tmp_path)
    assert run.returncode == 4 and run.stdout == "" and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(f"arrayjob: error: URI: {tmp_path / 'file'} is not writable: ")
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.s3
def test_missing_bucket_exit_4_names_it(logreg, s3_endpoint, s3_bucket, arrayjob):
    spec = logreg_spec(logreg, "s3://no-such-bucket-x/out", storage=f'endpoint_url = "{s3_endpoint}"')
    run = arrayjob("run", spec, cwd=logreg)
    assert_one_line(run, 4, f"output.uri: s3://no-such-bucket-x/out: the bucket 'no-such-bucket-x' does not exist "
                            f"(at {s3_endpoint})")
    names = [b["Name"] for b in boto3.client("s3", endpoint_url=s3_endpoint).list_buckets()["Buckets"]]
    assert "no-such-bucket-x" not in names
