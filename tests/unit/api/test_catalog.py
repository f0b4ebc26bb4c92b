"""The algorithm catalog against reference implementations (scikit-learn, TensorLy)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorly as tl
import zarr
from sklearn.cluster import KMeans as SkKMeans
from sklearn.datasets import make_blobs
from sklearn.linear_model import LinearRegression as SkLinearRegression
from sklearn.linear_model import Ridge
from tensorly.decomposition import parafac
from tensorly.tenalg import unfolding_dot_khatri_rao

from arrayjob.algorithms.tensor import random_factors
from arrayjob.api.job import JobContext
from arrayjob.catalog import get_job
from arrayjob.errors import InputError, SpecError
from arrayjob.io.arrays import ResultGroup
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from arrayjob.spec import table_to_dataclass

PLANNER = {"tiling": "naive", "fusion": "none", "placement": "roundrobin"}




def run_job(algorithm, arrays, result=None, session=None, **params):
    cls = get_job(algorithm)
    job = cls(table_to_dataclass(cls.Params, params, "params"), arrays)
    if session is None:
        session = Session(LocalExecutor(StorageOptions()),
                          PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2), **PLANNER))
    return job.run(JobContext(session, session.executor.metrics, StorageOptions(), result))


def conditioned(shape, cond, seed=6):
    """A random matrix with singular values spread evenly in log scale from 1 to 1/cond."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal(shape))
    V, _ = np.linalg.qr(rng.standard_normal((shape[1], shape[1])))
    return (U * np.logspace(0, -np.log10(cond), shape[1])) @ V.T


@pytest.mark.parametrize("method", ["auto", "householder"])
@pytest.mark.parametrize("shape,chunk", [((20000, 12), 1500), ((5000, 40), 64), ((300, 30), 300)])
def test_tsqr_invariants_and_numpy(put, tmp_path, shape, chunk, method):
    A = np.random.default_rng(6).standard_normal(shape)
    group = ResultGroup(parse_uri(str(tmp_path / "result.zarr")), StorageOptions())
    r = run_job("tsqr", {"A": put("A", A, (chunk, shape[1]))}, result=group, method=method)
    assert ("CholeskyQR2" in r.summary[0]) == (method == "auto")
    stored = zarr.open_group(str(tmp_path / "result.zarr"), mode="r")["Q"]
    assert stored.chunks == (chunk, shape[1])  # Q is chunked like A
    Q, R = stored[:], r.arrays["R"]
    assert np.linalg.norm(Q @ R - A) / np.linalg.norm(A) <= 1e-12
    assert np.linalg.norm(Q.T @ Q - np.eye(shape[1])) <= 1e-12
    np.testing.assert_array_equal(R, np.triu(R))
    np.testing.assert_allclose(np.abs(R), np.abs(np.linalg.qr(A)[1]), rtol=1e-10, atol=1e-10 * np.abs(R).max())


@pytest.mark.parametrize("cond,how", [(1e5, "CholeskyQR2"), (1e9, "Householder TSQR (cond(A) above"),
                                      (np.inf, "Householder TSQR (cond(A) above")])
def test_tsqr_falls_back_to_householder_when_cholesky_qr2_would_lose_orthogonality(put, tmp_path, cond, how):
    A = conditioned((6000, 16), cond if np.isfinite(cond) else 1.0)
    if not np.isfinite(cond):
        A[:, 3] = A[:, 5]  # rank-deficient: the Gram is singular
    group = ResultGroup(parse_uri(str(tmp_path / "result.zarr")), StorageOptions())
    r = run_job("tsqr", {"A": put("A", A, (1000, 16))}, result=group)
    assert r.summary[0].split(" by ", 1)[1].startswith(how)
    Q, R = zarr.open_group(str(tmp_path / "result.zarr"), mode="r")["Q"][:], r.arrays["R"]
    assert np.linalg.norm(Q @ R - A) / np.linalg.norm(A) <= 1e-13
    assert np.linalg.norm(Q.T @ Q - np.eye(16)) <= 1e-12


