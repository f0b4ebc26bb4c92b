"""Jobs of a user's own, written on ``arrayjob.api`` and named in the spec as ``module:Class``
or through the ``arrayjob.jobs`` entry-point group: how they are found, what they get (plan,
estimate, run, resume after a SIGKILL, a remote Ray importing their code), and every error a
user's job can cause, each one line with its exit code.

The examples (examples/ridge: iterative, checkpointed; examples/colstats: a block function of
its own) are copied to a directory outside the checkout and run as a user runs them, compared
with scikit-learn and NumPy. The error cases use ``tests/user_jobs.py``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from arrayjob import api
from tests.helpers import read_result, run_cli, without_progress, write_array, write_spec

REPO = Path(__file__).resolve().parents[1]
FAULTY = "tests.user_jobs:Faulty"
USER_JOBS = REPO / "tests" / "user_jobs.py"


def line_of(path: Path, text: str) -> int:
    """The number of the line of ``path`` holding ``text``: the line an error must name."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def user_spec(path: Path, algorithm: str, **kwargs) -> Path:
    """``write_spec`` for a job named ``module:Class`` (not a valid job name): named user-job."""
    write_spec(path, algorithm=algorithm, **kwargs)
    path.write_text(path.read_text().replace(f'name = "test-{algorithm}"', 'name = "user-job"'))
    return path


def _error(err: str) -> str:
    lines = without_progress(err).strip().splitlines()
    return lines[-1] if lines else ""


@pytest.fixture
def faulty(workdir: Path):
    """A spec of ``tests.user_jobs:Faulty`` over a 1,000 × 3 X; call with its params."""
    X = np.random.default_rng(0).standard_normal((1000, 3))
    write_array(str(workdir / "X.zarr"), X, (250, 3))

    def spec(params: str = "", algorithm: str = FAULTY) -> Path:
        return user_spec(workdir / "faulty.toml", algorithm, inputs={"X": "X.zarr"}, output="out", params=params)

    spec.X = X  # type: ignore[attr-defined]
    return spec


# -- the public surface -------------------------------------------------------------------------------


def test_the_builtin_jobs_import_only_the_api():
    """Every import of arrayjob in arrayjob/jobs names arrayjob.api or another job module (the
    import contract jobs-use-the-api in pyproject.toml says the same to lint-imports)."""
    for path in sorted((REPO / "arrayjob" / "jobs").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                if name == "arrayjob" and isinstance(node, ast.ImportFrom):
                    assert [a.name for a in node.names] == ["api"], (path.name, ast.unparse(node))
                elif name.startswith("arrayjob."):
                    assert name == "arrayjob.api" or name.startswith("arrayjob.jobs"), (path.name, name)


def test_the_api_is_versioned_and_every_name_is_documented():
    major, minor = map(int, api.API_VERSION.split("."))
    assert major >= 1 and minor >= 0
    reference = (REPO / "docs" / "writing-jobs.md").read_text()
    for name in api.__all__:
        assert hasattr(api, name), name
        assert f"`{name}" in reference or f"api.{name}" in reference, f"{name} is not in docs/writing-jobs.md"


# -- naming a job -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("algorithm", "message"), [
    ("no_such_package.ridge:Ridge", "job.algorithm: no module 'no_such_package' to import "
                                    "'no_such_package.ridge:Ridge' from (is its directory on PYTHONPATH, or its "
                                    "package installed?)"),
    ("tests.user_jobs:Nothing", f"job.algorithm: module 'tests.user_jobs' ({USER_JOBS}) has no 'Nothing'"),
    ("tests.user_jobs:FaultyParams", "job.algorithm: tests.user_jobs:FaultyParams is not a job (expected a "
                                     "subclass of arrayjob.api.Job, got <class 'tests.user_jobs.FaultyParams'>)"),
    ("arrayjob.api:Job", "job.algorithm: arrayjob.api:Job is not a complete job: it lacks inputs, Params, "
                         "check_inputs, run, stages"),
    ("tests.user_jobs:", "job.algorithm: expected a built-in name or \"module:Class\", got 'tests.user_jobs:'"),
])
def test_a_job_that_cannot_be_found_is_exit_2(faulty, capsys, algorithm, message):
    code, _, err = run_cli(["plan", str(faulty(algorithm=algorithm))], capsys)
    assert (code, err) == (2, f"arrayjob: error: {message}\n")


