"""The memory model's rules on plans alone (no Ray): what a run applies and an estimate prices
(``planner.memory``). The whole-job equality of the two is ``test_memory_model.py``."""

from __future__ import annotations

import arrayjob.lazy as la
from arrayjob.io.locations import ArrayInfo, parse_uri
from arrayjob.planner.memory import Admission, KeptBlock, MemoryBudget, MemoryModel
from arrayjob.planner.pipeline import make_plan
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.planner.residency import StreamRates

CLUSTER = ClusterShape(nodes=1, workers_per_node=2)
RATES = StreamRates(bucket_bytes_per_s=1e8, spill_bytes_per_s=1e9, spill_capacity=2**30)
ROWS, COLS, CHUNK = 4000, 8, 500  # X: 8 blocks of 32 kB


def plan(tmp_path, program):
    options = PlanOptions(cluster=CLUSTER, target_block_bytes=CHUNK * COLS * 8, tiling="naive", fusion="none")
    return make_plan(la.capture(list(program.values())), options)


def x_array(tmp_path):
    return la.from_zarr(ArrayInfo("X", parse_uri(str(tmp_path / "X.zarr")), (ROWS, COLS), "float64",
                                  (CHUNK, COLS), 3))


def test_without_a_budget_nothing_is_decided(tmp_path):
    x = x_array(tmp_path)
    model = MemoryModel(None, CLUSTER, spills=True)
    decided = model.run(plan(tmp_path, {"s": x.sum(axis=0)}).physical)
    assert decided.residency is None and decided.order is None and not decided.spilled_results


def test_a_kept_array_held_in_memory_takes_the_budget(tmp_path):
    x = x_array(tmp_path)
    budget = 3 * ROWS * COLS * 8  # X, twice X kept, and room for the sums' intermediates
    model = MemoryModel(MemoryBudget(budget, repeats=4, rates=RATES), CLUSTER, spills=True)
    p = plan(tmp_path, {"k": x * 2.0})
    decided = model.run(p.physical, keeps=True)
    assert not decided.kept_to_spill  # by the plan's sizes it fits beside X
    before = list(model.resident_bytes)
    model.keep(p.physical, [("persist:k", len(p.assembly[0].blocks))], decided)
    assert model.resident_bytes[0] == before[0] + ROWS * COLS * 8  # charged
    model.release(["persist:k"])
    assert model.resident_bytes == before  # and given back


def test_a_persist_that_does_not_fit_goes_to_the_spill_and_comes_back_as_room_allows(tmp_path):
    x = x_array(tmp_path)
    nbytes = ROWS * COLS * 8
    model = MemoryModel(MemoryBudget(2 * nbytes, repeats=4, rates=RATES), CLUSTER, spills=True)
    twice, thrice = plan(tmp_path, {"k": x * 2.0}), plan(tmp_path, {"k": x * 3.0})
    d2 = model.run(twice.physical, keeps=True)
    model.keep(twice.physical, [("a:k", 8)], d2)
    d3 = model.run(thrice.physical, keeps=True)
    assert d3.kept_to_spill  # X and the first kept array take the budget
    assert model.keep(thrice.physical, [("b:k", 8)], d3) == {}  # no room: none read back
    admitted = model.release(["a:k"])
    assert 0 < len(admitted["b:k"]) <= 8 and model.resident_bytes[0] <= 2 * nbytes
    assert isinstance(model.log[-1], Admission) and model.log[-1].after == "release"
    # a program reading the kept array maps the blocks still in the spill, and those that
    # leave memory to make room for its intermediates (the last admitted first)
    reads = plan(tmp_path, {"s": la.cached("b:k", (ROWS, COLS), "float64", (CHUNK, COLS)).sum(axis=0)})
    decided = model.run(reads.physical)
    in_memory = set(admitted["b:k"]) - set(decided.demoted_kept.get("b:k", ()))
    assert decided.kept_from_spill == {KeptBlock("b:k", i) for i in range(8) if i not in in_memory}


def test_a_kept_array_goes_to_the_spill_only_if_the_executor_can_put_it_there(tmp_path):
    x = x_array(tmp_path)
    nbytes = ROWS * COLS * 8
    for spills in (True, False):
        model = MemoryModel(MemoryBudget(nbytes + nbytes // 2, repeats=4, rates=RATES), CLUSTER, spills=spills)
        p = plan(tmp_path, {"k": x * 2.0})
        assert model.run(p.physical, keeps=True).kept_to_spill is spills
    no_disk = StreamRates(bucket_bytes_per_s=1e8, spill_bytes_per_s=1e9, spill_capacity=0)
    model = MemoryModel(MemoryBudget(nbytes + nbytes // 2, repeats=4, rates=no_disk), CLUSTER, spills=True)
    assert not model.run(plan(tmp_path, {"k": x * 2.0}).physical, keeps=True).kept_to_spill


def test_blocks_streamed_under_the_budget_are_named_and_ordered(tmp_path):
    x = x_array(tmp_path)
    model = MemoryModel(MemoryBudget(ROWS * COLS * 8 // 2, repeats=4, rates=RATES), CLUSTER, spills=True)
    p = plan(tmp_path, {"s": x.sum(axis=0)})
    loaded = model.load(p.physical)
    assert loaded.residency is not None and loaded.residency.streams
    decided = model.run(p.physical)
    assert decided.residency is None  # decided by the load
    assert decided.streamed == loaded.residency.streamed and decided.order is not None
    again = model.run(p.physical)
    assert again.streamed is decided.streamed and again.order is decided.order  # cached per program