@pytest.mark.parametrize("method", ["tsqr", "normal"])
@pytest.mark.parametrize("l2,fit_intercept", [(0.0, True), (1e-2, True), (1e-3, False)])
def test_linreg_matches_sklearn(put, method, l2, fit_intercept):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 6)) + 2.0
    y = X @ rng.standard_normal(6) + 0.7 + 0.1 * rng.standard_normal(3000)
    r = run_job("linreg", {"X": put("X", X, (400, 6)), "y": put("y", y, (400,))}, l2=l2, fit_intercept=fit_intercept,
                method=method)
    ref = (Ridge(alpha=l2 * len(y), fit_intercept=fit_intercept) if l2 else
           SkLinearRegression(fit_intercept=fit_intercept)).fit(X, y)
    np.testing.assert_allclose(r.arrays["coef"], ref.coef_, rtol=1e-6)
    assert r.arrays["intercept"][0] == pytest.approx(ref.intercept_ if fit_intercept else 0.0, rel=1e-6, abs=1e-9)
    pred = X @ ref.coef_ + (ref.intercept_ if fit_intercept else 0)
    objective = np.sum((pred - y) ** 2) / (2 * len(y)) + 0.5 * l2 * ref.coef_ @ ref.coef_
    assert r.attrs["objective"] == pytest.approx(objective, rel=1e-6)


