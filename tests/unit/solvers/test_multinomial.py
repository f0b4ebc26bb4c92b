"""Multinomial logistic regression (``logreg``, family multinomial): the softmax program against
NumPy and finite differences, fits against scikit-learn on dense and sparse X, how K is found,
the labels the workers refuse, and one run end to end on Ray."""

from __future__ import annotations

import re

import numpy as np
import pytest
import zarr
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

from arrayjob import lazy as la
from arrayjob.algorithms.logreg import LogisticRegression, LogRegParams
from arrayjob.errors import InputError
from arrayjob.io.locations import StorageOptions
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from arrayjob.solvers import multinomial
from tests.harness.helpers import (
    multinomial_data,
    run_cli,
    sparse_logreg_data,
)
from tests.harness.linear_models import binary_objective, fit, inputs, softmax_objective

NAIVE = {"tiling": "naive", "fusion": "none", "placement": "roundrobin"}


def sklearn_fit(X, y, l2, fit_intercept=True, **options):
    model = SkLogisticRegression(C=1 / (l2 * X.shape[0]), fit_intercept=fit_intercept, tol=1e-12,
                                 max_iter=10_000, **options).fit(X, y)
    return model.coef_, model.intercept_ - model.intercept_.mean()  # ours sum to 0, as its start keeps them


@pytest.mark.parametrize("planner", [NAIVE, {}], ids=["unfused", "planned"])
def test_softmax_program_matches_numpy_and_finite_differences(tmp_path, planner):
    """Σ rᵢ lossᵢ, with sample and class weights, and its gradient: one program, any plan."""
    X, y = multinomial_data(700, 4, 3, seed=1)
    weights = np.random.default_rng(1).uniform(0.5, 2.0, 700)
    arrays = inputs(tmp_path, rows=160, X=X, y=y, weights=weights)
    rows = multinomial.row_weights(la.from_zarr(arrays["y"]), 3, la.from_zarr(arrays["weights"]), balanced=True)
    program = multinomial.softmax_program(la.from_zarr(arrays["X"]), la.from_zarr(arrays["y"]), 3, True, rows)
    session = Session(LocalExecutor(StorageOptions()), PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2), **planner))
    rng = np.random.default_rng(2)
    W, b, class_weight = rng.standard_normal((3, 4)), rng.standard_normal(3), np.array([0.5, 1.0, 2.0])
    r = session.compute(program, {"W": W, "b": b, "class_weight": class_weight})
    row = weights * class_weight[y.astype(int)]

    def total(W, b):
        return softmax_objective(X, y, W, b, 0.0, 0.0, row) * row.sum()

    assert float(r["loss"]) == pytest.approx(total(W, b), rel=1e-12)
    eps = 1e-6
    numeric_W = np.array([(total(W + eps * E, b) - total(W - eps * E, b)) / (2 * eps)
                          for E in np.eye(12).reshape(12, 3, 4)]).reshape(3, 4)
    np.testing.assert_allclose(r["grad_W"], numeric_W, rtol=1e-6, atol=1e-6)
    numeric_b = [(total(W, b + eps * e) - total(W, b - eps * e)) / (2 * eps) for e in np.eye(3)]
    np.testing.assert_allclose(r["grad_b"], numeric_b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.sum(r["grad_b"]), 0.0, atol=1e-9)  # Σₖ (pᵢₖ − yᵢₖ) = 0 for every row


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_multinomial_matches_sklearn(tmp_path, sparse, fit_intercept):
    if sparse:
        X, _ = sparse_logreg_data(2000, 40, seed=3)
        W = np.random.default_rng(3).standard_normal((4, 40))
        y = np.asarray(X @ W.T + np.random.default_rng(4).gumbel(size=(2000, 4))).argmax(axis=1).astype(np.float64)
    else:
        X, y = multinomial_data(2000, 5, 4, seed=3)
    l2 = 1e-3
    job = LogisticRegression(LogRegParams(l2=l2, fit_intercept=fit_intercept, tol=1e-8, max_iter=500),
                             inputs(tmp_path, X=X, y=y))
    result, _ = fit(job)
    coef, intercept = result.arrays["coef"], result.arrays["intercept"]
    assert coef.shape == (4, X.shape[1]) and intercept.shape == (4,)
    assert result.attrs["family"] == "multinomial" and result.attrs["classes"] == 4 and result.attrs["converged"]
    ref_coef, ref_intercept = sklearn_fit(X, y, l2, fit_intercept)
    np.testing.assert_allclose(coef, ref_coef, atol=1e-5)
    np.testing.assert_allclose(intercept, ref_intercept if fit_intercept else 0.0, atol=1e-5)
    reference = softmax_objective(X, y, ref_coef, ref_intercept, 0.0, l2)
    assert result.attrs["objective"] == pytest.approx(reference, rel=1e-10)
    assert softmax_objective(X, y, coef, intercept, 0.0, l2) == pytest.approx(result.attrs["objective"], rel=1e-12)