def test_an_entry_point_names_a_job_and_a_clash_names_both(faulty, capsys, tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = site / "acme_jobs-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-jobs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[arrayjob.jobs]\nacme.faulty = {FAULTY}\nlogreg = {FAULTY}\n")
    monkeypatch.syspath_prepend(str(site))
    code, out, err = run_cli(["plan", str(faulty(algorithm="acme.faulty"))], capsys)
    assert code == 0, err
    assert "doubled" in out  # its block function, planned
    code, _, err = run_cli(["plan", str(faulty(algorithm="logreg"))], capsys)
    assert (code, err) == (2, "arrayjob: error: job.algorithm: 'logreg' is both the built-in "
                              "arrayjob.jobs.logreg:LogisticRegression and entry point 'logreg' of acme-jobs "
                              f"({FAULTY}); name the class as \"module:Class\"\n")
    code, _, err = run_cli(["plan", str(faulty(algorithm="acme.nothing"))], capsys)
    assert code == 2 and "acme.faulty" in err  # the names it knows, the registered ones among them


def test_a_failing_params_check_is_the_builtin_jobs_line(faulty, capsys):
    code, _, err = run_cli(["plan", str(faulty("scale = -1"))], capsys)
    assert (code, err) == (2, "arrayjob: error: params.scale: expected a number > 0, got -1\n")
    code, _, err = run_cli(["plan", str(faulty("shape = 1"))], capsys)
    assert (code, err) == (2, "arrayjob: error: params.shape: unknown key (expected one of: fault, scale)\n")


# -- errors in the user's code ------------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "exception", "text"), [
    ("check", "RuntimeError: checking the inputs failed", 'raise RuntimeError("checking'),
    ("stages", "KeyError: 'b'", '{"a": 1}["b"]'),
])
def test_an_exception_on_the_driver_is_exit_8_naming_the_users_line(faulty, capsys, fault, exception, text):
    spec = faulty(f'fault = "{fault}"')
    for command in ("plan", "estimate"):
        code, _, err = run_cli([command, str(spec)], capsys)
        assert (code, err) == (8, f"arrayjob: error: job {FAULTY}: {exception} at "
                                  f"{USER_JOBS}:{line_of(USER_JOBS, text)}\n")
    code, _, err = run_cli(["plan", str(spec), "--debug"], capsys)
    assert code == 8 and "Traceback (most recent call last)" in err and text in err


