"""Estimates that learn (issue 29): a spec's recent runs correct the profile's estimate, the
estimate names the history it used, and a missing or unreadable history falls back to the
profile with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arrayjob.costing.history import OTHER, RunRecord, recent_history, save_record, storage_key
from arrayjob.costing.profile import SHIPPED
from arrayjob.spec import load_spec
from tests.harness.helpers import logreg_data, run_cli, write_array, write_spec


@pytest.fixture
def history(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = workdir / "history"
    monkeypatch.setenv("ARRAYJOB_HISTORY", str(directory))
    return directory


@pytest.fixture
def spec(workdir: Path) -> str:
    X, y = logreg_data(2000, 4)
    write_array("X.zarr", X, (500, 4))
    write_array("y.zarr", y, (500,))
    return str(write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out",
                          params="max_iter = 30\n"))


def estimate(spec: str, capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code, out, err = run_cli(["estimate", spec, "--format", "json", *args], capsys)
    assert (code, err) == (0, ""), err
    return json.loads(out)


def records_of(spec_path: str, doc: dict, ratio: float, iterations: int, runs: int, directory: Path,
               start: float = 1000.0, prefix: str = "r") -> list[RunRecord]:
    """``runs`` records of the spec at ``spec_path`` whose every stage took ``ratio`` × what the
    profile's estimate ``doc`` predicted, after ``iterations`` iterations."""
    spec = load_spec(spec_path)
    stages = {s["name"]: (s["profile_wall_seconds"], ratio * s["profile_wall_seconds"]) for s in doc["stages"]
              if s["name"] != "shutdown"}
    shutdown = next(s["profile_wall_seconds"] for s in doc["stages"] if s["name"] == "shutdown")
    stages[OTHER] = (shutdown, ratio * shutdown)
    made = []
    for i in range(runs):
        record = RunRecord(run_id=f"{prefix}{i}", spec_sha256=spec.digest(), algorithm=spec.algorithm,
                           storage=storage_key(spec), profile=f"{SHIPPED.name} @ shipped", finished_at=start + i,
                           nodes=1, iterations=iterations, wall_seconds=(doc["wall_seconds"], ratio * doc["wall_seconds"]),
                           stages=stages)
        save_record(record, directory)
        made.append(record)
    return made


def test_a_specs_history_corrects_the_estimate_and_is_named(spec, history, capsys):
    plain = estimate(spec, capsys, "--iterations", "7")
    assert plain["history"]["used"] is False and "estimated from the profile alone" in plain["history"]["line"]
    records_of(spec, plain, 2.0, 7, 3, history)
    learned = estimate(spec, capsys)
    # the iterations the spec's runs did, and every stage at the ratio they measured
    assert learned["iterations"]["assumed"] == 7 and "last 3 run(s)" in learned["iterations"]["from"]
    assert learned["wall_seconds"] == pytest.approx(2 * plain["wall_seconds"], rel=1e-3)
    for before, after in zip(plain["stages"], learned["stages"], strict=True):
        assert after["profile_wall_seconds"] == pytest.approx(before["wall_seconds"], rel=1e-3)
        assert after["wall_seconds"] == pytest.approx(2 * before["wall_seconds"], rel=1e-3)
    assert learned["history"]["kind"] == "spec" and learned["history"]["run_ids"] == ["r0", "r1", "r2"]
    # the table says which history it used, in one line
    code, table, _ = run_cli(["estimate", spec], capsys)
    lines = [line for line in table.splitlines() if line.startswith(" History: ")]
    assert code == 0 and len(lines) == 1 and "the last 3 runs of this spec" in lines[0] and str(history) in lines[0]


def test_the_median_of_the_recent_runs_and_only_this_profiles(spec, history, capsys):
    plain = estimate(spec, capsys, "--iterations", "30")
    records_of(spec, plain, 1.0, 30, 2, history, start=1)
    records_of(spec, plain, 3.0, 30, 1, history, start=10, prefix="slow")  # one slow run among three
    assert estimate(spec, capsys)["wall_seconds"] == pytest.approx(plain["wall_seconds"], rel=1e-3)
    other = load_spec(spec)
    save_record(RunRecord("other-profile", other.digest(), "logreg", "local", "a calibrated one @ 2026", 20, 1, 30,
                          (1.0, 1.0), {"load": (1.0, 50.0)}), history)
    assert estimate(spec, capsys)["wall_seconds"] == pytest.approx(plain["wall_seconds"], rel=1e-3)


