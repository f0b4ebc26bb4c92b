"""Logistic regression: block kernels, the job on the in-process executor, and end to end on Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

from arrayjob.algorithms.logreg import LogisticRegression, LogRegParams
from arrayjob.api.job import JobContext
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from tests.harness.helpers import (
    logreg_data,
    published,
    read_group,
    read_result,
    run_cli,
    without_progress,
    write_array,
    write_spec,
)

PLANNER = {"tiling": "naive", "fusion": "none", "placement": "roundrobin"}


def objective(X, y, coef, intercept, l2):
    z = X @ coef + intercept
    s = 2 * y - 1
    return np.mean(np.logaddexp(0, -s * z)) + 0.5 * l2 * coef @ coef


def sklearn_fit(X, y, l2, fit_intercept):
    model = SkLogisticRegression(C=1 / (l2 * len(y)), fit_intercept=fit_intercept, tol=1e-12, max_iter=10_000)
    model.fit(X, y)
    intercept = model.intercept_[0] if fit_intercept else 0.0
    return model.coef_[0], intercept


def _job(tmp_path, X, y, chunks, **params):
    write_array(str(tmp_path / "X.zarr"), X, (chunks, X.shape[1]))
    write_array(str(tmp_path / "y.zarr"), y, (chunks + 300,))  # y chunked unlike X: blocks still line up
    options = StorageOptions()
    arrays = {n: open_array_info(n, parse_uri(str(tmp_path / f"{n}.zarr")), options) for n in ("X", "y")}
    return LogisticRegression(LogRegParams(**params), arrays)


def _session(**planner):
    executor = LocalExecutor(StorageOptions())
    options = PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2), **planner)
    return Session(executor, options), executor.metrics


def test_program_matches_numpy_and_finite_differences(tmp_path):
    X, y = logreg_data(500, 4, seed=1)
    job = _job(tmp_path, X, y, 60, solver="newton")
    session, _ = _session(**PLANNER)
    w, b = np.array([0.3, -0.2, 0.1, 0.05]), 0.4
    r = session.compute(job.program(), {"w": w, "b": b})
    loss = lambda w, b: np.sum(np.logaddexp(0, -(2 * y - 1) * (X @ w + b)))  # noqa: E731
    assert r["loss"] == pytest.approx(loss(w, b), rel=1e-12)
    eps = 1e-6
    numeric = [(loss(w + eps * e, b) - loss(w - eps * e, b)) / (2 * eps) for e in np.eye(4)]
    np.testing.assert_allclose(r["grad_w"], numeric, rtol=1e-6)
    assert r["grad_b"] == pytest.approx((loss(w, b + eps) - loss(w, b - eps)) / (2 * eps), rel=1e-6)
    grad = lambda w: session.compute(job.program(), {"w": w, "b": b})["grad_w"]  # noqa: E731
    numeric_h = np.array([(grad(w + eps * e) - grad(w - eps * e)) / (2 * eps) for e in np.eye(4)])
    np.testing.assert_allclose(r["hess_ww"], numeric_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r["hess_ww"], r["hess_ww"].T)


@pytest.mark.parametrize("solver", ["lbfgs", "newton"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_job_matches_sklearn_on_the_local_executor(tmp_path, solver, fit_intercept):
    X, y = logreg_data(4000, 6, seed=2)
    l2 = 1e-3
    job = _job(tmp_path, X, y, 700, solver=solver, l2=l2, fit_intercept=fit_intercept, tol=1e-7)
    session, metrics = _session(**PLANNER)
    result = job.run(JobContext(session, metrics))
    coef, intercept = sklearn_fit(X, y, l2, fit_intercept)
    ours = objective(X, y, result.arrays["coef"], result.arrays["intercept"][0], l2)
    assert ours == pytest.approx(objective(X, y, coef, intercept, l2), rel=1e-9)
    assert result.attrs["objective"] == pytest.approx(ours, rel=1e-12)
    np.testing.assert_allclose(result.arrays["coef"], coef, rtol=1e-4, atol=1e-6)
    assert result.attrs["converged"]
    # Every stored byte of X and y is read in the load stage, and nothing while fitting.
    load, fit = metrics.stages
    stored = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
    assert load.storage.bytes_read >= stored and fit.storage.get_requests == 0
    assert fit.tasks > 0 and result.attrs["iterations"] > 1


# -- end to end on Ray, through the CLI ----------------------------------------------------


@pytest.fixture(params=["local", "s3"])
def bucket(request, workdir):
    """(base URI, [storage] lines, endpoint) on a local directory or the loopback S3 server."""
    if request.param == "local":
        return str(workdir / "bucket"), "", None
    endpoint = request.getfixturevalue("s3_endpoint")
    return f"s3://{request.getfixturevalue('s3_bucket')}", f'endpoint_url = "{endpoint}"', endpoint


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("solver", ["lbfgs", "newton"])
def test_run_matches_sklearn_end_to_end(bucket, workdir, capsys, solver):
    base, storage, endpoint = bucket
    X, y = logreg_data(5000, 8, seed=3)
    write_array(f"{base}/X.zarr", X, (600, 8), endpoint=endpoint)
    write_array(f"{base}/y.zarr", y, (600,), endpoint=endpoint)
    l2 = 1e-4
    spec = write_spec(workdir / "spec.toml", inputs={"X": f"{base}/X.zarr", "y": f"{base}/y.zarr"},
                      output=f"{base}/out", params=f'solver = "{solver}"\nl2 = {l2}\ntol = 1e-8\n',
                      storage=storage)
    code, out, err = run_cli(["run", str(spec)], capsys)
    assert (code, without_progress(err)) == (0, "")
    run_prefix = published(f"{base}/out", endpoint)
    assert "converged in" in out and f"{run_prefix}/result.zarr" in out

    group = read_group(f"{run_prefix}/result.zarr", endpoint)
    coef, intercept = group["coef"][:], group["intercept"][:]
    assert coef.shape == (8,) and intercept.shape == (1,)
    ref_coef, ref_intercept = sklearn_fit(X, y, l2, True)
    reference = objective(X, y, ref_coef, ref_intercept, l2)
    assert objective(X, y, coef, intercept[0], l2) == pytest.approx(reference, rel=1e-6)
    assert group.attrs["objective"] == pytest.approx(reference, rel=1e-6)
    assert group.attrs["converged"] is True and group.attrs["iterations"] >= 1

    import fsspec

    fs, root = fsspec.core.url_to_fs(f"{base}/out", **({"endpoint_url": endpoint} if endpoint else {}))
    manifest = json.loads(fs.cat(f"{root}/_SUCCESS"))
    report = json.loads(fs.cat(f"{root}/{manifest['prefix']}/report.json"))
    assert {f["path"] for f in manifest["files"]} >= {"report.json", "result.zarr/zarr.json"}
    assert [s["name"] for s in report["stages"]] == ["validate", "connect", "load", "fit", "write"]
    # Every block of X and y is read from storage exactly once, however many iterations ran.
    # (zstd makes the stored bytes fewer than the array's nbytes)
    assert report["stages"][2]["storage.bytes_read"] > (X.nbytes + y.nbytes) / 2
    assert sum(s["storage.bytes_read"] for s in report["stages"]) == report["storage"]["bytes_read"]
    assert report["stages"][3]["storage.get_requests"] == 0
    assert report["spec"]["params"]["solver"] == solver

    # A rerun of the same spec is a no-op that says so.
    code, out, _ = run_cli(["run", str(spec)], capsys)
    assert code == 0 and "already complete" in out
    assert json.loads(fs.cat(f"{root}/_SUCCESS"))["run_id"] == manifest["run_id"]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_json_report_and_overwrite(workdir, capsys):
    X, y = logreg_data(1000, 3)
    write_array("X.zarr", X, (250, 3))
    write_array("y.zarr", y, (250,))
    spec = write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out")
    code, out, _ = run_cli(["run", str(spec), "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["result"]["converged"] and report["tasks"]["count"] > 0
    code, out, _ = run_cli(["run", str(spec), "--overwrite", "--set", "params.l2=0.5", "--json"], capsys)
    assert code == 0 and json.loads(out)["spec"]["params"]["l2"] == 0.5
    assert read_result("out").attrs["objective"] != report["result"]["objective"]
    # the replaced run's prefix is removed once the new one is published
    assert [f"out/runs/{p.name}" for p in (workdir / "out/runs").iterdir()] == [published("out")]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_failure_after_writing_leaves_no_success_and_rerun_recovers(workdir, capsys, monkeypatch):
    from arrayjob.errors import StorageError
    from arrayjob.io import output

    X, y = logreg_data(800, 3)
    write_array("X.zarr", X, (200, 3))
    write_array("y.zarr", y, (200,))
    spec = write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out")

    staged = []

    def fail(self, name, document):
        staged.extend((workdir / "out/runs").glob("*/result.zarr/coef"))
        raise StorageError("output: writing report.json failed: disk full (injected)")

    with monkeypatch.context() as patch:
        patch.setattr(output.JobOutput, "write_json", fail)
        code, out, err = run_cli(["run", str(spec)], capsys)
    assert code == 4 and without_progress(err) == "arrayjob: error: output: writing report.json failed: disk full (injected)\n"
    # result.zarr had been written (to staging) when the failure came; nothing is left behind
    assert staged and not (workdir / "out").exists()

    code, out, _ = run_cli(["run", str(spec)], capsys)
    assert code == 0 and (workdir / "out/_SUCCESS").exists()
    assert len(list((workdir / "out/runs").iterdir())) == 1 and not (workdir / "out/_lease").exists()


BAD_DATA = [
    ("nan in X", lambda X, y: X.__setitem__((517, 1), np.nan), "",
     "inputs.X: NaN or infinite values in [400:600, 0:3] of {cwd}/X.zarr"),
    # a binary fit: label 2 is not 0 or 1 (under family "auto" it would make the fit multinomial)
    ("label 2", lambda X, y: y.__setitem__(33, 2.0), 'family = "binary"\n',
     "inputs.y: labels must be 0 or 1, found 2.0 in [0:200] of {cwd}/y.zarr"),
    # family "auto": the first pass over y, which finds the classes, names the label
    ("label 0.5", lambda X, y: y.__setitem__(433, 0.5), "",
     "inputs.y: labels must be integers >= 0, found 0.5 in [400:600] of {cwd}/y.zarr"),
]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("name,corrupt,params,expected", BAD_DATA, ids=[b[0] for b in BAD_DATA])
def test_bad_data_is_one_line_exit_2_nothing_written(workdir, capsys, name, corrupt, params, expected):
    X, y = logreg_data(800, 3)
    corrupt(X, y)
    write_array("X.zarr", X, (200, 3))
    write_array("y.zarr", y, (200,))
    spec = write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out", params=params)
    code, out, err = run_cli(["run", str(spec)], capsys)
    assert (code, out) == (2, "")
    assert without_progress(err) == f"arrayjob: error: {expected.format(cwd=workdir)}\n"
    assert not (workdir / "out").exists()


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_corrupt_chunk_is_one_line_exit_2(workdir, capsys):
    import zarr

    X, y = logreg_data(800, 3)
    z = zarr.create_array("X.zarr", shape=X.shape, chunks=(200, 3), dtype="f8")  # zstd-compressed
    z[:] = X
    write_array("y.zarr", y, (200,))
    (workdir / "X.zarr/c/2/0").write_bytes(b"this is not zstd")
    spec = write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out")
    code, out, err = run_cli(["run", str(spec)], capsys)
    assert (code, out) == (2, "")
    err = without_progress(err)
    assert err.startswith("arrayjob: error: inputs.X: chunk (2, 0) (key 'c/2/0') of ") and " is corrupt: " in err
    assert err.count("\n") == 1 and not (workdir / "out").exists()
