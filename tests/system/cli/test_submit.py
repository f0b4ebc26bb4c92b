"""The system tests of ``tests.unit.cli.test_submit``: what needs processes, clusters or a job server of their own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.cli.test_submit import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    REPO,
    _lines,
    cases,
    pytestmark,
)


@pytest.mark.jobs
def test_a_bad_spec_submits_nothing(cases: dict[str, Any]) -> None:
    run = cases["bad_spec"]
    assert run["code"] == 2
    assert _lines(run) == ["arrayjob: error: params.l3: unknown key (expected one of: solver, family, classes, l2, l1, "
                           "class_weight, fit_intercept, max_iter, tol)"]
    assert run["jobs_after"] == 0


@pytest.mark.jobs
def test_no_wait_then_status_and_logs(cases: dict[str, Any]) -> None:
    run = cases["no_wait"]
    job_id = run["stdout"].strip()
    assert run["code"] == 0 and job_id.startswith("arrayjob-logreg-demo-")
    first = run["status_at_once"]["stdout"].splitlines()[0]
    assert first in (f"{job_id}: PENDING", f"{job_id}: RUNNING", f"{job_id}: SUCCEEDED (exit code 0)")
    assert run["follow"]["code"] == 0
    assert "converged in" in run["follow"]["stdout"]
    status = json.loads(run["status"]["stdout"])
    assert status["status"] == "SUCCEEDED" and status["exit_code"] == 0
    assert status["entrypoint"] == "python -m arrayjob run spec.toml"  # --upload-package
    assert status["metadata"] == {"arrayjob_job": "logreg-demo", "arrayjob_output": "s3://jobs/out/nowait"}
    assert "converged in" in run["logs"]["stdout"]
    assert run["published"] == ["out/nowait/_SUCCESS"]


@pytest.mark.jobs
def test_sigterm_to_submit_stops_the_remote_job(cases: dict[str, Any]) -> None:
    run = cases["sigterm"]
    assert run["job_id"], run["stderr"]
    assert run["code"] == 143
    assert _lines(run)[-2:] == [f"arrayjob: stopping job {run['job_id']}", "arrayjob: terminated (SIGTERM)"]
    assert run["exited_after"] < 8
    assert run["remote_status"] == "STOPPED"
    assert "arrayjob: terminated (SIGTERM)" in run["remote_logs"]


@pytest.mark.jobs
def test_stop_ends_the_run_as_sigterm_does(cases: dict[str, Any]) -> None:
    run = cases["stop"]
    assert run["waiting"]  # the job was running, waiting for the output's other holder
    assert run["stop"]["code"] == 0
    assert run["stop"]["stdout"].strip().endswith(": STOPPED")
    assert json.loads(run["status"]["stdout"])["status"] == "STOPPED"
    assert "arrayjob: terminated (SIGTERM)" in run["logs"]["stdout"]  # it unwound: staging and lease cleaned up
    assert cases["leases_left"] == []


@pytest.mark.jobs
def test_submit_follows_the_job_and_publishes(cases: dict[str, Any]) -> None:
    from sklearn.linear_model import LogisticRegression

    from tests.harness.helpers import logreg_data

    run = cases["submit"]
    assert run["code"] == 0, run["stderr"]
    assert "logreg-demo: logistic regression (binary, lbfgs) on X 4,000 × 4" in run["stdout"]  # the job's own summary
    assert run["published"] == ["out/ok/_SUCCESS"]
    X, y = logreg_data(4000, 4)
    reference = LogisticRegression(C=1 / (1e-4 * len(y)), tol=1e-10, max_iter=1000).fit(X, y)
    assert run["coef"] == pytest.approx(reference.coef_[0], rel=1e-4, abs=1e-5)
    assert run["intercept"] == pytest.approx(reference.intercept_, rel=1e-4, abs=1e-5)
    assert not any("INFO" in line for line in _lines(run))  # Ray's SDK is quiet


@pytest.mark.jobs
def test_submit_sends_a_users_job_with_it(cases: dict[str, Any]) -> None:
    """examples/colstats, from a directory outside the checkout, runs on a cluster that has its
    module nowhere but in what submit sent, and computes what NumPy does."""
    from tests.harness.jobserver import colstats_data

    run = cases["user_job"]
    assert run["code"] == 0, run["stderr"]
    assert run["published"] == ["out/user/_SUCCESS"]
    X = colstats_data()
    assert run["mean"] == pytest.approx(X.mean(axis=0), rel=1e-12)
    assert run["std"] == pytest.approx(X.std(axis=0), rel=1e-12)


@pytest.mark.jobs
def test_the_job_exit_code_comes_back(cases: dict[str, Any]) -> None:
    """A run that fails on the cluster (exit 2 here): its own line in the job's logs, its exit code
    passed on (every status and code: test_the_job_exit_code_is_passed_on)."""
    run, code = cases["missing_input"], 2
    message = "arrayjob: error: inputs.X: no Zarr array at s3://jobs/in/nothing.zarr"
    assert run["code"] == code
    assert message in run["stdout"]  # the remote run's own line, in the job's logs
    assert _lines(run)[-1].startswith("arrayjob: error: job arrayjob-logreg-demo-")
    assert _lines(run)[-1].endswith(f"failed with exit code {code}")
    assert run.get("published", []) == []
