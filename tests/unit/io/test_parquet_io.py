"""Parquet datasets as inputs, below the jobs: the ``[inputs]`` forms, opening a dataset from its
footers (files in sorted key order, the row chunk from its row groups), and block reads that
take exactly the requests ``ArrayInfo.block_reads`` says, on local disk and on S3."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arrayjob.errors import InputError, SpecError
from arrayjob.io.arrays import read_block
from arrayjob.io.locations import StorageOptions, TableSelection, parse_uri
from arrayjob.io.parquet import is_parquet_dataset, open_table_info
from arrayjob.spec import InputEntry
from tests.harness.helpers import feature_tables, write_parquet

SIZES = [800, 700, 750, 750]  # rows per file: row groups of 250, and a short one at two files' ends


def _data(n: int = 3000, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)), (rng.random(n) < 0.5).astype(np.float64)


def footer_length(path) -> int:
    """The length of a file's footer (the metadata), as its last 8 bytes give it."""
    with open(path, "rb") as f:
        f.seek(-8, 2)
        return int.from_bytes(f.read(4), "little")


@pytest.mark.parametrize(("value", "entry"), [
    ("data/X.zarr", InputEntry("data/X.zarr")),
    ("data/features.parquet", InputEntry("data/features.parquet", "parquet")),
    ("s3://b/features/part-*.parquet", InputEntry("s3://b/features/part-*.parquet", "parquet")),
    ({"uri": "s3://b/features/", "format": "parquet", "columns": ["f0", "f1"]},
     InputEntry("s3://b/features/", "parquet", table=TableSelection(columns=("f0", "f1")))),
    ({"uri": "s3://b/features/", "columns": "f*"},
     InputEntry("s3://b/features/", "parquet", table=TableSelection(glob="f*"))),
    ({"uri": "s3://b/features/", "columns": "embedding"},
     InputEntry("s3://b/features/", "parquet", table=TableSelection(columns=("embedding",)))),
    ({"uri": "s3://b/features/", "column": "label", "nulls": "zero"},
     InputEntry("s3://b/features/", "parquet", table=TableSelection(column="label", nulls="zero"))),
    ({"uri": "data/X.zarr", "missing_chunks": "fill"}, InputEntry("data/X.zarr", "", "fill")),
])
def test_inputs_entries_name_their_format_and_columns(value, entry):
    assert InputEntry.parse(value, "inputs.X") == entry


@pytest.mark.parametrize(("value", "message"), [
    ({"uri": "f/", "columns": ["f0"], "column": "label"},
     "inputs.X.column: give columns (a matrix) or column (a vector), not both"),
    ({"uri": "f/", "columns": []}, "inputs.X.columns: expected a list of column names or a glob such as \"f*\", got []"),
    ({"uri": "f/", "columns": ["f0", 3]}, "inputs.X.columns: expected a list of column names or a glob"),
    ({"uri": "f/", "columns": ["f0", "f0"]}, "inputs.X.columns: 'f0' is named twice"),
    ({"uri": "f/", "column": ""}, "inputs.X.column: expected a column name, got ''"),
    ({"uri": "f/", "format": "csv"}, "inputs.X.format: expected one of 'zarr', 'parquet', got 'csv'"),
    ({"uri": "f/", "format": "parquet", "nulls": "drop"}, "inputs.X.nulls: expected one of 'error', 'zero', got 'drop'"),
    ({"uri": "f/", "format": "zarr", "column": "y"}, "inputs.X.column: a key of Parquet inputs, but inputs.X.format is"),
    ({"uri": "f.parquet", "missing_chunks": "fill"}, "inputs.X.missing_chunks: a key of Zarr inputs"),
    ({"uri": "f/", "colums": ["f0"]}, "inputs.X.colums: unknown key (expected one of: uri, format, missing_chunks,"),
])
def test_a_malformed_parquet_entry_is_one_line(value, message):
    with pytest.raises(SpecError) as caught:
        InputEntry.parse(value, "inputs.X")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_dataset_opens_from_its_footers_alone(tmp_path):
    X, y = _data()
    keys = write_parquet(str(tmp_path / "features"), feature_tables(X, y, SIZES), row_group_size=250)
    read = open_table_info("X", parse_uri(str(tmp_path / "features")), StorageOptions(), TableSelection(glob="f*"))
    info = read.info
    assert (info.shape, info.dtype, info.chunks) == ((3000, 5), "float64", (250, 5))  # the commonest row group
    assert info.uri == f"{tmp_path / 'features'}#f*" and info.table is not None
    assert info.table.columns == ("f0", "f1", "f2", "f3", "f4") and len(info.table.row_groups) == 13
    assert info.table.offsets[:5] == (0, 250, 500, 750, 800)  # the first file ends in a group of 50
    # two GETs per file, its last 8 bytes and its footer: nothing else
    assert read.counters.get_requests == 2 * len(keys)
    assert read.counters.bytes_read == sum(footer_length(tmp_path / "features" / k) + 8 for k in keys)
    assert info.block_nbytes((slice(0, 500), slice(0, 5))) == 500 * 5 * 8


