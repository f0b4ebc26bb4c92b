"""One local multi-node Ray cluster for the whole test session, in a process of its own.

The test process is connected to the session's one-node Ray (``ray_session``) and a process
talks to one Ray at a time, so the multi-node cluster (a ``ray.cluster_utils.Cluster``: real
raylets and object stores on this host) lives in a harness process, started once per session
by the ``multinode_cluster`` fixture (``tests/conftest.py``). A test asks it to call a function
of the tests' modules, ``function(harness, **kwargs)``, and gets back what it returns (plain
data). The function runs jobs in the harness (connected to the cluster) or as
``arrayjob run`` processes (``harness.env``), and changes the cluster under them.

As in Ray's own fault tests (``ray_start_cluster`` with a head of ``num_cpus=0``), the head
has no CPUs: it holds the GCS and the drivers, and every node a case computes on is a worker
the case asks for (``use_workers``, ``add_node``) and kills (``kill``:
``remove_node(allow_graceful=False)``, its raylet, object store and workers die at once).
Workers a call leaves alive and idle stay for the next call that asks for the same kind
(starting a node takes seconds); any other state, and the head, is left as it was found. Node death is noticed within about 1 s
(health checks every 200 ms, 5 misses), as Ray's reconstruction tests configure it.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 200,
    "health_check_failure_threshold": 5,
    "task_retry_delay_ms": 100,
    "object_timeout_milliseconds": 200,
}


IDLE_SECONDS = 20  # workers left idle this long are removed (the next case comes sooner, or much later)

# the worker node most cases ask for: one CPU, a store big enough for their small data
WORKER = {"num_cpus": 1, "object_store_memory": 150 * 2**20}


class Harness:
    """The cluster a case changes: add worker nodes, kill them, wait for Ray to notice."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.address: str = cluster.address
        self._args: dict[str, dict[str, Any]] = {}  # node id -> the arguments it was started with

    @property
    def env(self) -> dict[str, str]:
        """The environment of an ``arrayjob run`` process that runs on this cluster."""
        return {**os.environ, "RAY_ADDRESS": self.address}

    @property
    def workers(self) -> list[Any]:
        return list(self.cluster.worker_nodes)

    def add_node(self, attempts: int = 3, **node_args: Any) -> Any:
        """A new worker node, registered with the GCS when this returns. Ray gives a raylet
        30 s to register; on a machine this loaded that can fail: the stray raylet is killed
        (it must not join later as a node nobody asked for) and the start tried again."""
        for attempt in range(attempts):
            known = {n.node_id for n in [self.cluster.head_node, *self.workers]}
            try:
                node = self.cluster.add_node(**node_args)
            except Exception as exc:  # noqa: BLE001 - Ray raises a plain Exception
                killed = kill_stray_raylets(known)
                print(f"cluster harness: starting a node failed ({exc}); killed stray raylets {killed}",
                      file=sys.stderr, flush=True)
                if attempt + 1 == attempts:
                    raise
                continue
            self.cluster.wait_for_nodes()
            self._args[node.node_id] = dict(node_args)
            return node
        raise AssertionError("unreachable")

    def use_workers(self, count: int, **node_args: Any) -> list[Any]:
        """Exactly ``count`` workers started with ``node_args``: those a previous call left
        (starting a node takes seconds), others removed, the missing ones added."""
        for node in self.workers:
            if self._args.get(node.node_id) != node_args or len(self.workers) > count:
                self.kill(node)
        while len(self.workers) < count:
            self.add_node(**node_args)
        self.wait_idle()
        return self.workers

    def kill(self, node: Any, timeout: float = 30) -> None:
        """Kill ``node`` without grace; return once the GCS has marked it dead."""
        self.cluster.remove_node(node, allow_graceful=False)
        self.wait_dead(node.node_id, timeout)

    @staticmethod
    def alive_ids() -> set[str]:
        import ray

        return {n["NodeID"] for n in ray.nodes() if n["Alive"]}

    def wait_dead(self, node_id: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while node_id in self.alive_ids():
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node_id} still alive {timeout:g} s after it was killed")
            time.sleep(0.05)

    def cpu_node_ids(self) -> tuple[str, ...]:
        """The alive nodes that can run tasks (the head has no CPUs), sorted."""
        import ray

        return tuple(sorted(n["NodeID"] for n in ray.nodes()
                            if n["Alive"] and n.get("Resources", {}).get("CPU", 0) > 0))

    def wait_idle(self, timeout: float = 60) -> None:
        """Until every CPU is free again (the last job's workers are gone)."""
        import ray

        deadline = time.monotonic() + timeout
        while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
            if time.monotonic() > deadline:
                raise TimeoutError("the cluster's CPUs are still in use")
            time.sleep(0.05)

    def reset(self) -> None:
        """Back to the head alone."""
        for node in self.workers:
            self.cluster.remove_node(node, allow_graceful=False)
        for node_id in self.alive_ids() - {self.cluster.head_node.node_id}:
            self.wait_dead(node_id)

    def tidy(self) -> None:
        """After a call: the head and the workers the call left, if all of them are alive and
        idle (the next call may use them); else the head alone."""
        try:
            alive = self.alive_ids()
            healthy = all(n.node_id in alive for n in self.workers) and len(alive) == len(self.workers) + 1
            if healthy:
                self.wait_idle(timeout=30)
                return
        except Exception:  # noqa: BLE001 - the head alone, then
            pass
        self.reset()


