"""The integration tests of ``tests.unit.planner.test_fusion``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import numpy as np
import pytest

from arrayjob.io.locations import StorageOptions
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.runtime.session import Session
from tests.unit.planner.test_fusion import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    CLUSTER,
    FUSIONS,
    _all_programs,
    _kernel_reading,
    _options,
    _plan,
    _rows,
    _run,
    _source,
    _source_node,
    black_scholes,
    black_scholes_numpy,
    bs,
    eager_compiler,
    invariant,
    kmeans,
    kmeans_step,
    logistic,
    logreg,
    pagerank,
    pagerank_step,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_fused_kernels_compile_and_run_on_ray_workers(tmp_path):
    import ray

    from arrayjob.runtime.ray_executor import RayExecutor

    rng = np.random.default_rng(9)
    n = 40_000
    data = {"S": rng.uniform(5, 30, n), "X": rng.uniform(1, 100, n), "T": rng.uniform(0.25, 10, n)}
    arrays = {k: _source(tmp_path, k, v, (10_000,)) for k, v in data.items()}
    call, put = black_scholes(arrays["S"], arrays["X"], arrays["T"], 0.02, 0.3)
    node_ids = tuple(node["NodeID"] for node in ray.nodes() if node["Alive"])
    options = PlanOptions(tiling="test-rows", fusion="cost", placement="lshs", cluster=ClusterShape(nodes=len(node_ids)))
    session = Session(RayExecutor(StorageOptions(), node_ids), options)
    result = session.compute({"call": call, "put": put})
    want_call, want_put = black_scholes_numpy(data["S"], data["X"], data["T"], 0.02, 0.3)
    np.testing.assert_allclose(result["call"], want_call, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(result["put"], want_put, rtol=1e-10, atol=1e-10)
