"""``arrayjob submit``, ``status``, ``logs`` and ``stop`` through Ray Jobs.

The cases run against a real Ray head and its job server, started by ``tests/submit_cases.py``
inside its own PID and network namespace (``unshare``): its ``ray start`` and ``ray stop``
can touch no other Ray on this machine, and everything it started ends with the namespace.
"""

from __future__ import annotations

import json
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from arrayjob.errors import SpecError
from arrayjob.spec import load_spec
from arrayjob.submission import (
    job_end,
    job_headers,
    job_server_address,
    sent_spec,
    tracking_environment,
)
from tests.helpers import run_in_own_session

REPO = Path(__file__).resolve().parents[1]
# the cases against the job server run once, in the first such test's setup: a few minutes on a busy machine
pytestmark = pytest.mark.timeout(900)


# -- without a cluster -----------------------------------------------------------------------


def test_address_from_the_option_then_ray_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(SpecError, match="no Ray job server given"):
        job_server_address(None)
    monkeypatch.setenv("RAY_ADDRESS", "http://a:8265")
    assert job_server_address(None) == "http://a:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://b:8265")
    assert job_server_address(None) == "http://b:8265"  # Ray's CLI reads it before RAY_ADDRESS
    assert job_server_address("http://c:8265") == "http://c:8265"


def test_tracking_and_lineage_settings_go_to_the_remote_run() -> None:
    """What records the run (MLflow, OpenLineage and its Airflow parent) is passed on; a key or a
    local config file is not, nor anything else."""
    here = {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_RUN_ID": "abc", "OPENLINEAGE_URL": "http://ol:5000",
            "OPENLINEAGE_PARENT_ID": "airflow/dag.submit/0190", "OPENLINEAGE_API_KEY": "secret",
            "OPENLINEAGE_CONFIG": "/etc/ol.yml", "OPENLINEAGE_NAMESPACE": "", "HOME": "/root"}
    assert tracking_environment(here) == {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_RUN_ID": "abc",
                                          "OPENLINEAGE_URL": "http://ol:5000",
                                          "OPENLINEAGE_PARENT_ID": "airflow/dag.submit/0190"}


def test_headers_are_a_json_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_JOB_HEADERS", raising=False)
    assert job_headers() is None
    monkeypatch.setenv("RAY_JOB_HEADERS", '{"Authorization": "Bearer x"}')
    assert job_headers() == {"Authorization": "Bearer x"}
    for bad in ("Bearer x", "[1]"):
        monkeypatch.setenv("RAY_JOB_HEADERS", bad)
        with pytest.raises(SpecError, match="RAY_JOB_HEADERS: expected a JSON object"):
            job_headers()


