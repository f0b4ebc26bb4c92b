"""Runs in MLflow: a real tracking server (``mlflow server`` on loopback, SQLite, artifacts
served by it), started once for the module; what a run logged is read back with MLflow's own
client and compared with the run's published report and result. An unreachable server is one
warning and exit 0; the spec asking for MLflow without the client installed is one line, exit 2."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.helpers import logreg_data, published, run_cli, write_array, write_spec

START_SECONDS = 240  # mlflow server creates its SQLite tables (alembic) first: a minute on a loaded host


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("mlflow.server", reason="the test extra: mlflow-skinny with the server's SQL store")
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(root / "server.log", "wb")  # noqa: SIM115 - closed when the server is stopped
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):  # its group is gone when it failed to start
            os.killpg(server.pid, signal.SIGTERM)  # its own session: the server and its uvicorn worker
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small logistic regression that runs all its 8 Newton iterations (tol 0)."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID",
                 "OPENLINEAGE_URL", "OPENLINEAGE_CONFIG", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    X, y = logreg_data(400, 3)
    write_array(str(tmp_path / "X.zarr"), X, (100, 3))
    write_array(str(tmp_path / "y.zarr"), y, (100,))
    write_spec(tmp_path / "job.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out",
               params='max_iter = 8\ntol = 1e-300\nsolver = "newton"\nl2 = 0.01\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.ray
def test_a_run_is_logged_as_a_child_of_mlflow_run_id(job, mlflow_server, ray_session, monkeypatch, capsys):
    """Params, a metric per iteration, the final figures, the artifacts and the result's tag,
    in a child of the run MLFLOW_RUN_ID names (as a parent process's mlflow.start_run sets it)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.create_experiment("pipeline")
    parent = client.create_run(experiment).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", parent)
    code, _, err = run_cli(["run", "job.toml", "-q", "--set", f"tracking.mlflow={json.dumps(mlflow_server)}"], capsys)
    assert code == 0, err
    assert "warning" not in err, err

    [child] = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent}'")
    run_id = child.info.run_id
    assert child.info.status == "FINISHED"
    output = published(str(job / "out"))
    report = json.loads(Path(output, "report.json").read_text())
    assert child.data.tags["arrayjob.result_uri"] == output
    assert child.data.tags["arrayjob.run_id"] == report_run_id(job)
    assert child.data.params["params.l2"] == "0.01"
    assert child.data.params["params.solver"] == "newton"
    assert child.data.params["inputs.X"] == str(job / "X.zarr")

    # one objective and one gradient norm per iteration, the last as the result reports it
    objective = sorted(client.get_metric_history(run_id, "objective"), key=lambda m: m.step)
    assert [m.step for m in objective] == list(range(1, 9))
    assert objective[-1].value == pytest.approx(report["result"]["objective"], rel=1e-12)
    assert objective[-1].value <= objective[0].value  # Newton's steps with a line search never go up
    assert len(client.get_metric_history(run_id, "gradient_norm")) == 8

    metrics = child.data.metrics
    assert metrics["wall_seconds"] == pytest.approx(report["wall_seconds"])
    assert metrics["bytes_read"] == report["storage"]["bytes_read"]
    assert metrics["dollars"] == pytest.approx(report["dollars"]["total"])
    assert metrics["estimate_error.wall_seconds"] == pytest.approx(report["estimate_error"]["wall_seconds"])

    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert artifacts == {"spec.toml", "report.json", "report.html"}
    logged = json.loads(Path(client.download_artifacts(run_id, "report.json", str(job))).read_text())
    assert logged == report
    assert Path(client.download_artifacts(run_id, "report.html", str(job))).read_text() == \
        Path(output, "report.html").read_text()


def report_run_id(job: Path) -> str:
    return json.loads((job / "out" / "_SUCCESS").read_text())["run_id"]


@pytest.mark.ray
def test_an_unreachable_server_is_a_warning_not_a_failure(job, ray_session, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_free_port()}")  # nothing listens
    started = time.monotonic()
    code, _, err = run_cli(["run", "job.toml", "-q"], capsys)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1, err
    assert warnings[0].startswith("arrayjob: warning: mlflow: starting the run: ")
    assert warnings[0].endswith("; the run goes on without it")
    assert (job / "out" / "_SUCCESS").exists()
    assert time.monotonic() - started < 120  # no long retries (MLflow's own: 7 with backoff)


def test_the_spec_asking_without_the_client_is_one_line(job, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if the mlflow extra were not installed
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    code, out, err = run_cli(["run", "job.toml", "--set", 'tracking.mlflow="http://127.0.0.1:5000"'], capsys)
    assert code == 2
    assert err == ("arrayjob: error: tracking.mlflow: MLflow's client is not installed "
                   "(pip install 'arrayjob[mlflow]')\n")
    assert not (job / "out").exists()
