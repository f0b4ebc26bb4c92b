"""Spartan-style tiling: the communication cost model, the greedy and exact searches, their quality.

Structural tests price small programs by hand (``P`` workers, bytes of float64); the quality
test replays Spartan's evaluation on seeded random programs: greedy must find the optimum
almost always and never pay much more than it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time

import numpy as np
import pytest

import arrayjob.lazy as la
from arrayjob.errors import SpecError
from arrayjob.io.locations import ArrayInfo, Location
from arrayjob.planner import tiling, tiling_model
from arrayjob.planner.ir import Graph
from arrayjob.planner.physical import Assemble
from arrayjob.planner.pipeline import make_plan, strategy
from arrayjob.planner.plan import ClusterShape, Plan, PlanOptions, Tiling
from arrayjob.planner.tiling_model import candidates, communication_cost
from tests.unit.planner.test_programs import random_program

P = 4
OPTIONS = PlanOptions(fusion="none", placement="roundrobin", cluster=ClusterShape(nodes=2, workers_per_node=2))
SEARCHES = ["greedy", "exact"]


def stored(name: str, shape: tuple[int, ...], chunks: tuple[int, ...]) -> la.BlockArray:
    """A float64 Zarr array known by its metadata: the planner never reads data."""
    return la.from_zarr(ArrayInfo(name, Location("file", f"/nowhere/{name}.zarr"), shape, "float64", chunks, 3))


def tiled(outputs: list[la.BlockArray], search: str, options: PlanOptions = OPTIONS) -> Plan:
    return make_plan(la.capture(outputs), dataclasses.replace(options, tiling=search), stop_after="tile")


def node(graph: Graph, label: str) -> int:
    """The one node labelled ``label`` (``X``, ``einsum(ij,j->i)``, ``transpose(1, 0)``...)."""
    (i,) = [i for i, n in enumerate(graph.nodes) if n.label() == label]
    return i


def axes(plan: Plan, label: str) -> tuple[int, ...]:
    assert plan.tilings is not None
    return plan.tilings[node(plan.graph, label)].axes


def cut_all(graph: Graph, how: dict[str, tuple[int, ...]], default: tuple[int, ...] = (0,)) -> tuple[Tiling, ...]:
    """Every array cut on ``default`` (if it has it), except those named in ``how``."""
    out = []
    for n in graph.nodes:
        if n.label() in how:
            out.append(Tiling(how[n.label()]))
        elif n.op in ("value", "const") or any(a >= n.ndim or n.shape[a] < 2 for a in default):
            out.append(Tiling())
        else:
            out.append(Tiling(default))
    return tuple(out)


# -- the cost model, by hand ------------------------------------------------------------------


@pytest.mark.parametrize("search", SEARCHES)
def test_logistic_regression_cuts_X_by_rows_and_moves_only_d_sized_partials(search: str) -> None:
    n, d = 4000, 5
    X, y, w = stored("X", (n, d), (250, d)), stored("y", (n,), (250,)), la.value("w", (d,))
    z = X @ w
    loss = la.sum(la.logaddexp(0.0, -(2 * y - 1) * z))
    grad = X.T @ (la.sigmoid(z) - y)
    plan = tiled([loss, grad], search)

    assert axes(plan, "X") == (0,) and axes(plan, "y") == (0,) and axes(plan, "einsum(ij,j->i)") == (0,)
    assert axes(plan, "einsum(ji,j->i)") == ()  # the gradient: partial sums per row block
    # w goes to every worker; the gradient's and the loss's partial sums come back
    assert communication_cost(plan) == plan.stats["tiling_cost"] == 8 * d * (P - 1) * 2 + 8 * (P - 1)

    lowered = make_plan(plan.graph, plan.options, stop_after="place")
    assert lowered.physical is not None
    tasks = lowered.physical.tasks
    assert not [t for t in tasks if isinstance(t.kernel.fn, Assemble)], "nothing is re-tiled"
    combines = [t for t in tasks if t.id.startswith("combine")]
    assert combines and max(b for t in combines for b in t.out_bytes) <= 8 * d


def test_column_chunked_matrix_stays_cut_by_columns() -> None:
    """Stored by column chunks, X @ w sums partial n-vectors instead of re-tiling X."""
    n, d = 200, 64
    X, w = stored("X", (n, d), (n, 8)), la.value("w", (d,))
    plan = tiled([X @ w], "greedy")
    assert axes(plan, "X") == (1,) and axes(plan, "einsum(ij,j->i)") == ()
    # w is scattered to the column blocks (3/4 of it moves), the n-vector partials are summed
    assert communication_cost(plan) == 8 * d * (P - 1) // P + 8 * n * (P - 1)


def test_elementwise_on_co_partitioned_arrays_costs_nothing() -> None:
    n, d = 1000, 6
    A, B = stored("A", (n, d), (100, d)), stored("B", (n, d), (100, d))
    out = la.exp(A) * B + 1.0
    graph = la.capture([out])
    assert communication_cost(graph, cut_all(graph, {}), OPTIONS) == 0
    for search in ("naive", *SEARCHES):
        assert tiled([out], search).stats["tiling_cost"] == 0


def test_a_whole_operand_is_broadcast_to_the_blocks() -> None:
    n, d = 1000, 6
    A, v = stored("A", (n, d), (100, d)), stored("v", (d,), (d,))
    plan = tiled([A * v], "greedy")
    assert axes(plan, "A") == (0,) and axes(plan, "v") == ()
    assert communication_cost(plan) == 8 * d * (P - 1)


def test_a_reduction_over_a_cut_axis_moves_partial_results() -> None:
    n, d = 1000, 6
    X = stored("X", (n, d), (100, d))
    graph = la.capture([X.sum(axis=0), X.max(axis=1)])
    tilings = cut_all(graph, {"sum(0)": ()})
    assert communication_cost(graph, tilings, OPTIONS) == 8 * d * (P - 1)  # max(1) stays in its row block


def test_transpose_is_a_view_of_its_input() -> None:
    n, d = 1000, 6
    X, Y = stored("X", (n, d), (100, d)), stored("Y", (d, n), (d, 100))
    out = X.T + Y
    for search in SEARCHES:
        plan = tiled([out], search)
        assert axes(plan, "X") == (0,) and axes(plan, "transpose(1, 0)") == (1,) and axes(plan, "Y") == (1,)
        assert plan.stats["tiling_cost"] == 0
    graph = la.capture([out])
    misfit = cut_all(graph, {"transpose(1, 0)": (0,), "add": (1,), "Y": (1,)})
    assert communication_cost(graph, misfit, OPTIONS) > 0  # cut apart from X: a re-tiling


def test_blocks_across_chunk_boundaries_read_the_array_again() -> None:
    n, d = 1000, 6
    X = stored("X", (n, d), (100, d))  # the larger array sets the row blocks: 100 rows per chunk
    aligned, misaligned = stored("y", (n,), (100,)), stored("y", (n,), (70,))
    costs = []
    for y in (aligned, misaligned):
        graph = la.capture([X.sum(axis=1) + y])
        costs.append(communication_cost(graph, cut_all(graph, {}), OPTIONS))
    assert costs == [0, 8 * n]


# -- the rules lowering imposes ---------------------------------------------------------------


def test_lowering_rules_shape_the_candidates() -> None:
    n, d = 1000, 32
    X = stored("X", (n, d), (100, 4))
    gram, colmax, w = X.T @ X, X.argmax(axis=0), la.value("w", (d,))
    graph = la.capture([gram, colmax, (X @ w).sum()])
    options = dataclasses.replace(OPTIONS, target_block_bytes=4096)  # so d is cut in blocks
    # the Gram matrix has both axes in one class: never cut, and so neither is X's d
    assert candidates(graph, node(graph, "einsum(ji,jk->ik)"), options) == [Tiling()]
    # argmax has no combine: X is never cut along the rows it reduces
    assert candidates(graph, node(graph, "X"), options) == [Tiling()]
    assert candidates(graph, node(graph, "w"), options) == [Tiling()]
    with pytest.raises(ValueError, match=r"node \d+ \(X\): axis 0 cannot be cut"):
        communication_cost(graph, cut_all(graph, {}), options)
    for search in ("naive", *SEARCHES):  # every strategy lowers
        make_plan(graph, dataclasses.replace(options, tiling=search), stop_after="place")


def test_every_strategy_is_registered() -> None:
    for name in ("naive", "greedy", "exact"):
        assert callable(strategy("tiling", name))
    with pytest.raises(SpecError, match="exact, greedy, naive"):
        strategy("tiling", "clever")


def test_the_tiling_decides_the_tasks_and_the_bytes_re_tiled() -> None:
    """The planner decides, the runtime obeys: naive cuts X.T by rows and so re-tiles X."""
    X = stored("X", (1000, 6), (100, 6))
    graph = la.capture([(X.T * 2.0).sum(axis=1)])
    moved, cost = {}, {}
    for search in ("naive", "greedy"):
        plan = make_plan(graph, dataclasses.replace(OPTIONS, tiling=search), stop_after="place")
        assert plan.physical is not None
        moved[search] = sum(t.out_bytes[0] for t in plan.physical.tasks if isinstance(t.kernel.fn, Assemble))
        cost[search] = plan.stats["tiling_cost"]
    assert moved["greedy"] == 0 and cost["greedy"] == 8 * 6 * (P - 1)  # only the partial sums
    assert moved["naive"] == X.size * 8 and cost["naive"] == X.size * 8 * (P - 1) // P


@pytest.mark.skipif(not hasattr(la, "map_blocks"), reason="needs lazy.map_blocks")
def test_blocks_a_program_fixes_are_kept() -> None:
    from arrayjob.planner.kernel import Kernel

    X = stored("X", (1000, 6), (100, 6))
    (scaled,) = la.map_blocks(Kernel("double", np.positive), X, outputs=[((1000, 6), "float64", 250)],
                              block_rows=[250])
    graph = la.capture([scaled.sum(axis=0)])
    for search in ("naive", *SEARCHES):
        plan = make_plan(graph, dataclasses.replace(OPTIONS, tiling=search), stop_after="tile")
        assert plan.grid(node(graph, "X")).block_shape == (250, 6)
        assert plan.stats["tiling_cost"] == communication_cost(plan)


# -- the searches ---------------------------------------------------------------------------


def random_case(seed: int) -> tuple[Graph, PlanOptions]:
    """Spartan's evaluation, in small: a random program on a random cluster and block budget."""
    graph = la.capture(list(random_program(seed).outputs.values()))
    rng = np.random.default_rng(seed + 10_000)
    return graph, PlanOptions(cluster=ClusterShape(nodes=int(rng.integers(1, 5)), workers_per_node=2),
                              target_block_bytes=int(rng.choice([256, 1024, 4096, 2**20])))


