"""Ray's fake autoscaling cluster (``fake_cluster.yaml``): worker nodes that Ray's own
autoscaler (v1) starts and stops as real raylets on this host.

Collected only in a private PID and network namespace (``tests/system/autoscale/run.sh``, run by
``make test`` after the main suite): starting and stopping this cluster acts on every Ray
process in sight.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
PRICES = HERE / "prices.toml"
IDLE_TIMEOUT = 6.0  # fake_cluster.yaml's idle_timeout_minutes, in seconds
HEAD_STORE = 100_000_000


def _private_namespace() -> bool:
    """This process has a network namespace of its own (loopback only) and is in a PID
    namespace: what run.sh sets up."""
    names = [name for _, name in socket.if_nameindex()]
    return names == ["lo"] and os.environ.get("ARRAYJOB_FAKE_CLUSTER") == "1"


def cluster_env() -> dict[str, str]:
    return {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_USAGE_STATS_ENABLED": "0", "ARRAYJOB_PRICES": str(PRICES),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _stop_everything_else() -> None:
    """SIGKILL every process in this namespace but this one and its ancestors, by pid (the
    namespace holds nothing else). Not ``ray stop --force``: this process is the namespace's
    first, so the processes it kills stay zombies until it reaps them, and ``ray stop`` waited
    out its grace period for them (23 s of the stage's 101 s on 2026-11-27)."""
    keep = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
        keep.add(pid)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in keep:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)


@pytest.fixture(scope="session")
def fake_cluster() -> Iterator[str]:
    """A head that only schedules (0 CPUs) and no workers; the address to connect to."""
    if not _private_namespace():
        pytest.fail("the fake-cluster tests run only in a private namespace: tests/system/autoscale/run.sh")
    start = [str(BIN / "ray"), "start", "--head", "--num-cpus", "0", "--object-store-memory", str(HEAD_STORE),
             "--autoscaling-config", str(HERE / "fake_cluster.yaml"), "--disable-usage-stats",
             "--port", "6379"]
    try:
        subprocess.run(start, env=cluster_env(), check=True, capture_output=True, timeout=180)
        yield "127.0.0.1:6379"
    finally:
        _stop_everything_else()


def workers(address: str) -> int:
    """Alive worker nodes (with CPUs) of the cluster, asked in a fresh process: the test
    process holds no Ray connection between jobs."""
    code = (f"import ray; ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False); "
            "print(sum(1 for n in ray.nodes() if n['Alive'] and n['Resources'].get('CPU', 0) > 0))")
    out = subprocess.run([sys.executable, "-c", code], env=cluster_env(), capture_output=True, text=True,
                         timeout=120, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def wait_for_workers(address: str, count: int, timeout: float) -> float:
    """Seconds until the cluster has ``count`` workers (``AssertionError`` after ``timeout``)."""
    start = time.monotonic()
    while True:
        n = workers(address)
        if n == count:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"{n} workers, not {count}, after {timeout:g} s"
        time.sleep(1)
