"""The integration tests of ``tests.unit.solvers.test_multinomial``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

from tests.harness.helpers import (
    multinomial_data,
    published,
    read_group,
    run_cli,
    without_progress,
    write_array,
    write_spec,
)
from tests.harness.linear_models import balanced, softmax_objective
from tests.unit.solvers.test_multinomial import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    NAIVE,
    sklearn_fit,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_weighted_multinomial_run_matches_sklearn_end_to_end(workdir, capsys):
    """Found K, sample and balanced class weights, through the CLI: its stages, its estimate's
    and its result against scikit-learn's."""
    X, y = multinomial_data(3000, 5, 3, seed=8)
    weights = np.random.default_rng(8).uniform(0.2, 3.0, 3000)
    for name, data, chunks in (("X", X, (500, 5)), ("y", y, (500,)), ("weights", weights, (700,))):
        write_array(f"{name}.zarr", data, chunks)
    l2 = 1e-3
    spec = write_spec(workdir / "spec.toml", inputs={n: f"{n}.zarr" for n in ("X", "y", "weights")}, output="out",
                      params=f'l2 = {l2}\nclass_weight = "balanced"\ntol = 1e-8\nmax_iter = 300\n')
    code, out, err = run_cli(["run", str(spec), "--json"], capsys)
    assert (code, without_progress(err)) == (0, "")
    group = read_group(f"{published('out')}/result.zarr")
    coef, intercept = group["coef"][:], group["intercept"][:]
    model = SkLogisticRegression(C=1 / (l2 * weights.sum()), class_weight="balanced", tol=1e-12, max_iter=10_000)
    model.fit(X, y, sample_weight=weights)
    np.testing.assert_allclose(coef, model.coef_, atol=1e-5)
    np.testing.assert_allclose(intercept, model.intercept_ - model.intercept_.mean(), atol=1e-5)
    rows = balanced(y, weights)
    assert group.attrs["weight_sum"] == pytest.approx(rows.sum(), rel=1e-12)
    assert group.attrs["objective"] == pytest.approx(
        softmax_objective(X, y, model.coef_, model.intercept_, 0.0, l2, rows), rel=1e-9)
    assert (group.attrs["family"], group.attrs["classes"], group.attrs["converged"]) == ("multinomial", 3, True)
    report = json.loads(out)
    assert [s["name"] for s in report["stages"]] == ["validate", "connect", "load", "fit", "write"]
    assert [s["name"] for s in report["estimate"]["stages"] if s["name"] != "shutdown"] == \
        ["connect", "load", "fit", "write"]
