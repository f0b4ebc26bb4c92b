"""Jobs of a user's own, written on ``arrayjob.api`` and named in the spec as ``module:Class``
or through the ``arrayjob.algorithms`` entry-point group: how they are found, what they get (plan,
estimate, run, resume after a SIGKILL, a remote Ray importing their code), and every error a
user's job can cause, each one line with its exit code.

The examples (examples/ridge: iterative, checkpointed; examples/colstats: a block function of
its own) are copied to a directory outside the checkout and run as a user runs them, compared
with scikit-learn and NumPy. The error cases use ``tests/harness/user_jobs.py``.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from arrayjob import api
from tests.harness.helpers import run_cli, without_progress, write_array, write_spec

REPO = Path(__file__).resolve().parents[3]
FAULTY = "tests.harness.user_jobs:Faulty"
USER_JOBS = REPO / "tests" / "harness" / "user_jobs.py"


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
    """A spec of ``tests.harness.user_jobs:Faulty`` over a 1,000 × 3 X; call with its params."""
    X = np.random.default_rng(0).standard_normal((1000, 3))
    write_array(str(workdir / "X.zarr"), X, (250, 3))

    def spec(params: str = "", algorithm: str = FAULTY) -> Path:
        return user_spec(workdir / "faulty.toml", algorithm, inputs={"X": "X.zarr"}, output="out", params=params)

    spec.X = X  # type: ignore[attr-defined]
    return spec


# -- the public surface -------------------------------------------------------------------------------


BUILTIN_SOURCES = sorted((REPO / "arrayjob" / "algorithms").rglob("*.py")) + \
    sorted((REPO / "arrayjob" / "solvers").rglob("*.py"))


def test_the_builtin_jobs_import_only_the_api():
    """Every import of arrayjob in arrayjob/algorithms and arrayjob/solvers names arrayjob.api
    or another built-in module (the import contract jobs-use-the-api in pyproject.toml says the
    same to lint-imports)."""
    assert len(BUILTIN_SOURCES) > 20, "the built-in jobs were not found"
    for path in BUILTIN_SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                if name == "arrayjob" and isinstance(node, ast.ImportFrom):
                    assert [a.name for a in node.names] == ["api"], (path.name, ast.unparse(node))
                elif name.startswith("arrayjob."):
                    assert name == "arrayjob.api" or name.startswith(("arrayjob.algorithms", "arrayjob.solvers")), \
                        (path.name, name)


def test_the_builtin_jobs_use_only_what_the_job_context_exposes():
    """A built-in reaches nothing behind ``JobContext``: every ``ctx.<name>`` it writes is a
    public member of the context, so a user's job can do whatever a built-in does."""
    import inspect
    import textwrap

    init = ast.parse(textwrap.dedent(inspect.getsource(api.JobContext.__init__)))
    fields = {node.attr for node in ast.walk(init) if isinstance(node, ast.Attribute)
              and isinstance(node.value, ast.Name) and node.value.id == "self" and isinstance(node.ctx, ast.Store)}
    public = {name for name in {*dir(api.JobContext), *fields} if not name.startswith("_")}
    used: dict[str, set[str]] = {}
    for path in BUILTIN_SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ctx":
                used.setdefault(node.attr, set()).add(path.name)
    assert used, "no built-in job uses its context"
    hidden = {name: sorted(files) for name, files in used.items() if name not in public}
    assert not hidden, f"built-in jobs reach past JobContext: {hidden}"


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
    ("tests.harness.user_jobs:Nothing", f"job.algorithm: module 'tests.harness.user_jobs' ({USER_JOBS}) has no 'Nothing'"),
    ("tests.harness.user_jobs:FaultyParams", "job.algorithm: tests.harness.user_jobs:FaultyParams is not a job (expected a "
                                     "subclass of arrayjob.api.Job, got <class 'tests.harness.user_jobs.FaultyParams'>)"),
    ("arrayjob.api:Job", "job.algorithm: arrayjob.api:Job is not a complete job: it lacks inputs, Params, "
                         "check_inputs, run, stages"),
    ("tests.harness.user_jobs:", "job.algorithm: expected a built-in name or \"module:Class\", got 'tests.harness.user_jobs:'"),
])
def test_a_job_that_cannot_be_found_is_exit_2(faulty, capsys, algorithm, message):
    code, _, err = run_cli(["plan", str(faulty(algorithm=algorithm))], capsys)
    assert (code, err) == (2, f"arrayjob: error: {message}\n")


def test_an_entry_point_names_a_job_and_a_clash_names_both(faulty, capsys, tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = site / "acme_jobs-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-jobs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[arrayjob.algorithms]\nacme.faulty = {FAULTY}\nlogreg = {FAULTY}\n")
    monkeypatch.syspath_prepend(str(site))
    code, out, err = run_cli(["plan", str(faulty(algorithm="acme.faulty"))], capsys)
    assert code == 0, err
    assert "doubled" in out  # its block function, planned
    code, _, err = run_cli(["plan", str(faulty(algorithm="logreg"))], capsys)
    assert (code, err) == (2, "arrayjob: error: job.algorithm: 'logreg' is both the built-in "
                              "arrayjob.algorithms.logreg:LogisticRegression and entry point 'logreg' of acme-jobs "
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


@pytest.fixture
def ray_address(ray_session):
    import ray

    return ray.get_runtime_context().gcs_address


# -- the tutorial's code is the code that runs --------------------------------------------------------


def _tutorial_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "docs" / "writing-jobs.md").read_text(), re.S)


def test_the_tutorials_iterative_ridge_is_the_examples_code():
    example = (REPO / "examples" / "ridge" / "ridge_cg.py").read_text()
    shown = _tutorial_blocks()[1]
    for line in shown.splitlines():
        assert line.split("  #")[0].rstrip() in example, line


def test_a_missing_input_of_a_users_job_is_exit_2_without_a_datagen_hint(workdir, capsys):
    spec = user_spec(workdir / "s.toml", FAULTY, inputs={"X": "nothing.zarr"}, output="out")
    code, _, err = run_cli(["plan", str(spec)], capsys)
    assert code == 2 and err.startswith("arrayjob: error: inputs.X: no Zarr array at ") and "datagen" not in err
