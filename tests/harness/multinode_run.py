"""``arrayjob run SPEC ARGS...`` as a process of its own on the session's multi-node cluster
(``tests/harness/cluster_harness.py``), a worker node killed without grace under it.

The run is held after iteration ``HOLD_AT`` of its fit (``arrayjob.runtime.supervision.pause``, through
its environment) until the node is dead, so the loss lands mid-fit, on a node holding the
run's blocks. Returns what the command did (``returncode``, ``stdout``, ``stderr``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ARRAYJOB = shutil.which("arrayjob", path=str(Path(sys.executable).parent)) or "arrayjob"
HOLD_AT = "fit:2"


def run_and_kill(harness: Any, args: list[str], timeout: float = 300) -> dict[str, Any]:
    from arrayjob.runtime.supervision.pause import DIR_ENV, POINTS_ENV
    from tests.harness.cluster_harness import WORKER

    workers = harness.use_workers(3, **WORKER)
    with tempfile.TemporaryDirectory() as pauses:
        env = {**harness.env, POINTS_ENV: HOLD_AT, DIR_ENV: pauses}
        job = subprocess.Popen([ARRAYJOB, "run", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        try:
            reached = Path(pauses) / f"{HOLD_AT}.reached"
            deadline = time.monotonic() + timeout
            while job.poll() is None and not reached.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            removed = job.poll() is None and reached.exists()
            if removed:
                harness.kill(workers[-1])
            (Path(pauses) / f"{HOLD_AT}.go").touch()
            out, err = job.communicate(timeout=timeout)
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
    return {"returncode": job.returncode, "stdout": out, "stderr": err, "node_removed": removed}


def measure_placements(harness: Any, configs: list[str], rows: int, cols: int, chunk_rows: int,
                       iterations: int) -> list[dict[str, Any]]:
    """``benchmarks/multinode.py``'s logistic-regression iteration on three worker nodes (one
    CPU each, ``WORKER``), once per ``PLACEMENT:FUSION`` of ``configs``: what the runtime measured."""
    from benchmarks.multinode import run_config, write_data
    from tests.harness.cluster_harness import WORKER

    harness.use_workers(3, **WORKER)
    node_ids = harness.cpu_node_ids()
    with tempfile.TemporaryDirectory() as tmp:
        X, y = write_data(Path(tmp), rows, cols, chunk_rows)
        return [run_config(*config.split(":"), "naive", node_ids, Path(tmp), X, y, iterations, 2)
                for config in configs]