@pytest.mark.parametrize("tol", [0.0, 1e-4])
def test_kmeans_matches_sklearn_from_the_same_centroids(put, tmp_path, tol):
    X, _ = make_blobs(4000, 5, centers=6, cluster_std=2.5, random_state=1)
    init = X[np.random.default_rng(3).choice(len(X), 6, replace=False)]
    put("init", init, init.shape)
    r = run_job("kmeans", {"X": put("X", X, (500, 5))}, k=6, init=str(tmp_path / "init.zarr"), tol=tol)
    ref = SkKMeans(6, init=init, n_init=1, algorithm="lloyd", tol=tol, max_iter=300).fit(X)
    np.testing.assert_array_equal(r.arrays["labels"], ref.labels_)
    assert r.attrs["inertia"] == pytest.approx(ref.inertia_, rel=1e-9)
    np.testing.assert_allclose(r.arrays["centroids"], ref.cluster_centers_, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_kmeans_own_initialisation_is_seeded(put, init):
    X, _ = make_blobs(2000, 3, centers=4, random_state=2)
    arrays = {"X": put("X", X, (300, 3))}
    a = run_job("kmeans", arrays, k=4, init=init, seed=5)
    b = run_job("kmeans", arrays, k=4, init=init, seed=5)
    np.testing.assert_array_equal(a.arrays["centroids"], b.arrays["centroids"])
    ref = SkKMeans(4, init=a.arrays["centroids"], n_init=1, algorithm="lloyd").fit(X)
    assert a.attrs["inertia"] <= ref.inertia_ * (1 + 1e-9)


def test_kmeans_warns_when_its_sample_has_fewer_distinct_rows_than_k(put, monkeypatch, capsys):
    from arrayjob.algorithms import kmeans

    monkeypatch.setattr(kmeans, "SAMPLE_ROWS", 4)  # one chunk of 4 of the 12 rows
    # no all-zero chunk: zarr would not store it, and a missing chunk is an error of its own
    X = np.repeat(np.array([[1.0, 1.0], [2.0, 1.0], [1.0, 2.0]]), 4, axis=0)
    r = run_job("kmeans", {"X": put("X", X, (4, 2))}, k=2, seed=0)
    assert r.arrays["centroids"].shape == (2, 2)
    assert capsys.readouterr().err == ("arrayjob: warning: params.k: 2 clusters but the 4 rows sampled from "
                                       "inputs.X hold only 1 distinct rows; some centroids will be duplicates\n")


@pytest.mark.parametrize("mode,names", [(0, "BC"), (1, "AC"), (2, "AB")])
def test_mttkrp_matches_tensorly(put, mode, names):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((24, 10, 7))
    factors = {n: rng.standard_normal((s, 5)) for n, s in zip("ABC", X.shape, strict=True)}
    arrays = {"X": put("X", X, (5, 10, 7)), **{n: put(n, factors[n], factors[n].shape) for n in names}}
    r = run_job("mttkrp", arrays, mode=mode)
    ref = unfolding_dot_khatri_rao(X, (np.ones(5), [factors[n] for n in "ABC"]), mode)
    np.testing.assert_allclose(r.arrays["M"], ref, rtol=1e-10, atol=1e-10 * np.abs(ref).max())


def test_cp_als_fit_matches_tensorly(put):
    rng = np.random.default_rng(5)
    A, B, C = (rng.standard_normal((s, 3)) for s in (20, 12, 9))
    X = np.einsum("if,jf,kf->ijk", A, B, C) + 0.05 * rng.standard_normal((20, 12, 9))
    r = run_job("cp_als", {"X": put("X", X, (6, 12, 9))}, rank=3, max_iter=100, tol=1e-8, seed=7)
    start = tl.cp_tensor.CPTensor((np.ones(3), random_factors(X.shape, 3, 7)))
    _, errors = parafac(tl.tensor(X), 3, init=start, n_iter_max=100, tol=1e-8, return_errors=True)
    assert r.attrs["fit"] == pytest.approx(1 - errors[-1], abs=0.01)
    # the factors reconstruct X as well as the fit says
    model = np.einsum("f,if,jf,kf->ijk", r.arrays["weights"], r.arrays["A"], r.arrays["B"], r.arrays["C"])
    assert 1 - np.linalg.norm(X - model) / np.linalg.norm(X) == pytest.approx(r.attrs["fit"], abs=1e-6)


BAD = [
    ("kmeans", {"X": ((10, 3), (5, 3))}, {"k": 11}, InputError, "params.k: 11 clusters but inputs.X has only 10 rows"),
    ("kmeans", {"X": ((10,), (5,))}, {"k": 2}, InputError, "inputs.X: expected a 2-D array (rows × features), got shape (10,)"),
    ("kmeans", {"X": ((10, 3), (5, 3))}, {"k": 2, "tol": float("nan")}, SpecError, "params.tol: expected a number >= 0, got nan"),
    ("linreg", {"X": ((10, 3), (5, 3)), "y": ((9,), (5,))}, {}, InputError,
     "inputs.y: expected shape (10,) to match the rows of inputs.X (10, 3), got (9,)"),
    ("linreg", {"X": ((10, 3), (5, 3)), "y": ((10,), (5,))}, {"l2": -1.0}, SpecError, "params.l2: expected a number >= 0, got -1.0"),
    ("mttkrp", {"X": ((4, 5, 6), (2, 5, 6)), "B": ((5, 2), (5, 2)), "C": ((7, 2), (7, 2))}, {}, InputError,
     "inputs.C: expected shape (6, rank) for mode 2 of X (4, 5, 6), got (7, 2)"),
    ("mttkrp", {"X": ((4, 5, 6), (2, 5, 6)), "B": ((5, 2), (5, 2))}, {}, InputError,
     "inputs.C: mode 0 needs factor matrices B and C"),
    ("mttkrp", {"X": ((4, 5), (2, 5)), "B": ((5, 2), (5, 2)), "C": ((6, 2), (6, 2))}, {}, InputError,
     "inputs.X: expected a 3-way tensor (I × J × K), got shape (4, 5)"),
    ("cp_als", {"X": ((4, 5, 6), (2, 5, 6))}, {}, SpecError, "params.rank: required key is missing"),
    ("cp_als", {"X": ((4, 5, 6), (2, 5, 6))}, {"rank": 0}, SpecError, "params.rank: expected an integer >= 1, got 0"),
    ("tsqr", {"A": ((4, 5), (2, 5))}, {}, InputError, "inputs.A: expected a tall matrix (rows >= columns > 0), got shape (4, 5)"),
    ("linreg", {"X": ((10, 3), (5, 3)), "y": ((10,), (5,))}, {"method": "qr"}, SpecError,
     "params.method: expected one of 'auto', 'refined', 'tsqr', 'normal', 'cg', 'owlqn', got 'qr'"),
    ("linreg", {"X": ((10, 3), (5, 3)), "y": ((10,), (5,))}, {"method": "tsqr", "l1": 0.1}, InputError,
     'params.method: tsqr solves least squares with an l2 penalty only; l1 > 0 needs "owlqn" (or "auto")'),
    ("linreg", {"X": ((10, 3), (5, 3)), "y": ((10,), (5,)), "weights": ((9,), (5,))}, {}, InputError,
     "inputs.weights: expected shape (10,) to match the rows of inputs.X (10, 3), got (9,)"),
    ("logreg", {"X": ((10, 3), (5, 3)), "y": ((10,), (5,))}, {"solver": "newton", "l1": 0.1}, InputError,
     "params.solver: newton takes no l1 penalty (use lbfgs: OWL-QN)"),
    ("logreg", {"X": ((10, 3), (5, 3)), "y": ((10,), (5,))}, {"solver": "newton", "family": "multinomial"},
     InputError, "params.solver: newton fits the binary family only (use lbfgs for more than two classes)"),
    ("logreg", {"X": ((10, 3), (5, 3)), "y": ((10,), (5,))}, {"family": "binary", "classes": 3}, InputError,
     "params.classes: the binary family has 2 classes, got 3"),
    ("logreg", {"X": ((10, 3), (5, 3)), "y": ((10,), (5,))}, {"classes": 1}, SpecError,
     "params.classes: expected 0 (found from y) or an integer >= 2, got 1"),
    ("logreg", {"X": ((10, 3), (5, 3)), "y": ((10,), (5,))}, {"class_weight": "auto"}, SpecError,
     "params.class_weight: expected one of 'none', 'balanced', got 'auto'"),
]


@pytest.mark.parametrize("algorithm,arrays,params,error,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_invalid_inputs_are_one_clear_line(put, algorithm, arrays, params, error, message):
    infos = {n: put(n, np.zeros(shape), chunks) for n, (shape, chunks) in arrays.items()}
    cls = get_job(algorithm)
    with pytest.raises(error) as raised:
        cls(table_to_dataclass(cls.Params, params, "params"), infos)
    assert str(raised.value) == message


def _networkx_rank(edges, n, alpha=0.85):
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from(map(tuple, edges))
    ranks = nx.pagerank(graph, alpha=alpha, tol=1e-15, max_iter=2000)
    return np.array([ranks[i] for i in range(n)])


@pytest.mark.parametrize("n_nodes", [None, 450])
def test_pagerank_matches_networkx(put, n_nodes):
    rng = np.random.default_rng(8)
    edges = rng.integers(0, 400, size=(3000, 2))
    edges = np.vstack([edges, edges[:100], [[3, 3], [9, 9]]])  # duplicates count once, self-loops stay
    params = {"tol": 1e-13, "max_iter": 1000} | ({"n_nodes": n_nodes} if n_nodes else {})
    r = run_job("pagerank", {"edges": put("edges", edges, (700, 2))}, **params)
    n = n_nodes or int(edges.max()) + 1
    ref = _networkx_rank(edges, n)
    assert r.arrays["rank"].shape == (n,) and r.attrs["converged"]
    assert np.abs(r.arrays["rank"] - ref).sum() <= 1e-6
    assert r.arrays["rank"].sum() == pytest.approx(1.0, abs=1e-12)


@dataclasses.dataclass(frozen=True)
class Scale:
    """A job's block function that captures a constant, as ``PageRankStep(damping)`` does."""

    factor: float

    def __call__(self, block: np.ndarray) -> np.ndarray:
        return block * self.factor


def test_two_jobs_in_one_process_keep_their_own_parameters(put):
    """Two programs that differ only in a constant their kernel captures build graphs of
    the same shape. Through one session (one planner, as a long-lived process running two
    jobs would), each must compute with its own constant: the kernel's function is part of
    its identity, so they never share a cached plan."""
    from arrayjob import lazy as la
    from arrayjob.planner.kernel import Kernel

    X = np.arange(24.0).reshape(12, 2)
    info = put("X", X, (4, 2))
    session = Session(LocalExecutor(StorageOptions()),
                      PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2), **PLANNER))
    for factor in (2.0, 3.0, 2.0):
        (scaled,) = la.map_blocks(Kernel("scale", Scale(factor)), la.from_zarr(info),
                                  outputs=[((12, 2), "float64", 4)], block_rows=[4])
        np.testing.assert_array_equal(session.compute({"y": la.sum(scaled, axis=0)})["y"], factor * X.sum(axis=0))
    assert len(session.planner) == 2  # the third program is the first again: planned once


