"""A Ray head with its job server and a loopback S3 server, for scripts that run inside their
own PID and network namespace (``unshare --pid --fork --mount-proc --net``): fixed ports are
free there, and ``ray stop`` sees no other Ray."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {
    **os.environ,
    "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",  # the cluster has arrayjob installed
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
}
for _variable in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_JOB_HEADERS", "AWS_PROFILE", "ARRAYJOB_BUCKET"):
    ENV.pop(_variable, None)

JOBS = "http://127.0.0.1:8265"
S3 = "http://127.0.0.1:5055"
SPEC = REPO / "configs" / "logreg.toml"


def colstats_data() -> Any:
    """The input of the submit case of a user's own job (examples/colstats): 4,000 × 4."""
    import numpy as np

    return np.random.default_rng(1).standard_normal((4000, 4)) * [1.0, 2.0, 0.5, 3.0] + 5.0


# the cases' waits are generous: under make test they run beside the other worker's tests, and
# under other developers' load the four took 292 s there (2026-11-27, load 10 to 25), 57 s alone
def arrayjob(*args: str, env: dict[str, str] | None = None, timeout: float = 480) -> dict[str, Any]:
    """The ``arrayjob`` command as a user runs it; its exit code, output and wall time."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "arrayjob", *args], env=env or ENV, capture_output=True,
                          text=True, timeout=timeout, cwd="/")
    return {"args": list(args), "code": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
            "seconds": round(time.monotonic() - started, 2)}


def start_moto() -> Any:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=5055, verbose=False)
    server.start()
    return server


def start_ray() -> None:
    """``ray start --head`` with the job server on 127.0.0.1:8265; returns once it answers."""
    subprocess.run([str(BIN / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", "6379",
                    "--dashboard-host", "127.0.0.1", "--dashboard-port", "8265", "--num-cpus", "2",
                    "--object-store-memory", str(200 * 2**20), "--disable-usage-stats"],
                   env=ENV, check=True, capture_output=True, timeout=120)
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + 60
    while True:  # the job server answers a little after `ray start` returns
        try:
            socket.create_connection(("127.0.0.1", 8265), timeout=1).close()
            JobSubmissionClient(JOBS).list_jobs()  # its jobs API answers
            return
        except (OSError, RuntimeError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the Ray job server did not answer in 60 s")
        time.sleep(0.25)


def stop_ray() -> None:
    """Inside the namespace only: the Ray started here is the only one ``ray stop`` can see."""
    subprocess.run([str(BIN / "ray"), "stop", "--force"], env=ENV, capture_output=True, timeout=60)