def test_greedy_finds_the_optimum_of_random_programs() -> None:
    equal, ratios, seconds = 0, [], []
    for seed in range(100):
        graph, options = random_case(seed)
        tiling_model._model.cache_clear()  # time the whole search, cost tables included
        start = time.perf_counter()
        greedy = tiling.greedy(Plan(graph, options))
        seconds.append(time.perf_counter() - start)
        exact = tiling.exact(Plan(graph, options))
        g, e = greedy.stats["tiling_cost"], exact.stats["tiling_cost"]
        assert exact.stats["tiling_fallback"] == 0
        assert e <= g, f"seed {seed}: exact {e} > greedy {g}"
        equal += g == e
        ratios.append(g / e if e else (1.0 if g == 0 else math.inf))
    assert equal >= 95, f"greedy optimal in {equal}/100"
    assert max(ratios) <= 1.5, f"worst greedy/optimum {max(ratios):.2f}"
    assert statistics.median(seconds) < 0.1, f"median planning {statistics.median(seconds) * 1e3:.0f} ms"


def test_exact_is_the_optimum() -> None:
    """Against brute force, on the random programs whose search space is small."""
    checked = 0
    for seed in range(60):
        graph, options = random_case(seed)
        model = tiling_model.tiling_model(graph, options)
        free = model.free_groups
        if math.prod(len(model.options_of[r]) for r in free) > 500:
            continue
        fixed = {r: 0 for r in model.groups}
        best = min(communication_cost(graph, model.tilings({**fixed, **dict(zip(free, combo, strict=True))}), options)
                   for combo in itertools.product(*(range(len(model.options_of[r])) for r in free)))
        assert tiling.exact(Plan(graph, options)).stats["tiling_cost"] == best, f"seed {seed}"
        checked += 1
    assert checked >= 40


def test_exact_falls_back_to_greedy_when_the_graph_is_too_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    graph, options = random_case(3)
    monkeypatch.setattr(tiling, "EXACT_MAX_TABLE", 1)
    exact, greedy = tiling.exact(Plan(graph, options)), tiling.greedy(Plan(graph, options))
    assert exact.stats["tiling_fallback"] == 1.0
    assert exact.tilings == greedy.tilings
