"""Per-row outputs as Parquet (``[output] format = "parquet"``): KMeans labels written as
``labels/part-*.parquet`` read back with pyarrow in row order and match the labels the same
job writes to Zarr, on local disk and on S3; an ``id_column`` of any Arrow type comes back
row for row; a rerun is idempotent; a run that fails publishes nothing; the spec refuses
what cannot be written, in one line, exit 2."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs
import pyarrow.parquet as pq
import pytest

from arrayjob.errors import SpecError
from arrayjob.io.locations import StorageOptions, TableSelection, TableTarget, parse_uri
from arrayjob.io.parquet import open_table_info
from arrayjob.io.table_writer import write_table_block
from arrayjob.spec import validate
from tests.harness.helpers import (
    feature_tables,
    run_cli,
    write_parquet,
    write_spec,
)

SIZES = [800, 700, 750, 750]  # rows per file: row groups of 250, a short one at two files' ends
KMEANS = "k = 3\nmax_iter = 20\n"


def _blobs() -> np.ndarray:
    rng = np.random.default_rng(5)
    return np.concatenate([rng.normal(c, 0.4, (1000, 4)) for c in (0.0, 3.0, 6.0)])[rng.permutation(3000)]


def _dataset(uri: str, endpoint: str | None) -> ds.Dataset:
    """The Parquet dataset at ``uri`` as any pyarrow user opens it."""
    if uri.startswith("s3://"):
        fs = pyarrow.fs.S3FileSystem(endpoint_override=endpoint, access_key="testing", secret_key="testing",
                                     region="us-east-1")
        return ds.dataset(uri.removeprefix("s3://"), filesystem=fs, format="parquet")
    return ds.dataset(uri, format="parquet")


def test_ids_of_any_arrow_type_and_rows_of_k_values_round_trip(tmp_path):
    """A struct id column (stored as two leaf columns) and a timestamp one come back as pyarrow
    reads them from the input (a timestamp in seconds is stored in ms: Parquet has no seconds);
    an (n, k) output is a fixed-size list column, read back by arrayjob as the same matrix."""
    n = 900
    ids = pa.StructArray.from_arrays([pa.array(np.arange(n) % 7), pa.array([f"u{i}" for i in range(n)])],
                                     names=["shard", "user"])
    when = pa.array(np.arange(n).astype("datetime64[s]"))
    pq.write_table(pa.table({"f0": np.arange(n, dtype=float), "who": ids, "when": when}), tmp_path / "in.parquet",
                   row_group_size=300)
    options = StorageOptions()
    scores = np.random.default_rng(0).standard_normal((n, 3))
    stored = pq.read_table(tmp_path / "in.parquet")
    for column in ("who", "when"):
        expected = stored.column(column).combine_chunks()
        X = open_table_info("X", parse_uri(str(tmp_path / "in.parquet")), options,
                            TableSelection(columns=("f0",), id_column=column)).info
        target = TableTarget("scores", parse_uri(str(tmp_path / f"out-{column}")), (n, 3), "float64", (300, 3), X.ids())
        for lo in (0, 300, 600):
            counts = write_table_block(target, options, ((lo, lo + 300), (0, 3)), scores[lo:lo + 300])
            assert counts[1] == 1 and counts[3] == 1  # one PUT; one GET of the block's id column chunk(s)
        back = ds.dataset(str(tmp_path / f"out-{column}")).to_table()
        assert back.column(column).combine_chunks().equals(expected)
        assert back.schema.field("scores").type == pa.list_(pa.float64(), 3)
        read = open_table_info("S", parse_uri(str(tmp_path / f"out-{column}")), options,
                               TableSelection(columns=("scores",))).info
        from arrayjob.io.parquet_blocks import read_table_block

        np.testing.assert_array_equal(read_table_block(read, (slice(0, n), slice(0, 3)), options)[0], scores)


def _spec(output: dict, algorithm: str = "kmeans", X: object = None) -> dict:
    return {"job": {"name": "t", "algorithm": algorithm}, "params": {"k": 2} if algorithm == "kmeans" else {},
            "inputs": {"X": X or {"uri": "/data/features", "columns": "f*", "id_column": "user_id"},
                       **({"y": "/data/y.zarr"} if algorithm == "logreg" else {})},
            "output": {"uri": "/data/out", **output}}


@pytest.mark.parametrize(("output", "algorithm", "X", "message"), [
    ({"format": "csv"}, "kmeans", None, "output.format: expected one of 'zarr', 'parquet', got 'csv'"),
    ({"format": "parquet"}, "logreg", "/data/X.zarr", "output.format: logreg writes no per-row outputs"),
    ({}, "kmeans", None, "inputs.X.id_column: ids are written only into a Parquet output"),
    ({"format": "parquet"}, "kmeans", {"uri": "/data/f", "id_column": 3}, "inputs.X.id_column: expected a column name"),
    ({"format": "parquet", "compression": "zstd"}, "kmeans", None, "output.compression: unknown key"),
])
def test_the_spec_refuses_what_cannot_be_written(output, algorithm, X, message):
    with pytest.raises(SpecError) as info:
        validate(_spec(output, algorithm, X))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_missing_id_column_is_one_line_exit_2_and_nothing_written(workdir, capsys):
    base = workdir / "bucket"
    write_parquet(str(base / "features"), feature_tables(_blobs(), None, SIZES), row_group_size=250)
    spec = write_spec(workdir / "kmeans.toml", inputs={"X": {"uri": str(base / "features"), "columns": "f*",
                                                             "id_column": "user_id"}},
                      output=str(base / "out"), algorithm="kmeans", params=KMEANS, output_format="parquet")
    code, out, err = run_cli(["run", str(spec)], capsys)
    assert code == 2 and err.startswith("arrayjob: error: inputs.X.id_column: column 'user_id' is not in ") \
        and err.count("\n") == 1, err
    assert not (base / "out").exists()
    # an id column named as the output column it would be written beside
    named = write_spec(workdir / "named.toml", inputs={"X": {"uri": str(base / "features"), "columns": "f*",
                                                              "id_column": "f0"}},
                       output=str(base / "out"), algorithm="kmeans", params=KMEANS, output_format="parquet")
    named.write_text(named.read_text().replace('"f0"', '"labels"'))
    write_parquet(str(base / "features"), [t.rename_columns([*t.column_names[:-1], "labels"])
                                           for t in feature_tables(_blobs(), None, SIZES)], row_group_size=250)
    code, out, err = run_cli(["run", str(named)], capsys)
    assert code == 2 and err.startswith("arrayjob: error: inputs.X.id_column: 'labels' is also the name of the "
                                        "output column") and err.count("\n") == 1, err
    assert not (base / "out").exists()
