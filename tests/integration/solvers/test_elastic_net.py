"""The integration tests of ``tests.unit.solvers.test_elastic_net``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import ElasticNet

from tests.harness.helpers import (
    published,
    read_group,
    run_cli,
    without_progress,
    write_array,
    write_spec,
)
from tests.harness.linear_models import (
    least_squares_objective,
)
from tests.unit.solvers.test_elastic_net import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    TRUE_W,
    elastic_net,
    regression_data,
    saga,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_weighted_lasso_run_end_to_end(workdir, capsys):
    """linreg with l1 and weights through the CLI: the weights' sum at load, OWL-QN's evaluations
    in the fit, and scikit-learn's ElasticNet's coefficients (its weights rescaled to sum to n)."""
    X, y = regression_data(3000, 6)
    weights = np.random.default_rng(6).uniform(0.0, 2.0, 3000)
    for name, data, chunks in (("X", X, (500, 8)), ("y", y, (500,)), ("weights", weights, (400,))):
        write_array(f"{name}.zarr", data, chunks)
    spec = write_spec(workdir / "spec.toml", inputs={n: f"{n}.zarr" for n in ("X", "y", "weights")}, output="out",
                      algorithm="linreg", params="l1 = 0.05\n")
    code, out, err = run_cli(["run", str(spec)], capsys)
    assert (code, without_progress(err)) == (0, "")
    group = read_group(f"{published('out')}/result.zarr")
    reference = ElasticNet(alpha=0.05, l1_ratio=1.0, tol=1e-14, max_iter=1_000_000).fit(X, y, sample_weight=weights)
    assert "OWL-QN converged in" in out and f"{np.count_nonzero(reference.coef_)} of 8 coefficients non-zero" in out
    np.testing.assert_array_equal(group["coef"][:] == 0, reference.coef_ == 0)
    np.testing.assert_allclose(group["coef"][:], reference.coef_, atol=1e-7)
    assert group.attrs["weight_sum"] == pytest.approx(weights.sum(), rel=1e-12)
    assert group.attrs["objective"] == pytest.approx(
        least_squares_objective(X, y, reference.coef_, reference.intercept_, 0.05, 0.0, weights), rel=1e-12)
