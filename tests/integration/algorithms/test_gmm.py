"""The integration tests of ``tests.unit.algorithms.test_gmm``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.harness.helpers import (
    published,
    read_group,
    run_cli,
    without_progress,
    write_array,
    write_spec,
)
from tests.unit.algorithms.test_gmm import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    REG_COVAR,
    assert_matches,
    blobs,
    reference,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_gmm_end_to_end_matches_sklearn_with_labels_written_by_the_workers(workdir, capsys):
    X = blobs(4000, 3, seed=9)
    means = X[np.random.default_rng(9).choice(len(X), 3, replace=False)]
    write_array(str(workdir / "X.zarr"), X, (1000, 3))
    write_array(str(workdir / "init.zarr"), means, means.shape)
    spec = write_spec(workdir / "spec.toml", inputs={"X": "X.zarr"}, output="out", algorithm="gmm",
                      params='k = 3\ninit = "init.zarr"\ntol = 1e-8\n')
    code, out, err = run_cli(["run", str(spec), "--json"], capsys)
    assert code == 0, without_progress(err)
    report = json.loads(out)
    ref = reference(X, means, "full", tol=1e-8)
    group = read_group(f"{published(str(workdir / 'out'))}/result.zarr")
    assert group["labels"].chunks == (1000,)  # written by the workers, chunked like X
    result = type("Result", (), {"attrs": dict(group.attrs),
                                 "arrays": {name: group[name][:] for name in group.array_keys()}})
    assert_matches(result, ref, X)
    # one pass over X per iteration, read once: every read in load, none in fit
    reads = {s["name"]: s["storage.get_requests"] for s in report["stages"]}
    assert reads["fit"] == 0 and reads["load"] >= 4
