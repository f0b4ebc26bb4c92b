"""The integration tests of ``tests.unit.algorithms.test_sparse_jobs``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from tests.harness.helpers import (
    published,
    read_group,
    run_cli,
    sparse_logreg_data,
    without_progress,
    write_array,
    write_csr_group,
    write_spec,
)
from tests.unit.algorithms.test_sparse_jobs import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    _arrays,
    _bad,
    _blocks,
    _reference,
    _run,
    assert_close,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(("change", "problem"), [
    # found by the driver, which reads indptr to plan the blocks
    (_bad("indptr", 3, 0), "'indptr' decreases at row 2"),
    # found by the worker that reads the block
    (_bad("indices", 40, 500), "holds column index 500, outside [0, 300)"),
    (_bad("data", 7, np.nan), "NaN or infinite values in"),
])
def test_a_bad_sparse_input_is_one_line_exit_2_and_nothing_written(workdir, capsys, change, problem):
    X, y = sparse_logreg_data(2000, 300, nnz_per_row=6, seed=10)
    write_csr_group(str(workdir / "X"), X, (400, 400, 300))
    write_array(str(workdir / "y.zarr"), y, (500,))
    change(zarr.open_group(str(workdir / "X"), mode="r+"))
    spec = write_spec(workdir / "spec.toml", inputs={"X": str(workdir / "X"), "y": str(workdir / "y.zarr")},
                      output=str(workdir / "out"))
    code, out, err = run_cli(["run", str(spec)], capsys)
    lines = without_progress(err).strip().splitlines()
    assert (code, out, len(lines)) == (2, "", 1), err
    assert lines[0].startswith("arrayjob: error: inputs.X: ") and problem in lines[0]
    assert not (workdir / "out" / "_SUCCESS").exists() and not list((workdir / "out").glob("runs/*/result.zarr"))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_racing_runs_on_a_sparse_input_publish_once(workdir, monkeypatch):
    """Three whole kmeans runs on one sparse X and one output, in threads of one driver: one
    runs (its workers write the labels along X's row blocks), the others find it published."""
    from arrayjob import runner
    from arrayjob.spec import load_spec
    from tests.unit.io.test_lease import _race

    monkeypatch.setenv("ARRAYJOB_LEASE_SECONDS", "5")
    X, _ = sparse_logreg_data(1500, 50, nnz_per_row=5, seed=11)
    write_csr_group(str(workdir / "X"), X, (500, 500, 200))
    spec_path = write_spec(workdir / "k.toml", inputs={"X": str(workdir / "X")}, output=str(workdir / "out"),
                           algorithm="kmeans", params="k = 3\n")
    specs = [load_spec(str(spec_path), []) for _ in range(3)]
    outcomes = _race(3, lambda i: runner.run(specs[i], notify=lambda line: None))
    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    ran = [o for o in outcomes if not o.skipped]
    assert len(ran) == 1 and all(o.manifest["run_id"] == ran[0].manifest["run_id"] for o in outcomes)
    group = read_group(f"{published(str(workdir / 'out'))}/result.zarr")
    assert group["labels"].shape == (1500,) and group.attrs["inertia"] == pytest.approx(ran[0].result.attrs["inertia"])


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(("algorithm", "where"), [("logreg", "local"), ("logreg", "s3"), ("linreg", "local"),
                                                  ("kmeans", "s3")])
def test_sparse_jobs_end_to_end_match_sklearn_and_are_estimated_exactly(request, workdir, capsys, algorithm, where):
    if where == "local":
        base, storage, endpoint = str(workdir / "bucket"), "", None
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        base, storage = f"s3://{request.getfixturevalue('s3_bucket')}", f'endpoint_url = "{endpoint}"'
    X, y = sparse_logreg_data(4000, 3000 if algorithm == "logreg" else 300, nnz_per_row=6, seed=7)
    if algorithm == "linreg":
        y = X @ np.random.default_rng(7).standard_normal(X.shape[1]) + 0.5
    write_csr_group(f"{base}/X", X, (1000, 700, 900), endpoint=endpoint, compressors=None)
    inputs = {"X": f"{base}/X"}
    if algorithm != "kmeans":
        write_array(f"{base}/y.zarr", y, (500,), endpoint=endpoint, compressors=None)  # stored bytes as planned
        inputs["y"] = f"{base}/y.zarr"
    l2, centroids = 1e-3, X[:3].toarray() + 0.01
    params = {"logreg": f"l2 = {l2}\ntol = 1e-9\nmax_iter = 500\n", "linreg": "",
              "kmeans": f'k = 3\ninit = "{base}/init.zarr"\n'}[algorithm]
    if algorithm == "kmeans":
        write_array(f"{base}/init.zarr", centroids, centroids.shape, endpoint=endpoint)
    spec = write_spec(workdir / "spec.toml", inputs=inputs, output=f"{base}/out", algorithm=algorithm,
                      params=params, storage=storage)

    code, out, err = run_cli(["plan", str(spec)], capsys)
    assert code == 0, err
    assert f"X: sparse (CSR), {X.nnz:,} non-zeros" in out

    code, out, err = run_cli(["estimate", str(spec), "--format", "json", "--iterations", "1"], capsys)
    assert code == 0, err
    estimate = json.loads(out)

    code, out, err = run_cli(["run", str(spec), "--json"], capsys)
    assert code == 0, without_progress(err)
    report = json.loads(out)
    group = read_group(f"{published(f'{base}/out', endpoint)}/result.zarr", endpoint)
    for name, expected in _reference(algorithm, X, y, l2, centroids).items():
        if name == "labels":
            np.testing.assert_array_equal(group[name][:], expected)
        else:
            assert_close(group[name][:], expected)
    # X's indptr once on the driver, then every block of X (and y) once: read as estimated, to
    # the byte (KMeans' initial centroids are read on the driver, in "fit")
    reads = {s["name"]: (s["storage.bytes_read"], s["storage.get_requests"]) for s in report["stages"]}
    planned = {s["name"]: (s["storage.bytes_read"], s["storage.get_requests"]) for s in estimate["stages"]}
    assert reads["validate"][0] > X.indptr.nbytes
    assert reads["validate"] == planned["validate"]
    if algorithm != "kmeans":
        assert reads["load"] == planned["load"] and reads["fit"] == (0, 0)
