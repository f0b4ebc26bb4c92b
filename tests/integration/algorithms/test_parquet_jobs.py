"""The integration tests of ``tests.unit.algorithms.test_parquet_jobs``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from tests.harness.helpers import (
    feature_tables,
    published,
    read_group,
    run_cli,
    without_progress,
    write_array,
    write_parquet,
    write_spec,
)
from tests.unit.algorithms.test_parquet_jobs import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    PARAMS,
    SIZES,
    _case,
    _data,
    _stage_reads,
    footer_length,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("algorithm", ["logreg", "linreg", "kmeans"])
def test_a_job_from_parquet_matches_zarr_to_the_last_bit_and_its_estimate(request, workdir, capsys, algorithm,
                                                                           where):
    if where == "local":
        base, storage, endpoint = str(workdir / "bucket"), "", None
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        base, storage = f"s3://{request.getfixturevalue('s3_bucket')}", f'endpoint_url = "{endpoint}"'
    X, y = _data(algorithm)
    write_parquet(f"{base}/features", feature_tables(X, y, SIZES), row_group_size=250, endpoint=endpoint)
    # the same rows in Zarr, chunked as the Parquet row groups are, so both plans cut the same blocks
    write_array(f"{base}/X.zarr", X, (250, 5), endpoint=endpoint)
    tables: dict[str, object] = {"X": {"uri": f"{base}/features", "columns": "f*"}}
    arrays: dict[str, object] = {"X": f"{base}/X.zarr"}
    if y is not None:
        write_array(f"{base}/y.zarr", y, (250,), endpoint=endpoint)
        tables["y"] = {"uri": f"{base}/features", "column": "label"}
        arrays["y"] = f"{base}/y.zarr"
    specs = {kind: write_spec(workdir / f"{kind}.toml", inputs=inputs, output=f"{base}/out-{kind}",
                              algorithm=algorithm, params=PARAMS[algorithm], storage=storage)
             for kind, inputs in (("parquet", tables), ("zarr", arrays))}

    code, out, err = run_cli(["plan", str(specs["parquet"])], capsys)
    assert code == 0, err
    assert "X: Parquet, 4 file(s), 13 row groups, 5 column(s) (f0, f1, f2, f3, …)" in out
    code, out, err = run_cli(["estimate", str(specs["parquet"]), "--format", "json"], capsys)
    assert code == 0, err
    estimate = json.loads(out)
    reports = {}
    for kind, spec in specs.items():
        code, out, err = run_cli(["run", str(spec), "--json"], capsys)
        assert code == 0, without_progress(err)
        reports[kind] = json.loads(out)

    groups = {kind: read_group(f"{published(f'{base}/out-{kind}', endpoint)}/result.zarr", endpoint)
              for kind in specs}
    names = sorted(groups["zarr"].array_keys())
    assert names and sorted(groups["parquet"].array_keys()) == names
    for name in names:  # same rows, same order, same blocks: the same numbers, bit for bit
        np.testing.assert_array_equal(groups["parquet"][name][:], groups["zarr"][name][:], err_msg=name)
    # the footers on the driver (validate), then each block once (load): read as estimated, to the byte
    reads, planned = _stage_reads(reports["parquet"]["stages"]), _stage_reads(estimate["stages"])
    assert reads["validate"][0] > 0 and reads["validate"][1] == 2 * len(SIZES) * len(tables)  # per input
    assert reads["validate"] == planned["validate"] and reads["load"] == planned["load"]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_null_found_by_a_worker_is_one_line_exit_2_and_nothing_published(workdir, capsys):
    X, y = _data("logreg")
    tables = feature_tables(X, y, SIZES)
    labels = tables[1]["label"].to_pylist()
    labels[260] = None  # row 1,060 of the dataset: row 260 of the second file, in its row group 1
    tables[1] = tables[1].set_column(tables[1].schema.get_field_index("label"), "label", pa.array(labels))
    write_parquet(str(workdir / "features"), tables, row_group_size=250)
    inputs = {"X": {"uri": str(workdir / "features"), "columns": "f*"},
              "y": {"uri": str(workdir / "features"), "column": "label"}}
    spec = write_spec(workdir / "spec.toml", inputs=inputs, output=str(workdir / "out"))
    code, out, err = run_cli(["run", str(spec)], capsys)
    lines = without_progress(err).strip().splitlines()
    assert (code, out, lines) == (2, "", [
        f"arrayjob: error: inputs.y: column 'label' holds a null at row 1,060 (row 260 of "
        f"{workdir / 'features' / 'part-00001.parquet'}, in its row group 1); nulls = \"zero\" in [inputs] reads "
        "nulls as 0"])
    assert not (workdir / "out" / "_SUCCESS").exists() and not list((workdir / "out").glob("runs/*/result.zarr"))

    inputs["y"]["nulls"] = "zero"  # type: ignore[index]
    spec = write_spec(workdir / "spec.toml", inputs=inputs, output=str(workdir / "out"))
    code, out, err = run_cli(["run", str(spec)], capsys)
    assert code == 0, without_progress(err)
    assert (workdir / "out" / "_SUCCESS").exists()
