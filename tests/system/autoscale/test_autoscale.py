"""A job sizes its cluster on Ray's fake autoscaling cluster: scale up from no workers, run,
match the reference, give the nodes back; refuse a max_nodes too small before reading."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from sklearn.linear_model import LogisticRegression

from tests.system.autoscale.conftest import HERE, IDLE_TIMEOUT, cluster_env, wait_for_workers, workers
from tests.harness.helpers import read_result

# 194 MB of X (10 blocks of 19.2 MB) and y: over 100 MB object stores (80 MB usable), 3 nodes
ROWS, COLS, CHUNK = 250_000, 96, 25_000
SPEC = """\
[job]
name = "logreg-scaled"
algorithm = "logreg"

[inputs]
X = "data/X.zarr"
y = "data/y.zarr"

[params]
max_iter = 10
tol = 1e-8

[output]
uri = "out"

[cluster]
address = "auto"
node_type = "fake.small"
scale_timeout = "3m"
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scaled")
    subprocess.run([str(Path(sys.executable).parent / "arrayjob"), "datagen", "logreg", str(root / "data"),
                    "--rows", str(ROWS), "--cols", str(COLS), "--chunk-rows", str(CHUNK)],
                   check=True, capture_output=True, timeout=300)
    (root / "job.toml").write_text(SPEC)
    return root


def arrayjob(root: Path, *args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "arrayjob"), "run", "job.toml", *args],
                          cwd=root, env=cluster_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(300)
def test_max_nodes_too_small_fails_before_reading(fake_cluster, job):
    done = arrayjob(job, "--set", f"cluster.address={json.dumps(fake_cluster)}", "--set", "cluster.max_nodes=2")
    assert done.returncode == 7, done.stderr
    assert done.stderr == ("arrayjob: error: the plan needs 3 × fake.small to hold its peak of 77.6 MB per node "
                           "(80.0 MB usable of a 100.0 MB object store), but cluster.max_nodes is 2\n")
    assert done.stdout == "" and not (job / "out").exists()
    assert workers(fake_cluster) == 0  # nothing was asked of the autoscaler


@pytest.mark.timeout(300)
def test_too_few_nodes_in_time_is_exit_7_and_the_request_is_cleared(fake_cluster, job):
    done = arrayjob(job, "--set", f"cluster.address={json.dumps(fake_cluster)}", "--set", "cluster.max_nodes=4",
                    "--set", 'cluster.scale_timeout="1s"')
    assert done.returncode == 7, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("arrayjob: error: only ") and "of 3 × fake.small nodes arrived within" in last
    assert "the plan needs 3 to hold" in last and not (job / "out" / "_SUCCESS").exists()
    assert not list((job / "out" / "runs").glob("*")) if (job / "out" / "runs").exists() else True
    # the request went with the job: whatever the autoscaler had started goes idle and away
    wait_for_workers(fake_cluster, 0, timeout=IDLE_TIMEOUT + 90)


