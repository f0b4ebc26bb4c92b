"""Jobs bigger than their memory budget, end to end on Ray: each algorithm with the budget at
about 40 % of its input finishes with the unconstrained run's result, its measured peak per
node within the budget; streamed blocks come back from the spill or, on S3, from the bucket,
with their GETs counted and estimated exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from arrayjob.costing.profile import SHIPPED, save_profile
from tests.harness.helpers import read_result, run_cli, without_progress

pytestmark = pytest.mark.usefixtures("ray_session")

# (algorithm, datagen options, params) — small inputs cut into 4 row blocks (2 per worker)
JOBS = {
    "logreg-lbfgs": ("logreg", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000"],
                     {"solver": '"lbfgs"', "max_iter": "15"}),
    "logreg-newton": ("logreg", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000"],
                      {"solver": '"newton"', "max_iter": "6"}),
    # a sparse X (CSR, 5 non-zeros per row): its row blocks streamed and spilled like dense ones
    "logreg-sparse": ("logreg", ["--rows", "8000", "--cols", "300", "--nnz-per-row", "5", "--chunk-rows", "1000"],
                      {"solver": '"lbfgs"', "max_iter": "15"}),
    "kmeans": ("kmeans", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000", "--k", "4"],
               {"k": "4", "max_iter": "8"}),
    "cp_als": ("cp_als", ["--shape", "400,12,10", "--chunk-rows", "50", "--rank", "3"],
               {"rank": "3", "max_iter": "6"}),
    "linreg": ("linreg", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000"], {}),
    "tsqr": ("tsqr", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000"], {}),
    "mttkrp": ("mttkrp", ["--shape", "400,12,10", "--chunk-rows", "50", "--rank", "3"], {}),
    # the ratings' row blocks streamed; the split pieces and the column layout built from them
    # (kept between iterations) go to the spill
    "als": ("als", ["--rows", "8000", "--cols", "1000", "--nnz-per-row", "40", "--chunk-rows", "1000"],
            {"rank": "4", "max_iter": "4"}),
}
ITERATIVE = ("logreg-lbfgs", "logreg-newton", "logreg-sparse", "kmeans", "cp_als", "als")


def spec_for(root: Path, name: str, data: str, output: str, endpoint: str | None = None) -> Path:
    algorithm, _, params = JOBS[name]
    config = Path(__file__).resolve().parents[3] / "configs" / f"{algorithm}.toml"
    text = config.read_text()
    start = text.index("[inputs]")
    inputs = text[start:text.index("\n[", start + 1) + 1].replace(
        "${ARRAYJOB_BUCKET:-../.arrayjob/bucket}/demo/" + algorithm, data)
    body = f'[job]\nname = "ooc-{name}"\nalgorithm = "{algorithm}"\n\n{inputs}[params]\n'
    body += "".join(f"{k} = {v}\n" for k, v in params.items())
    body += f'\n[output]\nuri = "{output}"\n'
    if endpoint:
        body += f'\n[storage]\nendpoint_url = "{endpoint}"\n'
    path = root / f"{name}.toml"
    path.write_text(body)
    return path


def run_json(capsys, spec: Path, *sets: str) -> dict:
    args = ["run", str(spec), "--json", "--overwrite"]
    for s in sets:
        args += ["--set", s]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    return json.loads(out)


def results(output: str, endpoint: str | None = None) -> dict[str, np.ndarray]:
    group = read_result(output, endpoint)
    return {name: np.asarray(group[name][...]) for name in group.array_keys()}


@pytest.fixture
def slow_spill(workdir: Path) -> None:
    """A calibrated profile whose local disk reads slower than storage: streamed blocks come
    back from the bucket."""
    from dataclasses import replace

    save_profile(replace(SHIPPED, spill_read_bytes_per_s=SHIPPED.storage_read_bytes_per_s / 10))


def generate(capsys, name: str, where: str) -> None:
    algorithm, options, _ = JOBS[name]
    code, _, err = run_cli(["datagen", algorithm, where, *options], capsys)
    assert code == 0, err


@pytest.mark.parametrize("name", list(JOBS))
def test_a_budget_of_40_percent_gives_the_same_result(workdir, capsys, name):
    generate(capsys, name, str(workdir / "data"))
    spec = spec_for(workdir, name, str(workdir / "data"), str(workdir / "free"))
    free = run_json(capsys, spec)
    inputs = sum(free["memory"]["input_block_bytes_per_node"])
    assert free["memory"]["resident_fraction"] == 1.0 and free["storage"]["bytes_reread"] == 0
    budget = int(0.4 * inputs)
    bounded = run_json(capsys, spec, f"cluster.memory_budget={budget}", f"output.uri={workdir / 'bounded'}")

    memory = bounded["memory"]
    assert max(memory["peak_bytes_per_node"]) <= budget == memory["budget_bytes"]
    # an iteration keeps a fixed part; a single pass keeps nothing (each block is used once)
    assert 0 < memory["resident_fraction"] < 0.4 if name in ITERATIVE else memory["resident_fraction"] == 0.0
    assert sum(memory["input_block_bytes_per_node"]) <= budget
    expected, got = results(str(workdir / "free")), results(str(workdir / "bounded"))
    assert expected.keys() == got.keys()
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-8, atol=1e-8, err_msg=key)
    if name in ITERATIVE:  # blocks came back from the spill, every later iteration
        assert memory["streamed_from"] == "spill" and memory["spill_bytes_read"] > 0
        # the load read the streamed blocks into the spill (as estimated): a fit reads no storage
        stages = {s["name"]: s for s in bounded["stages"]}
        estimated = {s["name"]: s for s in bounded["estimate"]["stages"]}
        assert stages["load"]["storage.bytes_read"] == pytest.approx(estimated["load"]["storage.bytes_read"], abs=1024)
        assert stages["load"]["storage.bytes_read"] >= inputs
        if name == "logreg":  # nothing demoted (KMeans' final pass re-reads what it pushes out)
            assert stages["fit"]["storage.bytes_read"] == estimated["fit"]["storage.bytes_read"] == 0
    else:  # no iterations: blocks read by their tasks, once per task (TSQR reads A twice), as estimated
        assert memory["spill_bytes_read"] == 0
        assert bounded["storage"]["bytes_reread"] == bounded["estimate"]["storage"]["bytes_reread"]
    # storage.bytes_read grows by the re-reads (blocks a later program's intermediates pushed out)
    # (up to a few bytes of metadata, read by whichever process opens an array first)
    grown = free["storage"]["bytes_read"] + bounded["storage"]["bytes_reread"]
    assert bounded["storage"]["bytes_read"] == pytest.approx(grown, abs=64)
    assert bounded["estimate"]["memory"]["resident_fraction"] == memory["resident_fraction"]
    if name != "tsqr":  # the estimate holds TSQR's Q whole: the store the run adds is not in its pass
        assert max(bounded["estimate"]["memory"]["peak_bytes_per_node"]) <= budget


def test_streamed_from_the_bucket_on_s3_counted_and_estimated_exactly(workdir, capsys, s3_endpoint, s3_bucket,
                                                                      monkeypatch, slow_spill):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # for datagen
    name = "logreg-newton"
    data, output = f"s3://{s3_bucket}/data", f"s3://{s3_bucket}/out"
    generate(capsys, name, data)
    spec = spec_for(workdir, name, data, output, s3_endpoint)
    free = run_json(capsys, spec)
    inputs = sum(free["memory"]["input_block_bytes_per_node"])
    report = run_json(capsys, spec, f"cluster.memory_budget={int(0.4 * inputs)}", f"output.uri={output}-b")

    memory, storage = report["memory"], report["storage"]
    assert memory["streamed_from"] == "bucket" and memory["spill_bytes_read"] == 0
    runs = report["result"]["evaluations"]  # passes over X: the first reads every block, the rest re-read
    streamed = inputs - round(memory["resident_fraction"] * inputs)
    assert storage["bytes_reread"] == (runs - 1) * streamed > 0
    # storage.bytes_read grows by the re-reads (up to the metadata a fresh worker process reads)
    assert storage["bytes_read"] == pytest.approx(free["storage"]["bytes_read"] + storage["bytes_reread"], abs=1024)
    assert storage["get_requests"] == pytest.approx(free["storage"]["get_requests"] + storage["reread_requests"],
                                                    abs=4)
    assert storage["reread_requests"] > 0

    # the estimate for as many passes predicts the same bytes and GETs
    code, out, err = run_cli(["estimate", str(spec), "--format", "json", "--iterations", str(runs - 1),
                              "--set", f"cluster.memory_budget={int(0.4 * inputs)}"], capsys)
    assert code == 0, err
    estimate = json.loads(out)
    assert estimate["storage"]["bytes_reread"] == storage["bytes_reread"]
    assert estimate["storage"]["reread_requests"] == storage["reread_requests"]
    assert estimate["memory"]["resident_fraction"] == memory["resident_fraction"]
    for key in expected_keys(free):
        np.testing.assert_allclose(results(f"{output}-b", s3_endpoint)[key], results(output, s3_endpoint)[key],
                                   rtol=1e-8, atol=1e-8)


def expected_keys(report: dict) -> list[str]:
    return ["coef", "intercept"]


def test_a_block_bigger_than_the_budget_is_refused_before_anything_runs(workdir, capsys):
    generate(capsys, "logreg-lbfgs", str(workdir / "data"))
    spec = spec_for(workdir, "logreg-lbfgs", str(workdir / "data"), str(workdir / "out"))
    code, out, err = run_cli(["run", str(spec), "--set", "cluster.memory_budget=50000"], capsys)
    assert code == 2 and out == ""
    err = without_progress(err)
    assert err.startswith("arrayjob: error: cluster.memory_budget: a block of inputs.X is ")
    assert "even streamed; " in err and err.count("\n") == 1
    assert not (workdir / "out").exists() or not any((workdir / "out").rglob("_SUCCESS"))
    code, _, err2 = run_cli(["estimate", str(spec), "--set", "cluster.memory_budget=50000"], capsys)
    assert code == 2 and err2 == err


@pytest.mark.parametrize("measure", [True, False])
def test_session_streams_under_a_budget_and_close_removes_the_spill(tmp_path, measure):
    import os

    import ray

    from arrayjob.io.locations import StorageOptions
    from arrayjob.planner.plan import ClusterShape, PlanOptions
    from arrayjob.planner.residency import StreamRates
    from arrayjob.runtime.executor import LocalExecutor
    from arrayjob.runtime.ray_executor import RayExecutor
    from arrayjob.runtime.session import MemoryBudget, Session
    from tests.system.runtime.test_multinode import logreg_program

    program, X, y = logreg_program(tmp_path)  # 12 row blocks of 500 × 5 (and y)
    node_ids = tuple(n["NodeID"] for n in ray.nodes() if n["Alive"])
    options = PlanOptions(tiling="naive", fusion="none", placement="lshs", cluster=ClusterShape(nodes=1),
                          target_block_bytes=500 * 5 * 8)
    spill = StreamRates(bucket_bytes_per_s=1e8, spill_bytes_per_s=1e9, spill_capacity=2**30)
    ray_executor = RayExecutor(StorageOptions(), node_ids, measure=measure)
    w = np.linspace(-1, 1, X.shape[1])
    z = X @ w
    for executor, rates in ((ray_executor, spill), (LocalExecutor(StorageOptions()), None)):
        budget = MemoryBudget(X.nbytes // 2, repeats=4, rates=rates)
        session = Session(executor, options, budget=budget)
        session.load(program)
        (residency,) = session.residencies
        assert residency.streams and 0 < residency.resident_fraction < 0.5  # the rest: intermediates
        try:
            for _ in range(3):
                out = session.compute(program, {"w": w})
        except BaseException:
            executor.close()
            raise
        np.testing.assert_allclose(out["loss"], np.logaddexp(0.0, -(2 * y - 1) * z).sum(), rtol=1e-12)
        np.testing.assert_allclose(out["grad"], X.T @ (1 / (1 + np.exp(-z)) - y), rtol=1e-12)
        streaming = executor.metrics.streaming
        physical = session.plan(program).physical
        uses = {b: sum(b in t.args for t in physical.tasks) for b in residency.streamed}  # unfused: X twice
        again = sum((3 * n - 1) * residency.block_bytes[b] for b, n in uses.items())  # all reads but the first
        if rates is None:  # in process: re-read from storage at every use after the first
            assert streaming.bytes_reread == again
        else:  # the load read each streamed block into the spill; every use read it back
            assert streaming.bytes_reread == 0 and streaming.spill_bytes_written == residency.streamed_bytes
            assert streaming.spill_bytes_read == again + sum(residency.block_bytes[b] for b in uses)
            spill_dir = ray_executor._spill_dir
            assert len(os.listdir(spill_dir)) == len(residency.streamed)
            executor.close()
            assert not os.path.exists(spill_dir)


def test_pagerank_streams_its_edges_its_build_and_its_graph_within_the_budget(workdir, capsys):
    from arrayjob.cli.format import memory_line

    code, _, err = run_cli(["datagen", "pagerank", str(workdir / "data"), "--rows", "20000"], capsys)
    assert code == 0, err
    spec = workdir / "pagerank.toml"
    spec.write_text(f'[job]\nname = "ooc-pagerank"\nalgorithm = "pagerank"\n\n[inputs]\n'
                    f'edges = "{workdir / "data" / "edges.zarr"}"\n\n[params]\nmax_iter = 20\n\n'
                    f'[output]\nuri = "{workdir / "free"}"\n')
    free = run_json(capsys, spec)
    edges = free["storage"]["bytes_read"]
    assert free["memory"]["spill_bytes_written"] == 0  # everything fits: nothing goes to the spill
    budget = int(0.4 * edges)
    bounded = run_json(capsys, spec, f"cluster.memory_budget={budget}", f"output.uri={workdir / 'bounded'}")
    np.testing.assert_allclose(results(str(workdir / "bounded"))["rank"], results(str(workdir / "free"))["rank"],
                               rtol=1e-8, atol=1e-12)
    memory = bounded["memory"]
    assert 0 < memory["resident_fraction"] < 0.4 and memory["streamed_from"] is not None  # the edges stream
    # the graph (about 0.6 of the edges' bytes, kept between iterations) and the build's edge
    # chunks sorted by target block (half the edges' bytes, all held until the last block is
    # built) go to the spill too: the peak in memory stays within the budget
    graph = free["memory"]["peak_bytes_per_node"][0] - free["memory"]["input_block_bytes_per_node"][0]
    assert memory["spill_bytes_written"] > graph
    assert max(memory["peak_bytes_per_node"]) <= budget
    (line,) = memory_line(bounded)
    assert "resident within" in line and "over the" not in line


@pytest.mark.parametrize("measure", [True, False])
def test_kept_blocks_over_the_budget_are_spilled_admitted_as_room_allows_and_lost_loudly(tmp_path, measure):
    import os

    import ray

    import arrayjob.lazy as la
    from arrayjob.errors import ClusterError
    from arrayjob.io.arrays import open_array_info
    from arrayjob.io.locations import StorageOptions, parse_uri
    from arrayjob.planner.plan import ClusterShape, PlanOptions
    from arrayjob.planner.residency import StreamRates
    from arrayjob.runtime.ray_executor import KeptBlockLost, RayExecutor
    from arrayjob.runtime.session import MemoryBudget, Session
    from tests.system.runtime.test_multinode import logreg_program

    _, X, _ = logreg_program(tmp_path)  # X: 12 row blocks of 500 × 5, 20 kB each
    x = la.from_zarr(open_array_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions()))
    node_ids = tuple(n["NodeID"] for n in ray.nodes() if n["Alive"])
    options = PlanOptions(tiling="naive", fusion="none", placement="lshs", cluster=ClusterShape(nodes=1),
                          target_block_bytes=500 * 5 * 8)
    rates = StreamRates(bucket_bytes_per_s=1e8, spill_bytes_per_s=1e9, spill_capacity=2**30)
    executor = RayExecutor(StorageOptions(), node_ids, measure=measure)
    budget = 2 * X.nbytes
    session = Session(executor, options, budget=MemoryBudget(budget, repeats=4, rates=rates))

    def spilled(kept: dict) -> int:
        return sum(s is not None for s in executor.kept_sizes(kept["k"].attrs.handle))

    try:
        # X is resident, and by the plan's sizes the program's results fit beside it: kept
        # in memory as without a budget, and counted against it
        twice = session.persist({"k": x * 2.0})
        assert spilled(twice) == 0 and session.memory.resident_bytes == [2 * X.nbytes]
        # no room left: the results go to the spill, each used from its file
        thrice = session.persist({"k": x * 3.0})
        assert spilled(thrice) == 12
        out = session.compute({"s": la.sum(thrice["k"], axis=0)})
        np.testing.assert_allclose(out["s"], 3 * X.sum(axis=0), rtol=1e-12)
        read = executor.metrics.streaming.spill_bytes_read
        assert read >= X.nbytes  # each block at each use
        session.release(twice)
        # the room it leaves is taken, less what the sum's intermediates need: read into memory
        admitted = 12 - spilled(thrice)
        assert admitted >= 10 and session.memory.resident_bytes[0] <= budget
        again = session.compute({"s": la.sum(thrice["k"], axis=0)})
        np.testing.assert_array_equal(again["s"], out["s"])
        assert executor.metrics.streaming.spill_bytes_read < 2 * read  # the spilled blocks' uses, and the admission
        # a spilled kept block whose file is gone (its node lost) fails the program with exit 5
        four = session.persist({"k": x * 4.0})
        assert spilled(four) == 12
        for name in os.listdir(executor._spill_dir):
            os.remove(os.path.join(executor._spill_dir, name))
        with pytest.raises(KeptBlockLost, match="lost with its node") as raised:
            session.compute({"s": la.sum(four["k"], axis=0)})
        assert isinstance(raised.value, ClusterError) and raised.value.exit_code == 5
    finally:
        executor.close()
    assert not os.path.exists(executor._spill_dir)


def test_a_result_that_cannot_be_written_to_the_spill_stays_in_the_store(tmp_path):
    """A full disk (here: a spill path under a file, which no directory can be made in):
    the task's result is returned as it is, and its record says it is in the store."""
    import ray

    from arrayjob.io.locations import StorageOptions
    from arrayjob.planner.physical import Combine
    from arrayjob.runtime import kept_spill
    from arrayjob.runtime.worker_tasks import run_streaming

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    block = np.arange(12.0).reshape(3, 4)
    good, bad = str(tmp_path / "spill" / "ok.bin"), str(blocker / "no.bin")
    kept, record = ray.get(run_streaming.options(num_returns=2).remote(
        Combine("sum"), 1, StorageOptions(), (good,), block))
    assert isinstance(kept, kept_spill.KeptFile) and record[1] == (0,)
    np.testing.assert_array_equal(kept.read(), block)
    stayed, record = ray.get(run_streaming.options(num_returns=2).remote(
        Combine("sum"), 1, StorageOptions(), (bad,), block))
    np.testing.assert_array_equal(stayed, block)
    assert record[1] == (block.nbytes,) and ("kept-written", bad) not in record[4]
