"""``predict`` with an ALS model: each user's ``top_n`` items by xᵤ·yᵢ (and those scores), as
NumPy's argsort of the published factors ranks them, written by the workers chunked like X (the
user ids); from the CLI, an ALS fit on a Parquet table scored into Parquet; what cannot be
scored refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from arrayjob.algorithms.als import scoring as als_scoring
from arrayjob.algorithms.predict import Predict, PredictParams
from arrayjob.errors import InputError
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.io.model import open_model
from tests.harness.helpers import (
    publish_model,
    write_array,
)
from tests.unit.algorithms.test_predict import score


def factors(users=50, items=40, rank=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((users, rank)), rng.standard_normal((items, rank))


def top(users_factors, item_factors, ids, n):
    """NumPy's ranking: every item by x·y, best first, the first ``n``."""
    scores = users_factors[ids] @ item_factors.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :n]
    return order, np.take_along_axis(scores, order, axis=1)


@pytest.mark.parametrize("slab_bytes", [als_scoring.SLAB_BYTES, 8 * 40 * 7])  # one slab, or slabs of 7 users
def test_the_top_items_of_each_user_are_numpys(tmp_path, monkeypatch, slab_bytes):
    monkeypatch.setattr(als_scoring, "SLAB_BYTES", slab_bytes)
    x, y = factors()
    model = publish_model(tmp_path / "model", "als", {"user_factors": x, "item_factors": y})
    ids = np.random.default_rng(1).integers(0, 50, 700)  # users in any order, some more than once
    result, written = score(tmp_path, model, ids, params=PredictParams(top_n=6))
    items, ratings = top(x, y, ids, 6)
    np.testing.assert_array_equal(written["items"][:], items)
    np.testing.assert_allclose(written["ratings"][:], ratings, rtol=1e-12, atol=1e-12)
    assert written["items"].dtype == np.int64 and written["items"].shape == (700, 6)
    assert result.attrs["top_n"] == 6 and result.attrs["model_algorithm"] == "als"


def test_every_item_when_top_n_is_all_of_them(tmp_path):
    x, y = factors(items=5)
    model = publish_model(tmp_path / "model", "als", {"user_factors": x, "item_factors": y})
    ids = np.arange(50)
    _, written = score(tmp_path, model, ids, params=PredictParams(top_n=5))
    np.testing.assert_array_equal(written["items"][:], top(x, y, ids, 5)[0])


def _job(tmp_path, X, top_n=3):
    from arrayjob.io.arrays import open_array_info

    x, y = factors()
    model = publish_model(tmp_path / "model", "als", {"user_factors": x, "item_factors": y})
    write_array(str(tmp_path / "X.zarr"), X, (10, *X.shape[1:]))
    info = open_array_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions())
    return Predict(PredictParams(top_n=top_n), {"X": info},
                   models={"model": open_model("model", parse_uri(model), StorageOptions())})


@pytest.mark.parametrize("X,top_n,message", [
    (np.zeros((20, 3)), 3, "inputs.X: the als model of run 20250101T000000Z-handmade at {model} scores users: "
                           "expected an (n,) vector of their ids, got shape (20, 3)"),
    (np.zeros(20), 41, "params.top_n: 41 items a user, but the als model of run 20250101T000000Z-handmade at "
                       "{model} has 40 items"),
], ids=["features", "top_n"])
def test_what_an_als_model_cannot_score_is_refused_before_x_is_read(tmp_path, X, top_n, message):
    with pytest.raises(InputError) as raised:
        _job(tmp_path, X, top_n)
    assert str(raised.value) == message.format(model=tmp_path / "model")


@pytest.mark.parametrize("bad", [50.0, -1.0, 2.5])
def test_a_user_id_outside_the_model_is_refused_where_it_is_read(tmp_path, bad):
    from tests.unit.algorithms.test_als import run

    X = np.arange(20, dtype=np.float64)
    X[13] = bad
    job = _job(tmp_path, X)
    with pytest.raises(InputError, match=rf"^inputs\.X: a user id of {bad:g}, not one of the model's users 0\.\.49 "
                                         r"in \[10:20\] of "):
        run(job)