def test_an_exception_importing_the_module_is_exit_8(workdir, capsys, monkeypatch):
    (workdir / "broken_job.py").write_text("import numpy\n\nRATE = 1 / 0\n")
    monkeypatch.syspath_prepend(str(workdir))
    write_array(str(workdir / "X.zarr"), np.ones((10, 2)), (5, 2))
    spec = user_spec(workdir / "s.toml", "broken_job:Job", inputs={"X": "X.zarr"}, output="out")
    code, _, err = run_cli(["plan", str(spec)], capsys)
    assert (code, err) == (8, "arrayjob: error: job broken_job:Job (importing it): ZeroDivisionError: division by "
                              f"zero at {workdir / 'broken_job.py'}:3\n")


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(("fault", "line"), [
    ("run", f"job {FAULTY}: ZeroDivisionError: division by zero at "
            f"{USER_JOBS}:{line_of(USER_JOBS, '# ZeroDivisionError')}"),
    ("kernel", "job tests.user_jobs (block function fails): ZeroDivisionError: a kernel of the user's own at "
               f"{USER_JOBS}:{line_of(USER_JOBS, 'raise ZeroDivisionError')}"),
    ("shape", "job tests.user_jobs (block function misshapen): returned shape (250, 1), declared blocks of 250 rows "
              "of (1000, 3)"),
    ("dtype", "job tests.user_jobs (block function single): returned dtype float32, declared float64"),
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


# -- the examples, from a directory outside the checkout ----------------------------------------------


def _example(name: str, where: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """examples/<name> copied to ``where``, importable, its data made by its own datagen."""
    home = where / name
    shutil.copytree(REPO / "examples" / name, home)
    monkeypatch.syspath_prepend(str(home))
    spec = home / f"{name}.toml"
    monkeypatch.setenv("ARRAYJOB_BUCKET", str(where / "bucket"))
    return spec


def _datagen(home: Path, name: str, rows: int = 20_000, cols: int = 8) -> None:
    subprocess.run([sys.executable, str(home / "datagen.py"), str(home.parent / "bucket" / "demo" / name),
                    "--rows", str(rows), "--cols", str(cols), "--chunk-rows", "5000"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


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


@pytest.fixture
def ray_address(ray_session):
    import ray

    return ray.get_runtime_context().gcs_address


@pytest.mark.ray
@pytest.mark.cli
@pytest.mark.timeout(300)
def test_the_colstats_example_runs_on_a_ray_that_imports_its_code(tmp_path_factory, workdir, capsys, monkeypatch,
                                                                   ray_address):
    """A run connected to a Ray started elsewhere (the session's) sends the job's module to its
    workers (Ray's runtime environment): its block function runs there, as NumPy computes."""
    where = tmp_path_factory.mktemp("elsewhere")
    spec = _example("colstats", where, monkeypatch)
    _datagen(spec.parent, "colstats")
    code, out, err = run_cli(["plan", str(spec)], capsys)
    assert code == 0 and "summarise" in out, err
    done = subprocess.run([sys.executable, "-m", "arrayjob", "run", str(spec), "-q", "--set",
                           f"cluster.address={json.dumps(ray_address)}"], capture_output=True, text=True,
                          timeout=240, cwd=where,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(spec.parent)])})
    assert done.returncode == 0, done.stderr
    result = read_result(str(where / "bucket" / "results" / "colstats-demo"))
    X = zarr.open_array(str(where / "bucket" / "demo" / "colstats" / "X.zarr"))[...]
    for name, expected in (("mean", X.mean(0)), ("std", X.std(0)), ("min", X.min(0)), ("max", X.max(0))):
        np.testing.assert_allclose(result[name][:], expected, rtol=1e-12, err_msg=name)


@pytest.mark.ray
@pytest.mark.cli
@pytest.mark.timeout(300)
def test_the_ridge_example_resumes_after_a_sigkill(tmp_path_factory, workdir, capsys, monkeypatch, ray_address):
    from tests.test_resume import LEASE_SECONDS, _killed_run, _rerun_resumes

    where = tmp_path_factory.mktemp("elsewhere")
    spec = _example("ridge", where, monkeypatch)
    _datagen(spec.parent, "ridge")
    code, _, err = run_cli(["run", str(spec), "-q", "--set", 'output.uri="reference"'], capsys)
    assert code == 0, err
    reference = read_result("reference")
    iterations = reference.attrs["iterations"]
    assert iterations > 3
    _killed_run(spec, "fit:3", ray_address, workdir, path=[spec.parent])
    monkeypatch.setenv("ARRAYJOB_LEASE_SECONDS", LEASE_SECONDS)
    _rerun_resumes(spec, "out", "fit:3", iterations, capsys)
    resumed = read_result("out")
    assert resumed.attrs["iterations"] == iterations
    np.testing.assert_allclose(resumed["coef"][:], reference["coef"][:], rtol=1e-10, atol=1e-14)


# -- the tutorial's code is the code that runs --------------------------------------------------------


def _tutorial_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "docs" / "writing-jobs.md").read_text(), re.S)


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


def test_the_tutorials_iterative_ridge_is_the_examples_code():
    example = (REPO / "examples" / "ridge" / "ridge_cg.py").read_text()
    shown = _tutorial_blocks()[1]
    for line in shown.splitlines():
        assert line.split("  #")[0].rstrip() in example, line


def test_a_missing_input_of_a_users_job_is_exit_2_without_a_datagen_hint(workdir, capsys):
    spec = user_spec(workdir / "s.toml", FAULTY, inputs={"X": "nothing.zarr"}, output="out")
    code, _, err = run_cli(["plan", str(spec)], capsys)
    assert code == 2 and err.startswith("arrayjob: error: inputs.X: no Zarr array at ") and "datagen" not in err
