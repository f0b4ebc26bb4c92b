"""Placement (NumS LSHS) and the plan's cost, planner only: no Ray, and no data read
except where a plan is run in-process to check it still gives NumPy's answer."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import zarr

import arrayjob.lazy as la
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import ArrayInfo, Location, StorageOptions, parse_uri
from arrayjob.planner.cost import physical_cost, work_seconds
from arrayjob.planner.ir import Graph
from arrayjob.planner.physical import (
    BlockGrid,
    Combine,
    DriverValue,
    InputArray,
    Kernel,
    PhysicalPlan,
    SourceBlock,
    Task,
    TaskResult,
)
from arrayjob.planner.pipeline import make_plan, strategies
from arrayjob.planner.placement import cyclic_node, lshs, node_grid
from arrayjob.planner.plan import ClusterShape, Plan, PlanOptions, WorkRates
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from tests.harness.helpers import write_array

TILINGS = list(strategies("tiling"))
FUSIONS = list(strategies("fusion"))


def stored(root: Path, name: str, shape: tuple[int, ...], chunks: tuple[int, ...]) -> la.BlockArray:
    """A Zarr array's metadata only (planning never reads data)."""
    uri = str(root / f"{name}.zarr")
    zarr.create_array(uri, shape=shape, chunks=chunks, dtype="float64")
    return la.from_zarr(open_array_info(name, parse_uri(uri), StorageOptions()))


def planned(outputs: list[la.BlockArray], *, nodes: int, placement: str, tiling: str = "naive",
            fusion: str = "none", block_budget: int = 64 * 2**20) -> Plan:
    options = PlanOptions(tiling=tiling, fusion=fusion, placement=placement, cluster=ClusterShape(nodes=nodes),
                          target_block_bytes=block_budget)
    return make_plan(la.capture(outputs), options)


def logreg_iteration(X: la.BlockArray, y: la.BlockArray, w: la.BlockArray) -> list[la.BlockArray]:
    z = X @ w
    return [la.sum(la.logaddexp(0.0, -((2 * y - 1) * z))), X.T @ (la.sigmoid(z) - y)]


# -- cyclic layout ----------------------------------------------------------------------------


