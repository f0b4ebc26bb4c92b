"""The integration tests of ``tests.unit.api.test_user_jobs``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from tests.harness.helpers import read_result, run_cli, write_array
from tests.unit.api.test_user_jobs import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    FAULTY,
    REPO,
    USER_JOBS,
    _datagen,
    _error,
    _example,
    _tutorial_blocks,
    faulty,
    line_of,
    ray_address,
    user_spec,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(("fault", "line"), [
    ("run", f"job {FAULTY}: ZeroDivisionError: division by zero at "
            f"{USER_JOBS}:{line_of(USER_JOBS, '# ZeroDivisionError')}"),
    ("kernel", "job tests.harness.user_jobs (block function fails): ZeroDivisionError: a kernel of the user's own at "
               f"{USER_JOBS}:{line_of(USER_JOBS, 'raise ZeroDivisionError')}"),
    ("shape", "job tests.harness.user_jobs (block function misshapen): returned shape (250, 1), declared blocks of 250 rows "
              "of (1000, 3)"),
    ("dtype", "job tests.harness.user_jobs (block function single): returned dtype float32, declared float64"),
])
def test_a_run_whose_code_fails_publishes_nothing_and_releases_the_output(faulty, workdir, capsys, fault, line):
    code, _, err = run_cli(["run", str(faulty(f'fault = "{fault}"')), "--debug" if fault == "kernel" else "-q"],
                           capsys)
    assert (code, _error(err)) == (8, f"arrayjob: error: {line}"), err
    if fault == "kernel":  # the worker's traceback, through the user's function
        assert "Traceback (most recent call last)" in err and "in fails" in err
    assert not (workdir / "out" / "_SUCCESS").exists()
    assert not (workdir / "out" / "_lease").exists() or not any((workdir / "out" / "_lease").iterdir())


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_users_block_function_runs_on_the_workers(faulty, workdir, capsys):
    code, _, err = run_cli(["run", str(faulty("scale = 0.5")), "-q"], capsys)
    assert code == 0, err
    np.testing.assert_allclose(read_result("out")["sums"][:], faulty.X.sum(axis=0), rtol=1e-12)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_the_ridge_example_plans_estimates_and_runs_as_scikit_learn_fits(tmp_path_factory, workdir, capsys,
                                                                         monkeypatch):
    from sklearn.linear_model import Ridge

    where = tmp_path_factory.mktemp("elsewhere")
    assert not where.is_relative_to(REPO)
    spec = _example("ridge", where, monkeypatch)
    _datagen(spec.parent, "ridge")
    code, out, err = run_cli(["plan", str(spec)], capsys)
    assert code == 0, err
    assert "kernels (1):" in out and "einsum(ij,j->i)+einsum(ji,j->i)" in out  # X @ p and X.T @ (...) fused
    code, out, err = run_cli(["estimate", str(spec), "--format", "json"], capsys)
    assert code == 0, err
    assert [s["name"] for s in json.loads(out)["stages"]][:2] == ["connect", "load"]
    code, out, err = run_cli(["run", str(spec), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["algorithm"] == "ridge_cg:RidgeCG"
    result = read_result(str(where / "bucket" / "results" / "ridge-cg-demo"))
    X = zarr.open_array(str(where / "bucket" / "demo" / "ridge" / "X.zarr"))[...]
    y = zarr.open_array(str(where / "bucket" / "demo" / "ridge" / "y.zarr"))[...]
    reference = Ridge(alpha=1e-2 * len(y), fit_intercept=False, solver="cholesky").fit(X, y)
    np.testing.assert_allclose(result["coef"][:], reference.coef_, rtol=1e-8, atol=1e-10)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_the_tutorials_ridge_is_short_plans_one_kernel_and_fits_as_scikit_learn(workdir, capsys, monkeypatch):
    from sklearn.linear_model import Ridge

    code = _tutorial_blocks()[0]
    assert code.startswith('"""Ridge regression by the normal equations') and len(code.splitlines()) <= 40
    (workdir / "tutorial_ridge.py").write_text(code)
    monkeypatch.syspath_prepend(str(workdir))
    rng = np.random.default_rng(3)
    X = rng.standard_normal((2000, 4))
    y = X @ [1.0, -2.0, 0.5, 3.0] + 0.1 * rng.standard_normal(2000)
    write_array(str(workdir / "X.zarr"), X, (500, 4))
    write_array(str(workdir / "y.zarr"), y, (500,))
    spec = user_spec(workdir / "ridge.toml", "tutorial_ridge:Ridge", inputs={"X": "X.zarr", "y": "y.zarr"},
                     output="out", params="l2 = 0.01")
    code_, out, err = run_cli(["plan", str(spec)], capsys)
    assert code_ == 0 and "kernels (1):" in out, err  # X.T @ X and X.T @ y: one pass over X
    code_, _, err = run_cli(["run", str(spec), "-q"], capsys)
    assert code_ == 0, err
    reference = Ridge(alpha=0.01 * len(y), fit_intercept=False, solver="cholesky").fit(X, y)
    np.testing.assert_allclose(read_result("out")["coef"][:], reference.coef_, rtol=1e-10)
