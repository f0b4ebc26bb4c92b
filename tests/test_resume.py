"""Long jobs resume: a run SIGKILLed during load, fit, write or publish, then run again, ends
exactly where an undisturbed run ends (1e-10, the same iterations), and says when it resumed.

The killed runs are real ``arrayjob run`` processes connected to the session's Ray; each
kills itself at the point ``ARRAYJOB_TEST_KILL_AT`` names (``io.checkpoint.kill_point``).
The runs after them are in-process, on the same Ray. Fit kill points are drawn at random
(seeded) among the iterations the undisturbed run took.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from arrayjob.io.backend import backend_for
from arrayjob.io.checkpoint import CHECKPOINTS, Checkpoint, CheckpointStore, decode, encode
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.jobs import lbfgs
from tests.helpers import (
    logreg_data,
    published,
    read_result,
    run_cli,
    without_progress,
    write_array,
    write_spec,
)

REPO = Path(__file__).resolve().parents[1]
LEASE_SECONDS = "2"  # a dead run's lease is taken over this long after its last heartbeat
RNG = random.Random(15)


# -- the checkpoint store and the optimiser, without Ray -------------------------------------------


@pytest.mark.parametrize("where", ["local", "s3"])
def test_checkpoint_round_trips_exactly_and_is_keyed_by_spec(where, tmp_path, request):
    if where == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        location, options = parse_uri(f"s3://{request.getfixturevalue('s3_bucket')}/out"), StorageOptions(endpoint)
    else:
        location, options = parse_uri(str(tmp_path / "out")), StorageOptions()
    backend = backend_for(location, options)
    state = {"x": np.random.default_rng(0).standard_normal(7), "s": np.ones((3, 7)) / 3, "f": 0.1 + 0.2,
             "iteration": 12, "done": False, "previous": None}
    store = CheckpointStore(backend, "a" * 64)
    assert store.load() is None
    store.save(Checkpoint("run-1", 12, "logreg", state))
    store.save(Checkpoint("run-1", 13, "logreg", state | {"iteration": 13}))  # replaces the first
    found = store.load()
    assert (found.run_id, found.iteration, found.job) == ("run-1", 13, "logreg")
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(found.state[key], value) and found.state[key].dtype == value.dtype
        elif key != "iteration":
            assert found.state[key] == value and type(found.state[key]) is type(value)
    assert CheckpointStore(backend, "b" * 64).load() is None  # another spec's is never read
    assert list(backend.list(CHECKPOINTS)) == [f"{CHECKPOINTS}/{'a' * 64}.npz"]
    backend.write_bytes(store.key, encode(found)[:100])  # a torn object (which write_bytes never leaves)
    assert store.load() is None
    store.clear()
    assert backend.list(CHECKPOINTS) == {}


def test_decode_refuses_garbage():
    with pytest.raises(ValueError, match="unreadable checkpoint"):
        decode(b"not a checkpoint")


def _rosenbrock(x):
    f = float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))
    g = np.zeros_like(x)
    g[:-1] = -400.0 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2 * (1 - x[:-1])
    g[1:] += 200.0 * (x[1:] - x[:-1] ** 2)
    return f, g


def test_lbfgs_resumed_from_any_iteration_is_bit_identical():
    """Stopped after k iterations, saved, loaded, and run on: the very same iterate and count."""
    x0 = np.array([-1.2, 1.0, -0.5, 0.8, 1.5])
    whole = lbfgs.minimize(_rosenbrock, lbfgs.LBFGSState.start(x0, _rosenbrock), tol=1e-9, max_iter=500)
    assert np.allclose(whole.x, 1.0, atol=1e-7) and whole.iteration > 20
    for k in (1, 5, whole.iteration // 2, whole.iteration - 1):
        state = lbfgs.minimize(_rosenbrock, lbfgs.LBFGSState.start(x0, _rosenbrock), tol=1e-9, max_iter=k)
        saved = decode(encode(Checkpoint("r", k, "t", state.as_dict()))).state
        again = lbfgs.LBFGSState.from_dict(saved)
        again.done = False  # it stopped at max_iter = k; the resumed run goes on to 500
        resumed = lbfgs.minimize(_rosenbrock, again, tol=1e-9, max_iter=500)
        assert np.array_equal(resumed.x, whole.x) and resumed.iteration == whole.iteration


def test_lbfgs_stops_quietly_when_f_cannot_decrease():
    """tol = 0 is out of reach: the fit stops when the line search finds no decrease, before
    max_iter, at the minimum, and without SciPy's warning (warnings are errors here)."""
    x0 = np.array([-1.2, 1.0, -0.5])
    state = lbfgs.minimize(_rosenbrock, lbfgs.LBFGSState.start(x0, _rosenbrock), tol=0.0, max_iter=2000)
    assert state.done and state.iteration < 2000 and np.allclose(state.x, 1.0, atol=1e-8)


