"""Long jobs resume: a run stopped during load, fit, write or publish, then run again, ends
exactly where an undisturbed run ends (1e-10, the same iterations), and says when it resumed.

Three levels, each checking what the one above cannot:
- each iterative algorithm stopped in-process right after a checkpoint (in its fit, and with
  its fit done) and resumed, on the in-process executor: the job's own state is enough;
- whole runs (``arrayjob run`` in-process, on the session's Ray) stopped at the points
  ``ARRAYJOB_TEST_KILL_AT`` names (``io.checkpoint.kill_point``, made to raise), then rerun:
  what the run does with a checkpoint (restore after the load, the report, removal once
  published, ``--restart``, another spec);
- real ``arrayjob run`` processes SIGKILLed at such a point, one per kind of checkpointed state
  (an optimiser's state with its history; an iterate with worker-written results): what only
  a dead process leaves (its lease to expire, its staging) and the rerun after it.
Stopping points in a fit are drawn at random (seeded) among the iterations the undisturbed
run took.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from arrayjob.cli.main import main
from arrayjob.io import checkpoint
from arrayjob.io.backend import backend_for
from arrayjob.io.checkpoint import (
    CHECKPOINTS,
    Checkpoint,
    Checkpoints,
    CheckpointStore,
    decode,
    encode,
)
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.solvers import lbfgs
from tests.harness.helpers import (
    logreg_data,
    multinomial_data,
    read_result,
    run_cli,
    sparse_logreg_data,
    without_progress,
    write_array,
    write_csr_group,
    write_spec,
)

REPO = Path(__file__).resolve().parents[3]
LEASE_SECONDS = "1"  # a dead run's lease is taken over this long after its last heartbeat
RNG = random.Random(15)


# -- the checkpoint store and the optimiser, without Ray -------------------------------------------


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


def test_checkpoint_every_spaces_the_saves_by_its_clock(tmp_path):
    """At most one save per ``every`` seconds of its clock since the last (or the fit's start);
    0 saves every iteration; the default (``run.checkpoint_every``) is a minute."""
    from arrayjob.spec import RunOptions

    assert RunOptions().checkpoint_every == 60.0
    now = [100.0]
    backend = backend_for(parse_uri(str(tmp_path / "out")), StorageOptions())
    counted = []
    ticks = Checkpoints(CheckpointStore(backend, "a" * 64), "r", "logreg", 60.0, clock=lambda: now[0],
                        count=counted.append)
    assert ticks.restore() is None
    saved_at = []
    for iteration in range(1, 13):  # one iteration each 25 s: saves at 75 s and 150 s (after 3 and 6)
        now[0] += 25.0
        before = ticks.saved
        ticks.tick(iteration, {"x": np.full(2, float(iteration))})
        if ticks.saved > before:
            saved_at.append(iteration)
    assert saved_at == [3, 6, 9, 12] and len(counted) == 4
    assert counted[0].put_requests == 1 and counted[0].bytes_written > 0
    assert ticks.store.load().iteration == 12
    every = Checkpoints(CheckpointStore(backend, "b" * 64), "r", "logreg", 0.0, clock=lambda: now[0])
    for iteration in range(1, 4):  # the clock stands still: 0 saves each iteration all the same
        every.tick(iteration, {"x": np.zeros(1)})
    assert every.saved == 3
    short = Checkpoints(CheckpointStore(backend, "c" * 64), "r", "logreg", 60.0, clock=lambda: now[0])
    for iteration in range(1, 60):  # a fit shorter than a minute: nothing saved
        now[0] += 1.0
        short.tick(iteration, {"x": np.zeros(1)})
    assert short.saved == 0 and short.store.load() is None


def test_lbfgs_stops_quietly_when_f_cannot_decrease():
    """tol = 0 is out of reach: the fit stops when the line search finds no decrease, before
    max_iter, at the minimum, and without SciPy's warning (warnings are errors here)."""
    x0 = np.array([-1.2, 1.0, -0.5])
    state = lbfgs.minimize(_rosenbrock, lbfgs.LBFGSState.start(x0, _rosenbrock), tol=0.0, max_iter=2000)
    assert state.done and state.iteration < 2000 and np.allclose(state.x, 1.0, atol=1e-8)


# -- every iterative algorithm, stopped after a checkpoint and resumed, in-process -----------------


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


def _gmm(base: Path) -> dict[str, str]:
    rng = np.random.default_rng(9)
    centres = np.array([[0.0, 0.0, 0.0], [2.5, 0.0, 1.0], [0.0, 3.0, -1.0]])
    X = centres[rng.integers(0, 3, 2400)] + rng.standard_normal((2400, 3)) * [1.0, 0.6, 1.4]
    write_array(str(base / "X.zarr"), X, (600, 3))
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


def _sparse_linreg(base: Path) -> dict[str, str]:
    X, _ = sparse_logreg_data(1500, 400, nnz_per_row=5, seed=8)
    y = X @ np.random.default_rng(8).standard_normal(400) + 0.5
    write_csr_group(str(base / "X"), X, (900, 900, 400))
    write_array(str(base / "y.zarr"), y, (500,))
    return {"X": "X", "y": "y.zarr"}


def _als(base: Path) -> dict[str, str]:
    R, _ = sparse_logreg_data(1200, 80, nnz_per_row=6, seed=10)
    write_csr_group(str(base / "R"), R, (900, 900, 300))
    return {"R": "R"}


def _pca(base: Path) -> dict[str, str]:
    X, _ = sparse_logreg_data(1500, 60, nnz_per_row=5, seed=9)
    write_csr_group(str(base / "X"), X, (900, 900, 400))
    return {"X": "X"}


def _multinomial(base: Path) -> dict[str, str]:
    X, y = multinomial_data(2000, 5, 3, seed=9)
    write_array(str(base / "X.zarr"), X, (500, 5))
    write_array(str(base / "y.zarr"), y, (500,))
    write_array(str(base / "weights.zarr"), np.random.default_rng(9).uniform(0.5, 2.0, 2000), (500,))
    return {"X": "X.zarr", "y": "y.zarr", "weights": "weights.zarr"}


def _lasso(base: Path) -> dict[str, str]:
    X, _ = logreg_data(1500, 8, seed=10)
    y = X @ np.array([1.0, 0.0, -0.5, 0.0, 0.0, 2.0, 0.0, 0.1]) + 0.3 + 0.2 * np.random.default_rng(10).standard_normal(1500)
    write_array(str(base / "X.zarr"), X, (500, 8))
    write_array(str(base / "y.zarr"), y, (500,))
    return {"X": "X.zarr", "y": "y.zarr"}


ALGORITHMS = {
    "lbfgs": _logreg("lbfgs"),
    # OWL-QN's state (the L-BFGS record, F with its L1 term) on a weighted, balanced, multinomial fit
    "multinomial-owlqn": ("logreg", _multinomial, 'l1 = 1e-3\nl2 = 1e-3\nclass_weight = "balanced"\ntol = 1e-8\n',
                          ("objective", "evaluations", "nonzero")),
    "linreg-owlqn": ("linreg", _lasso, "l1 = 0.02\nl2 = 0.01\n", ("objective", "evaluations", "nonzero")),
    # conjugate gradients on a sparse X: its iterate, residual and direction checkpointed
    "linreg-cg-sparse": ("linreg", _sparse_linreg, 'method = "cg"\ntol = 1e-12\n', ("objective",)),
    "newton": _logreg("newton"),
    "kmeans": ("kmeans", _kmeans, "k = 5\ntol = 1e-9\n", ("inertia",)),
    # EM's weights, means, covariances and lower bound checkpointed; labels written at the end
    "gmm": ("gmm", _gmm, "k = 3\ntol = 1e-12\nmax_iter = 12\n", ("lower_bound", "converged")),
    "pagerank": ("pagerank", _pagerank, "tol = 1e-9\n", ()),
    "cp_als": ("cp_als", _cp_als, "rank = 3\ntol = 1e-12\nmax_iter = 12\n", ("fit",)),
    # randomized subspace iteration on a sparse X: its basis and the mean checkpointed
    "pca": ("pca", _pca, "k = 3\nn_iter = 5\n", ("total_variance",)),
    # both factor matrices and the objective so far checkpointed; the column layout built again
    "als": ("als", _als, "rank = 3\nmax_iter = 5\n", ("objective",)),
}


def _setup(name, workdir):
    algorithm, write, params, _ = ALGORITHMS[name]
    inputs = write(workdir)
    return write_spec(workdir / "spec.toml", inputs=inputs, output="out", algorithm=algorithm, params=params,
                      extra="\n[run]\ncheckpoint_every = 0\n")


def _same_result(name, got, reference):
    """``got`` and ``reference`` (published ``result.zarr`` groups, or ``(attrs, arrays)``) agree to 1e-10."""
    (got_attrs, got_arrays), (attrs, arrays) = _contents(got), _contents(reference)
    assert got_attrs["iterations"] == attrs["iterations"]
    for key in ALGORITHMS[name][3]:
        if isinstance(attrs[key], int):
            assert got_attrs[key] == attrs[key], key
        else:
            assert got_attrs[key] == pytest.approx(attrs[key], rel=1e-10, abs=0), key
    assert set(got_arrays) == set(arrays)
    for key, array in arrays.items():
        if key == "labels":
            assert np.array_equal(got_arrays[key], array)
        else:
            np.testing.assert_allclose(got_arrays[key], array, rtol=1e-10, atol=1e-14)


def _contents(result):
    if isinstance(result, tuple):
        return result
    return dict(result.attrs), {key: result[key][:] for key in result.array_keys()}


class Interrupted(BaseException):  # noqa: N818 - a run stopped on purpose, not an error of its own
    """Where a test stopped a run: not an ``Exception``, so that it passes through ``main``'s
    handlers as a kill would, while the run unwinds (gives up its lease, removes its staging)."""


@dataclass
class StopAfter(Checkpoints):
    """Checkpoints that stop the run right after iteration ``at``'s tick (and its save)."""

    at: int = 0

    def tick(self, iteration, state):
        super().tick(iteration, state)
        if iteration == self.at:
            raise Interrupted(f"fit:{iteration}")


def _fit(job, checkpoints):
    """``job`` run on the in-process executor, with ``checkpoints``; (attrs, arrays) of its result."""
    from arrayjob.api.job import JobContext
    from arrayjob.planner.plan import ClusterShape, PlanOptions
    from arrayjob.runtime.executor import LocalExecutor
    from arrayjob.runtime.session import Session

    session = Session(LocalExecutor(StorageOptions()), PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2)))
    result = job.run(JobContext(session, session.executor.metrics, StorageOptions(), None, checkpoints))
    return dict(result.attrs), dict(result.arrays)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_each_algorithm_stopped_after_a_checkpoint_resumes_to_the_undisturbed_result(name, workdir):
    """Stopped in its fit (a random iteration) and with its fit done (as a run stopped in write or
    publish is), then run again from the checkpoint: the same result, the same iterations."""
    from arrayjob.runner import prepare
    from arrayjob.spec import load_spec

    spec = load_spec(str(_setup(name, workdir)))
    job = prepare(spec)
    store = CheckpointStore(backend_for(spec.output, StorageOptions()), spec.digest())
    undisturbed = _fit(job, Checkpoints(store, "whole", spec.algorithm, every=0))
    iterations = undisturbed[0]["iterations"]
    assert iterations >= 3, f"{name}: too few iterations ({iterations}) to stop in between"
    store.clear()
    for at in (RNG.randint(1, iterations - 1), iterations):
        with pytest.raises(Interrupted):
            _fit(job, StopAfter(store, f"stopped-{at}", spec.algorithm, every=0, at=at))
        again = Checkpoints(store, "again", spec.algorithm, every=0)
        resumed = _fit(job, again)
        assert (again.resumed.run_id, again.resumed.iteration) == (f"stopped-{at}", at)
        assert again.saved == iterations - at  # it went on from there, not from the start
        _same_result(name, resumed, undisturbed)
        store.clear()
    # a checkpoint of another algorithm under this spec's name is not this job's state
    store.save(Checkpoint("other", 2, "not-" + spec.algorithm, {"x": np.zeros(1)}))
    fresh = Checkpoints(store, "fresh", spec.algorithm, every=0)
    _same_result(name, _fit(job, fresh), undisturbed)
    assert fresh.resumed is None and fresh.saved == iterations


