"""ALS from a Parquet table of (user, item, rating) rows (``algorithms.als.table``): the same factors as
from the same ratings in a CSR group, and as the NumPy reference of ``tests/unit/algorithms/test_als.py``; the
table's blocks built into both layouts on the workers; what cannot be ratings refused in one
line (exit 2, nothing published)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import scipy.sparse

from arrayjob.errors import InputError
from arrayjob.io.locations import StorageOptions, TableSelection, parse_uri
from arrayjob.io.parquet import open_table_info
from tests.harness.helpers import write_parquet, write_spec
from tests.unit.algorithms.test_als import (
    RANK,
    assert_matches,
    make,
    opened,
    ratings,
    reference,
    run,
)


def full_ratings(implicit: bool = False) -> scipy.sparse.csr_matrix:
    """``test_als.ratings`` with the last user and the last item rated: the table's largest ids
    give R's shape, as the CSR group's ``shape`` does."""
    R = ratings(implicit=implicit).tolil()
    R[R.shape[0] - 1, R.shape[1] - 1] = 1.0
    return R.tocsr()


def as_table(R: scipy.sparse.csr_matrix, seed: int = 1, **types: pa.DataType) -> pa.Table:
    """R's ratings as rows of (user, item, rating) in a random order."""
    coo = R.tocoo()
    order = np.random.default_rng(seed).permutation(coo.nnz)
    return pa.table({"user": pa.array(coo.row[order], types.get("user", pa.int64())),
                     "item": pa.array(coo.col[order], types.get("item", pa.int32())),
                     "rating": pa.array(coo.data[order], types.get("rating", pa.float64()))})


def opened_table(tmp_path, table: pa.Table, columns=("user", "item", "rating"), parts: int = 3, row_group: int = 300):
    cut = np.linspace(0, table.num_rows, parts + 1).astype(int)
    write_parquet(str(tmp_path / "ratings"), [table.slice(a, b - a) for a, b in zip(cut, cut[1:], strict=False)],
                  row_group_size=row_group)
    return open_table_info("R", parse_uri(str(tmp_path / "ratings")), StorageOptions(),
                           TableSelection(columns=tuple(columns))).info


@pytest.mark.parametrize("implicit", [False, True])
def test_a_table_gives_the_factors_of_the_same_ratings_as_csr_and_numpy(tmp_path, implicit):
    R = full_ratings(implicit)
    params = {"rank": RANK, "l2": 0.05, "max_iter": 4, "seed": 2, "implicit": implicit, "alpha": 1.5}
    job = make({"R": opened_table(tmp_path, as_table(R))}, **params)
    assert (job.users, job.items, job.nnz) == (*R.shape, R.nnz)
    result, _ = run(job)
    from_csr, _ = run(make({"R": opened(tmp_path, R)}, **params))
    y0 = np.random.default_rng(2).standard_normal((R.shape[1], RANK)) / np.sqrt(RANK)
    assert_matches(result, *reference(R, y0, 0.05, 4, alpha=1.5 if implicit else None))
    for name in ("user_factors", "item_factors"):
        np.testing.assert_allclose(result.arrays[name], from_csr.arrays[name], rtol=1e-10, atol=1e-12)
    # several table blocks, user blocks and item blocks: the shuffle was exercised
    assert job._row_blocks(4)[1] >= 3 and job._user_blocks(4)[1] >= 3 and job._item_blocks(4)[1] >= 3
    assert "(a table)" in job.describe()


def bad_table(kind: str) -> tuple[pa.Table, tuple[str, ...]]:
    table = as_table(scipy.sparse.csr_matrix(np.arange(1.0, 25.0).reshape(6, 4)))
    columns = ("user", "item", "rating")
    if kind == "float ids":
        table = table.set_column(1, "item", pa.array(table["item"].to_numpy().astype(np.float64)))
    elif kind == "negative id":
        table = table.set_column(0, "user", pa.array(table["user"].to_numpy() - 2))
    elif kind == "two columns":
        columns = ("user", "rating")
    elif kind == "missing column":
        columns = ("user", "movie", "rating")
    elif kind == "no statistics":
        pass  # written below without statistics
    return table, columns


DRIVER = [
    ("float ids", "inputs.R: column 'item' (the item ids) is double; ids are integers 0, 1, 2, …"),
    ("negative id", "inputs.R: column 'user' (the user ids) holds a negative id (-2) in "),
    ("two columns", "inputs.R: a table of ratings is read as three columns, user, item and rating, in that order "
                    "(columns = [\"user\", \"item\", \"rating\"]); got 2: user, rating"),
    ("missing column", "inputs.R: column 'movie' is not in "),
]


@pytest.mark.parametrize("kind,message", DRIVER, ids=[k for k, _ in DRIVER])
def test_what_cannot_be_ratings_is_refused_from_the_footers(tmp_path, kind, message):
    table, columns = bad_table(kind)
    with pytest.raises(InputError) as raised:
        make({"R": opened_table(tmp_path, table, columns, parts=1)}, rank=2)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_nulls_read_as_zero_are_refused_for_ratings(tmp_path):
    opened_table(tmp_path, bad_table("")[0], parts=1)
    info = open_table_info("R", parse_uri(str(tmp_path / "ratings")), StorageOptions(),
                           TableSelection(columns=("user", "item", "rating"), nulls="zero")).info
    with pytest.raises(InputError, match=r'^inputs\.R: nulls = "zero" would read a missing user or item id as 0'):
        make({"R": info}, rank=2)


