"""The integration tests of ``tests.unit.io.test_storage``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

from tests.unit.io.test_storage import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    backend,
)


def test_block_reads_find_the_bucket_region_when_none_is_configured(s3_endpoint, monkeypatch):
    import uuid

    import boto3

    from arrayjob.io._s3 import _bucket_region

    class Session:  # a boto3 session whose S3 client reaches the loopback server
        def client(self, service, **kwargs):
            return boto3.client(service, endpoint_url=s3_endpoint, region_name="us-east-1", **kwargs)

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="eu-west-1").create_bucket(
        Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    assert _bucket_region(Session(), name) == "eu-west-1"
    assert _bucket_region(Session(), f"missing-{uuid.uuid4().hex[:8]}") == "us-east-1"  # no answer: the default