def test_the_sent_spec_is_resolved_with_absolute_local_paths(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARRAYJOB_BUCKET", "s3://prod")
    spec = load_spec(REPO / "configs" / "logreg.toml",
                     ["params.l2=0.5", 'inputs.y={uri = "data/y.zarr", missing_chunks = "fill"}'])
    sent = tomllib.loads(tomli_w.dumps(sent_spec(spec)))
    assert sent["inputs"]["X"] == "s3://prod/demo/logreg/X.zarr"  # this machine's environment
    assert sent["inputs"]["y"] == {"uri": str(workdir / "data" / "y.zarr"), "missing_chunks": "fill"}
    assert sent["params"]["l2"] == 0.5
    # read on the cluster, in a directory of its own, it names the same places
    elsewhere = workdir / "job"
    elsewhere.mkdir()
    (elsewhere / "spec.toml").write_text(tomli_w.dumps(sent))
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("ARRAYJOB_BUCKET")
    remote = load_spec("spec.toml")
    assert remote.inputs == spec.inputs and remote.output == spec.output and remote.params == spec.params


@pytest.mark.parametrize(("status", "code", "expected"), [
    ("SUCCEEDED", 0, 0), ("FAILED", 2, 2), ("FAILED", 4, 4), ("FAILED", 5, 5), ("FAILED", 6, 6),
    ("FAILED", None, 5),  # its runtime environment failed: the command never ran
    ("FAILED", -9, 137), ("STOPPED", None, 143),
    ("FAILED", 127, 5),  # the shell found no arrayjob command on the cluster
])
def test_the_job_exit_code_is_passed_on(status: str, code: int | None, expected: int) -> None:
    from ray.job_submission import JobDetails, JobStatus, JobType

    info = JobDetails(type=JobType.SUBMISSION, entrypoint="arrayjob run spec.toml", status=JobStatus(status),
                      driver_exit_code=code, message="runtime env setup failed\nmore")
    end = job_end("j", info)
    assert end.exit_code == expected
    if code == 127:
        assert "--upload-package" in end.line
    assert (end.line == "") == (expected == 0)


def test_a_bad_spec_is_refused_before_anything_is_contacted(workdir: Path) -> None:
    from arrayjob.cli.main import main

    # no job server at this address: the spec's error comes first, exit 2
    assert main(["submit", str(REPO / "configs" / "logreg.toml"), "--address", "http://127.0.0.1:9",
                 "--set", "params.l3=1"]) == 2


def test_an_unreachable_job_server_is_exit_5(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from arrayjob.cli.main import main

    assert main(["status", "some-job", "--address", "http://127.0.0.1:9"]) == 5
    err = capsys.readouterr().err
    assert err.startswith("arrayjob: error: --address: cannot reach the Ray job server at http://127.0.0.1:9")
    assert len(err.strip().splitlines()) == 1


# -- against a Ray job server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("these tests need unshare and ip (util-linux, iproute2) and root")
    out = tmp_path_factory.mktemp("submit") / "cases.json"
    script = f"ip link set lo up && exec {sys.executable} {REPO / 'tests' / 'submit_cases.py'} --out {out}"
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--net", "bash", "-c", script]
    # unshare and the namespace's first process are one process group: the rest die with it
    run_in_own_session(cmd, timeout=840, what="the submit cases", cwd=REPO)
    result = json.loads(out.read_text())
    assert "error" not in result, result["error"]
    return result


def _lines(run: dict[str, Any]) -> list[str]:
    return run["stderr"].strip().splitlines()


@pytest.mark.jobs
def test_submit_follows_the_job_and_publishes(cases: dict[str, Any]) -> None:
    from sklearn.linear_model import LogisticRegression

    from tests.helpers import logreg_data

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
def test_a_bad_spec_submits_nothing(cases: dict[str, Any]) -> None:
    run = cases["bad_spec"]
    assert run["code"] == 2
    assert _lines(run) == ["arrayjob: error: params.l3: unknown key (expected one of: solver, family, classes, l2, l1, "
                           "class_weight, fit_intercept, max_iter, tol)"]
    assert run["jobs_after"] == 0


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


@pytest.mark.jobs
def test_submit_sends_a_users_job_with_it(cases: dict[str, Any]) -> None:
    """examples/colstats, from a directory outside the checkout, runs on a cluster that has its
    module nowhere but in what submit sent, and computes what NumPy does."""
    from tests.jobserver import colstats_data

    run = cases["user_job"]
    assert run["code"] == 0, run["stderr"]
    assert run["published"] == ["out/user/_SUCCESS"]
    X = colstats_data()
    assert run["mean"] == pytest.approx(X.mean(axis=0), rel=1e-12)
    assert run["std"] == pytest.approx(X.std(axis=0), rel=1e-12)


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
def test_stop_ends_the_run_as_sigterm_does(cases: dict[str, Any]) -> None:
    run = cases["stop"]
    assert run["waiting"]  # the job was running, waiting for the output's other holder
    assert run["stop"]["code"] == 0
    assert run["stop"]["stdout"].strip().endswith(": STOPPED")
    assert json.loads(run["status"]["stdout"])["status"] == "STOPPED"
    assert "arrayjob: terminated (SIGTERM)" in run["logs"]["stdout"]  # it unwound: staging and lease cleaned up
    assert cases["leases_left"] == []


@pytest.mark.jobs
def test_sigterm_to_submit_stops_the_remote_job(cases: dict[str, Any]) -> None:
    run = cases["sigterm"]
    assert run["job_id"], run["stderr"]
    assert run["code"] == 143
    assert _lines(run)[-2:] == [f"arrayjob: stopping job {run['job_id']}", "arrayjob: terminated (SIGTERM)"]
    assert run["exited_after"] < 8
    assert run["remote_status"] == "STOPPED"
    assert "arrayjob: terminated (SIGTERM)" in run["remote_logs"]
