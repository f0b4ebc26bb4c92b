"""The integration tests of ``tests.unit.io.test_lease``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import re

import numpy as np
import pytest

from arrayjob.io.backend import backend_for
from arrayjob.io.locations import StorageOptions, parse_uri
from tests.harness.helpers import (
    published,
    read_result,
    run_cli,
    without_progress,
    write_array,
    write_spec,
)
from tests.unit.io.test_lease import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    _race,
    _stale_lease,
    place,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("runs", [2, 4])
def test_racing_kmeans_runs_publish_once_with_worker_written_labels(place, workdir, runs, monkeypatch):
    """Whole runs (validate, lease, Ray, workers writing labels, commit) racing in threads of one driver."""
    from arrayjob import runner
    from arrayjob.spec import load_spec

    monkeypatch.setenv("ARRAYJOB_LEASE_SECONDS", "5")
    base, _, endpoint = place
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(c, 0.1, (400, 2)) for c in (0.0, 5.0, 10.0)])
    write_array(f"{base}/X.zarr", X, (300, 2), endpoint=endpoint)
    spec_path = write_spec(workdir / "k.toml", inputs={"X": f"{base}/X.zarr"}, output=f"{base}/out",
                           algorithm="kmeans", params="k = 3\n",
                           storage=f'endpoint_url = "{endpoint}"' if endpoint else "")
    specs = [load_spec(str(spec_path), []) for _ in range(runs)]
    lines: list[str] = []
    outcomes = _race(runs, lambda i: runner.run(specs[i], notify=lines.append))
    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    ran = [o for o in outcomes if not o.skipped]
    assert len(ran) == 1
    assert all(o.manifest["run_id"] == ran[0].manifest["run_id"] for o in outcomes)
    group = read_result(f"{base}/out", endpoint)
    labels = group["labels"][:]
    assert labels.shape == (1200,) and sorted(np.bincount(labels)) == [400, 400, 400]
    backend = backend_for(parse_uri(f"{base}/out"), specs[0].storage)
    assert {k.split("/")[0] for k in backend.list()} == {"_SUCCESS", "runs"}
    assert {k.split("/")[1] for k in backend.list("runs")} == {ran[0].manifest["run_id"]}


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_stale_lease_of_a_dead_run_is_taken_over_and_its_staging_removed(workdir, capsys):
    from tests.harness.helpers import logreg_data

    X, y = logreg_data(400, 2)
    write_array("X.zarr", X, (100, 2))
    write_array("y.zarr", y, (100,))
    spec = write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out")
    backend = backend_for(parse_uri(str(workdir / "out")), StorageOptions())
    _stale_lease(backend)
    backend.write_bytes("runs/20240101T000000Z-dead0000/result.zarr/zarr.json", b"{}")  # its half-written run
    code, out, err = run_cli(["run", str(spec)], capsys)
    assert code == 0, err
    assert re.fullmatch(rf"arrayjob: took over {workdir}/out from run 20240101T000000Z-dead0000 on gone-host "
                        r"\(pid 4242, since 2024-01-01T00:00:00\+00:00\): no heartbeat for 36\d\d s \(expiry 60 s\)\n",
                        without_progress(err)), err
    assert [p.name for p in (workdir / "out/runs").iterdir()] == [published("out").rsplit("/", 1)[1]]
    assert not (workdir / "out/_lease").exists()