# -- whole runs stopped at a kill point, in-process on the session's Ray ---------------------------


@pytest.fixture
def stop_at(monkeypatch):
    """``stop_at(point)``: the next run in this process raises ``Interrupted`` at ``point``
    (``io.checkpoint.kill_point``) instead of being SIGKILLed there."""

    def die(point):
        monkeypatch.delenv(checkpoint.KILL_ENV)
        raise Interrupted(point)

    monkeypatch.setattr(checkpoint, "die", die)
    return lambda point: monkeypatch.setenv(checkpoint.KILL_ENV, point)


def _reference(spec, capsys):
    code, _, err = run_cli(["run", str(spec), "--set", 'output.uri="reference"'], capsys)
    assert (code, without_progress(err)) == (0, "")
    return read_result("reference")


def _stopped_run(spec, point, stop_at, workdir, capsys, *args, output="out"):
    success, runs = workdir / output / "_SUCCESS", workdir / output / "runs"
    before = success.read_bytes() if success.exists() else None
    staged = sorted(p.name for p in runs.iterdir()) if runs.exists() else []
    stop_at(point)
    with pytest.raises(Interrupted, match=f"^{point}$"):
        main(["run", str(spec), "--set", f"output.uri={json.dumps(output)}", *args])
    capsys.readouterr()  # what it printed is not the rerun's
    assert (success.read_bytes() if success.exists() else None) == before  # nothing published
    assert not (workdir / output / "_lease").exists()  # it unwound: lease given up, staging removed
    assert (sorted(p.name for p in runs.iterdir()) if runs.exists() else []) == staged