def test_node_grid_factors_nodes_over_the_axes_with_most_blocks() -> None:
    assert node_grid((8, 1), 4) == (4, 1)
    assert node_grid((4, 4), 4) == (2, 2)
    assert node_grid((16, 2), 6) == (6, 1)
    assert node_grid((10,), 3) == (3,)
    assert node_grid((), 5) == ()
    assert [cyclic_node((i, 0), (4, 1)) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert cyclic_node((1, 1), (2, 2)) == 3


# -- elementwise: co-partitioned arrays stay put --------------------------------------------


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("nodes", [3, 6, 16])
def test_elementwise_on_co_partitioned_arrays_moves_nothing(tmp_path: Path, nodes: int, fusion: str) -> None:
    A = stored(tmp_path, "A", (4000, 8), (250, 8))
    B = stored(tmp_path, "B", (4000, 8), (250, 8))
    u = stored(tmp_path, "u", (4000,), (250,))
    v = stored(tmp_path, "v", (4000,), (250,))
    outputs = [la.exp(A) * B + 1.0, la.sigmoid(A - B), la.sqrt(u * u + v * v) - u]
    plan = planned(outputs, nodes=nodes, placement="lshs", fusion=fusion)
    assert plan.cost.bytes_between_nodes == 0
    # stored arrays start in the cyclic layout: row block i is read on node i mod N
    first: dict[SourceBlock, int] = {}
    for task in plan.physical.tasks:
        for arg in task.args:
            if isinstance(arg, SourceBlock):
                first.setdefault(arg, task.node)
    blocks = plan.physical.source("A").grid.num_blocks
    assert len(first) == 4 * blocks
    assert all(node == block.index[0] % nodes for block, node in first.items())
    # and the work is spread as evenly as the blocks are
    assert max(plan.cost.tasks_per_node) == math.ceil(blocks / nodes) * plan.cost.tasks // blocks

    # round robin separates a block's chain of unfused ops, unless the node count divides the block count
    if fusion == "none" and blocks % nodes:
        dealt = planned(outputs, nodes=nodes, placement="roundrobin", fusion=fusion)
        assert dealt.cost.bytes_between_nodes > 0


# -- reductions: co-located partials first, then a tree over nodes ---------------------------


def _hops(plan: Plan) -> list[int]:
    """For every leaf partial of every reduction tree: how many times it crosses nodes to the root."""
    tasks = {t.id: t for t in plan.physical.tasks}

    def chains(task: Task) -> list[int]:
        if not isinstance(task.kernel.fn, Combine):
            return [0]
        out = []
        for arg in task.args:
            child = tasks[arg.task]
            out += [h + (child.node != task.node) for h in chains(child)]
        return out

    return [h for o in plan.physical.outputs for h in chains(tasks[o.task])]


@pytest.mark.parametrize("fan_in", [2, 8])
@pytest.mark.parametrize("k", [2, 3, 4, 5, 8, 16])
def test_transposed_product_crosses_nodes_at_most_log2_k_times_per_chain(tmp_path: Path, k: int, fan_in: int) -> None:
    X = stored(tmp_path, "X", (6400, 6), (100, 6))
    Y = stored(tmp_path, "Y", (6400, 3), (100, 3))
    partial = 6 * 3 * 8
    # partials bigger than half a block's budget are combined pairwise across nodes
    budget = 2 * partial if fan_in == 2 else 64 * 2**20
    plan = planned([X.T @ Y], nodes=k, placement="lshs", block_budget=budget)
    hops = _hops(plan)
    assert len(hops) == plan.cost.tasks - sum(isinstance(t.kernel.fn, Combine) for t in plan.physical.tasks)
    assert max(hops) <= math.ceil(math.log2(k))
    # partials on one node are combined there: exactly one partial per node but the root's crosses
    assert plan.cost.bytes_between_nodes == (k - 1) * partial
    levels = math.ceil(math.log(k, fan_in) - 1e-9)
    assert max(plan.cost.network_in_per_node) <= levels * (fan_in - 1) * partial

    dealt = planned([X.T @ Y], nodes=k, placement="roundrobin", block_budget=budget)
    assert dealt.cost.bytes_between_nodes > plan.cost.bytes_between_nodes


def test_rebuilt_reductions_give_numpy_results(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    Xv, Yv, yv = rng.standard_normal((900, 5)), rng.standard_normal((900, 3)), (rng.random(900) > 0.5) * 1.0
    arrays = {}
    for name, data, chunks in (("X", Xv, (50, 5)), ("Y", Yv, (50, 3)), ("y", yv, (50,))):
        write_array(str(tmp_path / f"{name}.zarr"), data, chunks)
        arrays[name] = la.from_zarr(open_array_info(name, parse_uri(str(tmp_path / f"{name}.zarr")), StorageOptions()))
    X, Y, y = arrays["X"], arrays["Y"], arrays["y"]
    loss, grad = logreg_iteration(X, y, la.value("w", (5,)))
    program = {"xty": X.T @ Y, "colmax": X.max(axis=0), "colmin": Y.min(axis=0), "loss": loss, "grad": grad}
    w = rng.standard_normal(5)
    z = Xv @ w
    expected = {"xty": Xv.T @ Yv, "colmax": Xv.max(0), "colmin": Yv.min(0),
                "loss": np.logaddexp(0, -(2 * yv - 1) * z).sum(), "grad": Xv.T @ (1 / (1 + np.exp(-z)) - yv)}
    for nodes in (2, 5, 7):
        options = PlanOptions(tiling="naive", fusion="none", placement="lshs", cluster=ClusterShape(nodes=nodes))
        session = Session(LocalExecutor(StorageOptions()), options)
        out = session.compute(program, {"w": w})
        for name, ref in expected.items():
            np.testing.assert_allclose(out[name], ref, rtol=1e-10, err_msg=f"{name} on {nodes} nodes")
        plan = session.plan(program)
        ids = [t.id for t in plan.physical.tasks]
        assert len(ids) == len(set(ids)) and all(t.node is not None for t in plan.physical.tasks)


# -- the logistic regression iteration on 16 simulated nodes ----------------------------------


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("tiling", TILINGS)
def test_lshs_balances_memory_and_network_better_than_round_robin(tmp_path: Path, tiling: str, fusion: str) -> None:
    X = stored(tmp_path, "X", (64_000, 16), (1000, 16))
    y = stored(tmp_path, "y", (64_000,), (1000,))
    program = logreg_iteration(X, y, la.value("w", (16,)))
    lshs = planned(program, nodes=16, placement="lshs", tiling=tiling, fusion=fusion).cost
    rr = planned(program, nodes=16, placement="roundrobin", tiling=tiling, fusion=fusion).cost
    assert lshs.max_peak_bytes <= rr.max_peak_bytes
    assert max(lshs.network_in_per_node) <= max(rr.network_in_per_node)
    assert max(lshs.network_out_per_node) <= max(rr.network_out_per_node)
    assert lshs.max_network_bytes <= rr.max_network_bytes
    assert lshs.bytes_between_nodes < rr.bytes_between_nodes
    # same reads and the same arithmetic: placement only moves work around
    assert (lshs.bytes_read, lshs.get_requests) == (rr.bytes_read, rr.get_requests) == (64_000 * 17 * 8, 128)


# -- the cost model ---------------------------------------------------------------------------


def test_plan_cost_follows_objects_through_a_hand_built_plan() -> None:
    """Two nodes, five tasks, every byte accounted by hand (see cost.ClusterLoad's rules)."""
    info = ArrayInfo("A", Location("file", "/nowhere/A.zarr"), (20,), "float64", (10,), 3)
    A = InputArray(info, BlockGrid((20,), (10,)))
    w = DriverValue("w", (2,), 16)
    k = Kernel("k", Combine("sum"))

    def task(name: str, node: int, *args: object, out: int) -> Task:
        return Task(name, k, tuple(args), node=node, out_shapes=((out // 8,),), out_bytes=(out,))

    tasks = (
        task("t0", 0, SourceBlock("A", (0,)), out=80),
        task("t1", 1, SourceBlock("A", (1,)), out=80),
        task("t2", 0, TaskResult("t0"), TaskResult("t1"), w, out=8),  # t1 moves 1 -> 0
        task("t3", 1, TaskResult("t2"), SourceBlock("A", (1,)), out=8),  # t2 moves 0 -> 1
        task("t4", 1, TaskResult("t2"), w, out=8),  # t2 is on node 1 already; w moves 0 -> 1
    )
    cost = physical_cost(PhysicalPlan((A,), tasks, (TaskResult("t3"), TaskResult("t4"))), nodes=2)
    assert (cost.bytes_read, cost.get_requests, cost.bytes_written) == (160, 2, 0)
    assert cost.bytes_between_nodes == 80 + 8 + 16
    assert cost.network_in_per_node == (80, 24) and cost.network_out_per_node == (24, 80)
    # node 0: w 16 + A[0] 80 + t0 80, then t1's copy 80 and t2 8 while t2 runs = 264
    # node 1: A[1] 80 + t1 80 = 160; t1 is freed (its last consumer ran) before t3 and t4
    assert cost.peak_bytes_per_node == (264, 160)
    assert cost.bytes_touched == 160 + 160 + (80 + 80 + 16 + 8) + (8 + 80 + 8) + (8 + 16 + 8)
    assert cost.tasks == 5 and cost.tasks_per_node == (2, 3)
    assert cost.flops == 10 + 10 + (10 + 10 + 2) + (1 + 10) + (1 + 2)
    as_dict = cost.as_dict()
    assert as_dict["storage"] == {"bytes_read": 160, "get_requests": 2, "bytes_written": 0}
    assert as_dict["network"]["bytes_between_nodes"] == 104
    assert as_dict["memory"] == {"bytes_touched": cost.bytes_touched, "peak_bytes_per_node": [264, 160]}
    assert as_dict["flops"] == cost.flops and as_dict["tasks"]["count"] == 5
    table = cost.table()
    assert "between nodes" in table and "104 B" in table and "264 B" in table
    assert len(table.splitlines()) == 9 + 2  # a title, six totals, a blank line, a header, a row per node


def test_cost_table_summarises_a_big_cluster(tmp_path: Path) -> None:
    X = stored(tmp_path, "X", (64_000, 16), (1000, 16))
    table = planned([X.sum(axis=0)], nodes=32, placement="lshs").cost.table()
    assert [line.split()[0] for line in table.splitlines()[-3:]] == ["min", "mean", "max"]


def test_ray_placement_leaves_every_task_to_ray(tmp_path: Path) -> None:
    X = stored(tmp_path, "X", (6400, 6), (100, 6))
    plan = planned([X.T @ X], nodes=4, placement="ray")
    assert {t.node for t in plan.physical.tasks} == {None}


@pytest.mark.parametrize("nodes,blocks", [(1, 4), (3, 4), (3, 16), (4, 4), (6, 40), (16, 20)])
def test_placed_tree_tasks_counts_the_store_tree_placement_builds(tmp_path, nodes, blocks) -> None:
    """The estimate counts the combine tasks of a worker-written output's tree with
    ``placed_tree_tasks``; placement rebuilds that tree to combine on each node first."""
    from arrayjob.planner.placement import placed_tree_tasks

    X = stored(tmp_path, "X", (blocks * 100, 4), (100, 4))
    uri = tmp_path / "out.zarr"
    zarr.create_array(str(uri), shape=(blocks * 100, 4), chunks=(100, 4), dtype="float64")
    target = open_array_info("out", parse_uri(str(uri)), StorageOptions())
    plan = planned([la.store(X * 2.0, target, StorageOptions())], nodes=nodes, placement="lshs",
                   block_budget=100 * 4 * 8)
    tasks = plan.physical.tasks
    writes = [t for t in tasks if t.kernel.name == "store"]
    combines = [t for t in tasks if t.kernel.name == "sum_partials"]
    assert len(writes) == blocks and combines
    per_node = [sum(t.node == n for t in writes) for n in range(nodes)]
    assert len(combines) == placed_tree_tasks(per_node)


def test_placed_tree_tasks_combines_on_each_node_first() -> None:
    from arrayjob.planner.placement import placed_tree_tasks

    assert placed_tree_tasks([4]) == 1  # one node: lower's tree
    assert placed_tree_tasks([2, 1, 1]) == 2  # node 0's pair, then the three nodes' partials
    assert placed_tree_tasks([9, 9, 0]) == 2 + 2 + 1
    assert placed_tree_tasks([1] * 10) == 2 + 1  # across nodes: 8 + 2, then the two
    assert placed_tree_tasks([0, 0]) == 0


# -- programs of one job agree on where stored blocks live (issue #16, CP-ALS) ---------------


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_a_later_program_reads_stored_blocks_where_the_first_one_did(tmp_path: Path, nodes: int) -> None:
    """CP-ALS reads X in its norm pass, then each MTTKRP takes X's blocks with a slice of a
    factor placed on the driver's node. Blocks read once stay where they were read for the
    job, so the MTTKRP must use X's cyclic layout too: it moves only factor slices and
    partial results, never a block of X (it used to deal X anew and fetch half of it)."""
    rows, J, K, F = 12, 6, 5, 2
    X = stored(tmp_path, "X", (rows, J, K), (1, J, K))
    norm = planned([(X * X).sum()], nodes=nodes, placement="lshs")
    mode1 = planned([la.einsum("ijk,if,kf->jf", X, la.value("A", (rows, F)), la.value("C", (K, F)))],
                    nodes=nodes, placement="lshs")
    layouts = []
    for plan in (norm, mode1):
        grid = plan.physical.source("X").grid
        first: dict[tuple[int, ...], int] = {}
        for task in plan.physical.tasks:
            for arg in task.args:
                if isinstance(arg, SourceBlock):
                    first.setdefault(arg.index, task.node)
        assert len(first) == grid.num_blocks > nodes
        dims = node_grid(grid.grid_shape, nodes)
        assert first == {index: cyclic_node(index, dims) for index in first}
        layouts.append((grid.grid_shape, first))
    assert layouts[0] == layouts[1]
    homes: dict = {}
    physical_cost(norm.physical, nodes, homes)
    block = J * K * 8
    # everything mode 1 moves, with X where the norm pass left it: A's rows (rows·F floats at
    # most) and one (J, F) partial per block at most, far below one block of X each time
    moved = physical_cost(mode1.physical, nodes, homes).bytes_between_nodes
    assert moved == mode1.cost.bytes_between_nodes
    assert moved <= rows * F * 8 + rows * J * F * 8 < rows * block


# -- compute is balanced when many tasks share one big input (issue #16, PageRank's build) ---


def _shared_input_program(tmp_path: Path, tasks: int) -> list[la.BlockArray]:
    """``tasks`` tasks that each take the whole of X (as PageRank's CSR builds each take every
    chunk's sorted edges) and return a small row."""
    X = stored(tmp_path, "X", (64_000, 16), (2_000, 16))

    def head(ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        return x[:1, :].copy()

    (out,) = la.map_blocks(Kernel("head", head), la.value("ids", (tasks,), "int64"), X,
                           outputs=[((tasks, 16), "float64", 1)], block_rows=[1, None])
    return [out]


def _seconds(cost, shape: ClusterShape) -> float:  # type: ignore[no-untyped-def]
    """The time ``lshs`` compares placements by (``_Placer.seconds``), from a plan's cost:
    each task on its node's worker free soonest, then the bytes moved."""
    workers = [[0.0] * shape.workers_per_node for _ in range(shape.nodes)]
    for node, touched, work in cost.task_work:
        free = workers[node]
        free[free.index(min(free))] += touched / shape.memory_bytes_per_s + work_seconds(work, shape.work_rates)
    return max(map(max, workers)) + cost.bytes_between_nodes / (shape.nodes * shape.network_bytes_per_s)


@pytest.mark.parametrize("nodes", [4, 8])
def test_tasks_sharing_one_big_input_are_spread_when_that_is_sooner(tmp_path: Path, nodes: int) -> None:
    tasks = 64
    shape = ClusterShape(nodes=nodes)
    program = la.capture(_shared_input_program(tmp_path, tasks))
    plans = {p: make_plan(program,
                          PlanOptions(tiling="naive", fusion="none", placement=p, cluster=shape,
                                      target_block_bytes=64 * 2**20))
             for p in ("lshs",)}
    x_bytes = 64_000 * 16 * 8
    heads = [t for t in plans["lshs"].physical.tasks if t.kernel.name == "head"]
    assert len(heads) == tasks
    # NumS's load maxima alone keep every task on the node holding X (one more task there
    # grows the busiest node's work by one X; moving X grows the maxima of bytes in and out
    # by one X each): all 64 tasks' work, 64 X's, on 2 workers. Balanced by finish time,
    # X is copied to the other nodes, at most once each ...
    used = {t.node for t in heads}
    assert len(used) > 1
    lshs = plans["lshs"].cost
    assert lshs.bytes_between_nodes <= (len(used) - 1) * x_bytes + tasks * 16 * 8
    # ... which is sooner than the tasks' work alone on one node, and than dealing the tasks
    # over the nodes without regard to X would be (every node fetches X: (N - 1) copies)
    one_node = tasks * x_bytes / (shape.workers_per_node * shape.memory_bytes_per_s)
    assert _seconds(lshs, shape) < one_node
    assert lshs.bytes_between_nodes < (nodes - 1) * x_bytes or len(used) == nodes


def _factor_cost(shapes: object) -> dict[str, float]:  # a factorisation: 1e10 flops on 80 kB
    return {"qr_flops": 1e10}


def _solve_cost(shapes: object) -> dict[str, float]:
    return {"qr_flops": 1e9}


def test_compute_by_kind_decides_where_bytes_are_even() -> None:
    """Two nodes whose blocks and results are the same size: ``factor`` on node 0's block
    is 1.8 s of QR, ``scale`` on node 1's 10,000 elements. ``finish`` takes a result from
    each, so either node fetches 8 bytes and touches as many bytes: by bytes alone the
    nodes are even and it goes to node 0, behind the QR; priced by kind, to node 1."""
    info = ArrayInfo("A", Location("file", "/nowhere/A.zarr"), (2000, 10), "float64", (1000, 10), 3)
    A = InputArray(info, BlockGrid((2000, 10), (1000, 10)))
    tasks = (
        Task("factor", Kernel("factor", Combine("sum"), cost=_factor_cost), (SourceBlock("A", (0, 0)),),
             out_shapes=((1,),), out_bytes=(8,)),
        Task("scale", Kernel("scale", Combine("sum")), (SourceBlock("A", (1, 0)),), out_shapes=((1,),), out_bytes=(8,)),
        Task("finish", Kernel("finish", Combine("sum"), cost=_solve_cost), (TaskResult("factor"), TaskResult("scale")),
             out_shapes=((1,),), out_bytes=(8,)),
    )
    physical = PhysicalPlan((A,), tasks, (TaskResult("finish"),))

    def node_of_finish(shape: ClusterShape) -> int:
        plan = lshs(Plan(Graph((), ()), PlanOptions(cluster=shape), physical=physical))
        nodes = {t.id: t.node for t in plan.physical.tasks}
        assert (nodes["factor"], nodes["scale"]) == (0, 1)  # their blocks' cyclic nodes
        return nodes["finish"]

    shape = ClusterShape(nodes=2, workers_per_node=1)
    assert node_of_finish(shape) == 1
    # the rates come from the cluster's shape: with QR nearly free, node 0 is the less busy
    assert node_of_finish(ClusterShape(nodes=2, workers_per_node=1, work_rates=WorkRates({"qr_flops": 1e30}))) == 0


def test_a_free_task_leaves_the_node_that_ends_last() -> None:
    """Placed in plan order, ``early`` (1e10 flops, free to go anywhere) goes to node 0, where
    its argument is; ``late`` then reads node 0's block (its cyclic node) and does as much
    again, so node 0 ends at twice a factorisation and node 1 idles. Neither placement looks
    back; the relief pass moves ``early`` to node 1 and the plan ends after one."""
    info = ArrayInfo("A", Location("file", "/nowhere/A.zarr"), (2000, 10), "float64", (1000, 10), 3)
    A = InputArray(info, BlockGrid((2000, 10), (1000, 10)))
    w = DriverValue("w", (2,), 16)
    factor = Kernel("factor", Combine("sum"), cost=_factor_cost)
    tasks = (
        Task("early", factor, (w,), out_shapes=((1,),), out_bytes=(8,)),
        Task("late", factor, (SourceBlock("A", (0, 0)), w), out_shapes=((1,),), out_bytes=(8,)),
        Task("done", Kernel("done", Combine("sum")), (TaskResult("early"), TaskResult("late")),
             out_shapes=((1,),), out_bytes=(8,)),
    )
    physical = PhysicalPlan((A,), tasks, (TaskResult("done"),))
    shape = ClusterShape(nodes=2, workers_per_node=1)
    plan = lshs(Plan(Graph((), ()), PlanOptions(cluster=shape), physical=physical))
    nodes = {t.id: t.node for t in plan.physical.tasks}
    assert nodes["late"] == 0 and nodes["early"] == 1
