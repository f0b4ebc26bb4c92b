"""The integration tests of ``tests.unit.algorithms.test_als``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse

from tests.harness.helpers import read_group, read_result, run_cli, write_spec
from tests.unit.algorithms.test_als import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    BAD,
    RANK,
    assert_matches,
    make,
    opened,
    ratings,
    reference,
    run,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_datagen_and_a_run_from_the_cli_match_numpy(workdir, capsys):
    """``arrayjob datagen als`` writes low-rank ratings; the run publishes factors whose
    objective, per iteration, is the reference's on the ratings read back."""
    code, _, err = run_cli(["datagen", "als", str(workdir / "data"), "--rows", "1500", "--cols", "200",
                            "--nnz-per-row", "6", "--chunk-rows", "250", "--rank", "3"], capsys)
    assert code == 0, err
    group = read_group(str(workdir / "data" / "R.zarr"))
    assert group.attrs["encoding-type"] == "csr_matrix" and group.attrs["shape"] == [1500, 200]
    R = scipy.sparse.csr_matrix((group["data"][:], group["indices"][:], group["indptr"][:]), shape=(1500, 200))
    assert np.all(np.diff(R.indptr) == 6)
    spec = write_spec(workdir / "als.toml", inputs={"R": str(workdir / "data" / "R.zarr")}, output="out",
                      algorithm="als", params="rank = 3\nl2 = 0.05\nmax_iter = 4\n")
    code, out, err = run_cli(["run", str(spec), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert [s["name"] for s in report["stages"]] == \
        [s["name"] for s in report["estimate"]["stages"] if s["name"] != "shutdown"]  # validate: R's indptr
    result = read_result("out")
    y0 = np.random.default_rng(0).standard_normal((200, 3)) / np.sqrt(3)
    x, y, objective = reference(R, y0, 0.05, 4)
    np.testing.assert_allclose(result.attrs["objective"], objective, rtol=1e-8, atol=0)
    assert np.linalg.norm(result["item_factors"][:] - y) <= 1e-8 * np.linalg.norm(y)
    assert result["user_factors"].shape == (1500, 3)
    assert np.all(np.diff(result.attrs["objective"]) < 0)
