"""The time model prices work by kind: an exp is not an add, a QR is not one flop per element."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from arrayjob import lazy as la
from arrayjob.algorithms.tsqr import SUB_ROWS, cholesky_qr2_program, gram_program, tsqr_program
from arrayjob.costing.estimate import _compute_seconds
from arrayjob.costing.profile import SHIPPED, MachineProfile, load_profile
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.planner.cost import WORK_KINDS, kernel_work, qr_flops
from arrayjob.planner.kernel import Kernel
from arrayjob.planner.pipeline import make_plan
from arrayjob.planner.plan import ClusterShape, PlanOptions
from tests.harness.helpers import write_array

CLUSTER = ClusterShape(nodes=1, workers_per_node=2)
ROWS, COLS = 40_000, 16


@pytest.fixture
def X(tmp_path):
    uri = str(tmp_path / "X.zarr")
    write_array(uri, np.ones((ROWS, COLS)), (ROWS // 4, COLS))
    return la.from_zarr(open_array_info("X", parse_uri(uri), StorageOptions()))


def _cost(*outputs: la.BlockArray):
    plan = make_plan(la.capture(list(outputs)), PlanOptions(cluster=CLUSTER))
    assert plan.cost is not None
    return plan.cost


def _fit_seconds(cost, profile: MachineProfile) -> float:
    """One run's compute as the estimate schedules it (four equal blocks on two workers)."""
    return _compute_seconds(cost, profile, CLUSTER)


def test_exp_costs_more_than_add_by_the_calibrated_ratio(X):
    heavy, light = _cost(la.exp(X).sum()), _cost((X + 1.0).sum())
    assert heavy.bytes_touched == light.bytes_touched and heavy.tasks == light.tasks
    assert heavy.work["transcendental"] == ROWS * COLS
    assert light.work["elementwise"] - heavy.work["elementwise"] == ROWS * COLS
    profile = dataclasses.replace(SHIPPED, elementwise_per_s=1e9, transcendental_per_s=5e7)
    extra = _fit_seconds(heavy, profile) - _fit_seconds(light, profile)
    expected = ROWS * COLS * (1 / 5e7 - 1 / 1e9) / CLUSTER.workers
    assert extra == pytest.approx(expected, rel=1e-3)
    # twice as slow an exp: the difference doubles
    slower = dataclasses.replace(profile, transcendental_per_s=2.5e7)
    assert _fit_seconds(heavy, slower) - _fit_seconds(light, slower) == pytest.approx(
        ROWS * COLS * (1 / 2.5e7 - 1 / 1e9) / CLUSTER.workers, rel=1e-3)


def test_logaddexp_is_two_transcendental_calls_and_sigmoid_one(X):
    assert _cost(la.logaddexp(0.0, X).sum()).work["transcendental"] == 2 * ROWS * COLS
    assert _cost(la.sigmoid(X).sum()).work["transcendental"] == ROWS * COLS


def test_matrix_vector_is_priced_by_bytes_and_gram_by_flops(X):
    w = la.value("w", (COLS,))
    gemv = _cost(X @ w).work
    assert gemv["contraction_bytes"] >= 8 * ROWS * COLS and "contraction_flops" not in gemv
    gram = _cost(la.einsum("ij,ik->jk", X, X)).work
    assert gram["contraction_flops"] == pytest.approx(2 * ROWS * COLS * COLS)
    assert "contraction_bytes" not in gram


def test_three_operand_einsum_is_priced_at_the_einsum_rate():
    T = la.value("T", (4, 50, 60))
    B, C = la.value("B", (50, 8)), la.value("C", (60, 8))
    work = _cost(la.einsum("ijk,jf,kf->if", T, B, C)).work
    assert work["einsum_flops"] == 2 * 4 * 50 * 60 * 8


