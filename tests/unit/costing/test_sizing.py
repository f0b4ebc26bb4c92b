"""The node count a job runs on, chosen from its estimate (``costing.sizing.choose_nodes``):
memory-bound, efficiency-bound, deadline-bound, fixed; metadata only, no Ray."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import zarr

from arrayjob import runner
from arrayjob.costing.estimate import DEFAULT_NODE_STARTUP_SECONDS
from arrayjob.costing.prices import Instance, load_prices
from arrayjob.costing.profile import load_profile
from arrayjob.costing.sizing import MIN_EFFICIENCY, choose_nodes, usable_bytes
from arrayjob.errors import CapacityError, CostLimitError
from arrayjob.spec import load_spec
from tests.harness.helpers import run_cli, write_spec

# a node whose object store holds 1 GiB; the plan may fill 80 % of it
SMALL = Instance("small", usd_per_hour=0.1, vcpus=4, memory_gib=4, object_store_gib=1.0)
BIG = Instance("big", usd_per_hour=0.2, vcpus=4, memory_gib=16, object_store_gib=3.0)


@pytest.fixture
def big(workdir: Path) -> Path:
    """Metadata only: logreg on X 5·10⁷ × 16 float64 (6.4 GB) in chunks of 10⁶ rows."""
    for name, shape, chunks in (("X", (5 * 10**7, 16), (10**6, 16)), ("y", (5 * 10**7,), (10**6,))):
        zarr.create_array(str(workdir / f"{name}.zarr"), shape=shape, chunks=chunks, dtype="f8")
    return write_spec(workdir / "job.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out",
                      params="max_iter = 20\n")


def _choose(spec_path: Path, overrides: tuple[str, ...] = (), **kw):  # type: ignore[no-untyped-def]
    """The choice for a cluster at an address (a local Ray is this machine: never sized)."""
    spec = load_spec(spec_path, ['cluster.address="auto"', *overrides])
    job = runner.prepare(spec)
    return choose_nodes(job, spec, instance=kw.pop("instance", SMALL), prices=load_prices(),
                        profile=load_profile(), **kw)


def test_memory_bound_is_the_smallest_count_whose_stores_hold_the_plan(big):
    choice = _choose(big)
    assert choice.rule == "memory" and choice.fits and choice.nodes == choice.needed
    priced = {p.nodes: p for p in choice.priced}
    assert priced[choice.nodes].peak_bytes <= usable_bytes(SMALL) and priced[choice.nodes].resident_fraction == 1
    assert priced[choice.nodes - 1].resident_fraction < 1  # one fewer does not hold it: it would stream
    assert choice.nodes == 9  # 50 blocks of 136 MB: 8 nodes would hold 7 of them on one
    assert choice.line.startswith("9 × small: the smallest count whose object stores hold its peak of ")
    assert choice.line.endswith("no cluster.max_nodes, so no more")


def test_min_nodes_is_a_floor(big):
    choice = _choose(big, ("cluster.min_nodes=10",))
    assert choice.nodes == 10 and "cluster.min_nodes" in choice.reason


def test_efficiency_bound_raises_while_the_extra_nodes_pay(big):
    choice = _choose(big, ("cluster.max_nodes=256",), instance=BIG)
    assert choice.rule == "efficiency" and choice.nodes > choice.needed == 3
    # efficiency of the time the nodes work: every count waits alike for its nodes to start
    walls = {p.nodes: p.wall_seconds - p.scale_up_seconds for p in choice.priced}
    assert all(p.scale_up_seconds == DEFAULT_NODE_STARTUP_SECONDS for p in choice.priced)
    efficiency = {n: walls[choice.needed] * choice.needed / (w * n) for n, w in walls.items()}
    assert efficiency[choice.nodes] >= MIN_EFFICIENCY
    # the next count tried (a quarter more) does not pay for itself, and the line says so
    after = min(n for n in walls if n > choice.nodes)
    assert after == math.ceil(choice.nodes * 1.25) and efficiency[after] < MIN_EFFICIENCY
    assert f"; {after} would finish " in choice.line and "the dollars" in choice.line
    # without max_nodes the count is never raised; with it, never past it
    assert _choose(big, instance=BIG).nodes == 3
    capped = _choose(big, ("cluster.max_nodes=4",), instance=BIG)
    assert capped.nodes == 4 and capped.line.endswith("cluster.max_nodes is 4")


def test_deadline_bound_is_the_cheapest_count_that_meets_it(big):
    base = _choose(big, ("cluster.max_nodes=64",))
    walls = {p.nodes: p.wall_seconds for p in base.priced}
    n = max(walls)  # a deadline just above what the largest count tried takes
    deadline = walls[n] * 1.01
    choice = _choose(big, ("cluster.max_nodes=64",), deadline=deadline)
    assert choice.rule == "deadline" and choice.estimate.wall_seconds <= deadline
    priced = {p.nodes: p for p in choice.priced}
    assert priced[choice.nodes - 1].wall_seconds > deadline  # one fewer is too slow
    assert all(p.dollars >= priced[choice.nodes].dollars for p in priced.values() if p.wall_seconds <= deadline)
    assert "the cheapest count the estimate finishes within" in choice.line
    # a deadline no count meets is exit 3, naming the fastest
    with pytest.raises(CostLimitError, match="no node count up to 64 meets --deadline"):
        _choose(big, ("cluster.max_nodes=64",), deadline=0.5)


def test_a_local_ray_is_priced_on_this_machine(big):
    spec = load_spec(big, [])
    choice = choose_nodes(runner.prepare(spec), spec, instance=SMALL, prices=load_prices(), profile=load_profile())
    assert (choice.nodes, choice.rule, choice.fits, choice.needed) == (1, "unsized", False, 9)
    assert choice.line == "1 × small: a local Ray: the job runs on this machine; 9 nodes would hold its plan " \
                          "in memory, fewer stream their inputs"
    assert choice.estimate.resident_fraction < 1  # priced as the run goes: streaming


def test_max_nodes_too_small_names_the_count_needed(big):
    with pytest.raises(CapacityError) as raised:
        _choose(big, ("cluster.max_nodes=3",))
    assert str(raised.value).startswith("the plan needs 9 × small to hold its peak of ")
    assert str(raised.value).endswith("but cluster.max_nodes is 3")


def test_fixed_count_says_when_it_does_not_fit(big):
    choice = _choose(big, nodes=2)
    assert (choice.nodes, choice.rule, choice.fits, choice.needed) == (2, "nodes", False, 9)
    assert "fixed by --nodes; its plan needs" in choice.line and "9 nodes would hold it" in choice.line
    with pytest.raises(CapacityError, match="--nodes 10 is above cluster.max_nodes"):
        _choose(big, ("cluster.max_nodes=9",), nodes=10)


def test_estimate_prints_the_choice(big, workdir, capsys):
    prices = workdir / "prices.toml"
    prices.write_text(load_prices().source and Path(load_prices().source).read_text()
                      + '"small" = { usd_per_hour = 0.1, vcpus = 4, memory_gib = 4, object_store_gib = 1.0 }\n')
    code, out, err = run_cli(["estimate", str(big), "--prices", str(prices), "--set", 'cluster.node_type="small"',
                              "--set", "cluster.max_nodes=256"], capsys)
    assert code == 0, err
    assert " Nodes: 9 × small: the smallest count whose object stores hold its peak of 816.0 MB per node" in out
    code, out, _ = run_cli(["estimate", str(big), "--prices", str(prices), "--instance-type", "small",
                            "--nodes", "9", "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["nodes"]["count"] == 9 and doc["choice"]["rule"] == "nodes"
    code, _, err = run_cli(["estimate", str(big), "--prices", str(prices), "--instance-type", "small",
                            "--set", "cluster.max_nodes=2"], capsys)
    assert code == 7 and err.count("\n") == 1 and "needs 9 × small" in err


def test_spec_keys_are_checked(big, capsys):
    code, _, err = run_cli(["estimate", str(big), "--set", "cluster.min_nodes=5", "--set", "cluster.max_nodes=4"],
                           capsys)
    assert code == 2 and "cluster.min_nodes: expected at most cluster.max_nodes (4), got 5" in err
    code, _, err = run_cli(["estimate", str(big), "--set", 'cluster.scale_timeout="soon"'], capsys)
    assert code == 2 and "cluster.scale_timeout: expected a duration like 90s, 10m or 1.5h" in err
    assert load_spec(big, ['cluster.scale_timeout="2m"']).cluster.scale_timeout_seconds == 120


def test_a_local_ray_cannot_be_sized(big, workdir, capsys):
    for args in (["--nodes", "2"], ["--deadline", "5m"], ["--set", "cluster.max_nodes=4"]):
        code, out, err = run_cli(["run", str(big), *args], capsys)
        assert code == 2 and out == "" and "sizing the cluster needs a Ray with an autoscaler" in err, err
    assert not (workdir / "out").exists()


# -- waiting for the nodes the autoscaler adds (issue #16: the estimate had no scale-up time) --


def _estimate(spec_path: Path, overrides: tuple[str, ...] = (), **kw):  # type: ignore[no-untyped-def]
    from arrayjob.costing.estimate import estimate_job

    spec = load_spec(spec_path, ['cluster.address="auto"', *overrides])
    return estimate_job(runner.prepare(spec), spec, instance=kw.pop("instance", BIG), prices=load_prices(),
                        profile=load_profile(), **kw)


def test_nodes_to_add_are_waited_for_and_paid_for_while_they_start(big):
    base = _estimate(big, ('cluster.node_startup="45s"',), nodes=4)
    grown = _estimate(big, ('cluster.node_startup="45s"',), nodes=4, nodes_added=3)
    assert (base.nodes_added, base.scale_up_seconds) == (0, 0.0)
    # the job waits 45 s for the three new nodes before reading anything ...
    assert grown.scale_up_seconds == 45.0
    assert grown.wall_seconds == pytest.approx(base.wall_seconds + 45.0)
    # ... and pays for them from their boot: 3 × 45 node-seconds more, not 4 × 45
    assert grown.node_seconds == pytest.approx(base.node_seconds + 3 * 45.0)
    extra = grown.dollars()["compute"] - base.dollars()["compute"]
    assert extra == pytest.approx(3 * 45.0 / 3600 * BIG.usd_per_hour)
    doc = grown.as_dict()
    assert (doc["nodes"]["added"], doc["nodes"]["scale_up_seconds"]) == (3, 45.0)
    assert doc["wall_seconds"] == pytest.approx(base.wall_seconds + 45.0, abs=1e-3)
    assert "3 node(s) added by the autoscaler, 45 s to start" in grown.assumptions()


def test_node_startup_comes_from_the_spec_else_the_price_table_else_a_minute(big):
    from arrayjob.costing.estimate import node_startup_seconds

    spec = load_spec(big, [])
    booting = Instance("booting", usd_per_hour=0.1, vcpus=4, memory_gib=16, node_startup_seconds=90.0)
    assert node_startup_seconds(spec, BIG) == DEFAULT_NODE_STARTUP_SECONDS == 60.0
    assert node_startup_seconds(spec, booting) == 90.0
    for given, expected in (('"2m"', 120.0), ("0", 0.0), ("15", 15.0)):
        assert node_startup_seconds(load_spec(big, [f"cluster.node_startup={given}"]), booting) == expected


def test_a_price_table_gives_a_node_types_startup(workdir):
    table = workdir / "prices.toml"
    table.write_text(Path(load_prices().source).read_text()
                     + '"slow" = { usd_per_hour = 0.1, vcpus = 4, memory_gib = 4, node_startup = "3m" }\n')
    prices = load_prices(table)
    assert prices.instance("slow").node_startup_seconds == 180.0
    assert prices.instance("r5.2xlarge").node_startup_seconds is None


def test_a_sized_cluster_at_an_address_starts_the_nodes_it_lacks(big):
    choice = _choose(big, ("cluster.max_nodes=4",), instance=BIG)
    assert choice.nodes == 4 and choice.estimate.nodes_added == 4  # estimate does not connect: none up
    assert choice.estimate.scale_up_seconds == DEFAULT_NODE_STARTUP_SECONDS
    some_up = _choose(big, ("cluster.max_nodes=4",), instance=BIG, nodes_up=3)
    assert some_up.estimate.nodes_added == 1
    assert some_up.estimate.node_seconds == pytest.approx(choice.estimate.node_seconds - 3 * 60.0)
    all_up = _choose(big, ("cluster.max_nodes=4",), instance=BIG, nodes_up=4)
    assert (all_up.estimate.nodes_added, all_up.estimate.scale_up_seconds) == (0, 0.0)
    # a cluster deployed at the chosen size is up before the job is submitted
    deployed = _choose(big, ("cluster.max_nodes=4",), instance=BIG, nodes_up=None)
    assert (deployed.nodes, deployed.estimate.nodes_added) == (4, 0)
    # a local Ray never grows, whatever --nodes says
    spec = load_spec(big, [])
    local = choose_nodes(runner.prepare(spec), spec, instance=BIG, prices=load_prices(), profile=load_profile(),
                         nodes=4)
    assert (local.estimate.nodes_added, local.estimate.scale_up_seconds) == (0, 0.0)


def test_estimate_shows_the_scale_up_on_its_own_line(big, capsys):
    code, out, err = run_cli(["estimate", str(big), "--instance-type", "r5.2xlarge", "--set", 'cluster.address="auto"',
                              "--set", "cluster.max_nodes=2", "--set", 'cluster.node_startup="50s"'], capsys)
    assert code == 0, err
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("scale up"))
    assert lines[at + 1].split()[1:4] == ["Start", "2", "×"] and "50.0" in lines[at + 1]
    code, out, _ = run_cli(["estimate", str(big), "--instance-type", "r5.2xlarge", "--nodes", "2"], capsys)
    assert code == 0 and "scale up" not in out
    code, _, err = run_cli(["estimate", str(big), "--set", 'cluster.node_startup="soon"'], capsys)
    assert code == 2 and "cluster.node_startup: expected a duration like 45s or 2m, or 0" in err
