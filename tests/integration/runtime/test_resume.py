"""The integration tests of ``tests.unit.runtime.test_resume``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from arrayjob.io.backend import backend_for
from arrayjob.io.checkpoint import (
    CHECKPOINTS,
    Checkpoint,
    CheckpointStore,
    encode,
)
from arrayjob.io.locations import StorageOptions, parse_uri
from tests.harness.helpers import (
    published,
    read_result,
    run_cli,
)
from tests.unit.runtime.test_resume import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    ALGORITHMS,
    KILLS,
    LEASE_SECONDS,
    REPO,
    RNG,
    Interrupted,
    StopAfter,
    _als,
    _contents,
    _cp_als,
    _fit,
    _gmm,
    _killed_run,
    _kmeans,
    _lasso,
    _logreg,
    _multinomial,
    _pagerank,
    _pca,
    _reference,
    _rerun_resumes,
    _rosenbrock,
    _same_result,
    _setup,
    _sparse_linreg,
    _stopped_run,
    ray_address,
    stop_at,
)


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("ray_session")
def test_a_run_stopped_in_load_fit_write_or_publish_resumes(workdir, capsys, stop_at):
    """KMeans: its labels are written by the workers, into the staging a stopped run leaves."""
    spec = _setup("kmeans", workdir)
    reference = _reference(spec, capsys)
    iterations = reference.attrs["iterations"]
    for point in ("load", f"fit:{RNG.randint(1, iterations - 1)}", "write", "publish"):
        output = f"out-{point.replace(':', '-')}"
        _stopped_run(spec, point, stop_at, workdir, capsys, output=output)
        if point != "load":
            assert len(list((workdir / output / CHECKPOINTS).iterdir())) == 1
        _rerun_resumes(spec, output, point, iterations, capsys)
        _same_result("kmeans", read_result(output), reference)


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
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


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(KILLS))
def test_killed_run_resumes_to_the_undisturbed_result(name, workdir, capsys, ray_address, monkeypatch):
    spec = _setup(name, workdir)
    reference = _reference(spec, capsys)
    iterations = reference.attrs["iterations"]
    point = f"fit:{RNG.randint(1, iterations - 1)}" if KILLS[name] == "fit" else KILLS[name]
    _killed_run(spec, point, ray_address, workdir)
    leases = list((workdir / "out" / "_lease").iterdir())
    assert len(leases) == 1 and len(list((workdir / "out" / CHECKPOINTS).iterdir())) == 1
    dead = json.loads(leases[0].read_text())["run_id"]
    if point == "publish":  # its staging is all there, but not published
        assert (workdir / "out" / "runs" / dead / "report.json").exists()
    monkeypatch.setenv("ARRAYJOB_LEASE_SECONDS", LEASE_SECONDS)
    report = _rerun_resumes(spec, "out", point, iterations, capsys)
    _same_result(name, read_result("out"), reference)
    if name == "lbfgs":  # the saves are counted where they were written (its fit writes nothing else)
        fit = next(s for s in report["stages"] if s["name"] == "fit")
        assert fit["storage.put_requests"] == report["checkpoints"]["saved"] > 0
    assert [p.name for p in (workdir / "out" / "runs").iterdir()] == [published("out").rsplit("/", 1)[1]]


@pytest.mark.ray
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("ray_session")
def test_restart_ignores_the_checkpoint_and_another_spec_never_reads_it(workdir, capsys, stop_at):
    spec = _setup("cp_als", workdir)
    reference = _reference(spec, capsys)
    _stopped_run(spec, "fit:4", stop_at, workdir, capsys)
    assert len(list((workdir / "out" / CHECKPOINTS).iterdir())) == 1

    # another spec on the same output: not this checkpoint's
    code, out, err = run_cli(["run", str(spec), "--set", "params.seed=3", "--json"], capsys)
    assert code == 0 and "resumed" not in err, err
    assert json.loads(out)["checkpoints"]["resumed"] is None
    assert not (workdir / "out" / CHECKPOINTS).exists()  # a publish removes every checkpoint

    _stopped_run(spec, "fit:4", stop_at, workdir, capsys, "--overwrite")
    code, out, err = run_cli(["run", str(spec), "--overwrite", "--restart", "--json"], capsys)
    assert code == 0 and "resumed" not in err, err
    assert json.loads(out)["checkpoints"] == {"every_seconds": 0.0, "saved": reference.attrs["iterations"],
                                              "resumed": None}
    _same_result("cp_als", read_result("out"), reference)