def _rerun_resumes(spec, output, point, iterations, capsys):
    """Run ``spec`` into ``output`` again after a stop at ``point``; the report."""
    code, out, err = run_cli(["run", str(spec), "--json", "--set", f"output.uri={json.dumps(output)}"], capsys)
    assert code == 0, err
    report = json.loads(out)
    if point == "load":  # stopped before any checkpoint: a fresh start
        assert "resumed" not in err and report["checkpoints"]["resumed"] is None
    else:
        resumed_at = int(point[4:]) if point.startswith("fit:") else iterations
        lines = [line for line in err.splitlines() if "resumed" in line]
        assert len(lines) == 1 and lines[0].startswith("arrayjob: resumed run "), (point, err)
        assert lines[0].endswith(f" from iteration {resumed_at}"), (point, lines)
        assert report["checkpoints"]["resumed"]["iteration"] == resumed_at
        assert report["checkpoints"]["saved"] == iterations - resumed_at
    assert not Path(output, CHECKPOINTS).exists()  # removed once published
    return report


# -- real processes SIGKILLed, then a rerun -------------------------------------------------------


@pytest.fixture
def ray_address(ray_session):
    import ray

    return ray.get_runtime_context().gcs_address


def _killed_run(spec, point, address, workdir, *args, output="out", path=()):
    """``arrayjob run`` in a process SIGKILLed at ``point``; ``path``: more of PYTHONPATH (a
    user's job)."""
    env = {**os.environ, "ARRAYJOB_TEST_KILL_AT": point, "ARRAYJOB_LEASE_SECONDS": LEASE_SECONDS,
           "PYTHONPATH": os.pathsep.join([str(REPO), *map(str, path)])}
    success = workdir / output / "_SUCCESS"
    before = success.read_bytes() if success.exists() else None
    proc = subprocess.run([sys.executable, "-m", "arrayjob.cli.main", "run", str(spec), "--set",
                           f"cluster.address={json.dumps(address)}", "--set", f"output.uri={json.dumps(output)}",
                           *args],
                          env=env, cwd=workdir, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr)
    assert (success.read_bytes() if success.exists() else None) == before  # nothing published


# an optimiser's whole state (L-BFGS: iterate, gradient, history) killed in its fit; an iterate
# (k-means' centroids) whose run was killed publishing, its worker-written labels in its staging
KILLS = {"lbfgs": "fit", "kmeans": "publish"}


def test_checkpoint_every_is_validated(data, capsys):
    spec = write_spec(data / "s.toml", inputs={"X": "data/X.zarr", "y": "data/y.zarr"}, output="out",
                      extra="\n[run]\ncheckpoint_every = -1\n")
    code, _, err = run_cli(["run", str(spec)], capsys)
    assert code == 2 and err == "arrayjob: error: run.checkpoint_every: expected a number of seconds >= 0, got -1\n"
    assert not (data / "out").exists()
