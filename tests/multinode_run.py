"""``arrayjob run SPEC ARGS...`` as a process of its own on the session's multi-node cluster
(``tests/cluster_harness.py``), a worker node killed without grace under it.

The run is held after iteration ``HOLD_AT`` of its fit (``arrayjob.runtime.pause``, through
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
    from arrayjob.runtime.pause import DIR_ENV, POINTS_ENV

    workers = [harness.add_node(num_cpus=1) for _ in range(2)]
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
