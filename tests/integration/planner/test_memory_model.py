"""The run and the estimate decide memory with one model (``planner.memory``): every shipped
config, run on Ray under a budget that makes its inputs stream (and PageRank's kept graph go
to the spill), records the same decisions, block by block, as its estimate priced."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from arrayjob.api.job import JobContext
from arrayjob.costing.estimate import estimate_cluster, estimate_job, stream_rates
from arrayjob.costing.prices import load_prices
from arrayjob.costing.profile import SHIPPED
from arrayjob.io.arrays import ResultGroup
from arrayjob.io.checkpoint import Checkpoints
from arrayjob.io.locations import parse_uri
from arrayjob.lazy import capture
from arrayjob.planner.memory import Admission, MemoryBudget, ProgramMemory
from arrayjob.runner import plan_options, prepare
from arrayjob.spec import load_spec
from tests.harness.helpers import run_cli
from tests.unit.api.test_stages import without_stores

pytestmark = pytest.mark.usefixtures("ray_session")

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
# datagen's algorithm and options (small: 8 row blocks or so) and the budget as a share of the
# inputs' bytes, for every config in configs/ (test_every_shipped_config_is_a_case)
CASES = {
    "logreg": ("logreg", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000"], 0.4),
    "logreg_multinomial": ("logreg", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000", "--classes", "3"], 0.4),
    "linreg": ("linreg", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000"], 0.4),
    "kmeans": ("kmeans", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000", "--k", "4"], 0.4),
    "tsqr": ("tsqr", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000"], 0.4),
    "pca": ("pca", ["--rows", "8000", "--cols", "12", "--chunk-rows", "1000", "--rank", "3"], 0.4),
    "gmm": ("gmm", ["--rows", "8000", "--cols", "4", "--chunk-rows", "1000", "--k", "3"], 0.4),
    "als": ("als", ["--rows", "4000", "--cols", "500", "--nnz-per-row", "10", "--chunk-rows", "500", "--rank", "3"], 0.4),
    "als_table": ("als", ["--rows", "4000", "--cols", "500", "--nnz-per-row", "10", "--chunk-rows", "500", "--rank",
                          "3", "--format", "parquet"], 0.4),
    # recommends with the ALS model the test fits first, for every user of als's data
    "predict_als": ("als", ["--rows", "4000", "--cols", "500", "--nnz-per-row", "10", "--chunk-rows", "500",
                            "--rank", "3"], 0.95),
    # scores with the logreg model the test publishes first, on logreg's data
    "predict": ("logreg", ["--rows", "8000", "--cols", "6", "--chunk-rows", "1000"], 0.7),
    "mttkrp": ("mttkrp", ["--shape", "400,12,10", "--chunk-rows", "50", "--rank", "3"], 0.4),
    "cp_als": ("cp_als", ["--shape", "400,12,10", "--chunk-rows", "50", "--rank", "3"], 0.4),
    "pagerank": ("pagerank", ["--rows", "20000"], 0.4),
}
PARAMS = {"logreg": ["params.max_iter=6"], "kmeans": ["params.max_iter=5", "params.k=4"],
          "logreg_multinomial": ["params.max_iter=6", "params.classes=3"],
          "pca": ["params.k=3"], "gmm": ["params.max_iter=4", "params.k=3"],
          "als": ["params.max_iter=3", "params.rank=3"], "als_table": ["params.max_iter=3", "params.rank=3"],
          "predict_als": ["params.top_n=1"],
          "cp_als": ["params.max_iter=4", "params.rank=3"],
          # the run learns the node count from the edges; the estimate is told it (else it plans
          # for as many nodes as edges)
          "pagerank": ["params.max_iter=5", "params.n_nodes=20000"]}
# where datagen writes a config's data: the directory its inputs name
DATA = {"predict": "logreg", "predict_als": "als"}
# the config that fits the model a scoring config scores with (on the same data)
MODEL = {"predict": ("logreg", ["params.max_iter=3"]), "predict_als": ("als", ["params.max_iter=3", "params.rank=3"])}


def test_every_shipped_config_is_a_case():
    assert sorted(CASES) == sorted(p.stem for p in CONFIGS.glob("*.toml"))


def by_pass(log, ran_graphs, declared) -> dict[str, tuple[dict, list]]:
    """The run's log as (the first decisions of each declared pass, the admissions after it);
    a load's split counts as that of the program it loads for."""
    names = {without_stores(capture(list(p.program.values()))): p.name for p in declared.passes}
    programs = [entry for entry in log if isinstance(entry, ProgramMemory)]
    assert len(programs) == len(ran_graphs)
    out: dict[str, tuple[dict, list]] = {}
    loaded = None
    current = None
    for entry in log:
        if isinstance(entry, Admission):
            if current is not None:
                out[current][1].append({k: list(v) for k, v in entry.positions.items()})
            continue
        how, graph = ran_graphs[programs.index(entry)]
        name = names[without_stores(graph)]
        if how == "load":
            loaded = entry
            continue
        summary = entry.summary()
        if loaded is not None:  # a load then its first compute: the split is the load's
            assert summary["resident"] is None
            summary["resident"] = loaded.summary()["resident"]
            summary["streamed_from"] = loaded.summary()["streamed_from"]
            loaded = None
        current = name if name not in out else None
        if current is not None:
            out[name] = (summary, [])
    return out


