"""The system tests of ``tests.unit.api.test_user_jobs``: what needs processes, clusters or a job server of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zarr

from tests.harness.helpers import read_result, run_cli
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
    from tests.unit.runtime.test_resume import LEASE_SECONDS, _killed_run, _rerun_resumes

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