def test_the_wall_time_is_the_median_of_the_runs_totals_shared_by_the_stages(spec, history, capsys):
    """Three runs, each slow in a different stage: every stage's median ratio is 1, yet every
    run took longer than the profile said. The estimate's wall time is the median run's (not
    the profile's, as a sum of per-stage medians would say); the stages keep their shares."""
    plain = estimate(spec, capsys, "--iterations", "30")
    one = load_spec(spec)
    profile = {s["name"]: s["profile_wall_seconds"] for s in plain["stages"] if s["name"] != "shutdown"}
    profile[OTHER] = next(s["profile_wall_seconds"] for s in plain["stages"] if s["name"] == "shutdown")
    slow = sorted(profile, key=profile.get)[-3:]  # the three longest stages, one slow in each run
    totals = []
    for i, name in enumerate(slow):
        stages = {n: (p, p * (3.0 if n == name else 1.0)) for n, p in profile.items()}
        totals.append(sum(m for _, m in stages.values()))
        save_record(RunRecord(f"r{i}", one.digest(), one.algorithm, storage_key(one), f"{SHIPPED.name} @ shipped",
                              1000.0 + i, 1, 30, (plain["wall_seconds"], totals[-1]), stages), history)
    learned = estimate(spec, capsys)
    median_total = sorted(totals)[1]
    assert learned["wall_seconds"] == pytest.approx(median_total, rel=1e-3)
    assert learned["wall_seconds"] > 1.1 * plain["wall_seconds"]
    share = median_total / plain["wall_seconds"]
    for before, after in zip(plain["stages"], learned["stages"], strict=True):
        assert after["wall_seconds"] == pytest.approx(share * before["wall_seconds"], rel=1e-3, abs=1e-4)
    assert f"the wall time ×{share:.2f} of the profile's" in learned["history"]["line"]


def test_another_spec_of_the_algorithm_lends_its_ratios_not_its_iterations(spec, history, workdir, capsys):
    plain = estimate(spec, capsys)
    sibling = write_spec(workdir / "other.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out2",
                         params="max_iter = 30\n")
    sibling_doc = estimate(str(sibling), capsys, "--iterations", "4")
    records_of(str(sibling), sibling_doc, 1.5, 4, 2, history)
    learned = estimate(spec, capsys)
    assert learned["history"]["kind"] == "algorithm" and "logreg on the same storage" in learned["history"]["line"]
    assert learned["iterations"]["assumed"] == 30
    assert learned["wall_seconds"] == pytest.approx(1.5 * plain["wall_seconds"], rel=1e-3)


def test_an_unreadable_history_falls_back_to_the_profile_in_one_line(spec, history, capsys):
    plain = estimate(spec, capsys)
    records_of(spec, plain, 2.0, 30, 2, history)
    spoiled = next(history.rglob("r1.json"))
    spoiled.write_text('{"run_id": "r1", "stages": ')
    doc = estimate(spec, capsys)
    assert doc["history"]["used"] is False and doc["wall_seconds"] == plain["wall_seconds"]
    assert doc["history"]["line"].startswith(f"history {spoiled} is unreadable (")
    assert doc["history"]["line"].endswith("; estimated from the profile alone")
    code, table, _ = run_cli(["estimate", spec], capsys)
    assert code == 0 and sum(line.startswith(" History: history ") for line in table.splitlines()) == 1


def test_no_history_at_all_is_said_and_off_says_nothing(spec, workdir, monkeypatch, capsys):
    monkeypatch.setenv("ARRAYJOB_HISTORY", str(workdir / "nowhere"))
    doc = estimate(spec, capsys)
    assert doc["history"]["line"] == (f"no runs of this spec or of logreg on local in {workdir / 'nowhere'} (none); "
                                      "estimated from the profile alone")
    assert recent_history(load_spec(spec), SHIPPED, directory=None).kind is None
    monkeypatch.setenv("ARRAYJOB_HISTORY", "off")
    code, table, _ = run_cli(["estimate", spec], capsys)
    assert code == 0 and "History:" not in table


