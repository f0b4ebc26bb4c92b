"""The integration tests of ``tests.unit.algorithms.test_predict_als``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from tests.harness.helpers import (
    read_result,
    run_cli,
    write_parquet,
    write_spec,
)
from tests.unit.algorithms.test_predict_als import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    _job,
    factors,
    top,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_from_the_cli_fit_on_a_table_and_recommend_into_parquet(workdir, capsys):
    """datagen writes a ratings table, ALS fits it, predict writes each listed user's top items
    as Parquet beside the user ids (id_column): the ranking of the published factors."""
    code, _, err = run_cli(["datagen", "als", str(workdir / "data"), "--rows", "600", "--cols", "80",
                            "--nnz-per-row", "8", "--chunk-rows", "200", "--rank", "3", "--format", "parquet"], capsys)
    assert code == 0, err
    spec = write_spec(workdir / "als.toml", algorithm="als", params="rank = 3\nmax_iter = 3",
                      inputs={"R": {"uri": str(workdir / "data" / "ratings"), "columns": ["user", "item", "rating"]}},
                      output=str(workdir / "model"))
    code, _, err = run_cli(["run", str(spec), "-q"], capsys)
    assert code == 0, err
    users = np.array([5, 599, 0, 17, 5, 300], dtype=np.int64)
    write_parquet(str(workdir / "users"), [pa.table({"user": users})], row_group_size=4)
    spec = write_spec(workdir / "predict.toml", algorithm="predict", params="top_n = 4", output_format="parquet",
                      inputs={"model": str(workdir / "model"),
                              "X": {"uri": str(workdir / "users"), "column": "user", "id_column": "user"}},
                      output=str(workdir / "recommended"))
    code, out, err = run_cli(["run", str(spec), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    fitted = read_result(str(workdir / "model"))
    items, ratings = top(fitted["user_factors"][:], fitted["item_factors"][:], users, 4)
    prefix = f"{workdir / 'recommended'}/{json.loads((workdir / 'recommended' / '_SUCCESS').read_text())['prefix']}"
    table = ds.dataset(f"{prefix}/items").to_table()
    assert table.column_names == ["user", "items"] and table["user"].to_pylist() == users.tolist()
    np.testing.assert_array_equal(np.array(table["items"].to_pylist()), items)
    np.testing.assert_allclose(np.array(ds.dataset(f"{prefix}/ratings").to_table()["ratings"].to_pylist()), ratings,
                               rtol=1e-12)
    assert report["algorithm"] == "predict"
