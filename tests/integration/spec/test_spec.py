"""The integration tests of ``tests.unit.spec.test_spec``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness.helpers import run_cli, without_progress, write_array
from tests.unit.spec.test_spec import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    GOOD,
    MALFORMED,
    _spec,
)


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_kmeans_k_over_distinct_rows_is_one_line_exit_2(ray_session, workdir, capsys, init):  # a run: joins the session's Ray
    from tests.harness.helpers import write_spec

    # no all-zero chunk: zarr would not store it, and a missing chunk is an error of its own
    points = np.array([[1.0, 1.0], [2.0, 1.0], [1.0, 2.0]])
    write_array("X.zarr", np.repeat(points, 4, axis=0), (4, 2))  # 12 rows, 3 distinct
    spec = write_spec(workdir / "k.toml", inputs={"X": "X.zarr"}, output="out", algorithm="kmeans",
                      params=f'k = 5\ninit = "{init}"\n')
    code, out, err = run_cli(["run", str(spec)], capsys)
    assert (code, out) == (2, "")
    assert without_progress(err) == "arrayjob: error: params.k: 5 clusters but inputs.X has only 3 distinct rows\n"
    assert not (workdir / "out" / "_SUCCESS").exists()
