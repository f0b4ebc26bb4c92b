"""`arrayjob estimate` and `calibrate`: predictions from metadata, prices, and the cost limit."""

from __future__ import annotations

import json
import shutil

import pytest

from arrayjob.costing.prices import load_prices
from tests.harness.helpers import logreg_data, run_cli, write_array, write_spec

KEYS = {"wall_seconds", "storage", "network", "memory", "tasks", "nodes", "dollars", "stages"}


@pytest.fixture
def spec(workdir):
    X, y = logreg_data(4000, 6)
    write_array("X.zarr", X, (500, 6))
    write_array("y.zarr", y, (500,))
    return str(write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out",
                          params="max_iter = 20\n"))


def test_estimate_reads_no_chunk(spec, workdir, capsys):
    code, before, err = run_cli(["estimate", spec, "--format", "json"], capsys)
    assert (code, err) == (0, "")
    for array in ("X.zarr", "y.zarr"):
        shutil.rmtree(workdir / array / "c")
    code, after, _ = run_cli(["estimate", spec, "--format", "json"], capsys)
    assert code == 0 and json.loads(after) == json.loads(before)
    doc = json.loads(before)
    assert set(doc) >= KEYS
    assert doc["stages"][1]["storage.bytes_read"] == 4000 * 6 * 8 + 4000 * 8  # every block once, uncompressed
    # and the metadata zarr reads when the driver writes the result, as a run counts it
    assert doc["storage"]["bytes_read"] == doc["stages"][1]["storage.bytes_read"] + doc["stages"][3]["storage.bytes_read"]
    assert doc["iterations"] == {"assumed": 20, "from": "params.max_iter, an upper bound"}
    assert [s["name"] for s in doc["stages"]] == ["connect", "load", "fit", "write", "shutdown"]
    assert doc["stages"][2]["runs"] == 21 and doc["stages"][2]["storage.bytes_read"] == 0
    assert not (workdir / "out").exists()


def test_more_iterations_cost_more_and_dollars_follow_the_price_table(spec, capsys):
    docs = {}
    for k in (5, 50):
        code, out, _ = run_cli(["estimate", spec, "--format", "json", "--iterations", str(k), "--nodes", "4",
                                "--instance-type", "r5.2xlarge"], capsys)
        assert code == 0
        docs[k] = json.loads(out)
    assert docs[50]["wall_seconds"] > docs[5]["wall_seconds"]
    assert docs[50]["iterations"]["from"] == "--iterations"
    rate = load_prices().instance("r5.2xlarge").usd_per_hour
    doc = docs[50]
    assert doc["nodes"]["node_seconds"] == pytest.approx(4 * doc["wall_seconds"], rel=1e-3)
    assert doc["dollars"]["compute"] == pytest.approx(doc["nodes"]["node_seconds"] / 3600 * rate, rel=1e-3)


def test_table_ends_with_a_one_line_summary(spec, capsys):
    code, out, _ = run_cli(["estimate", spec, "--instance-type", "m5.xlarge", "--nodes", "2"], capsys)
    assert code == 0 and "OVERALL TOTAL" in out and "price table aws-us-east-1-2026-11" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("This job will read 224.0 kB in ") and " on 2 × m5.xlarge: about $" in last


def test_max_cost_exits_3_before_running(spec, workdir, capsys):
    code, _, err = run_cli(["estimate", spec, "--instance-type", "r5.4xlarge", "--nodes", "100",
                            "--max-cost", "0.000001"], capsys)
    assert code == 3 and err.startswith("arrayjob: error: estimated cost $") and "exceeds --max-cost" in err
    code, out, err = run_cli(["run", spec, "--instance-type", "r5.4xlarge", "--max-cost", "0"], capsys)
    assert code == 3 and out == "" and not (workdir / "out").exists()


def test_unknown_instance_type(spec, capsys):
    code, _, err = run_cli(["estimate", spec, "--instance-type", "z9.huge"], capsys)
    assert code == 2 and err.startswith("arrayjob: error: --instance-type: 'z9.huge' is not in price table")


@pytest.mark.parametrize("total,limit,message", [
    (3.9e-05, 0.0, "estimated cost $0.00004 exceeds --max-cost $0"),
    (0.0016, 0.0, "estimated cost $0.0016 exceeds --max-cost $0"),
    (0.00012, 0.0001, "estimated cost $0.00012 exceeds --max-cost $0.0001"),
    (2.5, 1e-06, "estimated cost $2.5000 exceeds --max-cost $0.000001"),
])
def test_cost_limit_message_shows_the_total_above_the_limit(total, limit, message):
    from types import SimpleNamespace

    from arrayjob.cli.commands import _check_cost
    from arrayjob.errors import CostLimitError

    with pytest.raises(CostLimitError) as raised:
        _check_cost(SimpleNamespace(dollars=lambda: {"total": total}), limit)
    assert str(raised.value) == message


def test_max_cost_0_on_a_free_instance_shows_the_storage_cents(spec, capsys):
    code, _, err = run_cli(["estimate", spec, "--max-cost", "0", "--format", "json"], capsys)
    assert code == 3 and err.count("\n") == 1
    shown = err.split("estimated cost $")[1].split()[0]
    assert float(shown) > 0 and err.endswith("exceeds --max-cost $0\n")


def test_an_estimate_from_the_shipped_profile_says_it_is_uncalibrated(spec, workdir, capsys):
    """Before `arrayjob calibrate` has run here, the estimate says so and how to calibrate; after, it does not."""
    import dataclasses

    from arrayjob.costing.profile import SHIPPED, UNCALIBRATED, save_profile

    code, table, _ = run_cli(["estimate", spec], capsys)
    assert code == 0 and f" Estimate {UNCALIBRATED}" in table.splitlines()
    code, raw, _ = run_cli(["estimate", spec, "--format", "json"], capsys)
    assert json.loads(raw)["profile"] == {"name": SHIPPED.name, "measured_at": None, "calibrated": False}

    save_profile(dataclasses.replace(SHIPPED, name="this machine", measured_at="2026-11-25T13:00:00+00:00"))
    code, table, _ = run_cli(["estimate", spec], capsys)
    assert code == 0 and "uncalibrated" not in table
    code, raw, _ = run_cli(["estimate", spec, "--format", "json"], capsys)
    assert json.loads(raw)["profile"]["calibrated"] is True


def test_a_big_driver_output_is_priced_by_its_size_without_writing_it():
    """PageRank's rank vector for 10⁹ nodes is 8 GB: the estimate used to write that many
    ones to a temporary directory to count the requests (half of each 60 s estimate). A
    driver array is one chunk, so it makes the requests a one-element array makes, and its
    bytes are its size."""
    import time

    from arrayjob.io.arrays import write_requests

    n = 10**9
    start = time.perf_counter()
    big = write_requests({"rank": ((n,), "float64")}, {})
    assert time.perf_counter() - start < 5
    small = write_requests({"rank": ((1,), "float64")}, {})
    assert (big.put_requests, big.get_requests) == (small.put_requests, small.get_requests)
    assert 8 * n <= big.bytes_written <= 8 * n + small.bytes_written + 100  # metadata: a few more digits
