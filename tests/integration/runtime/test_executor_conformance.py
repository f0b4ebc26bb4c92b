"""Executor conformance: what every ``Executor`` must do, run against each one for real (the
in-process executor, and the Ray executor on the suite's shared Ray instance), as
``test_backends.py`` does for storage.

The arrays are tiny (a few hundred bytes a block): what is checked is the contract (results,
which blocks are held, read, streamed and kept where) and the counters both report.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arrayjob import lazy as la
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.planner.lower import assemble_outputs
from arrayjob.planner.physical import SourceBlock, TaskResult
from arrayjob.planner.pipeline import Planner
from arrayjob.planner.plan import ClusterShape, Plan, PlanOptions
from arrayjob.planner.residency import Residency
from arrayjob.runtime.executor import Executor, LocalExecutor
from tests.harness.helpers import write_array

ROWS, COLS, CHUNK = 40, 6, 10  # X: 4 row blocks of 480 bytes
BLOCK_BYTES = CHUNK * COLS * 8
OPTIONS = PlanOptions(tiling="naive", fusion="none", placement="lshs", cluster=ClusterShape(nodes=1))


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    """A fresh executor of each kind (the Ray one on the shared instance's nodes)."""
    if request.param == "local":
        made: Executor = LocalExecutor(StorageOptions())
    else:
        request.getfixturevalue("ray_session")
        import ray

        from arrayjob.runtime.ray_executor import RayExecutor

        made = RayExecutor(StorageOptions(), tuple(n["NodeID"] for n in ray.nodes() if n["Alive"]))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def X(tmp_path: Path) -> np.ndarray:
    data = np.random.default_rng(0).standard_normal((ROWS, COLS))
    write_array(str(tmp_path / "X.zarr"), data, (CHUNK, COLS))
    return data


@pytest.fixture
def x(tmp_path: Path, X: np.ndarray) -> la.BlockArray:
    return la.from_zarr(open_array_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions()))


def plan_of(outputs: dict[str, la.BlockArray]) -> Plan:
    plan = Planner().plan(la.capture(list(outputs.values())), OPTIONS)
    assert plan.physical is not None
    return plan


def run(executor: Executor, plan: Plan, values: dict[str, Any] | None = None, **kwargs: Any) -> list[np.ndarray]:
    assert plan.physical is not None
    return assemble_outputs(plan, executor.run(plan.physical, values or {}, **kwargs))


def block(i: int) -> SourceBlock:
    return SourceBlock("X", (i, 0))


def held_bytes(executor: Executor) -> int:
    return sum(executor.metrics.block_bytes_by_node.values())


