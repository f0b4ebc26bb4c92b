"""The planned block cache (planner only, no Ray): Belady's MIN with bypass on cyclic scans
against a brute-force optimum, the fixed resident set, the prefetch order, the refusal."""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest

import arrayjob.lazy as la
from arrayjob.io.locations import ArrayInfo, Location, parse_uri
from arrayjob.planner.physical import (
    BlockGrid,
    Combine,
    InputArray,
    Kernel,
    PhysicalPlan,
    SourceBlock,
    Task,
    TaskResult,
)
from arrayjob.planner.pipeline import make_plan
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.planner.residency import (
    BudgetError,
    StreamRates,
    belady,
    intermediate_peak,
    plan_residency,
    spilled_results,
)


def optimum(uses: list[int], capacity: int) -> int:
    """The fewest misses any policy can have (blocks of one size, ``capacity`` of them held;
    a missed block may be kept or not, anything held may be dropped at any time)."""

    @cache
    def best(i: int, held: frozenset[int]) -> int:
        if i == len(uses):
            return 0
        block = uses[i]
        if block in held:
            return best(i + 1, held)
        options = [best(i + 1, held)]  # bypass
        for drop in [None, *held] if len(held) >= capacity else [None]:
            kept = held - {drop} if drop is not None else held
            if len(kept) < capacity:
                options.append(best(i + 1, kept | {block}))
        return 1 + min(options)

    return best(0, frozenset())


def blocks(n: int) -> list[SourceBlock]:
    return [SourceBlock("X", (i, 0)) for i in range(n)]


@pytest.mark.parametrize(("n", "capacity", "cycles"), [(3, 1, 3), (4, 2, 3), (5, 2, 4), (5, 3, 3), (6, 4, 3)])
def test_belady_on_a_cyclic_scan_is_optimal(n: int, capacity: int, cycles: int) -> None:
    scan = blocks(n)
    uses = scan * cycles
    sizes = dict.fromkeys(scan, 10)
    missed, kept, evicted = belady(uses, sizes, capacity * 10)
    assert missed // 10 == optimum([b.index[0] for b in uses], capacity)
    # a fixed resident set: nothing is evicted, and every cycle after the first misses n - capacity
    assert not evicted and len(kept) == capacity
    assert missed // 10 == n + (cycles - 1) * (n - capacity)


def lru_misses(uses: list[int], capacity: int) -> int:
    held: list[int] = []
    misses = 0
    for b in uses:
        if b in held:
            held.remove(b)
        else:
            misses += 1
            if len(held) >= capacity:
                held.pop(0)
        held.append(b)
    return misses


def test_lru_thrashes_where_belady_keeps_a_set() -> None:
    uses = [b.index[0] for b in blocks(5)] * 4
    assert lru_misses(uses, 2) == 20  # every use misses
    assert optimum(uses, 2) == 5 + 3 * 3


