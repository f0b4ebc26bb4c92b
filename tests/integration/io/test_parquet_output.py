"""The integration tests of ``tests.unit.io.test_parquet_output``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json
import os

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs
import pytest

from arrayjob.errors import InputError
from tests.harness.helpers import (
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
from tests.unit.io.test_parquet_output import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    KMEANS,
    SIZES,
    _blobs,
    _dataset,
    _spec,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_rerun_is_idempotent_and_a_failed_run_publishes_nothing(workdir, capsys):
    from arrayjob import runner
    from arrayjob.runtime.metrics import RunMetrics
    from arrayjob.runtime.supervision.pause import hold
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
