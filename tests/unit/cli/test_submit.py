"""``arrayjob submit``, ``status``, ``logs`` and ``stop`` through Ray Jobs.

The cases run against a real Ray head and its job server, started by ``tests/harness/submit_cases.py``
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
from tests.harness.helpers import run_in_own_session

REPO = Path(__file__).resolve().parents[3]
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
    script = f"ip link set lo up && exec {sys.executable} {REPO / 'tests' / 'harness' / 'submit_cases.py'} --out {out}"
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--net", "bash", "-c", script]
    # unshare and the namespace's first process are one process group: the rest die with it
    run_in_own_session(cmd, timeout=840, what="the submit cases", cwd=REPO)
    result = json.loads(out.read_text())
    assert "error" not in result, result["error"]
    return result


def _lines(run: dict[str, Any]) -> list[str]:
    return run["stderr"].strip().splitlines()


