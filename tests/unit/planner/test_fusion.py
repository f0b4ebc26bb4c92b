"""Fusion: which operators become one kernel, what that saves, and that fused plans compute the same.

The analyses follow KASEN (Zhang et al., VLDB'16) and SystemML codegen (Boehm et al.,
VLDB'18): Black-Scholes is one pass over its inputs, a PageRank iteration's vector operations
are one kernel, K-means reads X once per iteration, the logistic loss and gradient are one
row-template kernel. Every program runs under each fusion strategy and is checked against
NumPy.
"""

from __future__ import annotations

import math
import pickle
import time

import numpy as np
import pytest

import arrayjob.lazy as la
from arrayjob import kernels
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.kernels import block_kernel as running
from arrayjob.kernels import compiler, primitives, row_chunks
from arrayjob.planner import contraction, fusion, fusion_model
from arrayjob.planner.ops import Const, Map, Op, Reduce
from arrayjob.planner.physical import BlockKernel, Step
from arrayjob.planner.pipeline import make_plan
from arrayjob.planner.plan import ClusterShape, PlanOptions, Tiling
from arrayjob.planner.registry import register
from arrayjob.planner.tiling import with_tilings
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from tests.harness.helpers import block_kernel, write_array

FUSIONS = ("none", "all", "cost")
CLUSTER = ClusterShape(nodes=2, workers_per_node=2)


@register("tiling", "test-rows")
def _rows(plan):
    """Cut the classes holding a stored array's first axis, nothing else: the row partitioning a
    tiler picks for these programs, fixed here so the fusion tests don't depend on the tiler."""
    g = plan.graph
    classes = g.axis_classes
    rows = {classes.of_axis(i, 0) for i, n in enumerate(g.nodes) if n.op == "source" and n.ndim}
    return with_tilings(plan, tuple(
        Tiling(tuple(a for a in range(n.ndim) if classes.of_axis(i, a) in rows and n.shape[a] > 1))
        if n.op not in ("const", "value") else Tiling()
        for i, n in enumerate(g.nodes)))


def _source(tmp_path, name, data, chunks):
    uri = str(tmp_path / f"{name}.zarr")
    write_array(uri, data, chunks)
    return la.from_zarr(open_array_info(name, parse_uri(uri), StorageOptions()))


def _options(fusion_name, tiling="test-rows"):
    return PlanOptions(tiling=tiling, fusion=fusion_name, placement="roundrobin", cluster=CLUSTER)


def _plan(outputs, fusion_name, tiling="test-rows"):
    return make_plan(la.capture(list(outputs.values())), _options(fusion_name, tiling))


def _run(outputs, values, fusion_name, tiling="test-rows"):
    session = Session(LocalExecutor(StorageOptions()), _options(fusion_name, tiling))
    return session.compute(outputs, values)


def _kernel_reading(plan, node):
    return [k for k in plan.kernels if any(node in plan.graph.nodes[v].inputs for v in k.nodes)]


def _source_node(plan, name):
    return next(i for i, n in enumerate(plan.graph.nodes) if n.op == "source" and n.attrs.array.name == name)


# -- programs ----------------------------------------------------------------------------------


def black_scholes(S, X, T, r, v):
    """The idiomatic program: maps (one array) and zips (two arrays) over S, X, T."""
    cdf = lambda x: 0.5 * (1.0 + la.erf(x * (1 / math.sqrt(2))))  # noqa: E731
    sqrt_t = la.sqrt(T)
    d1 = (la.log(S / X) + (r + 0.5 * v * v) * T) / (v * sqrt_t)
    d2 = d1 - v * sqrt_t
    discounted = X * la.exp(-r * T)
    call = S * cdf(d1) - discounted * cdf(d2)
    put = discounted * cdf(-d2) - S * cdf(-d1)
    return call, put


def black_scholes_numpy(S, X, T, r, v):
    from scipy.special import ndtr

    d1 = (np.log(S / X) + (r + 0.5 * v * v) * T) / (v * np.sqrt(T))
    d2 = d1 - v * np.sqrt(T)
    return S * ndtr(d1) - X * np.exp(-r * T) * ndtr(d2), X * np.exp(-r * T) * ndtr(-d2) - S * ndtr(-d1)


def logistic(X, y, w):
    z = X @ w
    loss = la.sum(la.logaddexp(0.0, -(2 * y - 1) * z))
    grad = X.T @ (la.sigmoid(z) - y)
    return {"loss": loss, "grad": grad}


def pagerank_step(A, r, r_prev, dangling, n, d=0.85):
    """One iteration after the (dense stand-in for the) SpMV. ``r_prev`` is ``r`` bound again:
    the axis classes would otherwise join A's rows and columns, and A could not be cut."""
    r_new = d * (A @ r) + (1 - d) / n + d * dangling / n
    delta = la.sum(la.absolute(r_new - r_prev))
    return {"r": r_new, "delta": delta}