def test_files_are_read_in_sorted_key_order_past_hidden_files(tmp_path):
    X, y = _data(600, 2)
    root = tmp_path / "events"
    # hive partition directories, and a writer's marker, checksum and summary files beside them
    write_parquet(str(root), feature_tables(X, y, [200, 200, 200]), row_group_size=100,
                  names=["day=2/part-0.parquet", "day=1/part-1.parquet", "day=1/part-0.parquet"])
    for hidden in ("_SUCCESS", "day=1/.part-0.parquet.crc", "_common_metadata"):
        (root / hidden).write_bytes(b"not parquet")
    order = np.concatenate([X[400:600], X[200:400], X[0:200]])  # day=1/part-0, day=1/part-1, day=2/part-0
    options = StorageOptions()
    for uri in (str(root), f"{root}/*/part-*.parquet"):
        assert is_parquet_dataset(parse_uri(uri), options)
        info = open_table_info("X", parse_uri(uri), options, TableSelection(columns=("f0", "f1"))).info
        assert info.table is not None and info.table.files == ("day=1/part-0.parquet", "day=1/part-1.parquet",
                                                               "day=2/part-0.parquet")
        np.testing.assert_array_equal(read_block(info, (slice(0, 600), slice(0, 2)), options)[0], order)
    one = open_table_info("X", parse_uri(f"{root}/day=2/part-0.parquet"), options, TableSelection(column="f1")).info
    assert one.shape == (200,) and one.table is not None and one.table.files == ("",)
    np.testing.assert_array_equal(read_block(one, (slice(0, 200),), options)[0], X[:200, 1])


