"""Lowering rules that no strategy should be able to break."""

from __future__ import annotations

import dataclasses

import numpy as np

from arrayjob import lazy as la
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.planner.lower import assemble_outputs, lower
from arrayjob.planner.placement import ray_default
from arrayjob.planner.plan import ClusterShape, FusedKernel, Plan, PlanOptions, Tiling
from arrayjob.planner.tiling import with_tilings
from arrayjob.runtime.executor import LocalExecutor
from tests.harness.helpers import write_array


def test_a_partial_output_is_combined_once_when_the_kernel_is_cut_along_another_class(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 6))
    write_array(str(tmp_path / "X.zarr"), X, (10, 6))
    x = la.from_zarr(open_array_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions()))
    product = x @ la.value("w", (6, 3))  # cut by rows and by its 3 columns
    total = (x * 2.0).sum()  # depends on the rows only: the same partial in every column block
    graph = la.capture([product, total])
    options = PlanOptions(tiling="naive", fusion="none", placement="ray", cluster=ClusterShape(1, 2))
    tilings = (Tiling((0,)), Tiling(), Tiling((0, 1)), Tiling(), Tiling((0,)), Tiling())
    plan = with_tilings(Plan(graph, options), tilings)
    plan = ray_default(lower(dataclasses.replace(plan, kernels=(FusedKernel("k", (2, 4, 5), (2, 5)),))))
    assert plan.grid(2).grid_shape == (4, 3)
    w = rng.standard_normal((6, 3))
    result = assemble_outputs(plan, LocalExecutor(StorageOptions()).run(plan.physical, {"w": w}))
    np.testing.assert_allclose(result[0], X @ w)
    assert np.isclose(result[1], (2 * X).sum(), rtol=1e-12)


def test_from_numpy_arrays_are_bound_at_compute_and_keep_the_plan(tmp_path):
    from arrayjob.runtime.session import Session

    rng = np.random.default_rng(1)
    X = rng.standard_normal((30, 4))
    write_array(str(tmp_path / "X.zarr"), X, (10, 4))
    x = la.from_zarr(open_array_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions()))
    session = Session(LocalExecutor(StorageOptions()))
    plans = []
    for _ in range(2):
        w = rng.standard_normal(4)
        program = {"z": x @ la.from_numpy(w, name="w")}
        np.testing.assert_allclose(session.compute(program)["z"], X @ w)
        plans.append(session.plan(program))
    assert plans[0] is plans[1]  # new contents, same name: the same plan