def kmeans_step(X, C, clusters):
    """Assignment, per-cluster sums and counts, and inertia, from one pass over X."""
    xx = la.sum(X * X, axis=1, keepdims=True)
    cc = la.sum(C * C, axis=1)
    dist = xx - 2 * (X @ C.T) + cc
    onehot = dist.argmin(axis=1, keepdims=True) == clusters  # labels[:, None] == arange(k)
    return {
        "sums": onehot.T @ X,
        "counts": la.sum(onehot, axis=0),
        "inertia": la.sum(dist.min(axis=1)),
        "labels": dist.argmin(axis=1),
    }


# -- Black-Scholes -----------------------------------------------------------------------------


@pytest.fixture
def bs(tmp_path):
    rng = np.random.default_rng(3)
    n = 4000
    data = {"S": rng.uniform(5, 30, n), "X": rng.uniform(1, 100, n), "T": rng.uniform(0.25, 10, n)}
    arrays = {k: _source(tmp_path, k, v, (500,)) for k, v in data.items()}
    call, put = black_scholes(arrays["S"], arrays["X"], arrays["T"], 0.02, 0.3)
    return {"call": call, "put": put}, data


def test_black_scholes_fused_touches_85_percent_fewer_bytes(bs):
    outputs, _ = bs
    unfused = _plan(outputs, "none")
    maps = sum(n.op == "map" for n in unfused.graph.nodes)
    assert maps >= 14 and len(unfused.kernels) == maps
    for name in ("all", "cost"):
        fused = _plan(outputs, name)
        assert len(fused.kernels) == 1, fused.kernels
        assert fused.cost.bytes_touched <= 0.15 * unfused.cost.bytes_touched
        assert fused.cost.tasks < unfused.cost.tasks
        # one pass: S, X and T read, call and put written, nothing else
        n_bytes = 4000 * 8
        assert fused.cost.bytes_touched == 5 * n_bytes


