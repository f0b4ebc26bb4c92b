"""The system tests of ``tests.unit.io.test_lease``: what needs processes, clusters or a job server of their own."""

from __future__ import annotations

import os
import re
import subprocess
import time

import numpy as np
import pytest

from arrayjob.io.backend import backend_for
from arrayjob.io.locations import StorageOptions, parse_uri
from tests.harness.helpers import (
    read_result,
    without_progress,
    write_array,
    write_spec,
)
from tests.unit.io.test_lease import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    _race,
    _stale_lease,
    place,
)


@pytest.mark.cli
@pytest.mark.ray
def test_racing_arrayjob_processes_on_s3_tsqr(s3_endpoint, s3_bucket, tmp_path, ray_session):
    """Two `arrayjob run` processes on one output, and a third with --no-wait while one holds it
    (drivers of the session's Ray: a Ray of their own would add nothing to the race but time)."""
    import ray

    from tests.system.cli.test_cli_process import ARRAYJOB

    env = {**os.environ, "AWS_ENDPOINT_URL": s3_endpoint, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    A = np.random.default_rng(1).standard_normal((2000, 4))
    write_array(f"s3://{s3_bucket}/A.zarr", A, (500, 4), endpoint=s3_endpoint)
    write_spec(tmp_path / "q.toml", inputs={"A": f"s3://{s3_bucket}/A.zarr"}, output=f"s3://{s3_bucket}/out",
               algorithm="tsqr", storage=f'endpoint_url = "{s3_endpoint}"')
    backend = backend_for(parse_uri(f"s3://{s3_bucket}/out"), StorageOptions(endpoint_url=s3_endpoint))
    procs = [subprocess.Popen([ARRAYJOB, "run", "q.toml"], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        deadline = time.monotonic() + 120
        while not backend.list("_lease") and time.monotonic() < deadline and procs[0].poll() is None:
            time.sleep(0.1)
        no_wait = subprocess.run([ARRAYJOB, "run", "q.toml", "--no-wait"], cwd=tmp_path, env=env, text=True,
                                 capture_output=True, timeout=120)
        results = [(p.wait(timeout=240), *p.communicate(timeout=10)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    assert [code for code, _, _ in results] == [0, 0], results
    done = [out for _, out, _ in results if "already complete" in out]
    ran = [(out, err) for _, out, err in results if "already complete" not in out]
    assert len(done) == 1 and len(ran) == 1, results
    waited = next(err for _, out, err in results if "already complete" in out)
    waited = without_progress(waited)
    assert waited == "" or re.fullmatch(r"arrayjob: waiting for run \S+ on \S+ \(pid \d+, since \S+\), "
                                        rf"which is writing s3://{s3_bucket}/out\n", waited), waited
    # the --no-wait run came while the output was leased (or, if it was that quick, after it was done)
    assert (no_wait.returncode, without_progress(no_wait.stderr).count("\n")) in ((6, 1), (0, 0)), no_wait
    if no_wait.returncode == 6:
        assert " is being written by run " in no_wait.stderr
    group = read_result(f"s3://{s3_bucket}/out", s3_endpoint)
    Q, R = group["Q"][:], group["R"][:]
    np.testing.assert_allclose(Q.T @ Q, np.eye(4), atol=1e-10)
    np.testing.assert_allclose(Q @ R, A, atol=1e-10)
    assert {k.split("/")[0] for k in backend.list()} == {"_SUCCESS", "runs"}
