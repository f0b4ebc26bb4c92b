"""Per-row outputs as Parquet (``[output] format = "parquet"``): KMeans labels written as
``labels/part-*.parquet`` read back with pyarrow in row order and match the labels the same
job writes to Zarr, on local disk and on S3; an ``id_column`` of any Arrow type comes back
row for row; a rerun is idempotent; a run that fails publishes nothing; the spec refuses
what cannot be written, in one line, exit 2."""

from __future__ import annotations

import json
import os

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs
import pyarrow.parquet as pq
import pytest

from arrayjob.errors import InputError, SpecError
from arrayjob.io.locations import StorageOptions, TableSelection, TableTarget, parse_uri
from arrayjob.io.parquet import open_table_info
from arrayjob.io.table_writer import write_table_block
from arrayjob.spec import validate
from tests.helpers import (
    feature_tables,
    published,
    read_group,
    run_cli,
    storage_options,
    without_progress,
    write_array,
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


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("where", ["local", "s3"])
def test_kmeans_labels_as_parquet_match_zarr_with_their_ids(request, workdir, capsys, where):
    if where == "local":
        base, storage, endpoint = str(workdir / "bucket"), "", None
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        base, storage = f"s3://{request.getfixturevalue('s3_bucket')}", f'endpoint_url = "{endpoint}"'
    X = _blobs()
    write_parquet(f"{base}/features", feature_tables(X, None, SIZES), row_group_size=250, endpoint=endpoint)
    write_array(f"{base}/X.zarr", X, (250, 4), endpoint=endpoint)
    table = {"uri": f"{base}/features", "columns": "f*", "id_column": "note"}
    specs = {"parquet": write_spec(workdir / "parquet.toml", inputs={"X": table}, output=f"{base}/out-parquet",
                                   algorithm="kmeans", params=KMEANS, storage=storage, output_format="parquet"),
             "zarr": write_spec(workdir / "zarr.toml", inputs={"X": f"{base}/X.zarr"}, output=f"{base}/out-zarr",
                                algorithm="kmeans", params=KMEANS, storage=storage)}
    code, out, err = run_cli(["estimate", str(specs["parquet"]), "--format", "json"], capsys)
    assert code == 0, err
    estimate = {s["name"]: s for s in json.loads(out)["stages"]}
    reports = {}
    for kind, spec in specs.items():
        code, out, err = run_cli(["run", str(spec), "--json"], capsys)
        assert code == 0, without_progress(err)
        reports[kind] = json.loads(out)

    prefix = published(f"{base}/out-parquet", endpoint)
    labels = _dataset(f"{prefix}/labels", endpoint).to_table()
    zarr_labels = read_group(f"{published(f'{base}/out-zarr', endpoint)}/result.zarr", endpoint)["labels"][:]
    assert labels.schema.names == ["note", "labels"] and labels.schema.field("labels").type == pa.int64()
    np.testing.assert_array_equal(labels.column("labels").to_numpy(), zarr_labels)
    assert labels.column("note").to_pylist() == [f"row {i}" for i in range(3000)]  # the ids, in row order
    # the centroids stay in result.zarr, and equal the Zarr run's to the last bit
    np.testing.assert_array_equal(read_group(f"{prefix}/result.zarr", endpoint)["centroids"][:],
                                  read_group(f"{published(f'{base}/out-zarr', endpoint)}/result.zarr",
                                             endpoint)["centroids"][:])
    # one file per row block, each listed in the manifest _SUCCESS publishes
    report = reports["parquet"]
    fs, root = fsspec.core.url_to_fs(f"{base}/out-parquet", **(storage_options(base, endpoint) or {}))
    files = [f["path"] for f in json.loads(fs.cat_file(f"{root}/_SUCCESS"))["files"]]
    parts = [os.path.basename(p) for p in _dataset(f"{prefix}/labels", endpoint).files]
    assert len(parts) > 1 and all(p.startswith("part-") and p.endswith(".parquet") for p in parts)  # part-0750…
    assert sorted(p for p in files if p.startswith("labels/")) == [f"labels/{p}" for p in sorted(parts)]
    written = sum(s["storage.put_requests"] for s in report["stages"] if s["name"] in ("fit", "write"))
    assert written == estimate["write"]["storage.put_requests"]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_rerun_is_idempotent_and_a_failed_run_publishes_nothing(workdir, capsys):
    from arrayjob import runner
    from arrayjob.runtime.metrics import RunMetrics
    from arrayjob.runtime.pause import hold
    from arrayjob.spec import load_spec

    base = workdir / "bucket"
    X = _blobs()
    keys = write_parquet(str(base / "features"), feature_tables(X, None, SIZES), row_group_size=250)
    table = {"uri": str(base / "features"), "columns": "f*", "id_column": "note"}
    spec = write_spec(workdir / "kmeans.toml", inputs={"X": table}, output=str(base / "out"), algorithm="kmeans",
                      params=KMEANS, output_format="parquet")
    code, _, err = run_cli(["run", str(spec)], capsys)
    assert code == 0, without_progress(err)
    first = json.loads((base / "out" / "_SUCCESS").read_text())
    labels = ds.dataset(f"{base}/out/{first['prefix']}/labels").to_table()
    code, out, err = run_cli(["run", str(spec)], capsys)  # the same spec again: skipped, nothing rewritten
    assert code == 0 and "already complete" in out, err
    assert json.loads((base / "out" / "_SUCCESS").read_text()) == first
    code, _, err = run_cli(["run", str(spec), "--overwrite"], capsys)  # run again: the same rows
    assert code == 0, without_progress(err)
    again = json.loads((base / "out" / "_SUCCESS").read_text())
    assert again["run_id"] != first["run_id"] and os.listdir(base / "out" / "runs") == [again["run_id"]]
    assert ds.dataset(f"{base}/out/{again['prefix']}/labels").to_table().equals(labels)

    # a run that fails while its workers write the labels: the ids of the last file are gone
    # when the labels pass reads them (after the iterations), so its other blocks' files were
    # written; none is published and the run's prefix is removed
    failing = write_spec(workdir / "failing.toml", inputs={"X": table}, output=str(base / "failed"),
                         algorithm="kmeans", params="k = 3\nmax_iter = 1\n", output_format="parquet")
    metrics = RunMetrics()
    hold(metrics, ["fit:1"], lambda point: os.remove(base / "features" / keys[-1]))
    with pytest.raises(InputError, match=r"inputs\.X\.note: .*part-00003\.parquet is missing: lost data"):
        runner.run(load_spec(failing), metrics=metrics)
    left = [os.path.join(d, f) for d, _, fs in os.walk(base / "failed") for f in fs]
    assert left == [], left


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