@pytest.mark.parametrize("fusion_name", FUSIONS)
def test_black_scholes_matches_numpy(bs, fusion_name):
    outputs, data = bs
    result = _run(outputs, {}, fusion_name)
    call, put = black_scholes_numpy(data["S"], data["X"], data["T"], 0.02, 0.3)
    np.testing.assert_allclose(result["call"], call, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(result["put"], put, rtol=1e-10, atol=1e-10)
    # put-call parity: C - P = S - X exp(-rT)
    np.testing.assert_allclose(result["call"] - result["put"],
                               data["S"] - data["X"] * np.exp(-0.02 * data["T"]), rtol=1e-9, atol=1e-9)


# -- PageRank ----------------------------------------------------------------------------------


@pytest.fixture
def pagerank(tmp_path):
    rng = np.random.default_rng(4)
    n = 300
    links = (rng.random((n, n)) < 0.05).astype(float)
    out_degree = links.sum(axis=0)
    A = np.divide(links, out_degree, out=np.zeros_like(links), where=out_degree > 0)
    r = rng.random(n)
    r /= r.sum()
    dangling = float(r[out_degree == 0].sum())
    A_ = _source(tmp_path, "A", A, (40, n))
    program = pagerank_step(A_, la.value("r", (n,)), la.value("r_prev", (n,)), la.value("dangling", ()), n)
    return program, {"r": r, "r_prev": r, "dangling": dangling}, A


def test_pagerank_vector_operations_are_one_kernel(pagerank):
    program, _, _ = pagerank
    for name in ("all", "cost"):
        plan = _plan(program, name)
        vector_ops = {i for i, n in enumerate(plan.graph.nodes) if n.op in ("map", "reduce")}
        holding = [k for k in plan.kernels if vector_ops & set(k.nodes)]
        assert len(holding) == 1 and vector_ops <= set(holding[0].nodes), plan.kernels
    assert len(_plan(program, "none").kernels) > 5


@pytest.mark.parametrize("fusion_name", FUSIONS)
def test_pagerank_matches_numpy(pagerank, fusion_name):
    program, values, A = pagerank
    result = _run(program, values, fusion_name)
    n = len(values["r"])
    r_new = 0.85 * (A @ values["r"]) + 0.15 / n + 0.85 * values["dangling"] / n
    np.testing.assert_allclose(result["r"], r_new, rtol=1e-12)
    assert result["delta"] == pytest.approx(np.abs(r_new - values["r"]).sum(), rel=1e-12)
    assert result["r"].sum() == pytest.approx(1.0, rel=1e-12)  # a stochastic step keeps the mass


# -- K-means -----------------------------------------------------------------------------------


@pytest.fixture
def kmeans(tmp_path):
    rng = np.random.default_rng(5)
    k, d = 4, 3
    centres = rng.standard_normal((k, d)) * 5
    X = centres[rng.integers(0, k, 2000)] + rng.standard_normal((2000, d))
    C = X[rng.choice(len(X), k, replace=False)]
    program = kmeans_step(_source(tmp_path, "X", X, (250, d)), la.value("C", (k, d)), la.value("clusters", (k,)))
    return program, {"C": C, "clusters": np.arange(k, dtype=float)}, X


def test_kmeans_reads_X_in_one_kernel(kmeans):
    program, _, _ = kmeans
    for name in ("all", "cost"):
        plan = _plan(program, name)
        readers = _kernel_reading(plan, _source_node(plan, "X"))
        assert len(readers) == 1, plan.kernels
        graph = plan.graph
        for name_ in ("sums", "counts", "inertia", "labels"):
            node = graph.outputs[list(program).index(name_)]
            assert node in readers[0].nodes
    unfused = _plan(program, "none")
    assert len(_kernel_reading(unfused, _source_node(unfused, "X"))) == 3


@pytest.mark.parametrize("fusion_name", FUSIONS)
def test_kmeans_matches_numpy(kmeans, fusion_name):
    program, values, X = kmeans
    result = _run(program, values, fusion_name)
    C = values["C"]
    dist = ((X[:, None, :] - C[None, :, :]) ** 2).sum(axis=2)
    labels = dist.argmin(axis=1)
    onehot = labels[:, None] == np.arange(len(C))
    np.testing.assert_array_equal(result["labels"], labels)
    np.testing.assert_allclose(result["sums"], onehot.T @ X, rtol=1e-12)
    np.testing.assert_array_equal(result["counts"], onehot.sum(axis=0))
    assert result["counts"].sum() == len(X)
    assert result["inertia"] == pytest.approx(dist.min(axis=1).sum(), rel=1e-9)


@pytest.mark.parametrize("ids", [[0.0, 1.0, 2.0, 3.0], [2.0, 2.0, 7.0, 0.0]])  # any ids: repeated, missing
def test_one_hot_products_run_as_loops_and_match_the_products(ids, monkeypatch):  # and argmin over short rows
    monkeypatch.setattr(compiler, "LOOP_MIN_BYTES", 0)
    rng = np.random.default_rng(8)
    n, d, k = 50_000, 5, 4
    X, C = rng.standard_normal((n, d)), rng.standard_normal((k, d))
    x, c, group = la.value("X", (n, d)), la.value("C", (k, d)), la.value("ids", (k,))
    labels = (x @ c.T).argmin(axis=1, keepdims=True)
    onehot = (labels == group) * 1.0
    outputs = [onehot.T @ x, onehot.sum(axis=0), la.square(x - onehot @ c).sum()]
    kernel, args = block_kernel(outputs, {"X": X, "C": C, "ids": np.array(ids)})
    program = compiler.Program(kernel, args)
    assert len(program.rewrites) == 4  # three products and the argmin
    assert not any(program.shapes[op.out] == (n, k) and op.kind == "map" for op in program.ops)  # E is never built
    for got, want in zip(kernels.run(kernel, *args), kernels.interpret(kernel, *args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10)


def test_nearest_centroid_is_one_loop_without_the_scores(monkeypatch):
    monkeypatch.setattr(compiler, "LOOP_MIN_BYTES", 0)
    rng = np.random.default_rng(10)
    n, d, k = 40_000, 6, 5
    X = rng.integers(-3, 4, (n, d)).astype(float)  # small integers: exact sums, so ties are exact
    C = rng.integers(-2, 3, (k, d)).astype(float)
    C[3] = C[1]  # two equal centroids: every tie between them goes to the first
    X[7] = np.nan
    x, c, csq = la.value("X", (n, d)), la.value("C", (k, d)), la.value("csq", (k,))
    labels = (csq - 2.0 * (x @ c.T)).argmin(axis=1, keepdims=True)
    kernel, args = block_kernel([labels], {"X": X, "C": C, "csq": (C**2).sum(1)})
    program = compiler.Program(kernel, args)
    assert len(program.rewrites) == 1
    assert not any(program.shapes[op.out] == (n, k) for op in program.ops)  # no n × k scores
    np.testing.assert_array_equal(kernels.run(kernel, *args), kernels.interpret(kernel, *args))


@pytest.mark.parametrize("ids", [[0.0, 1.0, 2.0, 3.0, 4.0], [3.0, 3.0, 9.0, 0.0, 1.0]])  # repeated, missing
@pytest.mark.parametrize("n", [40_003, 40_001, 40_000])  # rows left after the fours, or none
def test_kmeans_step_is_one_loop_over_X_and_matches_the_products(ids, n, monkeypatch):
    monkeypatch.setattr(compiler, "LOOP_MIN_BYTES", 0)
    rng = np.random.default_rng(11)
    d, k = 6, 5
    X = rng.integers(-3, 4, (n, d)).astype(float)  # small integers: exact sums and exact ties
    C = rng.integers(-2, 3, (k, d)).astype(float)
    C[3] = C[1]
    x, c, csq, group = la.value("X", (n, d)), la.value("C", (k, d)), la.value("csq", (k,)), la.value("ids", (k,))
    onehot = ((csq - 2.0 * (x @ c.T)).argmin(axis=1, keepdims=True) == group) * 1.0
    kernel, args = block_kernel([onehot.T @ x, onehot.sum(axis=0)],
                                {"X": X, "C": C, "csq": (C**2).sum(1), "ids": np.array(ids)})
    program = compiler.Program(kernel, args)
    assert len(program.packed) == 1
    readers = [op for op in program.ops if 0 in op.inputs]  # X is argument 0
    assert len(readers) == 1, [op.kind for op in program.ops]  # one pass: no separate assignment, sums, counts
    got, want = kernels.run(kernel, *args), kernels.interpret(kernel, *args)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])  # integers: exact in any order