def test_ids_without_statistics_are_refused(tmp_path):
    import pyarrow.parquet as pq

    (tmp_path / "ratings").mkdir()
    pq.write_table(bad_table("no statistics")[0], str(tmp_path / "ratings" / "part-0.parquet"), write_statistics=False)
    info = open_table_info("R", parse_uri(str(tmp_path / "ratings")), StorageOptions(),
                           TableSelection(columns=("user", "item", "rating"))).info
    with pytest.raises(InputError, match=r"column 'user' \(the user ids\) has no statistics in some row group of .*: "
                                         r"write the files with statistics"):
        make({"R": info}, rank=2)


WORKERS = [
    ("null", r"^inputs\.R: column 'rating' holds a null at row 5 "),
    ("nan", r"^inputs\.R: NaN or infinite values in \[\d+:\d+, 0:3\] of .*ratings#user,item,rating$"),
    ("repeat", r"^inputs\.R: user 1 rated item 2 more than once in .*ratings; ALS takes one rating per \(user, item\) "
               r"pair \(sum or drop the repeats first\)$"),
]


@pytest.mark.parametrize("kind,message", WORKERS, ids=[k for k, _ in WORKERS])
def test_bad_ratings_are_refused_where_their_block_is_read(tmp_path, kind, message):
    table, _ = bad_table("")
    rating = table["rating"].to_pylist()
    if kind == "null":
        rating[5] = None
    elif kind == "nan":
        rating[5] = float("nan")
    table = table.set_column(2, "rating", pa.array(rating, pa.float64()))
    if kind == "repeat":
        table = pa.concat_tables([table, pa.table({"user": pa.array([1], pa.int64()), "item": pa.array([2], pa.int32()),
                                                   "rating": pa.array([5.0])})])
    job = make({"R": opened_table(tmp_path, table, parts=2, row_group=5)}, rank=2, max_iter=1)
    with pytest.raises(InputError, match=message):
        run(job)


def test_implicit_feedback_refuses_a_negative_rating_where_its_block_is_read(tmp_path):
    table, _ = bad_table("")
    table = table.set_column(2, "rating", pa.array(np.where(np.arange(table.num_rows) == 7, -3.0, 1.0)))
    job = make({"R": opened_table(tmp_path, table, parts=1)}, rank=2, implicit=True)
    with pytest.raises(InputError, match=r"^inputs\.R: a negative rating \(-3; implicit feedback takes counts >= 0\) "
                                         r"in \[0:24, 0:3\] of "):
        run(job)


def test_the_table_is_read_once_in_load_as_the_estimate_says(tmp_path):
    """The table's row groups are read once, in load, where both layouts are built; an iteration
    reads nothing and runs one task per user block and one per item block; the estimate's
    reads are the run's, exactly."""
    from arrayjob.api.job import JobContext
    from arrayjob.costing.estimate import estimate_cluster, estimate_job
    from arrayjob.costing.prices import load_prices
    from arrayjob.costing.profile import SHIPPED
    from arrayjob.runner import plan_options, prepare
    from arrayjob.runtime.executor import LocalExecutor
    from arrayjob.runtime.session import Session
    from arrayjob.spec import load_spec

    R = full_ratings()
    opened_table(tmp_path, as_table(R))
    spec_path = write_spec(tmp_path / "spec.toml", algorithm="als", params="rank = 3\nmax_iter = 3\n",
                           inputs={"R": {"uri": str(tmp_path / "ratings"), "columns": ["user", "item", "rating"]}},
                           output=str(tmp_path / "out"))
    spec = load_spec(str(spec_path))
    job = prepare(spec)
    prices = load_prices()
    instance = prices.instance("local")
    estimate = estimate_job(job, spec, nodes=1, instance=instance, prices=prices, profile=SHIPPED, iterations=3)
    planned = {s.name: (s.bytes_read, s.get_requests) for s in estimate.stages}
    session = Session(LocalExecutor(StorageOptions()), plan_options(spec, estimate_cluster(1, instance, SHIPPED)))
    job.run(JobContext(session, session.executor.metrics))
    metrics = session.executor.metrics
    reads = {s.name: (s.storage.bytes_read, s.storage.get_requests) for s in metrics.stages}
    assert reads["fit"] == planned["fit"] == (0, 0)
    assert reads["load"] == planned["load"] and planned["load"][1] > 0
    workers = session.options.cluster.workers
    per_iteration = sum(len(session.plan(job.stages(workers)[name]).physical.tasks) for name in ("users", "items"))
    assert per_iteration == job._user_blocks(workers)[1] + job._item_blocks(workers)[1]
    assert {s.name: s for s in metrics.stages}["fit"].tasks == 3 * per_iteration
