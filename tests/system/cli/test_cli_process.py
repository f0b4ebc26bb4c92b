"""The installed ``arrayjob`` command as a real process: the demo spec on S3, exit codes, quiet output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.helpers import published, read_group, run_cli, without_progress

REPO = Path(__file__).resolve().parents[3]
ARRAYJOB = shutil.which("arrayjob", path=str(Path(sys.executable).parent)) or "arrayjob"


def arrayjob(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ARRAYJOB, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=240)


@pytest.mark.cli
def test_demo_spec_runs_on_s3_with_its_own_ray(s3_endpoint, s3_bucket, tmp_path, monkeypatch, capsys):
    """The documented production path: ARRAYJOB_BUCKET=s3://... and AWS_ENDPOINT_URL, a fresh Ray
    (the run is the installed command; the data it reads is made, and the rerun skipped, in-process)."""
    variables = {"ARRAYJOB_BUCKET": f"s3://{s3_bucket}", "AWS_ENDPOINT_URL": s3_endpoint}
    env = {**os.environ, **variables}
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["datagen", "logreg", f"s3://{s3_bucket}/demo/logreg", "--rows", "20000", "--cols", "8",
                            "--chunk-rows", "2500"], capsys)
    assert code == 0, err
    run = arrayjob("run", str(REPO / "configs/logreg.toml"), env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert without_progress(run.stderr) == ""  # a quiet local Ray: no start-up noise
    assert "logreg-demo: logistic regression (binary, lbfgs) on X 20,000 × 8" in run.stdout
    run_prefix = published(f"s3://{s3_bucket}/results/logreg-demo", s3_endpoint)
    assert f"result: {run_prefix}/result.zarr" in run.stdout
    group = read_group(f"{run_prefix}/result.zarr", s3_endpoint)
    assert group["coef"].shape == (8,) and group.attrs["converged"] is True

    code, out, _ = run_cli(["run", str(REPO / "configs/logreg.toml"), "--json"], capsys)  # before any Ray
    assert code == 0 and json.loads(out)["already_complete"] is True


@pytest.mark.cli
def test_unreachable_cluster_exit_5(tmp_path):
    from tests.harness.helpers import logreg_data, write_array, write_spec

    X, y = logreg_data(100, 2)
    write_array(str(tmp_path / "X.zarr"), X, (50, 2))
    write_array(str(tmp_path / "y.zarr"), y, (50,))
    write_spec(tmp_path / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out")
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9"}
    run = arrayjob("run", "s.toml", env=env, cwd=tmp_path)
    assert run.returncode == 5, run.stderr
    err = without_progress(run.stderr)
    assert err.startswith("arrayjob: error: cluster.address: cannot connect to Ray at '127.0.0.1:9'")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_usage_errors_exit_2(capsys):
    code, out, err = run_cli(["run"], capsys)
    assert (code, out) == (2, "") and err == "arrayjob: error: Missing argument 'SPEC'.\n"
