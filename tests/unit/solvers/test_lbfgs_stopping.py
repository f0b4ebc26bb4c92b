"""L-BFGS near the optimum: a tol out of reach stops where no step can lower the objective by
more than rounding, says so, and costs about one pass over X an iteration (issue 28, part 3);
the objective is scikit-learn's at a tight tol."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

from arrayjob.solvers import lbfgs
from tests.harness.helpers import logreg_data
from tests.unit.api.test_catalog import run_job

L2 = 1e-4


def _objective(X, y, coef, intercept):
    margin = (2 * y - 1) * (X @ coef + intercept)
    return float(np.mean(np.logaddexp(0.0, -margin)) + 0.5 * L2 * coef @ coef)


@pytest.fixture
def fitted(put):
    X, y = logreg_data(6000, 8, seed=11)
    arrays = {"X": put("X", X, (1500, 8)), "y": put("y", y, (1500,))}
    reference = SkLogisticRegression(C=1 / (L2 * len(y)), tol=1e-14, max_iter=10_000).fit(X, y)
    return X, y, arrays, _objective(X, y, reference.coef_[0], reference.intercept_[0])


def test_a_tol_out_of_reach_stops_at_machine_precision_with_sklearns_objective(fitted):
    X, y, arrays, best = fitted
    r = run_job("logreg", arrays, l2=L2, tol=1e-300, max_iter=200)
    attrs = r.attrs
    assert not attrs["converged"] and attrs["no_further_decrease"] and attrs["iterations"] < 200
    assert "did NOT converge" in r.summary[0] and "(no further decrease possible at machine precision)" in r.summary[0]
    assert f"{attrs['evaluations']} evaluations, {attrs['evaluations_per_iteration']:.2f} an iteration" in r.summary[0]
    assert attrs["objective"] == pytest.approx(best, rel=1e-10)
    assert _objective(X, y, r.arrays["coef"], r.arrays["intercept"][0]) == pytest.approx(best, rel=1e-10)
    assert attrs["evaluations"] / attrs["iterations"] <= 1.3  # the first evaluation (at θ = 0) included


@pytest.mark.parametrize("tol,max_iter", [(1e-6, 100), (1e-10, 100), (1e-300, 5)])
def test_about_one_pass_an_iteration(fitted, tol, max_iter):
    _, _, arrays, best = fitted
    r = run_job("logreg", arrays, l2=L2, tol=tol, max_iter=max_iter)
    assert r.attrs["evaluations"] / r.attrs["iterations"] <= 1.3
    assert r.attrs["evaluations_per_iteration"] == pytest.approx(r.attrs["evaluations"] / r.attrs["iterations"], abs=1e-4)
    assert "no_further_decrease" not in r.attrs or not r.attrs["converged"]
    if r.attrs["converged"]:
        assert r.attrs["objective"] == pytest.approx(best, rel=1e-8)


def test_the_stop_is_saved_and_resumed_with_the_state():
    """``flat`` goes into the checkpoint's state and comes back; an old state without it resumes as not flat."""
    state = lbfgs.LBFGSState(np.ones(2), 1.0, np.zeros(2), np.empty((0, 2)), np.empty((0, 2)), 3, True, True)
    assert lbfgs.LBFGSState.from_dict(state.as_dict()).flat
    old = {k: v for k, v in state.as_dict().items() if k != "flat"}
    assert not lbfgs.LBFGSState.from_dict(old).flat