@pytest.mark.parametrize("seed", range(20))
def test_belady_on_random_sequences_is_optimal(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, capacity = int(rng.integers(3, 6)), int(rng.integers(1, 4))
    uses = [int(b) for b in rng.integers(0, n, 12)]
    refs = [SourceBlock("X", (b, 0)) for b in uses]
    missed, _, _ = belady(refs, dict.fromkeys(refs, 1), capacity)
    assert missed == optimum(uses, capacity)


def logreg_plan(tmp_path, rows: int = 4000, cols: int = 8, chunk: int = 500, nodes: int = 1):
    X = ArrayInfo("X", parse_uri(str(tmp_path / "X.zarr")), (rows, cols), "float64", (chunk, cols), 3)
    y = ArrayInfo("y", parse_uri(str(tmp_path / "y.zarr")), (rows,), "float64", (chunk,), 3)
    x, t = la.from_zarr(X), la.from_zarr(y)
    w = la.value("w", (cols,))
    p = la.sigmoid(x @ w)
    program = {"loss": la.sum(p - t), "grad": x.T @ (p - t)}
    options = PlanOptions(cluster=ClusterShape(nodes=nodes, workers_per_node=2), target_block_bytes=chunk * cols * 8)
    plan = make_plan(la.capture(list(program.values())), options)
    assert plan.physical is not None
    return plan.physical


def test_everything_fits_nothing_streams(tmp_path) -> None:
    physical = logreg_plan(tmp_path)
    r = plan_residency(physical, 1, 10**9, repeats=100)
    assert not r.streams and r.resident_fraction == 1.0
    assert r.order == tuple(range(len(physical.tasks)))  # the plan as it was


def test_budget_keeps_a_fixed_fraction(tmp_path) -> None:
    physical = logreg_plan(tmp_path)  # 8 blocks of X (32 kB each) and of y (4 kB)
    total = sum(plan_residency(physical, 1, 10**9).block_bytes.values())
    r = plan_residency(physical, 1, int(0.4 * total), repeats=50)
    assert r.streams and r.resident_bytes + r.streamed_bytes == total
    assert r.resident_bytes <= 0.4 * total - max(r.intermediate_peak)
    assert 0.2 < r.resident_fraction <= 0.4
    # a bigger budget keeps more
    assert plan_residency(physical, 1, int(0.7 * total), repeats=50).resident_fraction > r.resident_fraction


def test_prefetch_order_spreads_reads_among_computes(tmp_path) -> None:
    physical = logreg_plan(tmp_path, rows=8000)  # 16 row blocks
    total = sum(plan_residency(physical, 1, 10**9).block_bytes.values())
    r = plan_residency(physical, 1, int(0.5 * total), repeats=10)
    tasks = [physical.tasks[i] for i in r.order]
    assert sorted(r.order) == list(range(len(physical.tasks)))  # a permutation
    seen: set[str] = set()
    for task in tasks:  # still in dependency order
        assert all(a.task in seen for a in task.args if isinstance(a, TaskResult))
        seen.add(task.id)
    leaves = [t for t in tasks if not any(isinstance(a, TaskResult) for a in t.args)]
    reads = [any(a in r.streamed for a in t.args) for t in leaves]
    assert reads[: r.prefetch_depth] == [True] * r.prefetch_depth  # the first reads start at once
    # never two reading tasks side by side while computing ones remain, up to the last ones
    computing = reads.count(False)
    runs = [len(list(g)) for k, g in itertools.groupby(reads[r.prefetch_depth:]) if k]
    assert computing and max(runs) <= 1 + len(reads) // max(1, computing)


def test_streamed_source_follows_the_rates(tmp_path) -> None:
    physical = logreg_plan(tmp_path)
    total = sum(plan_residency(physical, 1, 10**9).block_bytes.values())
    fast_disk = StreamRates(bucket_bytes_per_s=3e8, spill_bytes_per_s=2e9, spill_capacity=10**9)
    slow_disk = StreamRates(bucket_bytes_per_s=3e8, spill_bytes_per_s=1e8, spill_capacity=10**9)
    no_room = StreamRates(bucket_bytes_per_s=3e8, spill_bytes_per_s=2e9, spill_capacity=1000)
    assert plan_residency(physical, 1, total // 2, repeats=5, rates=fast_disk).source == "spill"
    assert plan_residency(physical, 1, total // 2, repeats=5, rates=slow_disk).source == "bucket"
    assert plan_residency(physical, 1, total // 2, repeats=5, rates=no_room).source == "bucket"
    assert plan_residency(physical, 1, total // 2, repeats=1, rates=fast_disk).source == "bucket"  # one pass


def test_a_block_bigger_than_the_budget_is_refused(tmp_path) -> None:
    physical = logreg_plan(tmp_path, rows=4000, chunk=2000)  # blocks of 2000 × 8 × 8 = 128 kB
    with pytest.raises(BudgetError) as caught:
        plan_residency(physical, 1, 100_000, repeats=10)
    message = str(caught.value)
    assert "\n" not in message
    assert "a block of inputs.X is 128.0 kB (128,000 bytes)" in message
    assert "chunks of at most" in message and "cluster.memory_budget" in message
    assert caught.value.exit_code == 2


def test_finer_blocks_when_the_inputs_exceed_the_budget(tmp_path) -> None:
    from arrayjob.planner.plan import TARGET_BLOCK_BYTES
    from arrayjob.planner.residency import block_target

    assert block_target(10**9, 10**8, TARGET_BLOCK_BYTES) == TARGET_BLOCK_BYTES  # fits: the plan as it was
    assert block_target(480 * 10**6, 1536 * 10**6, TARGET_BLOCK_BYTES) == 60 * 10**6
    # the X (3,000,000 × 64, 1.54 GB; metadata only) under a 480 MB budget
    X = ArrayInfo("X", parse_uri(str(tmp_path / "X.zarr")), (3_000_000, 64), "float64", (100_000, 64), 3)
    program = [la.sum(la.from_zarr(X) @ la.value("w", (64,)))]
    resident = {}
    for target in (TARGET_BLOCK_BYTES, block_target(480 * 10**6, X.nbytes, TARGET_BLOCK_BYTES)):
        options = PlanOptions(cluster=ClusterShape(nodes=1, workers_per_node=2), target_block_bytes=target)
        physical = make_plan(la.capture(program), options).physical
        resident[target] = plan_residency(physical, 1, 480 * 10**6, repeats=100).resident_fraction
    coarse, fine = resident.values()
    assert coarse < 0.2 < 0.28 < fine <= 480 / 1536


def test_finer_blocks_keep_the_compiled_loops(tmp_path) -> None:
    """The budget's finer blocks (51 MB, under the 64 MiB a block needs for compiled loops)
    are the same big job: its kernels say so (``worker_bytes``) and the workers compile the
    loops for them, as for its blocks without a budget; a small job's kernels do not."""
    from arrayjob import kernels
    from arrayjob.kernels import compiler
    from arrayjob.planner.physical import BlockKernel
    from arrayjob.planner.plan import TARGET_BLOCK_BYTES
    from arrayjob.planner.residency import block_target

    def logistic_kernel(rows: int, target: int) -> BlockKernel:
        X = ArrayInfo("X", parse_uri(str(tmp_path / "X.zarr")), (rows, 64), "float64", (100_000, 64), 3)
        x, w = la.from_zarr(X), la.value("w", (64,))
        program = [la.sum(la.logaddexp(0.0, x @ w)), x.T @ la.sigmoid(x @ w)]
        options = PlanOptions(cluster=ClusterShape(nodes=1, workers_per_node=2), target_block_bytes=target)
        physical = make_plan(la.capture(program), options).physical
        return next(t.kernel.fn for t in physical.tasks if isinstance(t.kernel.fn, BlockKernel))

    big = logistic_kernel(3_000_000, block_target(480 * 10**6, 3_000_000 * 64 * 8, TARGET_BLOCK_BYTES))
    small = logistic_kernel(300_000, TARGET_BLOCK_BYTES)  # 154 MB over 2 workers: blocks of 51 MB
    assert big.worker_bytes == 3_000_000 * 64 * 8 // 2
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((20_000, 64)), rng.standard_normal(64)]  # any block: the choice is the job's
    assert compiler.Program(big, args).row_loop is not None
    assert compiler.Program(small, args).row_loop is None
    got, want = kernels.run(big, *args), kernels.interpret(big, *args)
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-10)


def test_the_budget_blocks_weigh_streamed_bytes_against_tasks(tmp_path) -> None:
    """``budget_block_target`` against every candidate planned out: with free tasks it keeps
    the most resident (the fewest bytes streamed), with dear ones the fewest tasks; between
    them, the cheapest of the two costs added."""
    from arrayjob.planner.pipeline import BLOCKS_PER_BUDGET, budget_block_target
    from arrayjob.planner.plan import TARGET_BLOCK_BYTES

    X = ArrayInfo("X", parse_uri(str(tmp_path / "X.zarr")), (3_000_000, 64), "float64", (100_000, 64), 3)
    x, w = la.from_zarr(X), la.value("w", (64,))
    graph = la.capture([la.sum(la.logaddexp(0.0, x @ w)), x.T @ la.sigmoid(x @ w)])
    options = PlanOptions(cluster=ClusterShape(nodes=1, workers_per_node=2))
    budget = 400 * 10**6

    def planned(target: int, rates: StreamRates) -> tuple[int, int]:
        import dataclasses

        physical = make_plan(graph, dataclasses.replace(options, target_block_bytes=target)).physical
        r = plan_residency(physical, 1, budget, repeats=10, rates=rates)
        return r.streamed_bytes, len(physical.tasks)

    candidates = {max(2**20, min(TARGET_BLOCK_BYTES, budget // k)) for k in BLOCKS_PER_BUDGET}
    free_tasks = StreamRates(bucket_bytes_per_s=2e8, spill_bytes_per_s=1e9, spill_capacity=10**12)
    dear_tasks = StreamRates(bucket_bytes_per_s=2e8, spill_bytes_per_s=1e12, spill_capacity=10**12, task_seconds=1.0)
    for rates, key in ((free_tasks, lambda c: c[0]), (dear_tasks, lambda c: c[1])):
        chosen = budget_block_target([(graph, 10)], options, budget, X.nbytes, repeats=10, rates=rates)
        assert chosen in candidates
        assert key(planned(chosen, rates)) == min(key(planned(t, rates)) for t in candidates)
    assert budget_block_target([(graph, 10)], options, 10**10, X.nbytes, repeats=10, rates=free_tasks) == TARGET_BLOCK_BYTES


# -- results that go to the spill ---------------------------------------------------------------


def _shuffle(nodes: list[int], part: int = 100) -> PhysicalPlan:
    """A shuffle as PageRank's build is: ``split`` i makes a part of ``part`` bytes from
    stored block i; every ``build`` j takes all the parts; the builds' results are returned."""
    k = len(nodes)
    info = ArrayInfo("E", Location("file", "/nowhere/E.zarr"), (k * 10,), "float64", (10,), 3)
    kernel = Kernel("k", Combine("sum"))
    splits = [Task(f"split{i}", kernel, (SourceBlock("E", (i,)),), node=n, out_shapes=((part // 8,),),
                   out_bytes=(part,)) for i, n in enumerate(nodes)]
    builds = [Task(f"build{j}", kernel, tuple(TaskResult(f"split{i}") for i in range(k)), node=n,
                   out_shapes=((1,),), out_bytes=(8,)) for j, n in enumerate(nodes)]
    return PhysicalPlan((InputArray(info, BlockGrid((k * 10,), (10,))),), (*splits, *builds),
                        tuple(TaskResult(b.id) for b in builds))


def test_results_go_to_the_spill_until_the_rest_fit() -> None:
    physical = _shuffle([0] * 6)  # six parts of 100 bytes, all held until the first build runs
    assert intermediate_peak(physical, 1) == (600 + 6 * 8,)  # and the builds' results, returned
    assert spilled_results(physical, 1, [10_000], min_bytes=0) == frozenset()  # everything fits: nothing spilled
    for room in (250, 400, 0):
        spilled = spilled_results(physical, 1, [room], min_bytes=0)
        peak = intermediate_peak(physical, 1, spilled=spilled)
        assert peak[0] <= room + 6 * 8, (room, spilled, peak)  # the builds' results stay in memory
        assert len(spilled) == 6 - room // 100
    # Belady: the parts the builds need last go first; they all are needed at the first build,
    # so the choice falls on those made first (furthest from their next use is a tie)
    assert all(isinstance(r, TaskResult) and r.task.startswith("split") for r in spilled_results(physical, 1, [250], min_bytes=0))


def test_only_results_used_on_their_own_node_and_not_returned_go_to_the_spill() -> None:
    spread = _shuffle([0, 1, 0, 1])  # every part is used by a build on each node: none can go
    assert spilled_results(spread, 2, [0, 0], min_bytes=0) == frozenset()
    alone = _shuffle([0, 0, 0])
    spilled = spilled_results(alone, 1, [0], min_bytes=0)
    assert {r.task for r in spilled} == {"split0", "split1", "split2"}  # never the returned builds
    assert spilled_results(alone, 1, [0], min_bytes=101) == frozenset()  # too small to be worth a file
