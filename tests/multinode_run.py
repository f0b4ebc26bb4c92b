"""Run ``arrayjob run SPEC ARGS...`` against a local 3-node Ray cluster and remove a worker
node, without grace, once the job's tasks run on it; print what the command did as JSON
(``returncode``, ``stdout``, ``stderr``).

    python tests/multinode_run.py SPEC [ARGS...]

The cluster (``ray.cluster_utils.Cluster``) is started here without connecting to it: the
job's own process is its only driver. Everything started is stopped by pid at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.pop("RAY_ADDRESS", None)

ARRAYJOB = shutil.which("arrayjob", path=str(Path(sys.executable).parent)) or "arrayjob"
IDLE_TITLES = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def running_task(raylet_pid: int) -> bool:
    """Whether a worker of this raylet runs a task (its title is the task's name)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != raylet_pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if title.startswith("ray::") and not title.startswith(IDLE_TITLES):
            return True
    return False


def main(argv: list[str]) -> int:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        env = {**os.environ, "RAY_ADDRESS": cluster.address}
        job = subprocess.Popen([ARRAYJOB, "run", *argv], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            victim = workers[-1]
            raylet = victim.all_processes["raylet"][0].process.pid
            deadline = time.monotonic() + 240
            while job.poll() is None and not running_task(raylet) and time.monotonic() < deadline:
                time.sleep(0.2)
            removed = job.poll() is None
            if removed:
                time.sleep(1.0)
                cluster.remove_node(victim, allow_graceful=False)
            out, err = job.communicate(timeout=300)
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
    finally:
        cluster.shutdown()
    print(json.dumps({"returncode": job.returncode, "stdout": out, "stderr": err, "node_removed": removed}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