def children(parent: int) -> list[tuple[int, list[str]]]:
    """The processes whose parent is ``parent``, with their command lines (read from /proc;
    one that ends while it is read is left out)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found.append((int(entry), f.read().decode(errors="replace").split("\0")))
        except (OSError, ValueError, IndexError):
            continue
    return found


def kill_stray_raylets(known: set[str]) -> list[int]:
    """SIGKILL the raylets this process started whose node is none of ``known`` (its agents
    and workers die with it); their pids."""
    killed = []
    for pid, args in children(os.getpid()):
        node = next((a.removeprefix("--node_id=") for a in args if a.startswith("--node_id=")), None)
        if args and args[0].endswith("raylet") and node is not None and node not in known:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def serve(fd: int) -> None:
    """The harness process: start the cluster, then answer calls on the connection ``fd``."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.pop("RAY_ADDRESS", None)
    # This process is a driver whose gRPC threads are busy (recovering a lost node's objects)
    # when Cluster.add_node forks the replacement's raylet: Ray starts its processes with a
    # preexec_fn, so subprocess forks (not vfork) and grpcio's fork handlers run. With them
    # the harness crashed once in a fresh-clone CI run ("Other threads are currently calling
    # into gRPC, skipping fork() handlers", then SIGSEGV). Nothing forked here uses gRPC before
    # it execs, so the handlers are off, as gRPC advises for such programs.
    os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"
    sys.path.insert(0, str(REPO))
    import ray
    from ray.cluster_utils import Cluster

    conn = Connection(fd)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "_system_config": SYSTEM_CONFIG})
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
        harness = Harness(cluster)
        conn.send(("ready", cluster.address))
        while True:
            if not conn.poll(IDLE_SECONDS):  # no case is coming soon: the rest of the suite gets the CPUs
                harness.reset()
                continue
            try:
                request = conn.recv()
            except EOFError:
                break
            if request is None:
                break
            name, kwargs = request
            try:
                module, _, function = name.partition(":")
                reply = ("ok", getattr(importlib.import_module(module), function)(harness, **kwargs))
            except BaseException:  # noqa: BLE001 - the test gets the traceback
                reply = ("error", traceback.format_exc()[-6000:])
            finally:
                with contextlib.suppress(Exception):
                    harness.tidy()
            conn.send(reply)
    finally:
        ray.shutdown()
        cluster.shutdown()


class ClusterClient:
    """The test side of the harness: ``call("tests.harness.node_loss:run_matrix", timeout, ...)``."""

    def __init__(self, workdir: Path) -> None:
        ours, theirs = socket.socketpair()
        self.log = workdir / "harness.log"
        with open(self.log, "wb") as log:
            # a session of its own: its raylets are killed with it whatever happens
            self.proc = subprocess.Popen(
                [sys.executable, "-c", f"from tests.harness.cluster_harness import serve; serve({theirs.fileno()})"],
                cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.broken: str | None = None
        self.address = self._receive(120, "starting the cluster")[1]

    def _receive(self, timeout: float, what: str) -> Any:
        if not self.conn.poll(timeout):
            self.stop()
            self.broken = f"the multi-node cluster harness did not finish {what} in {timeout:g} s"
            raise TimeoutError(f"{self.broken}\n{self.tail()}")
        try:
            return self.conn.recv()
        except EOFError:
            self.broken = f"the multi-node cluster harness died while {what}"
            raise RuntimeError(f"{self.broken}\n{self.tail()}") from None

    def call(self, function: str, timeout: float, **kwargs: Any) -> Any:
        """``function(harness, **kwargs)`` in the harness; its result, or its error raised here."""
        if self.broken:
            raise RuntimeError(self.broken)
        self.conn.send((function, kwargs))
        status, value = self._receive(timeout, function)
        if status != "ok":
            raise AssertionError(f"{function} failed in the cluster harness:\n{value}")
        return value

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-3000:]
        return ""

    def stop(self) -> None:
        """Shut the cluster down (at most 60 s), then kill whatever is left of the harness's session."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.conn.close()


@contextlib.contextmanager
def started(workdir: Path) -> Iterator[ClusterClient]:
    client = ClusterClient(workdir)
    try:
        yield client
    finally:
        client.stop()
