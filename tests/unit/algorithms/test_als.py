"""ALS (``als``) against a NumPy implementation of the same updates from the same initial item
factors, written here from scipy.sparse: the objective after each iteration to 1e-8 and never
rising, and the factors, for explicit and implicit ratings; R's column layout built as SciPy
lays out R's columns, once, and kept; the estimate reads what the run reads; bad inputs in one
line; and once end to end from the CLI on Ray (``datagen als``, then the run)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse

from arrayjob.algorithms.als.layout import BuildItemBlock, SplitByItemBlock
from arrayjob.api.job import JobContext
from arrayjob.catalog import get_job
from arrayjob.costing.estimate import estimate_cluster, estimate_job
from arrayjob.costing.prices import load_prices
from arrayjob.costing.profile import SHIPPED
from arrayjob.costing.table import table
from arrayjob.errors import InputError, SpecError
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.io.sparse import open_sparse_info
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from arrayjob.spec import table_to_dataclass
from tests.harness.helpers import write_csr_group, write_spec

RANK = 3


def ratings(users: int = 600, items: int = 90, per_user: int = 8, seed: int = 0,
            implicit: bool = False) -> scipy.sparse.csr_matrix:
    """Low rank plus noise on a few items per user (0 to 2·per_user: some users rate nothing,
    some items are never rated); implicit: counts 0, 1, 2, … (stored zeros among them)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 2 * per_user + 1, users)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    indices = np.concatenate([np.sort(rng.choice(items - 5, c, replace=False)) for c in counts])
    x, y = rng.standard_normal((users, RANK)), rng.standard_normal((items, RANK))
    values = np.einsum("ij,ij->i", x[np.repeat(np.arange(users), counts)], y[indices])
    values += 0.3 * rng.standard_normal(len(values))
    if implicit:
        values = np.floor(np.abs(values))
    return scipy.sparse.csr_matrix((values, indices, indptr), shape=(users, items))


def reference(R: scipy.sparse.csr_matrix, y: np.ndarray, l2: float, iterations: int,
              alpha: float | None = None) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """ALS from item factors ``y``, one user (item) at a time: (X, Y, the objective after each
    iteration); explicit when ``alpha`` is None (weighted-λ), else implicit (Hu et al.)."""
    rank = y.shape[1]
    rows, columns = R.tocsr(), R.tocsc().T.tocsr()

    def half(M: scipy.sparse.csr_matrix, F: np.ndarray) -> np.ndarray:
        out = np.zeros((M.shape[0], rank))
        gram = F.T @ F
        for u in range(M.shape[0]):
            span = slice(M.indptr[u], M.indptr[u + 1])
            theirs, r = F[M.indices[span]], M.data[span]
            if alpha is None:
                if len(r):
                    out[u] = np.linalg.solve(theirs.T @ theirs + l2 * len(r) * np.eye(rank), theirs.T @ r)
            else:
                c, p = 1 + alpha * r, (r > 0).astype(float)
                out[u] = np.linalg.solve(gram + theirs.T @ ((c - 1)[:, None] * theirs) + l2 * np.eye(rank),
                                         theirs.T @ (c * p))
        return out

    dense, stored = R.toarray(), np.zeros(R.shape, dtype=bool)
    stored[R.nonzero()] = True
    stored[rows.tocoo().row, rows.tocoo().col] = True  # stored zeros are ratings too
    objective = []
    for _ in range(iterations):
        x = half(rows, y)
        y = half(columns, x)
        residual = dense - x @ y.T
        if alpha is None:
            objective.append(np.sum(residual[stored] ** 2) + l2 * (np.diff(rows.indptr) @ np.sum(x**2, axis=1)
                                                                   + np.diff(columns.indptr) @ np.sum(y**2, axis=1)))
        else:
            c = 1 + alpha * dense
            objective.append(np.sum(c * ((dense > 0) - x @ y.T) ** 2) + l2 * (np.sum(x**2) + np.sum(y**2)))
    return x, y, objective


def opened(tmp_path, R, name="R", chunks=(700, 700, 60)):
    write_csr_group(str(tmp_path / name), R, chunks)
    return open_sparse_info(name, parse_uri(str(tmp_path / name)), StorageOptions()).info


def make(arrays, **params):
    cls = get_job("als")
    return cls(table_to_dataclass(cls.Params, params, "params"), arrays)


def run(job, session=None):
    if session is None:
        session = Session(LocalExecutor(StorageOptions()), PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2)))
    return job.run(JobContext(session, session.executor.metrics)), session


def assert_matches(result, x, y, objective):
    found = np.array(result.attrs["objective"])
    np.testing.assert_allclose(found, objective, rtol=1e-8, atol=0)
    assert np.all(np.diff(found) <= 1e-12 * found[:-1])  # never rises
    for got, want in ((result.arrays["user_factors"], x), (result.arrays["item_factors"], y)):
        assert np.linalg.norm(got - want) <= 1e-8 * np.linalg.norm(want)


