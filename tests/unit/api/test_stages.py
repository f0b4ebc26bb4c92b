"""Every job runs exactly the programs it declares (``Job.stages``): each in its declared
stage, as many times as declared for the iterations the run took, and nothing else. The
estimate prices that same declaration, so this is what keeps ``run`` and ``estimate`` from
drifting apart."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from arrayjob.algorithms import JOBS
from arrayjob.api.job import JobContext, StagePlan
from arrayjob.catalog import get_job
from arrayjob.io.arrays import ResultGroup
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.io.sparse import open_sparse_info
from arrayjob.lazy import capture
from arrayjob.planner.ir import Graph
from arrayjob.planner.ops import Op
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from arrayjob.spec import table_to_dataclass
from tests.harness.helpers import (
    logreg_data,
    publish_model,
    sparse_logreg_data,
    write_adjacency_group,
    write_csr_group,
)

CLUSTER = ClusterShape(nodes=2, workers_per_node=2)


def without_stores(graph: Graph) -> Graph:
    """``graph`` with its ``store`` nodes replaced by what they store: a run writes declared
    outputs on the workers (``lazy.store``), and the estimate prices those writes apart."""
    nodes: list = []
    index: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.op is Op.STORE:
            index[i] = index[node.inputs[0]]
            continue
        index[i] = len(nodes)
        nodes.append(replace(node, inputs=tuple(index[j] for j in node.inputs)))
    return Graph(tuple(nodes), tuple(index[o] for o in graph.outputs))


def run_recording(job, result=None):
    """Run ``job`` on a local executor; returns its result and every program it ran as
    (how: load | persist | compute, the stage it ran in, its graph without stores)."""
    executor = LocalExecutor(StorageOptions())
    ran: list[tuple[str, str | None, Graph]] = []
    session = Session(executor, PlanOptions(cluster=CLUSTER),
                      on_run=lambda how, graph: ran.append((how, executor.metrics.current_stage,
                                                            without_stores(graph))))
    return job.run(JobContext(session, executor.metrics, StorageOptions(), result)), ran


def assert_ran_as_declared(declared: StagePlan, ran, iterations: int) -> None:
    graphs = {p.name: without_stores(capture(list(p.program.values()))) for p in declared.passes}
    name_of = {graph: name for name, graph in graphs.items()}
    assert len(name_of) == len(graphs), "two declared passes have the same program"

    def named(graph: Graph) -> str:
        return name_of.get(graph, f"an undeclared program of {len(graph)} nodes")

    expected = Counter({(p.stage, p.name): p.runs.times(iterations) for p in declared.passes})
    runs = Counter((stage, named(graph)) for how, stage, graph in ran if how != "load")
    assert +runs == +expected
    # blocks are read for a declared program, in "load"
    assert {("load", named(graph)) for how, stage, graph in ran if how == "load"} <= \
        {("load", p.name) for p in declared.passes}




def make_job(algorithm, arrays, **params):
    cls = get_job(algorithm)
    return cls(table_to_dataclass(cls.Params, params, "params"), arrays)


def conditioned(shape, cond, seed=6):
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal(shape))
    V, _ = np.linalg.qr(rng.standard_normal((shape[1], shape[1])))
    return (U * np.logspace(0, -np.log10(cond), shape[1])) @ V.T


def logreg(put, tmp_path, solver):
    X, y = logreg_data(2000, 4)
    return make_job("logreg", {"X": put("X", X, (500, 4)), "y": put("y", y, (500,))}, solver=solver), None


def linreg(put, tmp_path, method):
    X, y = logreg_data(2000, 4)
    return make_job("linreg", {"X": put("X", X, (500, 4)), "y": put("y", y, (500,))}, method=method), None


def kmeans(put, tmp_path, init):
    rng = np.random.default_rng(2)
    X = np.concatenate([rng.standard_normal((600, 3)) + 6 * c for c in range(3)])
    job = make_job("kmeans", {"X": put("X", X, (400, 3))}, k=3, init=init, seed=1)
    return job, ResultGroup(parse_uri(str(tmp_path / "result.zarr")), StorageOptions())


def pca(put, tmp_path, method, scores=False):
    X = np.random.default_rng(9).standard_normal((2000, 6)) @ np.diag([5.0, 3, 1, 0.5, 0.2, 0.1]) + 2.0
    job = make_job("pca", {"X": put("X", X, (500, 6))}, k=2, method=method, scores=scores)
    return job, ResultGroup(parse_uri(str(tmp_path / "result.zarr")), StorageOptions())


def gmm(put, tmp_path, covariance):
    rng = np.random.default_rng(10)
    X = np.concatenate([rng.standard_normal((500, 2)) * (1 + c) + 8 * c for c in range(3)])
    job = make_job("gmm", {"X": put("X", X, (500, 2))}, k=3, covariance=covariance, seed=1)
    return job, ResultGroup(parse_uri(str(tmp_path / "result.zarr")), StorageOptions())


def tsqr(put, tmp_path, method, cond=None):
    A = conditioned((3000, 8), cond) if cond else np.random.default_rng(6).standard_normal((3000, 8))
    job = make_job("tsqr", {"A": put("A", A, (500, 8))}, method=method)
    return job, ResultGroup(parse_uri(str(tmp_path / "result.zarr")), StorageOptions())


def mttkrp(put, tmp_path, mode):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((12, 10, 8))
    arrays = {"X": put("X", X, (4, 10, 8))}
    for name in "ABC":
        if name != "ABC"[mode]:
            arrays[name] = put(name, rng.standard_normal((X.shape["ABC".index(name)], 3)), (50, 3))
    return make_job("mttkrp", arrays, mode=mode), None


def cp_als(put, tmp_path):
    X = np.random.default_rng(5).standard_normal((9, 8, 7))
    return make_job("cp_als", {"X": put("X", X, (3, 8, 7))}, rank=2, max_iter=6, tol=1e-12), None


def pagerank(put, tmp_path, csr=False):
    rng = np.random.default_rng(8)
    edges = rng.integers(0, 150, size=(1200, 2))
    if not csr:
        return make_job("pagerank", {"edges": put("edges", edges, (300, 2))}, tol=1e-10), None
    write_adjacency_group(str(tmp_path / "graph.zarr"), edges, 150, "anndata", chunks=(300, 100))
    opened = open_sparse_info("edges", parse_uri(str(tmp_path / "graph.zarr")), StorageOptions(), pattern=True)
    return make_job("pagerank", {"edges": opened.info}, tol=1e-10), None


def predict(put, tmp_path, algorithm):
    from arrayjob.io.model import open_model

    rng = np.random.default_rng(3)
    fitted = {"logreg": {"coef": rng.standard_normal((3, 4)), "intercept": rng.standard_normal(3)},
              "kmeans": {"centroids": rng.standard_normal((5, 4))}}[algorithm]
    model = open_model("model", parse_uri(publish_model(tmp_path / "model", algorithm, fitted)), StorageOptions())
    job = get_job("predict")(table_to_dataclass(get_job("predict").Params, {}, "params"),
                             {"X": put("X", rng.standard_normal((900, 4)), (300, 4))}, models={"model": model})
    return job, ResultGroup(parse_uri(str(tmp_path / "result.zarr")), StorageOptions())


def als(put, tmp_path, implicit=False):
    R, _ = sparse_logreg_data(400, 50, nnz_per_row=5, seed=3)
    if implicit:
        R.data = np.abs(R.data)
    write_csr_group(str(tmp_path / "R"), R, (300, 300, 100))
    opened = open_sparse_info("R", parse_uri(str(tmp_path / "R")), StorageOptions())
    return make_job("als", {"R": opened.info}, rank=2, max_iter=3, implicit=implicit), None


CASES = {
    "logreg-lbfgs": (logreg, {"solver": "lbfgs"}),
    "logreg-newton": (logreg, {"solver": "newton"}),
    "linreg-tsqr": (linreg, {"method": "tsqr"}),
    "linreg-normal": (linreg, {"method": "normal"}),
    "linreg-cg": (linreg, {"method": "cg"}),
    "kmeans": (kmeans, {"init": "k-means++"}),
    "pca-exact-scores": (pca, {"method": "exact", "scores": True}),
    "pca-randomized": (pca, {"method": "randomized"}),
    "gmm-full": (gmm, {"covariance": "full"}),
    "tsqr-auto": (tsqr, {"method": "auto"}),
    "tsqr-householder": (tsqr, {"method": "householder"}),
    "tsqr-auto-falls-back": (tsqr, {"method": "auto", "cond": 1e9}),
    "mttkrp": (mttkrp, {"mode": 1}),
    "cp_als": (cp_als, {}),
    "pagerank-edges": (pagerank, {}),
    "pagerank-csr": (pagerank, {"csr": True}),
    "predict-logreg": (predict, {"algorithm": "logreg"}),
    "predict-kmeans": (predict, {"algorithm": "kmeans"}),
    "als-explicit": (als, {}),
    "als-implicit": (als, {"implicit": True}),
}


def test_every_algorithm_has_a_case():
    assert {make.__name__ for make, _ in CASES.values()} == set(JOBS)


@pytest.mark.parametrize("case", CASES)
def test_a_run_runs_what_its_job_declares(put, tmp_path, case):
    make, params = CASES[case]
    job, result = make(put, tmp_path, **params)
    r, ran = run_recording(job, result)
    workers = CLUSTER.workers
    if job.name == "pagerank":  # the run learns the node count, then builds its programs for it
        declared = job.stages(workers, n_nodes=r.attrs["n_nodes"])
    elif job.name == "tsqr":  # the condition check chose the path
        declared = job.stages(workers, fallback="cond(A) above" in r.summary[0])
        assert ("cond(A) above" in r.summary[0]) == (case == "tsqr-auto-falls-back")
    else:
        declared = job.stages(workers)
    iterations = r.attrs.get("iterations", 0)
    if job.name == "pca" and iterations:  # its first power iteration is the start pass, declared once
        iterations -= 1
    if job.name == "logreg":  # a backtracking line search steps more than once per iteration
        assert r.attrs["evaluations"] >= iterations + 1
        iterations = r.attrs["evaluations"] - 1
    if declared.main.runs.per_iteration:
        assert iterations >= 2, "the case should iterate"
    assert_ran_as_declared(declared, ran, iterations)


def test_a_drifted_run_is_caught(put, tmp_path):
    """An extra run of a program, or a program the declaration does not name, fails the check."""
    job, _ = kmeans(put, tmp_path, "random")
    r, ran = run_recording(job)
    declared = job.stages(CLUSTER.workers)
    assert_ran_as_declared(declared, ran, r.attrs["iterations"])
    with pytest.raises(AssertionError):
        assert_ran_as_declared(declared, [*ran, ran[-1]], r.attrs["iterations"])
    with pytest.raises(AssertionError):
        assert_ran_as_declared(declared, [(how, "fit" if stage == "load" else stage, graph)
                                          for how, stage, graph in ran], r.attrs["iterations"])
