"""The integration tests of ``tests.unit.costing.test_history``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json

import pytest

from arrayjob.costing.history import RunRecord
from tests.harness.helpers import published, run_cli
from tests.unit.costing.test_history import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    estimate,
    history,
    records_of,
    spec,
)


def test_a_published_run_is_recorded_once_and_corrects_the_next(ray_session, spec, history, workdir, capsys):
    code, out, err = run_cli(["run", spec, "--json"], capsys)
    assert code == 0, err
    first = json.loads(out)
    assert "arrayjob: history: no runs of this spec" in err and first["estimate"]["history"]["used"] is False
    run_id = published(str(workdir / "out")).rsplit("/", 1)[1]
    [record] = list(history.rglob("*.json"))
    assert record.name == f"{run_id}.json"
    kept = RunRecord.from_json(record.read_text())
    measured = {s["name"]: s["wall_seconds"] for s in first["stages"]}
    assert all(kept.stages[name][1] == pytest.approx(measured[name], abs=1e-3) for name in ("connect", "load", "fit"))
    assert kept.iterations == first["result"]["iterations"] and kept.wall_seconds[1] == first["wall_seconds"]
    # a rerun that finds the output complete publishes nothing and records nothing
    assert run_cli(["run", spec], capsys)[0] == 0 and len(list(history.rglob("*.json"))) == 1
    code, out, err = run_cli(["run", spec, "--json", "--overwrite"], capsys)
    second = json.loads(out)
    assert code == 0 and second["estimate"]["history"]["run_ids"] == [run_id]
    assert f"arrayjob: history: the last 1 run of this spec ({record.parent})" in err
    assert second["estimate"]["iterations"]["assumed"] == first["result"]["iterations"]
    assert len(list(history.rglob("*.json"))) == 2