def test_explicit_from_item_factors_by_uri_matches_numpy(tmp_path, put):
    R = ratings()
    y0 = np.random.default_rng(3).standard_normal((R.shape[1], RANK))
    put("init", y0, y0.shape)
    job = make({"R": opened(tmp_path, R)}, rank=RANK, l2=0.05, max_iter=6, init=str(tmp_path / "init.zarr"))
    result, _ = run(job)
    assert_matches(result, *reference(R, y0, 0.05, 6))
    assert result.attrs["iterations"] == 6 and not result.attrs["implicit"]
    # the run had several blocks on each side (a row block's users, a column block's items)
    rows, columns = job._row_blocks(4)[1], job._item_blocks(4)[1]
    assert rows >= 3 and columns >= 3


def test_implicit_from_the_seed_matches_numpy(tmp_path):
    R = ratings(seed=1, implicit=True)
    assert (R.data == 0).any()  # stored zeros: p = 0, c = 1, as an absent pair
    job = make({"R": opened(tmp_path, R)}, rank=RANK, l2=0.5, alpha=2.0, implicit=True, max_iter=5, seed=7)
    result, _ = run(job)
    y0 = np.random.default_rng(7).standard_normal((R.shape[1], RANK)) / np.sqrt(RANK)
    assert_matches(result, *reference(R, y0, 0.5, 5, alpha=2.0))
    assert result.attrs["alpha"] == 2.0


