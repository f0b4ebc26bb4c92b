"""The integration tests of ``tests.unit.io.test_sparse_io``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import boto3
import pytest

from arrayjob.errors import InputError
from arrayjob.io.arrays import read_block
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.io.sparse import open_sparse_info
from tests.unit.io.test_sparse_io import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    COLS,
    ROWS,
    SMALL,
    _attrs,
    _del_attr,
    _replace,
    _set,
    assert_blocks_read_as_priced,
    backend,
    blocks,
    load_csr,
    matrix,
    write_csr,
)


def test_a_missing_chunk_on_s3_is_named(s3_endpoint, s3_bucket):
    m = matrix(seed=7)
    uri = f"s3://{s3_bucket}/X.zarr"
    write_csr(uri, m, chunks=(8, 5, 6), endpoint=s3_endpoint)
    options = StorageOptions(endpoint_url=s3_endpoint)
    info = open_sparse_info("X", parse_uri(uri), options).info
    assert_blocks_read_as_priced(info, m, options, info.chunks[0] * 3)
    boto3.client("s3", endpoint_url=s3_endpoint).delete_object(Bucket=s3_bucket, Key="X.zarr/indices/c/2")
    # a row whose values all lie in that chunk (of 5): the read's one request finds nothing
    # (a read of several chunks fails the same way, but leaves zarr's other requests to be
    # cancelled at exit, with noise)
    row = next(r for r in range(ROWS) if 10 <= m.indptr[r] < m.indptr[r + 1] <= 15)
    info = open_sparse_info("X", parse_uri(uri), options, target_nnz_per_chunk=1).info
    assert info.chunks[0] == 1
    with pytest.raises(InputError, match=rf"^inputs\.X: chunk \(2,\) \(key 'c/2'\) of {uri}/indices is missing"):
        read_block(info, (slice(row, row + 1), slice(0, COLS)), options)