@pytest.mark.parametrize("fn", ["argmin", "argmax"])
def test_arg_reductions_over_short_rows_match_numpy_with_ties_and_nans(fn):
    from arrayjob.kernels import loops

    rng = np.random.default_rng(9)
    S = rng.integers(0, 3, (1000, 7)).astype(float)  # many ties: the first wins
    S[rng.random(S.shape) < 0.05] = np.nan
    S[0] = np.nan
    S[1, 3:] = -np.inf
    S[2, :] = np.inf
    want = getattr(np, fn)(S, axis=1, keepdims=True)
    np.testing.assert_array_equal(getattr(loops, f"{fn}_rows")(S), want)


# -- logistic regression: the row template -----------------------------------------------------


@pytest.fixture
def logreg(tmp_path):
    rng = np.random.default_rng(6)
    X = rng.standard_normal((3000, 6))
    y = (rng.random(3000) > 0.5).astype(float)
    program = logistic(_source(tmp_path, "X", X, (300, 6)), _source(tmp_path, "y", y, (300,)), la.value("w", (6,)))
    return program, X, y


def test_logistic_loss_and_gradient_are_one_row_kernel(logreg):
    program, _, _ = logreg
    unfused, fused = _plan(program, "none"), _plan(program, "cost")
    assert len(fused.kernels) == 1
    (kernel,) = fused.kernels
    blocks = fused.grid(_source_node(fused, "X")).grid_shape[0]
    assert set(kernel.outputs) == set(fused.graph.outputs)  # loss and gradient, both partial
    assert fused.cost.tasks < unfused.cost.tasks
    assert fused.cost.bytes_touched < unfused.cost.bytes_touched
    kernel_tasks = [t for t in fused.physical.tasks if t.kernel.fn.__class__ is BlockKernel]
    assert len(kernel_tasks) == blocks
    assert len(_kernel_reading(fused, _source_node(fused, "X"))) == 1
    assert len(_kernel_reading(unfused, _source_node(unfused, "X"))) == 2


@pytest.mark.parametrize("fusion_name", FUSIONS)
def test_logistic_matches_numpy(logreg, fusion_name):
    program, X, y = logreg
    w = np.linspace(-0.5, 0.5, 6)
    result = _run(program, {"w": w}, fusion_name)
    z = X @ w
    assert result["loss"] == pytest.approx(np.logaddexp(0, -(2 * y - 1) * z).sum(), rel=1e-12)
    np.testing.assert_allclose(result["grad"], X.T @ (1 / (1 + np.exp(-z)) - y), rtol=1e-10)


# -- cost-based choice -------------------------------------------------------------------------