# -- killed runs of every iterative algorithm, then a rerun ----------------------------------------


def _logreg(solver):
    def write(base: Path) -> dict[str, str]:
        X, y = logreg_data(2000, 6, seed=4)
        write_array(str(base / "X.zarr"), X, (500, 6))
        write_array(str(base / "y.zarr"), y, (500,))
        return {"X": "X.zarr", "y": "y.zarr"}

    params = f'solver = "{solver}"\nl2 = 1e-4\ntol = 1e-8\n'
    return "logreg", write, params, ("objective", "evaluations")


def _kmeans(base: Path) -> dict[str, str]:
    X = np.random.default_rng(5).uniform(size=(3000, 3))
    write_array(str(base / "X.zarr"), X, (750, 3))
    return {"X": "X.zarr"}


def _pagerank(base: Path) -> dict[str, str]:
    rng = np.random.default_rng(6)
    edges = rng.integers(0, 400, size=(3000, 2)).astype(np.int64)
    write_array(str(base / "edges.zarr"), edges, (1000, 2))
    return {"edges": "edges.zarr"}


def _cp_als(base: Path) -> dict[str, str]:
    rng = np.random.default_rng(7)
    A, B, C = rng.random((20, 3)), rng.random((12, 3)), rng.random((10, 3))
    X = np.einsum("if,jf,kf->ijk", A, B, C) + 0.05 * rng.random((20, 12, 10))
    write_array(str(base / "X.zarr"), X, (5, 12, 10))
    return {"X": "X.zarr"}


ALGORITHMS = {
    "lbfgs": _logreg("lbfgs"),
    "newton": _logreg("newton"),
    "kmeans": ("kmeans", _kmeans, "k = 5\ntol = 1e-9\n", ("inertia",)),
    "pagerank": ("pagerank", _pagerank, "tol = 1e-9\n", ()),
    "cp_als": ("cp_als", _cp_als, "rank = 3\ntol = 1e-12\nmax_iter = 12\n", ("fit",)),
}


@pytest.fixture
def ray_address(ray_session):
    import ray

    return ray.get_runtime_context().gcs_address


def _setup(name, workdir):
    algorithm, write, params, _ = ALGORITHMS[name]
    inputs = write(workdir)
    return write_spec(workdir / "spec.toml", inputs=inputs, output="out", algorithm=algorithm, params=params,
                      extra="\n[run]\ncheckpoint_every = 0\n")


def _reference(spec, capsys):
    code, _, err = run_cli(["run", str(spec), "--set", 'output.uri="reference"'], capsys)
    assert (code, without_progress(err)) == (0, "")
    return read_result("reference")


def _killed_run(spec, point, address, workdir, *args, output="out"):
    env = {**os.environ, "ARRAYJOB_TEST_KILL_AT": point, "ARRAYJOB_LEASE_SECONDS": LEASE_SECONDS,
           "PYTHONPATH": str(REPO)}
    success = workdir / output / "_SUCCESS"
    before = success.read_bytes() if success.exists() else None
    proc = subprocess.run([sys.executable, "-m", "arrayjob.cli.main", "run", str(spec), "--set",
                           f"cluster.address={json.dumps(address)}", "--set", f"output.uri={json.dumps(output)}",
                           *args],
                          env=env, cwd=workdir, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr)
    assert (success.read_bytes() if success.exists() else None) == before  # nothing published


def _same_result(name, got, reference):
    keys = ALGORITHMS[name][3]
    assert got.attrs["iterations"] == reference.attrs["iterations"]
    for key in keys:
        if isinstance(reference.attrs[key], int):
            assert got.attrs[key] == reference.attrs[key], key
        else:
            assert got.attrs[key] == pytest.approx(reference.attrs[key], rel=1e-10, abs=0), key
    for array in reference.array_keys():
        if array == "labels":
            assert np.array_equal(got[array][:], reference[array][:])
        else:
            np.testing.assert_allclose(got[array][:], reference[array][:], rtol=1e-10, atol=1e-14)