def test_every_column_is_the_default_and_must_be_numeric(tmp_path):
    X, y = _data(300, 3)
    write_parquet(str(tmp_path / "numbers"), feature_tables(X, None, [300]), row_group_size=100)
    with pytest.raises(InputError, match=r"column 'note' of .* is string, not numeric"):
        open_table_info("X", parse_uri(str(tmp_path / "numbers")), StorageOptions(), TableSelection())
    pq.write_table(pa.table({"a": X[:, 0], "b": np.arange(300), "c": X[:, 2] > 0}), str(tmp_path / "all.parquet"))
    info = open_table_info("X", parse_uri(str(tmp_path / "all.parquet")), StorageOptions(), TableSelection()).info
    block, _ = read_block(info, (slice(0, 300), slice(0, 3)), StorageOptions())
    np.testing.assert_array_equal(block, np.column_stack([X[:, 0], np.arange(300), X[:, 2] > 0]))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_block_reads_exactly_what_block_reads_says(request, tmp_path, where):
    if where == "local":
        uri, options, endpoint = str(tmp_path / "features"), StorageOptions(), None
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        uri, options = f"s3://{request.getfixturevalue('s3_bucket')}/features", StorageOptions(endpoint_url=endpoint)
    X, y = _data()
    write_parquet(uri, feature_tables(X, y, SIZES), row_group_size=250, endpoint=endpoint)
    info = open_table_info("X", parse_uri(uri), options, TableSelection(columns=("f0", "f1", "f2", "f3", "f4"))).info
    label = open_table_info("y", parse_uri(uri), options, TableSelection(column="label")).info
    for array, selection, expected in [
        (info, (slice(0, 250), slice(0, 5)), X[:250]),  # one row group: its five column chunks, one range
        (info, (slice(750, 1500), slice(0, 5)), X[750:1500]),  # across a file's end: the groups it overlaps
        (info, (slice(500, 1000), slice(1, 3)), X[500:1000, 1:3]),  # two columns only
        (info, (slice(2750, 3000), slice(0, 5)), X[2750:]),
        (label, (slice(0, 3000),), y),  # y: one chunk per row group (the columns between are not read)
    ]:
        block, counters = read_block(array, selection, options)
        np.testing.assert_array_equal(block, expected)
        assert (counters.bytes_read, counters.get_requests) == array.block_reads(selection)
    assert info.block_reads((slice(0, 250), slice(0, 5)))[1] == 1  # f0 … f4 lie side by side: one GET
    assert label.block_reads((slice(0, 3000),))[1] == 13  # a GET per row group
    # rows 750:1000 of the 2nd file's first group, rows 1000:1250 in its second: neighbours read both
    assert info.block_reads((slice(750, 1000), slice(0, 5)))[1] == 2


def test_a_fixed_size_list_column_is_a_matrix(tmp_path):
    E = np.arange(1200, dtype=np.float32).reshape(400, 3)
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(E.ravel()), 3)
    pq.write_table(pa.table({"id": np.arange(400), "embedding": embedding}), str(tmp_path / "e.parquet"),
                   row_group_size=100)
    info = open_table_info("X", parse_uri(str(tmp_path / "e.parquet")), StorageOptions(),
                           TableSelection(columns=("embedding",))).info
    assert (info.shape, info.chunks) == ((400, 3), (100, 3))
    block, counters = read_block(info, (slice(100, 300), slice(0, 3)), StorageOptions())
    np.testing.assert_array_equal(block, E[100:300])
    assert (counters.bytes_read, counters.get_requests) == info.block_reads((slice(100, 300), slice(0, 3)))
    with pytest.raises(InputError, match="a list column is a matrix by itself"):
        open_table_info("X", parse_uri(str(tmp_path / "e.parquet")), StorageOptions(),
                        TableSelection(columns=("id", "embedding")))


def test_a_null_is_refused_naming_its_column_file_row_group_and_row_or_read_as_zero(tmp_path):
    labels = np.arange(600, dtype=np.float64)
    with_null = pa.array([None if i == 221 else v for i, v in enumerate(labels[300:])], pa.float64())
    write_parquet(str(tmp_path / "d"), [pa.table({"label": labels[:300]}), pa.table({"label": with_null})],
                  row_group_size=100)
    options = StorageOptions()
    info = open_table_info("y", parse_uri(str(tmp_path / "d")), options, TableSelection(column="label")).info
    np.testing.assert_array_equal(read_block(info, (slice(0, 300),), options)[0], labels[:300])  # no null there
    with pytest.raises(InputError) as caught:
        read_block(info, (slice(300, 600),), options)
    assert str(caught.value) == (f"inputs.y: column 'label' holds a null at row 521 (row 221 of "
                                 f"{tmp_path / 'd' / 'part-00001.parquet'}, in its row group 2); nulls = \"zero\" "
                                 "in [inputs] reads nulls as 0")
    zero = open_table_info("y", parse_uri(str(tmp_path / "d")), options,
                           TableSelection(column="label", nulls="zero")).info
    expected = labels.copy()
    expected[521] = 0.0
    np.testing.assert_array_equal(read_block(zero, (slice(0, 600),), options)[0], expected)