def test_the_column_layout_is_r_by_columns_from_unsorted_row_blocks_with_repeats():
    """The split of each row block and the build of each column block give R's columns as SciPy
    lays them out (a repeated entry summed, every item's users ascending)."""
    rng = np.random.default_rng(5)
    users, items, rows, width = 23, 17, 6, 5
    coo = scipy.sparse.random(users, items, density=0.3, random_state=6, format="coo")
    # the same entries in shuffled order, some of them twice (half each): a valid, non-canonical CSR
    order = rng.permutation(coo.nnz)
    twice = order[: coo.nnz // 4]
    row = np.concatenate([coo.row[order], coo.row[twice]])
    col = np.concatenate([coo.col[order], coo.col[twice]])
    halves = coo.data[twice] / 2
    data = np.concatenate([coo.data[order], halves])
    data[: len(twice)] = halves
    by_row = np.argsort(row, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=users))])
    messy = scipy.sparse.csr_matrix((data[by_row], col[by_row], indptr), shape=(users, items))
    assert not messy.has_canonical_format
    blocks = -(-users // rows)
    sizes = [messy[b * rows:(b + 1) * rows].nnz for b in range(blocks)]
    split = SplitByItemBlock(items, width, max(sizes))
    parts = [split(messy[b * rows:(b + 1) * rows]) for b in range(blocks)]
    item_ids, user_ids, values = (np.concatenate([p[i] for p in parts]) for i in range(3))
    starts = np.concatenate([p[3] for p in parts])
    build = BuildItemBlock(users, items, rows, width, max(sizes))
    columns = [build(np.array([c]), item_ids, user_ids, values, starts)[0, 0] for c in range(-(-items // width))]
    built = scipy.sparse.hstack(columns, format="csc")
    expected = coo.tocsc()
    expected.sum_duplicates()
    np.testing.assert_array_equal(built.indptr, expected.indptr)
    np.testing.assert_array_equal(built.indices, expected.indices)
    np.testing.assert_allclose(built.data, expected.data, rtol=1e-15)
    assert all(c.has_sorted_indices for c in columns)


def test_the_column_layout_is_built_once_and_kept(tmp_path):
    """R is read once, in load, where its column layout is built; an iteration reads nothing and
    runs one task per row block and one per column block."""
    R = ratings(seed=2)
    job = make({"R": opened(tmp_path, R)}, rank=RANK, max_iter=4)
    result, session = run(job)
    load, fit = session.executor.metrics.stages
    assert load.storage.get_requests > 0 and fit.storage.get_requests == 0
    workers = session.options.cluster.workers
    per_iteration = sum(len(session.plan(job.stages(workers)[name]).physical.tasks) for name in ("users", "items"))
    assert per_iteration == job._row_blocks(workers)[1] + job._item_blocks(workers)[1]
    assert fit.tasks == 4 * per_iteration
    assert "two layouts" in job.describe()


def test_the_estimate_reads_what_the_run_reads(tmp_path):
    """Opening R reads its indptr on the driver; the run reads every row block once in load (the
    build reads the same blocks) and nothing while it iterates: the estimate's reads, exactly."""
    from arrayjob.runner import plan_options, prepare

    R = ratings(seed=4)
    write_csr_group(str(tmp_path / "R"), R, (400, 400, 60), compressors=None)
    spec_path = write_spec(tmp_path / "spec.toml", inputs={"R": str(tmp_path / "R")}, output=str(tmp_path / "out"),
                           algorithm="als", params="rank = 3\nmax_iter = 3\n")
    from arrayjob.spec import load_spec

    spec = load_spec(str(spec_path))
    job = prepare(spec)
    prices = load_prices()
    instance = prices.instance("local")
    estimate = estimate_job(job, spec, nodes=1, instance=instance, prices=prices, profile=SHIPPED, iterations=3)
    planned = {s.name: (s.bytes_read, s.get_requests) for s in estimate.stages}
    session = Session(LocalExecutor(StorageOptions()), plan_options(spec, estimate_cluster(1, instance, SHIPPED)))
    job.run(JobContext(session, session.executor.metrics))
    reads = {s.name: (s.storage.bytes_read, s.storage.get_requests) for s in session.executor.metrics.stages}
    assert reads["fit"] == planned["fit"] == (0, 0)
    assert reads["load"] == planned["load"] and planned["validate"][1] > 0
    # the build is priced once, in load; the two passes once per iteration each
    stages = {s.name: s for s in estimate.stages}
    assert stages["fit"].runs == 2 * 3 and stages["load"].work["edge_build"] == pytest.approx(R.nnz)
    assert " fit (6 passes) " in table(estimate)  # the compute stage, after R's validate stage


BAD = [
    ("dense", {"rank": 2}, InputError, "inputs.R: expected a sparse ratings matrix (users × items, a CSR group in "
                                       "AnnData's layout, or a Parquet table of user, item and rating columns), got "
                                       "a dense array of shape (6, 4)"),
    ("csc", {"rank": 2}, InputError, "a csc_matrix group; ALS takes the ratings as CSR (row u: the ratings of user u)"),
    ("init", {"rank": 2}, InputError, "params.init: expected an (items × rank) array of item factors, (4, 2), "
                                      "got (4, 3)"),
    ("csr", {"rank": 2, "l2": 0.0}, SpecError, "params.l2: expected a number > 0, got 0.0"),
    ("csr", {}, SpecError, "params.rank: required key is missing"),
    ("csr", {"rank": 2, "alpha": -1.0}, SpecError, "params.alpha: expected a number >= 0, got -1.0"),
]


@pytest.mark.parametrize("kind,params,error,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_are_one_line(tmp_path, put, kind, params, error, message):
    R = scipy.sparse.csr_matrix(np.arange(24.0).reshape(6, 4))
    if kind == "dense":
        arrays = {"R": put("R", R.toarray(), (3, 4))}
    elif kind == "csc":
        write_csr_group(str(tmp_path / "R"), R.tocsc(), encoding="csc_matrix")
        arrays = {"R": open_sparse_info("R", parse_uri(str(tmp_path / "R")), StorageOptions()).info}
    else:
        arrays = {"R": opened(tmp_path, R)}
    if kind == "init":
        put("init", np.ones((4, 3)), (4, 3))
        params = {**params, "init": str(tmp_path / "init.zarr")}
    with pytest.raises(error) as raised:
        cls = get_job("als")
        cls(table_to_dataclass(cls.Params, params, "params"), arrays)
    assert str(raised.value).endswith(message)


def test_implicit_feedback_refuses_a_negative_rating_where_its_block_is_read(tmp_path):
    R = ratings(seed=3)  # explicit ratings: some negative
    job = make({"R": opened(tmp_path, R)}, rank=RANK, implicit=True)
    with pytest.raises(InputError, match=r"^inputs\.R: a negative rating \(-[0-9.]+; implicit feedback takes "
                                         r"counts >= 0\) in \[0:\d+, 0:90\] of "):
        run(job)


@pytest.mark.parametrize("alpha", [None, 1.5])
def test_the_systems_are_the_same_with_and_without_the_table_of_products(monkeypatch, alpha):
    """A row's Σ wᵢfᵢfᵢᵀ from the other side's table of products, or from each slab's ratings
    gathered (the other side too big for a table), in slabs of a few rows: the same factors."""
    from arrayjob.algorithms.als import solve as als_solve

    R = ratings(300, 40, seed=8, implicit=alpha is not None)
    F = np.random.default_rng(9).standard_normal((40, 4))
    gram = F.T @ F if alpha is not None else None
    whole = als_solve.solve_rows(R, F, 0.3, alpha, gram)
    monkeypatch.setattr(als_solve, "TABLE_BYTES", 0)
    monkeypatch.setattr(als_solve, "SLAB_BYTES", 8 * 10 * 16)  # slabs of 10 rows, or of 16 ratings
    np.testing.assert_allclose(als_solve.solve_rows(R, F, 0.3, alpha, gram), whole, rtol=1e-12, atol=1e-12)
    assert np.all(whole[np.diff(R.indptr) == 0] == 0)  # users without ratings (explicit: by choice)
