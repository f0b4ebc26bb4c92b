"""The integration tests of ``tests.unit.algorithms.test_pca``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.io.sparse import open_sparse_info
from tests.harness.helpers import (
    published,
    read_group,
    run_cli,
    without_progress,
    write_csr_group,
    write_spec,
)
from tests.unit.algorithms.test_pca import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    BAD,
    START,
    _gapped_sparse,
    _run,
    _sines,
    _sparse,
    _svd,
    assert_within_subspace_iteration_bound,
    low_rank_plus_noise,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_randomized_pca_of_a_sparse_x_end_to_end(workdir, capsys):
    """``arrayjob run`` on a CSR group: the result read with plain zarr, the scores written by
    the workers chunked like X's row chunks, the reads and tasks as estimated."""
    X = _gapped_sparse(7)
    write_csr_group(str(workdir / "X"), X, (1000, 700, 900), compressors=None)
    spec = write_spec(workdir / "spec.toml", inputs={"X": str(workdir / "X")}, output=str(workdir / "out"),
                      algorithm="pca", params="k = 3\nscores = true\nn_iter = 3\n")
    code, out, err = run_cli(["estimate", str(spec), "--format", "json"], capsys)
    assert code == 0, err
    estimate = json.loads(out)
    code, out, err = run_cli(["run", str(spec), "--json"], capsys)
    assert code == 0, without_progress(err)
    report = json.loads(out)
    group = read_group(f"{published(str(workdir / 'out'))}/result.zarr")
    assert group.attrs["method"] == "randomized" and group.attrs["iterations"] == 3
    s, vt = _svd(X, center=True)
    components = group["components"][:]
    assert np.all(_sines(components, vt[:3]) <= START * (s[13] / s[:3]) ** 6 + 1e-9)
    np.testing.assert_allclose(group["explained_variance"][:], s[:3] ** 2 / (X.shape[0] - 1), rtol=1e-8)
    scores = group["scores"]
    row_chunk = open_sparse_info("X", parse_uri(str(workdir / "X")), StorageOptions()).info.chunks[0]
    assert scores.shape == (3000, 3) and scores.chunks == (row_chunk, 3)  # chunked like X's rows
    dense = X.toarray()
    np.testing.assert_allclose(scores[:], (dense - dense.mean(axis=0)) @ components.T, atol=1e-10 * np.abs(dense).max())
    ran = {s["name"]: (s["tasks"], s["storage.bytes_read"]) for s in report["stages"]}
    planned = {s["name"]: (s["tasks.count"], s["storage.bytes_read"]) for s in estimate["stages"]}
    assert ran["fit"] == planned["fit"] and ran["load"] == planned["load"]
