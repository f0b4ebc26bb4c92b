"""Ray's failures become arrayjob's: signals, a private Ray dying under the job, Ray's noise
on stdout, a private Ray outliving a killed driver.

Each test runs the installed ``arrayjob`` command in a subprocess with its own private Ray,
waits until the job's tasks run, does one real thing to it (a signal, a kill by pid) and
checks the exit code, the one line on stderr and the processes left. Only processes these
tests started are signalled, by pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arrayjob import runner
from arrayjob.datagen import DatagenRequest, generate
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.runtime.supervision.pause import DIR_ENV, POINTS_ENV
from arrayjob.spec import load_spec
from tests.harness.helpers import read_result, without_progress, write_spec

REPO = Path(__file__).resolve().parents[4]
ARRAYJOB = shutil.which("arrayjob", path=str(Path(sys.executable).parent)) or "arrayjob"
IDLE_TITLES = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")

pytestmark = [pytest.mark.cli, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]


# -- processes, from /proc ---------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of ``pid``, or None once it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[19]))


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> dict[int, int]:
    """Every live process under ``root`` (children, their children, ...): pid -> start time."""
    parents: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parents[int(entry)] = st
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, (ppid, start) in parents.items():
            if ppid == pid and child not in found:
                found[child] = start
                frontier.append(child)
    return found


def alive(recorded: dict[int, int]) -> dict[int, str]:
    """Those of ``recorded`` (pid -> start time) still running: the same pid, the same start."""
    return {pid: _title(pid) for pid, start in recorded.items() if (st := _stat(pid)) and st[1] == start}


def wait_for_tasks(job: subprocess.Popen[str], timeout: float = 180) -> dict[int, int]:
    """Wait until a worker of the job's private Ray runs a task; the job's processes then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert job.poll() is None, f"the job ended early: {job.returncode}"
        under = descendants(job.pid)
        if any(_title(p).startswith("ray::") and not _title(p).startswith(IDLE_TITLES) for p in under):
            return under
        time.sleep(0.2)
    raise AssertionError("the job's tasks never started")


def stop_all(recorded: dict[int, int]) -> None:
    for pid in alive(recorded):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def started() -> Iterator[dict[int, int]]:
    """Processes a test started (pid -> start time), killed by pid whatever happens."""
    recorded: dict[int, int] = {}
    yield recorded
    stop_all(recorded)


# -- a job that runs until it is stopped -------------------------------------------------------
@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pagerank")
    generate("pagerank", DatagenRequest(parse_uri(str(root)), 20000, 2, 2000, 0, StorageOptions()))
    return root / "edges.zarr"


def endless_spec(tmp_path: Path, edges: Path, max_iter: int = 1_000_000) -> Path:
    """PageRank that never converges (tol 1e-300): it runs until stopped, or ``max_iter``."""
    return write_spec(tmp_path / "spec.toml", algorithm="pagerank", inputs={"edges": str(edges)},
                      output=str(tmp_path / "out"), params=f"tol = 1e-300\nmax_iter = {max_iter}\n")