@pytest.mark.timeout(420)
def test_scales_up_from_no_workers_runs_and_gives_the_nodes_back(fake_cluster, job):
    """With no ``node_type`` in the spec (issue 29): the worker type is read from the
    autoscaler's config (fake.small, 1 CPU and a 100 MB store, up to 6) and sized for as with
    node_type = "fake.small" (3 nodes), the price table adding its dollars."""
    wait_for_workers(fake_cluster, 0, timeout=IDLE_TIMEOUT + 90)
    done = subprocess.run([str(Path(sys.executable).parent / "arrayjob"), "run", untyped(job, "out"), "--json",
                           "--set", f"cluster.address={json.dumps(fake_cluster)}", "--set", "cluster.max_nodes=4"],
                          cwd=job, env=cluster_env(), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "arrayjob: nodes: 3 × fake.small: the smallest count whose object stores hold" in done.stderr
    nodes = report["nodes"]
    assert nodes["requested"] == 3 and nodes["count"] >= 3 and nodes["added"] >= 3
    assert nodes["instance_type"] == "fake.small"
    assert nodes["types"]["offer"] == "fake.small (1 CPU, 100.0 MB object store, up to 6)"
    assert nodes["types"]["source"].endswith("tests/system/autoscale/fake_cluster.yaml")
    assert len(report["cluster"]["node_ids"]) >= 3 and report["tasks"]["per_node"].count(0) == 0
    spans = nodes["per_node"]
    assert all(p["added"] and p["left"] is not None and p["seconds"] > 0 for p in spans)
    # each was started for the job's request: its span (node-seconds, dollars) begins with it
    assert all(p["since"] < p["joined"] for p in spans) and len({p["since"] for p in spans}) == 1
    assert nodes["node_seconds"] == pytest.approx(sum(p["seconds"] for p in spans), abs=0.01)
    assert [e["kind"] for e in nodes["events"]].count("join") == len(spans)
    rate = 0.1  # fake.small's dollars per hour in tests/system/autoscale/prices.toml
    assert report["dollars"]["compute"] == pytest.approx(nodes["node_seconds"] / 3600 * rate, abs=1e-6)
    assert report["estimate"]["nodes"]["count"] == len(report["cluster"]["node_ids"])
    assert "nodes.node_seconds" in report["estimate_error"]
    # the estimate waits for the nodes the autoscaler added, at fake.small's node_startup
    assert 3 <= report["estimate"]["nodes"]["added"] <= nodes["added"]
    assert report["estimate"]["nodes"]["scale_up_seconds"] == 12.0
    # the result is the reference's
    X = zarr.open_array(str(job / "data" / "X.zarr"))[:]
    y = zarr.open_array(str(job / "data" / "y.zarr"))[:]
    result = read_result(str(job / "out"))
    reference = LogisticRegression(C=1 / (1e-4 * len(y)), tol=1e-10, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(result["coef"][:], reference.coef_[0], rtol=2e-3, atol=2e-4)
    # the request went with the job: the idle nodes go within the idle timeout (and the
    # autoscaler's own period of a few seconds)
    assert wait_for_workers(fake_cluster, 0, timeout=IDLE_TIMEOUT + 60) <= IDLE_TIMEOUT + 60


@pytest.mark.timeout(420)
def test_a_job_killed_outright_gives_the_nodes_back(fake_cluster, job):
    """A SIGKILLed job cannot clear its request; its guard does, and the nodes go idle and away."""
    wait_for_workers(fake_cluster, 0, timeout=IDLE_TIMEOUT + 90)
    log = job / "killed.log"
    run = subprocess.Popen([str(Path(sys.executable).parent / "arrayjob"), "run", "job.toml",
                            "--set", f"cluster.address={json.dumps(fake_cluster)}", "--set", "cluster.max_nodes=4",
                            "--set", "params.max_iter=100000", "--set", "params.tol=1e-300", "--overwrite"],
                           cwd=job, env=cluster_env(), stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        wait_for_workers(fake_cluster, 3, timeout=240)  # the request is in and met
        assert run.poll() is None, log.read_text()
    finally:
        run.kill()
        run.wait(timeout=30)
    assert wait_for_workers(fake_cluster, 0, timeout=IDLE_TIMEOUT + 90) <= IDLE_TIMEOUT + 90


def untyped(root: Path, output: str) -> str:
    """The job's spec without ``cluster.node_type``, publishing to ``output``: sized for the
    node types the cluster says it has (issue 29)."""
    spec = root / f"{output}.toml"
    spec.write_text(SPEC.replace('node_type = "fake.small"\n', "").replace('uri = "out"', f'uri = "{output}"'))
    return spec.name


@pytest.mark.timeout(120)
def test_a_request_no_node_type_can_hold_fails_within_a_minute(fake_cluster, job):
    """2-CPU nodes ("local" in the price table) on a cluster whose only worker type has 1."""
    started = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).parent / "arrayjob"), "run", untyped(job, "out-impossible"),
                           "--set", f"cluster.address={json.dumps(fake_cluster)}", "--set", "cluster.max_nodes=4",
                           "--set", 'cluster.node_type="local"'],
                          cwd=job, env=cluster_env(), capture_output=True, text=True, timeout=100)
    assert time.monotonic() - started < 60
    assert done.returncode == 7, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("arrayjob: error: the job asks the autoscaler for 1 × local node(s) of 2 CPUs and a ")
    assert last.endswith(" object store, which no worker type of the cluster can hold: fake.small (1 CPU, 100.0 MB "
                         f"object store, up to 6) (from the autoscaler's config {HERE / 'fake_cluster.yaml'})")
    assert not (job / "out-impossible").exists() and workers(fake_cluster) == 0  # nothing was asked of the autoscaler