@pytest.mark.parametrize("algorithm", sorted(CASES))
def test_the_run_applies_the_decisions_the_estimate_priced(algorithm, tmp_path, monkeypatch, capsys):
    import ray

    from arrayjob.runtime.metrics import RunMetrics
    from arrayjob.runtime.ray_executor import RayExecutor
    from arrayjob.runtime.session import Session

    generator, options, share = CASES[algorithm]
    bucket = tmp_path / "bucket"
    data = bucket / "demo" / DATA.get(algorithm, algorithm)
    code, _, err = run_cli(["datagen", generator, str(data), *options], capsys)
    assert code == 0, err
    monkeypatch.setenv("ARRAYJOB_BUCKET", str(bucket))
    if algorithm in MODEL:  # the model it scores with
        config, sets = MODEL[algorithm]
        code, _, err = run_cli(["run", str(CONFIGS / f"{config}.toml"), "--quiet",
                                *(a for s in sets for a in ("--set", s))], capsys)
        assert code == 0, err
    spec = load_spec(CONFIGS / f"{algorithm}.toml", PARAMS.get(algorithm, []))
    job = prepare(spec)
    inputs = sum(info.nbytes for info in job.arrays.values())
    spec = load_spec(CONFIGS / f"{algorithm}.toml",
                     [*PARAMS.get(algorithm, []), f"cluster.memory_budget={int(share * inputs)}"])
    job = prepare(spec)
    prices = load_prices()
    instance = prices.instance("local")
    profile = SHIPPED
    rates = stream_rates(profile)
    iterations = job.iterations_assumed()[0]
    store = 2**30
    estimate = estimate_job(job, spec, nodes=1, instance=instance, prices=prices, profile=profile,
                            store_bytes=store, rates=rates)
    assert estimate.memory is not None

    # the run, set up as ``runner.run`` sets it up, on the estimate's cluster
    budget = MemoryBudget(spec.cluster.budget_bytes(store), iterations, rates)
    cluster = estimate_cluster(1, instance, profile)
    node_ids = tuple(n["NodeID"] for n in ray.nodes() if n["Alive"])
    metrics = RunMetrics()
    executor = RayExecutor(spec.storage, node_ids, metrics)
    ran = []
    try:
        session = Session(executor, plan_options(spec, cluster, job, budget), budget=budget,
                          on_run=lambda how, graph: ran.append((how, graph)))
        result = ResultGroup(parse_uri(str(tmp_path / "result.zarr")), spec.storage)
        job.run(JobContext(session, metrics, spec.storage, result, Checkpoints()))
    finally:
        executor.close()
    assert any(r.streams for r in session.residencies), "the budget should make the inputs stream"

    declared = job.stages(cluster.workers)
    run = by_pass(session.memory.log, ran, declared)
    estimated = by_pass(estimate.memory.log, [("persist" if p.keeps else "compute",
                                               capture(list(p.program.values()))) for p in declared.passes],
                        declared)
    for name in run:
        assert run[name][0] == estimated[name][0], f"pass {name}: the run decided otherwise than the estimate"
        assert run[name][1] == estimated[name][1], f"after pass {name}: kept blocks admitted otherwise"
    if algorithm == "pagerank":  # the kept graph goes to the spill, and some of it comes back
        assert any(d["kept_to_spill"] for d, _ in run.values())
    assert dataclasses.asdict(budget) == dataclasses.asdict(session.memory.budget)