def start(spec: Path, started: dict[int, int], *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **(env or {})}
    job = subprocess.Popen([ARRAYJOB, "run", str(spec), *args], env=env, cwd=spec.parent, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started[job.pid] = _stat(job.pid)[1]  # type: ignore[index]
    return job


def finish(job: subprocess.Popen[str], timeout: float) -> tuple[int, str, str, float]:
    """Wait for ``job``: its exit code, stdout, stderr and the seconds it took."""
    begin = time.monotonic()
    out, err = job.communicate(timeout=timeout)
    return job.returncode, out, err, time.monotonic() - begin


def assert_gone(recorded: dict[int, int], within: float) -> None:
    deadline = time.monotonic() + within
    while (left := alive(recorded)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"still running {within} s later: {left}"


# -- the tests ---------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_sigterm_unwinds_exit_143_and_frees_the_output(tmp_path, edges, started, request):
    spec = endless_spec(tmp_path, edges)
    job = start(spec, started)
    started.update(wait_for_tasks(job))
    job.send_signal(signal.SIGTERM)
    code, out, err, seconds = finish(job, timeout=30)
    assert code == 143, err
    assert without_progress(err) == "arrayjob: terminated (SIGTERM)\n" and out == ""  # Ray's stack dump is gone
    assert seconds < 10
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    assert_gone(started, within=10)  # the private Ray stopped with it
    # the lease was released: a rerun takes the output at once instead of waiting for expiry
    # (``--no-wait``; in this process, on the session's Ray: a process of its own adds nothing)
    request.getfixturevalue("ray_session")
    runner.run(load_spec(str(spec), ["params.max_iter=2"]), wait=False)
    assert read_result(str(tmp_path / "out"))["rank"].size > 0


@pytest.mark.timeout(300)
def test_sigkill_leaves_no_process_of_the_private_ray_and_no_spill(tmp_path, started):
    """Killed outright, a job's private Ray goes with it, every process of it, and so does the
    spill of the blocks it streamed under a memory budget (its watchdog removes both). One run
    checks both: held after the fit's second iteration, when every process of its Ray is up and
    streamed blocks have gone to the spill."""
    generate("logreg", DatagenRequest(parse_uri(str(tmp_path / "data")), 200000, 16, 20000, 0, StorageOptions()))
    spec = write_spec(tmp_path / "spec.toml", inputs={"X": str(tmp_path / "data" / "X.zarr"),
                                                      "y": str(tmp_path / "data" / "y.zarr")},
                      output=str(tmp_path / "out"), params="tol = 1e-300\nmax_iter = 1000000\n")
    job = start(spec, started, "--set", "cluster.memory_budget=8MB",
                env={POINTS_ENV: "fit:2", DIR_ENV: str(tmp_path / "pauses")})
    reached = tmp_path / "pauses" / "fit:2.reached"
    deadline = time.monotonic() + 180
    while not reached.exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-2000:]
        time.sleep(0.05)
    root = Path(tempfile.gettempdir()) / "arrayjob-spill"
    spill = [p for p in root.glob(f"{job.pid}-*/*/*") if p.is_file()]
    assert spill, "the budget should have streamed blocks through the spill"
    started.update(descendants(job.pid))  # the agents and workers too
    assert any(_title(p) == "ray::DashboardAgent" for p in started) or len(started) > 5
    job.kill()
    job.communicate(timeout=30)
    assert_gone(started, within=10)
    deadline = time.monotonic() + 10
    while list(root.glob(f"{job.pid}-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(root.glob(f"{job.pid}-*")), spill


@pytest.mark.timeout(300)
@pytest.mark.parametrize("process", ["gcs_server", "raylet"])
def test_a_private_ray_dying_under_the_job_is_exit_5(tmp_path, edges, started, process):
    job = start(endless_spec(tmp_path, edges), started)
    started.update(wait_for_tasks(job))
    (victim,) = [p for p in descendants(job.pid) if f"/{process} " in f"{_title(p)} "]
    os.kill(victim, signal.SIGKILL)
    code, out, err, seconds = finish(job, timeout=90)
    assert code == 5, err
    err = without_progress(err)
    assert err.startswith(f"arrayjob: error: the job's Ray stopped under it: its {process} (pid {victim}) died")
    assert err.count("\n") == 1 and out == ""
    assert seconds < 15  # not Ray's minute of waiting for its GCS
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    assert_gone(started, within=10)
    # the output was given up: no lease left to wait out, no staging left behind
    assert not list((tmp_path / "out").glob("_lease/*")) and not list((tmp_path / "out").glob("runs/*"))


@pytest.mark.multinode
@pytest.mark.timeout(600)
def test_json_stdout_stays_json_when_a_node_dies(tmp_path, edges, multinode_cluster):
    """Ray's driver prints what a dying raylet reports to stdout; ``--json`` must still parse."""
    spec = endless_spec(tmp_path, edges, max_iter=30)
    result = multinode_cluster.call("tests.harness.multinode_run:run_and_kill", timeout=560, args=[str(spec), "--json"])
    assert result["node_removed"], result
    assert result["returncode"] == 0, result["stderr"][-3000:]
    report = json.loads(result["stdout"])  # nothing but the report
    assert report["job"] == "test-pagerank"
    assert report["faults"]["nodes_lost"] == 1
    assert "Raylet is terminated" in result["stderr"]  # Ray's own account of it, on stderr