def test_classes_found_or_given_fit_the_same_and_two_labels_fit_the_binary_model(tmp_path):
    X, y = multinomial_data(1500, 4, 3, seed=5)
    arrays = inputs(tmp_path, X=X, y=y)
    found = LogisticRegression(LogRegParams(tol=1e-9), arrays)
    given = LogisticRegression(LogRegParams(classes=3, tol=1e-9), arrays)
    # the first evaluation finds K (the largest label comes back with the loss); given, it need not
    assert "largest" in found.program() and "largest" not in given.program()
    assert found.outputs_estimate() == [((4,), "float64", None), ((1,), "float64", None)]  # 2 assumed
    assert given.outputs_estimate() == [((3, 4), "float64", None), ((3,), "float64", None)]
    (a, ran), (b, _) = fit(found), fit(given)
    np.testing.assert_allclose(a.arrays["coef"], b.arrays["coef"], atol=1e-12)
    assert a.attrs["evaluations"] == b.attrs["evaluations"] + 1  # that first pass, at θ = 0 of two classes
    load, fitting = ran.stages
    stored = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
    assert load.storage.bytes_read >= stored and fitting.storage.get_requests == 0  # X and y read once

    two = y % 2  # labels 0 and 1 only: family auto is binary, as family binary is
    arrays = inputs(tmp_path / "two", X=X, y=two)
    auto, binary = fit(LogisticRegression(LogRegParams(tol=1e-9), arrays))[0], \
        fit(LogisticRegression(LogRegParams(family="binary", tol=1e-9), arrays))[0]
    assert "family" not in auto.attrs and auto.arrays["coef"].shape == (4,)
    np.testing.assert_array_equal(auto.arrays["coef"], binary.arrays["coef"])
    assert auto.attrs["evaluations"] == binary.attrs["evaluations"]  # its first pass was the first evaluation


def test_two_class_softmax_is_the_binary_model_with_half_the_l2(tmp_path):
    """Softmax over K = 2 with (l2/2)‖W‖²: the rows of W sum to 0 at the optimum, so W₁ − W₀ is
    the binary fit's w with penalty (l2/4)‖w‖²: l2/2 in the binary parametrisation."""
    X, y = multinomial_data(1500, 4, 2, seed=6)
    arrays = inputs(tmp_path, X=X, y=y)
    l2 = 1e-2
    softmax = fit(LogisticRegression(LogRegParams(family="multinomial", l2=l2, tol=1e-10), arrays))[0]
    binary = fit(LogisticRegression(LogRegParams(family="binary", l2=l2 / 2, tol=1e-10), arrays))[0]
    W, b = softmax.arrays["coef"], softmax.arrays["intercept"]
    np.testing.assert_allclose(W.sum(axis=0), 0.0, atol=1e-8)
    np.testing.assert_allclose(W[1] - W[0], binary.arrays["coef"], atol=1e-7)
    assert b[1] - b[0] == pytest.approx(binary.arrays["intercept"][0], abs=1e-7)
    assert softmax.attrs["objective"] == pytest.approx(
        binary_objective(X, y, W[1] - W[0], b[1] - b[0], 0.0, l2 / 2), rel=1e-9)


@pytest.mark.parametrize("params,label,message", [
    ({"classes": 3}, 3.0, "labels must be integers 0 to 2, found 3.0"),
    ({"family": "multinomial", "classes": 3}, 1.5, "labels must be integers 0 to 2, found 1.5"),
    ({}, -1.0, "labels must be integers >= 0, found -1.0"),  # found by the pass that finds K
])
def test_a_bad_label_is_named_where_its_block_is_read(tmp_path, params, label, message):
    X, y = multinomial_data(600, 3, 3, seed=7)
    y[437] = label
    job = LogisticRegression(LogRegParams(**params), inputs(tmp_path, X=X, y=y))
    with pytest.raises(InputError) as raised:
        fit(job)
    assert re.fullmatch(rf"inputs\.y: {re.escape(message)} in \[\d+:\d+\] of .*/y", str(raised.value))


@pytest.mark.parametrize("sparse", [[], ["--nnz-per-row", "4"]], ids=["dense", "sparse"])
def test_datagen_writes_labels_of_k_classes(tmp_path, capsys, sparse):
    code, _, err = run_cli(["datagen", "logreg", str(tmp_path / "demo"), "--rows", "3000", "--cols", "12",
                            "--chunk-rows", "1000", "--classes", "4", *sparse], capsys)
    assert code == 0, err
    y = zarr.open_array(str(tmp_path / "demo/y.zarr"), mode="r")[:]
    assert set(np.unique(y)) == {0.0, 1.0, 2.0, 3.0} and np.bincount(y.astype(int)).min() > 300
    code, _, err = run_cli(["datagen", "kmeans", str(tmp_path / "other"), "--classes", "3"], capsys)
    assert code == 2 and err.strip() == "arrayjob: error: datagen: --classes is for logreg, not kmeans"