@pytest.mark.parametrize("size,high", [(0, 5), (1, 5), (2, 1), (1000, 10), (100_000, 2**40)])
def test_distinct_is_numpy_unique(size, high):
    from arrayjob.algorithms.pagerank.graph import distinct

    keys = np.random.default_rng(size).integers(0, high, size)
    assert np.array_equal(distinct(keys), np.unique(keys))


def _rmat_edges(rng: np.random.Generator, n: int, m: int, scale: int = 17) -> np.ndarray:
    """R-MAT-like edges, as datagen draws them: most edges on the low ids."""
    def ids() -> np.ndarray:
        out = np.zeros(m, dtype=np.int64)
        for level in range(scale):
            out |= (rng.random(m) < 0.24).astype(np.int64) << level  # b + d = 0.19 + 0.05
        return out % n
    return np.stack([ids(), ids()], axis=1)


@pytest.mark.parametrize("n,blocks", [(1, 1), (2, 2), (3, 2), (10, 4), (997, 3), (1000, 4), (2**20, 2), (999_999, 7)])
def test_degree_order_is_a_bijection_into_the_blocks(n, blocks):
    from arrayjob.algorithms.pagerank.graph import by_node_id, degree_order

    out_edges = np.random.default_rng(n).integers(0, 50, n) ** 2
    block = -(-n // blocks)
    labels = degree_order(out_edges, block)
    assert np.array_equal(np.sort(labels), np.arange(n))  # every new id once, all below n
    sizes = np.bincount(labels // block, minlength=-(-n // block))
    assert np.all(sizes[:-1] == block) and sizes[-1] == n - block * (len(sizes) - 1)
    values = np.random.default_rng(n + 1).random(n)
    by_label = np.empty(n)
    by_label[labels] = values
    assert np.array_equal(by_node_id(by_label, labels), values)


def test_degree_order_puts_the_busiest_sources_first_and_balances_a_power_law_graph():
    from arrayjob.algorithms.pagerank.graph import degree_order

    rng, n, blocks = np.random.default_rng(11), 100_000, 4
    edges = _rmat_edges(rng, n, 400_000)
    out_edges = np.bincount(edges[:, 0], minlength=n)
    block = -(-n // blocks)
    labels = degree_order(out_edges, block)
    plain = np.bincount(edges[:, 1] // block, minlength=blocks)
    dealt = np.bincount(labels[edges[:, 1]] // block, minlength=blocks)
    assert plain.max() / plain.mean() > 1.8  # most edges on the low ids
    assert dealt.max() / dealt.mean() < 1.05
    # the first 1 % of each block's ids are sources of far more edges than the rest
    position = labels % block
    hot = position < block // 100
    assert out_edges[hot].mean() > 10 * out_edges[~hot].mean()
    group = np.floor(np.log2(out_edges + 1.0))  # by power of two: within a block, no colder group before a hotter one
    for b in range(blocks):
        mine = labels // block == b
        assert np.all(np.diff(group[mine][np.argsort(position[mine])]) <= 0)


def _pagerank_spec(tmp_path, edges_uri, params=""):
    from arrayjob.spec import load_spec

    (tmp_path / "s.toml").write_text(
        f'[job]\nname = "g"\nalgorithm = "pagerank"\n[inputs]\nedges = "{edges_uri}"\n'
        f'[params]\ntol = 1e-13\nmax_iter = 1000\n{params}[output]\nuri = "{tmp_path}/out"\n')
    return load_spec(tmp_path / "s.toml")


@pytest.mark.parametrize("layout", ["anndata", "arrayjob"])
def test_pagerank_reads_a_csr_group(tmp_path, layout):
    """The adjacency as a CSR group, opened by the one sparse reader (``io.sparse``) as its
    pattern: AnnData's layout, whose weights are never read (their chunks are gone here), or
    the group arrayjob took before (indptr, indices and a shape attribute)."""
    import shutil

    from arrayjob.runner import open_inputs
    from tests.harness.helpers import write_adjacency_group

    rng = np.random.default_rng(10)
    n = 250
    edges = rng.integers(0, n, size=(1500, 2))
    matrix = write_adjacency_group(str(tmp_path / "graph.zarr"), edges, n, layout)
    if layout == "anndata":
        shutil.rmtree(tmp_path / "graph.zarr" / "data" / "c")  # PageRank is unweighted: data is not read
    arrays = open_inputs(_pagerank_spec(tmp_path, tmp_path / "graph.zarr"))
    (info,) = arrays.values()
    assert set(arrays) == {"edges"} and info.sparse is not None and info.sparse.pattern
    assert info.shape == (n, n) and info.sparse.nnz == matrix.nnz and info.dtype == "bool"
    r = run_job("pagerank", arrays, tol=1e-13, max_iter=1000)
    assert np.abs(r.arrays["rank"] - _networkx_rank(edges, n)).sum() <= 1e-6
    assert r.attrs["n_nodes"] == n


@pytest.mark.parametrize("case,problem", [
    ("csc", "a csc_matrix group; PageRank takes the adjacency matrix as CSR (row i: the targets of node i's edges)"),
    ("rectangular", "expected an adjacency matrix, shape = [n, n], got [30, 31]"),
    ("target", "row 4 holds column index 30, outside [0, 30)"),
    ("no shape", "no shape attribute (expected shape = [rows, columns])"),
])
def test_pagerank_refuses_a_csr_group_that_is_no_adjacency(tmp_path, case, problem):
    import scipy.sparse

    from arrayjob.runner import open_inputs
    from tests.harness.helpers import write_adjacency_group, write_csr_group

    uri = tmp_path / "graph.zarr"
    edges = np.array([[0, 1], [4, 2], [4, 29], [7, 7]])
    matrix = write_adjacency_group(str(uri), edges, 30, "arrayjob")
    if case == "csc":
        write_csr_group(str(uri), matrix.tocsc(), encoding="csc_matrix")
    elif case == "rectangular":
        zarr.open_group(str(uri), mode="r+").attrs["shape"] = [30, 31]
        zarr.open_array(str(uri / "indptr"), mode="r+")  # unchanged: 31 offsets for 30 rows
    elif case == "target":
        zarr.open_array(str(uri / "indices"), mode="r+")[2] = 30  # row 4's second edge
    elif case == "no shape":
        del zarr.open_group(str(uri), mode="r+").attrs["shape"]
    assert scipy.sparse.issparse(matrix)
    with pytest.raises(InputError) as raised:
        run_job("pagerank", open_inputs(_pagerank_spec(tmp_path, uri)))
    assert str(raised.value) == f"inputs.edges: {uri}: {problem}"


def test_pagerank_on_a_csr_group_is_estimated_as_it_reads(tmp_path):
    """Opening the group reads its indptr on the driver; the run then reads indptr whole once
    and every chunk of indices once, never data: the estimate's reads, to the byte."""
    from arrayjob.costing.estimate import estimate_cluster, estimate_job
    from arrayjob.costing.prices import load_prices
    from arrayjob.costing.profile import SHIPPED
    from arrayjob.runner import plan_options, prepare
    from tests.harness.helpers import write_adjacency_group

    n = 399
    # distinct edges, every chunk whole (a last chunk, part empty, is stored whole)
    pairs = np.random.default_rng(11).choice(n * n, size=6 * 512, replace=False)
    write_adjacency_group(str(tmp_path / "graph.zarr"), np.stack([pairs // n, pairs % n], axis=1), n, "anndata",
                          (512, 100), compressors=None)
    spec = _pagerank_spec(tmp_path, tmp_path / "graph.zarr")
    job = prepare(spec)
    prices = load_prices()
    instance = prices.instance("local")
    estimate = estimate_job(job, spec, nodes=1, instance=instance, prices=prices, profile=SHIPPED, iterations=3)
    planned = {s.name: (s.bytes_read, s.get_requests) for s in estimate.stages}

    executor = LocalExecutor(StorageOptions())
    session = Session(executor, plan_options(spec, estimate_cluster(1, instance, SHIPPED)))
    job.run(JobContext(session, executor.metrics))
    reads = {s.name: (s.storage.bytes_read, s.storage.get_requests) for s in executor.metrics.stages}
    opened = (job.metadata_reads.bytes_read, job.metadata_reads.get_requests)
    assert opened[0] >= 4 * (n + 1)  # indptr, whole
    assert reads["fit"] == planned["fit"] == (0, 0)
    assert planned["validate"] == opened and reads["load"] == planned["load"]


def test_pagerank_keeps_the_graph_between_iterations(put):
    edges = np.random.default_rng(9).integers(0, 200, size=(2000, 2))
    cls = get_job("pagerank")
    job = cls(table_to_dataclass(cls.Params, {"tol": 1e-10}, "params"), {"edges": put("edges", edges, (500, 2))})
    executor = LocalExecutor(StorageOptions())
    session = Session(executor, PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2), **PLANNER))
    r = job.run(JobContext(session, executor.metrics))
    load, fit = executor.metrics.stages
    # the edges are read once (in load); iterations read nothing and rebuild nothing
    assert load.storage.get_requests > 0 and fit.storage.get_requests == 0
    # each iteration runs exactly the iteration's plan (a fused step per target block and the
    # sums of its partials); the build (splits, shuffle, CSR blocks, scaling) is not rerun
    per_iteration = len(session.plan(job.program(session.options.cluster.workers)).physical.tasks)
    assert r.attrs["iterations"] > 3 and fit.tasks == r.attrs["iterations"] * per_iteration


PAGERANK_BAD = [
    (np.array([[0.5, 1.0]]), {}, "inputs.edges: expected integer node ids, got dtype float64"),
    (np.array([[0, 1, 2]]), {}, "inputs.edges: expected an (E, 2) array of (source, target), got shape (1, 3)"),
    (np.array([[0, 1], [5, 2]]), {"n_nodes": 4}, "inputs.edges: node id 5 is out of range for params.n_nodes = 4"),
    (np.array([[0, 1], [-3, 2]]), {}, "inputs.edges: node ids must be >= 0, found -3"),
]


@pytest.mark.parametrize("edges,params,message", PAGERANK_BAD, ids=range(len(PAGERANK_BAD)))
def test_pagerank_bad_edges(put, edges, params, message):
    with pytest.raises(InputError) as raised:
        run_job("pagerank", {"edges": put("edges", edges, (1, edges.shape[1]))}, **params)
    assert str(raised.value) == message