# a random fit iteration for each algorithm; kills in load, write and publish spread over them
KILLS = {"lbfgs": "load", "newton": "publish", "kmeans": "write", "pagerank": "publish", "cp_als": "write"}


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_killed_run_resumes_to_the_undisturbed_result(name, workdir, capsys, ray_address, monkeypatch):
    spec = _setup(name, workdir)
    reference = _reference(spec, capsys)
    iterations = reference.attrs["iterations"]
    assert iterations >= 3, f"{name}: too few iterations ({iterations}) to kill in between"
    monkeypatch.setenv("ARRAYJOB_LEASE_SECONDS", LEASE_SECONDS)
    for point in (f"fit:{RNG.randint(1, iterations - 1)}", KILLS[name]):
        output = f"out-{point.replace(':', '-')}"
        _killed_run(spec, point, ray_address, workdir, output=output)

        code, _, err = run_cli(["run", str(spec), "--set", f"output.uri={json.dumps(output)}"], capsys)
        assert code == 0, err
        report = json.loads(Path(published(output), "report.json").read_text())
        if point == "load":  # killed before any checkpoint: a fresh start
            assert "resumed" not in err and report["checkpoints"]["resumed"] is None
        else:
            resumed_at = int(point[4:]) if point.startswith("fit:") else iterations
            lines = [line for line in err.splitlines() if "resumed" in line]
            assert len(lines) == 1 and lines[0].startswith("arrayjob: resumed run "), (point, err)
            assert lines[0].endswith(f" from iteration {resumed_at}"), (point, lines)
            assert report["checkpoints"]["resumed"]["iteration"] == resumed_at
        _same_result(name, read_result(output), reference)
        assert not (workdir / output / CHECKPOINTS).exists()  # removed once published


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_restart_ignores_the_checkpoint_and_another_spec_never_reads_it(workdir, capsys, ray_address, monkeypatch):
    spec = _setup("cp_als", workdir)
    reference = _reference(spec, capsys)
    _killed_run(spec, "fit:4", ray_address, workdir)
    assert len(list((workdir / "out" / CHECKPOINTS).iterdir())) == 1
    monkeypatch.setenv("ARRAYJOB_LEASE_SECONDS", LEASE_SECONDS)

    # another spec on the same output: not this checkpoint's
    code, out, err = run_cli(["run", str(spec), "--set", "params.seed=3", "--json"], capsys)
    assert code == 0 and "resumed" not in err, err
    assert json.loads(out)["checkpoints"]["resumed"] is None
    assert not (workdir / "out" / CHECKPOINTS).exists()  # a publish removes every checkpoint

    _killed_run(spec, "fit:4", ray_address, workdir, "--overwrite")
    code, out, err = run_cli(["run", str(spec), "--overwrite", "--restart", "--json"], capsys)
    assert code == 0 and "resumed" not in err, err
    assert json.loads(out)["checkpoints"] == {"every_seconds": 0.0, "saved": reference.attrs["iterations"],
                                              "resumed": None}
    _same_result("cp_als", read_result("out"), reference)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_checkpoint_every_spaces_the_saves(data, capsys):
    """The default saves at most once a minute (none in a short fit); 0 saves every iteration."""
    spec = write_spec(data / "s.toml", inputs={"X": "data/X.zarr", "y": "data/y.zarr"}, output="out")
    code, out, _ = run_cli(["run", str(spec), "--json"], capsys)
    assert code == 0 and json.loads(out)["checkpoints"] == {"every_seconds": 60.0, "saved": 0, "resumed": None}
    code, out, _ = run_cli(["run", str(spec), "--json", "--overwrite", "--set", "run.checkpoint_every=0"], capsys)
    report = json.loads(out)
    assert code == 0 and report["checkpoints"]["saved"] == report["result"]["iterations"] > 1
    fit = next(s for s in report["stages"] if s["name"] == "fit")
    assert fit["storage.put_requests"] == report["checkpoints"]["saved"]  # counted where they were written
    assert not (data / "out" / CHECKPOINTS).exists()


def test_checkpoint_every_is_validated(data, capsys):
    spec = write_spec(data / "s.toml", inputs={"X": "data/X.zarr", "y": "data/y.zarr"}, output="out",
                      extra="\n[run]\ncheckpoint_every = -1\n")
    code, _, err = run_cli(["run", str(spec)], capsys)
    assert code == 2 and err == "arrayjob: error: run.checkpoint_every: expected a number of seconds >= 0, got -1\n"
    assert not (data / "out").exists()