def test_map_blocks_declares_its_cost(X):
    _, r = tsqr_program(X, ROWS // 4, with_q=True)
    work = _cost(r).work
    # four blocks of 10,000 rows, each QR'd in sub-blocks, then the stacked R once more
    full, rest = divmod(ROWS // 4, SUB_ROWS)
    per_block = full * qr_flops(SUB_ROWS, COLS) + qr_flops(rest, COLS) + qr_flops((full + 1) * COLS, COLS)
    assert work["qr_flops"] == pytest.approx(4 * per_block + qr_flops(4 * COLS, COLS))
    # an undeclared block function: one elementwise operation per input element
    assert kernel_work(Kernel("f", np.copy), [(10, 3)]) == {"elementwise": 30}
    declared = Kernel("f", np.copy, cost=lambda shapes: {"qr_flops": 7.0})
    assert kernel_work(declared, [(10, 3)]) == {"qr_flops": 7.0}


def test_cholesky_qr2_is_priced_as_gram_products_and_triangular_solves(X):
    first = _cost(gram_program(X, ROWS // 4)).work
    q, r2 = cholesky_qr2_program(X, la.value("R1", (COLS, COLS)), ROWS // 4)
    rest = _cost(q, r2).work
    assert first["contraction_flops"] == 2 * ROWS * COLS * COLS  # AᵀA
    assert rest["contraction_flops"] == 2 * ROWS * COLS * COLS  # Q₁ᵀQ₁
    assert rest["triangular_solve_flops"] == 3 * ROWS * COLS * COLS  # A R₁⁻¹; then again, and Q₁ R₂⁻¹
    assert "qr_flops" not in first and "qr_flops" not in rest


def test_qr_time_follows_the_qr_rate(X):
    # the Householder blocks' QR (with Q: the tsqr job's householder method); the R-only TSQR
    # does its blocks by Cholesky QR and only the small stacked R by Householder
    q, _ = tsqr_program(X, ROWS // 4, with_q=True)
    cost = _cost(q)
    fast = dataclasses.replace(SHIPPED, qr_flops_per_s=1e10)
    slow = dataclasses.replace(SHIPPED, qr_flops_per_s=1e9)
    extra = _fit_seconds(cost, slow) - _fit_seconds(cost, fast)
    assert extra == pytest.approx(cost.work["qr_flops"] * (1 / 1e9 - 1 / 1e10) / CLUSTER.workers, rel=1e-2)


def test_odd_block_counts_leave_workers_idle():
    from arrayjob.planner.schedule import makespan

    assert makespan([(0, 1.0)] * 4, CLUSTER.nodes, CLUSTER.workers_per_node) == 2.0
    assert makespan([(0, 1.0)] * 5, CLUSTER.nodes, CLUSTER.workers_per_node) == 3.0  # not 2.5: a block is not split
    assert makespan([(0, 1.0), (1, 1.0)], 2, 1) == 1.0


def test_every_kind_has_a_rate_and_old_profiles_still_load(tmp_path):
    for kind in WORK_KINDS:
        assert hasattr(SHIPPED, f"{kind}_per_s"), kind
    old = {k: v for k, v in dataclasses.asdict(SHIPPED).items() if not k.endswith("_per_s") or k in (
        "memory_bytes_per_s", "flops_per_s", "storage_read_bytes_per_s", "storage_write_bytes_per_s",
        "network_bytes_per_s")}
    old["sparse_build_per_s"] = 2.6e7  # a rate an earlier version measured, since retired
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(old))
    loaded = load_profile(path)
    assert loaded.transcendental_per_s == SHIPPED.transcendental_per_s
    assert loaded.rate("qr_flops") == SHIPPED.qr_flops_per_s


def test_write_requests_are_what_writing_the_result_really_makes(tmp_path):
    from arrayjob import kernels
    from arrayjob.io.arrays import ResultGroup, write_group, write_requests
    from arrayjob.io.locations import StorageCounters
    from arrayjob.planner.physical import WriteBlock

    options = StorageOptions()
    group = ResultGroup(parse_uri(str(tmp_path)).join("result.zarr"), options)
    labels = group.create_array("labels", shape=(100,), chunks=(25,), dtype="int64")
    puts = sum(int(kernels.run(WriteBlock(labels, options, ((i, i + 25),)), np.arange(25))[1]) for i in range(0, 100, 25))
    written = StorageCounters()
    write_group(group.location, options, {"centroids": np.ones((3, 2)), "coef": np.ones(7)},
                {"inertia": 1.0, "iterations": 3, "k": 3}, written)
    predicted = write_requests({"centroids": ((3, 2), "float64"), "coef": ((7,), "float64")},
                               {"labels": ((100,), (25,), "int64")})
    assert predicted.get_requests == group.counters.get_requests + written.get_requests
    assert predicted.put_requests == group.counters.put_requests + puts + written.put_requests


def test_stored_blocks_stay_where_an_earlier_program_read_them(X):
    from arrayjob.planner.cost import physical_cost
    from arrayjob.planner.physical import SourceBlock

    options = PlanOptions(cluster=ClusterShape(nodes=3, workers_per_node=1), placement="roundrobin")
    plan = make_plan(la.capture([(X * 2.0).sum(axis=1)]), options)
    assert physical_cost(plan.physical, 3).bytes_between_nodes == 0  # each block read where it is used
    homes: dict = {}
    physical_cost(plan.physical, 3, homes)
    assert len(homes) == 4 and {node for node, _ in homes.values()} == {0, 1, 2}
    # a later program finds every block on node 0: the blocks its tasks need elsewhere move
    on_node_0 = {block: (0, nbytes) for block, (_, nbytes) in homes.items()}
    moved = physical_cost(plan.physical, 3, on_node_0).bytes_between_nodes
    away = {a for t in plan.physical.tasks if t.node % 3 != 0 for a in t.args if isinstance(a, SourceBlock)}
    assert moved >= len(away) * ROWS // 4 * COLS * 8 > 0


def test_results_big_enough_for_the_object_store_are_priced_as_fresh_memory(X):
    # a row-block result of 10,000 × 16 floats (1.28 MB) goes to the object store; a sum does not
    assert _cost(X * 2.0).work["result_bytes"] == ROWS * COLS * 8
    assert "result_bytes" not in _cost((X * 2.0).sum()).work


def test_graph_rates_time_the_kernels_pagerank_declares():
    from arrayjob.algorithms.pagerank.graph import GraphWork
    from arrayjob.costing.calibrate import graph_rates

    rates = graph_rates()
    declared = set()
    for work in (GraphWork("split"), GraphWork("build", 10.0), GraphWork("product", 10.0, 1, vector=10),
                 GraphWork("product", 10.0, 1, vector=2**22)):
        declared |= set(work([(10, 2)]))
    assert {f"{kind}_per_s" for kind in declared - {"elementwise"}} == set(rates)
    assert all(np.isfinite(r) and r > 0 for r in rates.values())


def test_moving_data_is_bounded_by_the_busiest_receiver():
    """A gather into one node takes that node's link, however many nodes send; bytes spread
    evenly go at the network's aggregate rate."""
    from arrayjob.planner.cost import network_seconds

    gb = 1e9
    assert network_seconds(30 * gb, 30 * gb, 16, 1e9) == pytest.approx(30.0)  # 15 senders, one receiver
    assert network_seconds(30 * gb, 30 * gb / 16, 16, 1e9) == pytest.approx(30 / 16)  # an even shuffle
    assert network_seconds(0, 0, 1, 1e9) == 0.0


def test_a_driver_array_is_priced_at_the_bytes_its_fitted_values_take(tmp_path):
    """Fitted values (ALS's factors, coefficients) hardly compress: the estimate's stand-in must
    not either (ones did: 200,000 × 8 factors were priced at a few hundred bytes)."""
    from arrayjob.io.arrays import write_group, write_requests
    from arrayjob.io.locations import StorageCounters

    factors = np.random.default_rng(1).standard_normal((20_000, 8))
    written = StorageCounters()
    write_group(parse_uri(str(tmp_path)).join("result.zarr"), StorageOptions(), {"user_factors": factors},
                {"fit": 0.0}, written)
    predicted = write_requests({"user_factors": (factors.shape, "float64")}, {})
    # zstd takes a few per cent off normal floats (their exponent bytes), none off the stand-in
    assert written.bytes_written <= predicted.bytes_written <= 1.05 * written.bytes_written
    assert factors.nbytes <= predicted.bytes_written