class TestExecutor:
    def test_load_reads_each_block_once_and_runs_equal_numpy(self, executor, x, X):
        plan = plan_of({"z": x @ la.value("w", (COLS,)), "s": la.sum(la.exp(x * 0.5), axis=0)})
        executor.load(plan.physical)
        m = executor.metrics
        assert m.storage.get_requests == 4 and held_bytes(executor) == X.nbytes  # a GET per chunk
        tasks = m.tasks
        for seed in range(2):
            w = np.random.default_rng(seed).standard_normal(COLS)
            z, s = run(executor, plan, {"w": w})
            np.testing.assert_allclose(z, X @ w, rtol=1e-12)
            np.testing.assert_allclose(s, np.exp(X * 0.5).sum(axis=0), rtol=1e-12)
        assert m.storage.get_requests == 4  # held across runs: never read again
        assert m.tasks == tasks + 2 * len(plan.physical.tasks)
        assert m.streaming.bytes_reread == 0 and m.faults.task_retries == 0 and not m.faults.nodes_lost

    def test_a_run_reads_blocks_not_loaded_on_first_use_and_holds_them(self, executor, x, X):
        plan = plan_of({"s": la.sum(x, axis=0)})
        for _ in range(2):
            (s,) = run(executor, plan)
            np.testing.assert_allclose(s, X.sum(axis=0), rtol=1e-12)
        assert executor.metrics.storage.get_requests == 4 and held_bytes(executor) == X.nbytes

    def test_results_spilled_by_their_tasks_are_equal(self, executor, x, X):
        plan = plan_of({"s": la.sum(la.exp(x), axis=0)})
        spilled = frozenset(TaskResult(t.id) for t in plan.physical.tasks if t.id not in
                            {o.task for o in plan.physical.outputs})
        assert spilled
        (s,) = run(executor, plan, spill_results=spilled)
        np.testing.assert_allclose(s, np.exp(X).sum(axis=0), rtol=1e-12)

    def test_run_submits_tasks_in_the_order_given(self, executor, tmp_path, monkeypatch):
        parts = []
        for i in range(3):  # three single-block arrays: three independent tasks, each its own kernel
            write_array(str(tmp_path / f"a{i}.zarr"), np.full((4, 2), float(i + 1)), (4, 2))  # not the fill value: stored
            parts.append(la.from_zarr(open_array_info(f"a{i}", parse_uri(str(tmp_path / f"a{i}.zarr")),
                                                      StorageOptions())))
        plan = plan_of({"p": parts[0] + 1.0, "q": parts[1] * 3.0, "r": la.exp(parts[2])})
        tasks = plan.physical.tasks
        assert len(tasks) == 3 and len({t.kernel.name for t in tasks}) == 3
        submitted = spy_submissions(executor, monkeypatch)
        order = (2, 0, 1)
        p, q, r = run(executor, plan, order=order)
        np.testing.assert_array_equal(p, np.full((4, 2), 2.0))
        np.testing.assert_array_equal(q, np.full((4, 2), 6.0))
        np.testing.assert_array_equal(r, np.exp(np.full((4, 2), 3.0)))
        assert submitted == [tasks[i].kernel.name for i in order]

    def test_demoted_blocks_are_streamed_from_storage_at_each_use(self, executor, x, X):
        plan = plan_of({"s": la.sum(x, axis=0)})
        executor.load(plan.physical)
        uri = plan.physical.source("X").array.uri
        executor.demote({(uri, block(0)), (uri, block(1))})
        assert held_bytes(executor) == X.nbytes - 2 * BLOCK_BYTES
        for _ in range(2):
            (s,) = run(executor, plan)
            np.testing.assert_allclose(s, X.sum(axis=0), rtol=1e-12)
        m = executor.metrics
        assert m.streaming.bytes_reread == 2 * 2 * BLOCK_BYTES  # read once already: every use is a re-read
        assert m.storage.get_requests == 4 + 2 * 2
        assert held_bytes(executor) == X.nbytes - 2 * BLOCK_BYTES  # streamed blocks are not held again

    def test_a_load_that_streams_holds_only_the_resident_blocks(self, executor, x, X):
        plan = plan_of({"s": la.sum(x, axis=0)})
        streamed = frozenset({block(2), block(3)})
        residency = Residency(budget=2 * BLOCK_BYTES, resident=frozenset({block(0), block(1)}), streamed=streamed,
                              source="bucket", order=tuple(range(len(plan.physical.tasks))), prefetch_depth=1,
                              block_bytes={block(i): BLOCK_BYTES for i in range(4)})
        executor.load(plan.physical, residency)
        m = executor.metrics
        assert m.storage.get_requests == 2 and held_bytes(executor) == 2 * BLOCK_BYTES
        for _ in range(3):
            (s,) = run(executor, plan)
            np.testing.assert_allclose(s, X.sum(axis=0), rtol=1e-12)
        # a streamed block's first read is a read, each later one a re-read
        assert m.streaming.bytes_reread == 2 * 2 * BLOCK_BYTES
        assert m.storage.get_requests == 2 + 3 * 2
        assert held_bytes(executor) == 2 * BLOCK_BYTES

    def test_kept_blocks_are_used_aliased_and_released(self, executor, x, X):
        plan = plan_of({"Z": la.exp(x * 0.5), "Y": x * 2.0})
        executor.keep(plan.physical, {}, "h")
        blocks = ROWS // CHUNK
        assert len(plan.physical.outputs) == 2 * blocks
        executor.alias("h:Z", "h", range(0, blocks))
        executor.alias("h:Y", "h", range(blocks, 2 * blocks))
        executor.release("h")  # the aliases hold the blocks now
        z = la.cached("h:Z", X.shape, "float64", (CHUNK, COLS))
        y = la.cached("h:Y", X.shape, "float64", (CHUNK, COLS))
        read = executor.metrics.storage.get_requests
        (s,) = run(executor, plan_of({"s": la.sum(z + y, axis=0)}))
        np.testing.assert_allclose(s, (np.exp(X * 0.5) + 2 * X).sum(axis=0), rtol=1e-12)
        assert executor.metrics.storage.get_requests == read  # kept blocks are not read again
        assert executor.kept_sizes("h:Z") == [None] * blocks  # in memory: not spilled
        executor.release("h:Z")
        with pytest.raises(KeyError):
            executor.kept_sizes("h:Z")
        (t,) = run(executor, plan_of({"t": la.sum(y, axis=0)}))  # the other name still holds its blocks
        np.testing.assert_allclose(t, 2 * X.sum(axis=0), rtol=1e-12)
        executor.release("h:Y")
        executor.release("never kept")  # releasing an unknown name is not an error

    def test_kept_blocks_spilled_where_supported_are_admitted_and_demoted(self, executor, x, X):
        plan = plan_of({"Z": la.exp(x)})
        blocks = len(plan.physical.outputs)
        executor.keep(plan.physical, {}, "k", spill=True)
        executor.alias("k:Z", "k", range(blocks))
        executor.release("k")
        z = la.cached("k:Z", X.shape, "float64", (CHUNK, COLS))
        program = plan_of({"s": la.sum(z, axis=0)})
        expected = np.exp(X).sum(axis=0)
        sizes = executor.kept_sizes("k:Z")
        if not executor.spills_kept:  # kept in memory whatever is asked; admitting is a no-op
            assert sizes == [None] * blocks
        else:  # each block in its node's spill (planner node 0: one node), as big as it is
            assert sizes == [(0, BLOCK_BYTES)] * blocks
            assert executor.metrics.streaming.spill_bytes_written >= blocks * BLOCK_BYTES
        np.testing.assert_allclose(run(executor, program)[0], expected, rtol=1e-12)
        executor.admit_kept("k:Z", [0, 1])
        if executor.spills_kept:
            assert executor.kept_sizes("k:Z") == [None, None] + [(0, BLOCK_BYTES)] * (blocks - 2)
        np.testing.assert_allclose(run(executor, program)[0], expected, rtol=1e-12)
        executor.demote_kept("k:Z", [0])
        if executor.spills_kept:
            assert executor.kept_sizes("k:Z") == [(0, BLOCK_BYTES), None] + [(0, BLOCK_BYTES)] * (blocks - 2)
        np.testing.assert_allclose(run(executor, program)[0], expected, rtol=1e-12)
        executor.release("k:Z")

    def test_nodes_are_watched_without_faults(self, executor):
        assert executor.nodes_now() is None  # neither follows a cluster's nodes unless asked
        executor.check_nodes()
        assert not executor.metrics.faults.nodes_lost and executor.metrics.faults.blocks_reconstructed == 0
        executor.close()  # twice is harmless (the fixture closes it again)


def spy_submissions(executor: Executor, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the kernels ``executor`` runs (in process) or submits (to Ray), in order."""
    names: list[str] = []
    if isinstance(executor, LocalExecutor):
        from arrayjob import kernels

        real = kernels.run

        def spy(fn: Any, *args: Any) -> Any:
            names.extend(t.kernel.name for t in spied_tasks if t.kernel.fn is fn)
            return real(fn, *args)

        spied_tasks: list[Any] = []
        original_run = executor.run

        def run_with_plan(plan, values, **kwargs):
            spied_tasks[:] = plan.tasks
            return original_run(plan, values, **kwargs)

        monkeypatch.setattr(kernels, "run", spy)
        monkeypatch.setattr(executor, "run", run_with_plan)
        return names
    from arrayjob.runtime import worker_tasks

    class Spy:
        def __init__(self, remote: Any) -> None:
            self.remote_function = remote

        def options(self, **options: Any) -> Any:
            names.append(options["name"])
            return self.remote_function.options(**options)

    for task in ("run_measured", "run_kernel", "run_streaming"):
        monkeypatch.setattr(worker_tasks, task, Spy(getattr(worker_tasks, task)))
    return names