@pytest.fixture
def invariant(tmp_path):
    """A row kernel next to an expensive loop invariant: ``all`` recomputes it per row block."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((4000, 4))
    table = rng.standard_normal(200_000)
    Xa, t, w = _source(tmp_path, "X", X, (250, 4)), la.value("table", table.shape), la.value("w", (4,))
    scale = la.sum(la.exp(la.tanh(t)))
    return {"score": la.sum(la.sigmoid(Xa @ w) * scale)}, {"table": table, "w": np.ones(4)}, X


def test_cost_materialises_an_invariant_that_all_recomputes(invariant):
    program, values, X = invariant
    everything, chosen = _plan(program, "all"), _plan(program, "cost")
    assert len(everything.kernels) == 1
    assert len(chosen.kernels) == 2
    assert chosen.cost.bytes_touched < everything.cost.bytes_touched / 4
    assert chosen.cost.flops < everything.cost.flops
    expected = np.sum(1 / (1 + np.exp(-X @ values["w"]))) * np.exp(np.tanh(values["table"])).sum()
    for name in FUSIONS:
        assert _run(program, values, name)["score"] == pytest.approx(expected, rel=1e-12)


def test_the_calibrated_transcendental_rate_reaches_fusion(tmp_path):
    """A small loop invariant (``sum(exp(tanh(t)))``) beside a row kernel: at the shipped
    profile's rates recomputing it in every row block costs less than a task of its own, so
    ``cost`` fuses it; on a machine whose exp and tanh are 1,000 times slower (as ``arrayjob
    calibrate`` would measure) the same plan materialises it once."""
    import dataclasses

    from arrayjob.costing.profile import SHIPPED

    rng = np.random.default_rng(9)
    Xa = _source(tmp_path, "X", rng.standard_normal((4000, 4)), (250, 4))
    t, w = la.value("table", (2000,)), la.value("w", (4,))
    program = {"score": la.sum(la.sigmoid(Xa @ w) * la.sum(la.exp(la.tanh(t))))}
    graph = la.capture(list(program.values()))

    def plan_at(profile):
        cluster = dataclasses.replace(CLUSTER, **profile.placement_rates())
        return make_plan(graph, PlanOptions(tiling="test-rows", fusion="cost", placement="roundrobin",
                                            cluster=cluster))

    slow = dataclasses.replace(SHIPPED, transcendental_per_s=SHIPPED.transcendental_per_s / 1000)
    assert len(plan_at(SHIPPED).kernels) == 1
    assert len(plan_at(slow).kernels) == 2
    # the plan at the shipped profile's rates is the plan of the default cluster shape
    assert plan_at(SHIPPED).kernels == _plan(program, "cost").kernels


def _all_programs(tmp_path):
    rng = np.random.default_rng(8)
    X = _source(tmp_path, "PX", rng.standard_normal((1000, 3)), (100, 3))
    y = _source(tmp_path, "Py", (rng.random(1000) > 0.5).astype(float), (100,))
    S, K, T = (_source(tmp_path, f"P{c}", rng.uniform(1, 2, 1000), (100,)) for c in "SKT")
    call, put = black_scholes(S, K, T, 0.01, 0.2)
    A = _source(tmp_path, "PA", rng.random((200, 200)), (20, 200))
    return [
        {"call": call, "put": put},
        logistic(X, y, la.value("w", (3,))),
        {**logistic(X, y, la.value("w", (3,))), "colmax": X.max(axis=0), "z": X @ la.value("w", (3,))},
        pagerank_step(A, la.value("r", (200,)), la.value("r_prev", (200,)), la.value("dm", ()), 200),
        kmeans_step(X, la.value("C", (3, 3)), la.value("clusters", (3,))),
    ]


@pytest.mark.parametrize("tiling", ["test-rows", "naive"])
def test_cost_is_never_much_worse_than_all_and_both_beat_none(tmp_path, tiling):
    for program in _all_programs(tmp_path):
        try:
            none = _plan(program, "none", tiling)
        except ValueError:  # e.g. a class cut twice in one array under naive tiling
            continue
        everything, chosen = _plan(program, "all", tiling), _plan(program, "cost", tiling)
        assert chosen.cost.bytes_touched <= 1.05 * everything.cost.bytes_touched
        assert chosen.stats["fusion_model_seconds"] <= everything.stats["fusion_model_seconds"] * (1 + 1e-9)
        assert everything.cost.bytes_touched <= none.cost.bytes_touched
        assert chosen.cost.tasks <= none.cost.tasks
        assert len(chosen.kernels) <= len(none.kernels)


def test_the_model_counts_what_plan_cost_counts(tmp_path):
    for program in _all_programs(tmp_path):
        for name in FUSIONS:
            plan = _plan(program, name)
            assert plan.stats["fusion_model_bytes"] == plan.cost.bytes_touched, (name, plan.kernels)


def test_fused_kernels_obey_lowering_and_are_topologically_ordered(tmp_path):
    for program in _all_programs(tmp_path):
        for name in FUSIONS:
            plan = _plan(program, name)
            seen: set[int] = set()
            done = {i for i, n in enumerate(plan.graph.nodes) if n.is_leaf}
            for kernel in plan.kernels:
                assert fusion.kernel_problem(plan, kernel.nodes) is None
                assert not seen & set(kernel.nodes)
                seen |= set(kernel.nodes)
                for v in kernel.nodes:
                    assert all(u in done or u in kernel.nodes for u in plan.graph.nodes[v].inputs)
                done |= set(kernel.nodes)
            assert seen | {i for i, n in enumerate(plan.graph.nodes) if n.is_leaf} == set(range(len(plan.graph)))


def test_incremental_merges_agree_with_analysis_from_scratch(tmp_path, monkeypatch):
    from tests.unit.planner.test_programs import random_program, zarr_source

    checked = []
    merge = fusion_model.Fuser.merge

    def checked_merge(self, a, b):
        got, want = merge(self, a, b), self.group(a.nodes | b.nodes)
        assert (got.problem is None) == (want.problem is None), (got.problem, want.problem)
        if want.problem is None:
            assert (got.space, set(got.external), got.outputs, got.cost) == \
                (want.space, set(want.external), want.outputs, want.cost)
            assert all(got.dep[v] == want.dep[v] for v in want.nodes)
        checked.append(got.problem is None)
        return got

    monkeypatch.setattr(fusion_model.Fuser, "merge", checked_merge)
    for seed in range(40):
        prog = random_program(seed, zarr_source(tmp_path / str(seed)), max_ops=25)
        for tiling in ("naive", "greedy"):
            options = PlanOptions(tiling=tiling, fusion="cost", cluster=CLUSTER, target_block_bytes=2048)
            make_plan(la.capture(list(prog.outputs.values())), options, stop_after="fuse")
    assert sum(checked) > 200 and len(checked) > sum(checked) + 50


def test_planning_a_long_chain_is_fast(tmp_path):
    X = _source(tmp_path, "X", np.zeros((1000, 4)), (100, 4))
    acc, outputs = X @ la.value("w", (4,)), {}
    for i in range(500):
        acc = la.tanh(acc * 0.5 + i)
        if i % 50 == 0:
            outputs[f"s{i}"] = la.sum(acc)
    outputs["last"] = acc
    for name in ("all", "cost"):
        start = time.perf_counter()
        plan = make_plan(la.capture(list(outputs.values())), _options(name), stop_after="fuse")
        assert time.perf_counter() - start < 10
        assert len(plan.kernels) == 1 and len(plan.kernels[0].nodes) > 1500


def test_kernel_problem_names_the_rule(logreg):
    program, _, _ = logreg
    plan = _plan(program, "none")
    loss = plan.graph.outputs[0]
    assert fusion.kernel_problem(plan, [plan.graph.nodes[loss].inputs[0], loss]) is None
    # p / sum(p): the sum is partial per row block, so the division can't share its kernel
    z = program["loss"]
    while z.op != "einsum":
        z = z.inputs[-1] if z.op == "map" else z.inputs[0]
    ratio = make_plan(la.capture([z / la.sum(z)]), _options("none"))
    nodes = [i for i, n in enumerate(ratio.graph.nodes) if not n.is_leaf]
    assert "partial" in fusion.kernel_problem(ratio, nodes)
    assert fusion.kernel_problem(ratio, nodes[:2]) is None


# -- compiled block kernels --------------------------------------------------------------------


@pytest.fixture
def eager_compiler(monkeypatch):
    """numexpr and row sub-blocking on the tiny blocks of test programs, not only on big ones."""
    monkeypatch.setattr(compiler, "MIN_EXPRESSION_SIZE", 1)
    monkeypatch.setattr(row_chunks, "MIN_CHUNK_ROWS", 1)
    monkeypatch.setattr(row_chunks, "CHUNK_BYTES", 24)
    compiled = []
    init = compiler.Program.__init__

    def record(self, kernel, args):
        init(self, kernel, args)
        compiled.append(self)

    monkeypatch.setattr(compiler.Program, "__init__", record)
    monkeypatch.setattr(running, "PROGRAMS", running.CompiledPrograms())
    return compiled


@pytest.mark.parametrize("seed", range(0, 60, 2))
def test_fused_random_programs_match_numpy(tmp_path, seed, eager_compiler):
    from tests.unit.planner.test_programs import check_results, random_program, zarr_source

    prog = random_program(seed, zarr_source(tmp_path))
    executor = LocalExecutor(StorageOptions())
    for tiling in ("naive", "greedy"):
        for name in ("all", "cost"):
            options = PlanOptions(tiling=tiling, fusion=name, placement="roundrobin", cluster=CLUSTER,
                                  target_block_bytes=2048)
            out = Session(executor, options).compute(prog.outputs, prog.values)
            check_results(prog, out, f"tiling={tiling}, fusion={name}")


def test_random_programs_exercise_expressions_and_chunks(tmp_path, eager_compiler):
    from tests.unit.planner.test_programs import random_program, zarr_source

    for seed in range(12):
        prog = random_program(seed, zarr_source(tmp_path / str(seed)))
        Session(LocalExecutor(StorageOptions()), _options("all", "naive")).compute(prog.outputs, prog.values)
    assert sum(p.chunking is not None for p in eager_compiler) >= 5
    assert sum(op.expression is not None and "v" in op.expression for p in eager_compiler for op in p.ops) >= 10


def test_logistic_kernel_is_one_chunked_pass_with_expressions(logreg):
    program, _, _ = logreg
    plan = _plan(program, "cost")
    task = next(t for t in plan.physical.tasks if isinstance(t.kernel.fn, BlockKernel))
    kernel = task.kernel.fn
    rng = np.random.default_rng(0)
    n = 200_000
    arrays = {"X": rng.standard_normal((n, 6)), "y": (rng.random(n) > 0.5).astype(float), "w": rng.standard_normal(6)}
    args = [arrays[getattr(a, "array", None) or a.name] for a in task.args]
    compiled = compiler.Program(kernel, args)
    assert compiled.chunking is not None and compiled.chunking.rows < n
    expressions = [op.expression for op in compiled.ops if op.expression is not None and "v" in op.expression]
    assert any("(1/(1+exp(-" in text for text in expressions)  # sigmoid, rewritten for numexpr
    for got, want in zip(kernels.run(kernel, *args), kernels.interpret(kernel, *args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.parametrize("fn,args", [
    ("sigmoid", (np.array([-1000.0, -40.0, -1e-300, 0.0, 3.0, 40.0, 1000.0]),)),
    ("logaddexp", (np.array([-1000.0, 0.0, 700.0, 1e308, -np.inf, np.inf, 5.0]),
                   np.array([-1000.0, 1e-300, 710.0, 1e308, -np.inf, np.inf, -5.0]))),
])
def test_rewritten_functions_are_stable_at_the_extremes(monkeypatch, fn, args):
    monkeypatch.setattr(compiler, "MIN_EXPRESSION_SIZE", 1)
    # a two-step expression, so that numexpr (not a single NumPy call) evaluates the rewrite
    n = len(args)
    steps = (Step(Op.CONST, Const(1.0), (), "float64"), Step(Op.MAP, Map(fn), tuple(range(n)), "float64"),
             Step(Op.MAP, Map("multiply"), (n + 1, n), "float64"))
    kernel = BlockKernel(fn, n, steps, (n + 2,))
    program = compiler.Program(kernel, args)
    assert [op.kind for op in program.ops if op.out == n + 2] == ["map"]
    assert "exp(" in program.ops[-1].expression
    with np.errstate(all="ignore"):
        want = kernels.interpret(kernel, *args)
    np.testing.assert_array_equal(kernels.run(kernel, *args), want)


def test_a_block_kernel_is_plain_data_and_a_fresh_copy_reuses_its_compiled_program(monkeypatch):
    monkeypatch.setattr(running, "PROGRAMS", running.CompiledPrograms())
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(50_000), rng.standard_normal(50_000)
    steps = (Step(Op.MAP, Map("subtract"), (0, 1), "float64"), Step(Op.MAP, Map("exp"), (2,), "float64"),
             Step(Op.MAP, Map("logaddexp"), (3, 0), "float64"), Step(Op.REDUCE, Reduce("sum", (0,)), (4,), "float64"))
    kernel = BlockKernel("k", 2, steps, (4, 5))
    first = kernels.run(kernel, x, y)
    program = running.PROGRAMS.get(kernel, (x, y))
    copy = pickle.loads(pickle.dumps(kernel))  # what a worker receives for every task
    assert copy == kernel and copy.__dict__ == kernel.__dict__
    # a fresh copy in the same process finds the program compiled for the first
    assert running.PROGRAMS.get(copy, (x, y)) is program
    for got, want in zip(kernels.run(copy, x, y), first, strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(first, kernels.interpret(kernel, x, y), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    # a constant is part of the key: another constant compiles another program
    other = BlockKernel("k", 2, (Step(Op.CONST, Const(2.0), (), "float64"),) + steps, (5, 6))
    assert running.PROGRAMS.get(other, (x, y)) is not program


def test_steps_numexpr_cannot_do_stay_numpy(monkeypatch):
    monkeypatch.setattr(compiler, "MIN_EXPRESSION_SIZE", 1)
    x = np.linspace(-3, 3, 101)
    flags = x > 0
    steps = (
        Step(Op.MAP, Map("erf"), (0,), "float64"),  # 2: not in numexpr
        Step(Op.MAP, Map("multiply"), (2, 2), "float64"),  # 3
        Step(Op.MAP, Map("exp"), (3,), "float64"),  # 4
        Step(Op.REDUCE, Reduce("sum", (0,)), (1,), "int64"),  # 5: sum of booleans
        Step(Op.MAP, Map("multiply"), (1, 0), "float64"),  # 6: arithmetic on booleans: NumPy
        Step(Op.MAP, Map("where"), (1, 4, 6), "float64"),  # 7: with 3 and 4, one expression
    )
    kernel = BlockKernel("k", 2, steps, (5, 7))
    program = compiler.Program(kernel, [x, flags])
    kinds = {op.out: op.expression or op.attrs for op in program.ops}
    assert kinds[2] == Map("erf") and kinds[6] == Map("multiply")
    assert kinds[7] == "where(v1,exp((v2*v2)),v6)" and not {3, 4} & set(kinds)
    for got, want in zip(kernels.run(kernel, x, flags), kernels.interpret(kernel, x, flags), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-14)


@pytest.mark.parametrize("subscripts", ["ijk,jf,kf->if", "ijk,kf,jf->fi", "jf,ijk,kf->if", "ijk,if,kf->jf",
                                        "abjk,jf,kf->bfa"])
def test_contractions_in_pieces_of_the_big_block_match_einsum(subscripts, monkeypatch):
    monkeypatch.setattr(contraction, "PIECE_BYTES", 600)  # a piece's first product: a few rows of 8 × 4
    contraction.pieces.cache_clear()
    rng = np.random.default_rng(12)
    sizes = dict(zip("ijkfab", (23, 8, 9, 4, 11, 3), strict=True))
    terms = subscripts.split("->")[0].split(",")
    blocks = [rng.standard_normal([sizes[x] for x in t]) for t in terms]
    shapes = tuple(b.shape for b in blocks)
    cut = subscripts.split("->")[1] != "jf"  # mode 1 sums the big block's first axis away: whole
    assert (contraction.pieces(subscripts, shapes) is not None) == cut
    np.testing.assert_allclose(primitives.einsum(subscripts, *blocks), np.einsum(subscripts, *blocks), rtol=1e-12)
    contraction.pieces.cache_clear()


@pytest.mark.parametrize("subscripts", ["ijk,jf,kf->if", "ijk,if,kf->jf", "ijk,if,jf->kf", "ij,jk,kl->il",
                                        "ijk,kf,if->jf", "abc,c->ab"])
def test_contractions_of_three_blocks_match_einsum(subscripts):
    from arrayjob.kernels.primitives import einsum as _einsum
    from arrayjob.planner.contraction import blas_pair as _blas_pair

    rng = np.random.default_rng(10)
    sizes = dict(zip("ijkfabcl", (7, 8, 9, 4, 5, 6, 3, 2), strict=True))
    terms = subscripts.split("->")[0].split(",")
    blocks = [rng.standard_normal([sizes[x] for x in t]) for t in terms]
    np.testing.assert_allclose(_einsum(subscripts, *blocks), np.einsum(subscripts, *blocks), rtol=1e-12)
    if subscripts == "ijk,jf,kf->if":  # MTTKRP, mode 0: Cᵀ @ X(ij, k)ᵀ first, one GEMM on a free reshape
        (big, other, axes, partner_first), rest = _blas_pair(subscripts, tuple(b.shape for b in blocks))
        assert (big, other, axes, partner_first, rest) == (0, 2, ([2], [0]), True, "fij,jf->if")


@pytest.mark.parametrize(("rank", "partner_first"), [(4, True), (contraction.NARROW_COLUMNS + 1, False)])
def test_a_narrow_first_product_puts_the_partner_first(rank, partner_first):
    """MTTKRP's first GEMM against a narrow factor runs as Cᵀ @ X(ij, k)ᵀ (OpenBLAS is faster
    so), a wide one as X(ij, k) @ C; both give einsum's result."""
    from arrayjob.kernels.primitives import einsum as _einsum
    from arrayjob.planner.contraction import blas_pair as _blas_pair

    rng = np.random.default_rng(11)
    X, B, C = rng.standard_normal((4, 50, 60)), rng.standard_normal((50, rank)), rng.standard_normal((60, rank))
    (_, _, _, first), rest = _blas_pair("ijk,jf,kf->if", (X.shape, B.shape, C.shape))
    assert first == partner_first and rest == ("fij,jf->if" if partner_first else "ijf,jf->if")
    want = np.einsum("ijk,jf,kf->if", X, B, C)
    np.testing.assert_allclose(_einsum("ijk,jf,kf->if", X, B, C), want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_a_small_block_program_does_not_import_numba():
    """Compiled loops are for blocks of LOOP_MIN_BYTES and more; a worker that only runs
    small blocks must not pay numba's import (once per worker process, in every job)."""
    import subprocess
    import sys
    from pathlib import Path

    script = """
import sys
import numpy as np
import arrayjob.lazy as la
from tests.harness.helpers import block_kernel
X, w = la.value("X", (1000, 8)), la.value("w", (8,))
kernel, args = block_kernel([la.sum(la.logaddexp(0.0, X @ w)), X.T @ la.sigmoid(X @ w)],
                            {"X": np.ones((1000, 8)), "w": np.ones(8)})
from arrayjob import kernels
kernels.run(kernel, *args)
print("numba" in sys.modules)
"""
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False"
