"""Connecting to Ray: a quiet local instance by default, an existing cluster by address."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, redirect_stdout, suppress
from dataclasses import dataclass, field
from typing import Any

from arrayjob.errors import ClusterError, Terminated
from arrayjob.planner.plan import ClusterShape
from arrayjob.runtime.supervision import reaper
from arrayjob.runtime.supervision.private_ray import PrivateRayWatch, private_processes
from arrayjob.units import parse_bytes, parse_duration


def _is_duration(value: float | str) -> bool:
    try:
        parse_duration(value)
    except ValueError:
        return False
    return True


# Without [cluster] memory_budget, the input blocks and intermediates of a job may fill this
# fraction of each node's object store; the rest is left for Ray's own use (driver values,
# objects being transferred, other jobs' objects on a shared cluster).
DEFAULT_BUDGET_FRACTION = 0.8


def _is_size(value: object) -> bool:
    try:
        parse_bytes(value)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def _is_budget(value: object) -> bool:
    if isinstance(value, float):
        return 0 < value <= 1
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return 0 < float(value.strip()[:-1]) <= 100
        except ValueError:
            return False
    return _is_size(value)


@dataclass(frozen=True)
class ClusterOptions:
    """The ``[cluster]`` section: where Ray runs, and how much of its memory a job may use."""

    address: str = field(default="local", metadata={"check": bool, "expect": "'local', 'auto' or a Ray address"})
    num_cpus: int | None = field(default=None, metadata={"check": lambda v: v > 0, "expect": "a positive integer"})
    # Sizing by the plan: the job asks the cluster's autoscaler for nodes between
    # these; without max_nodes it plans on the nodes it finds and asks for none.
    min_nodes: int = field(default=0, metadata={"check": lambda v: v >= 0, "expect": "an integer >= 0"})
    max_nodes: int | None = field(default=None, metadata={"check": lambda v: v > 0, "expect": "a positive integer"})
    node_type: str | None = field(default=None, metadata={"check": bool, "expect": "an instance type of the price table"})
    scale_timeout: float | str = field(default=600.0, metadata={"check": _is_duration,
                                                                "expect": "a duration like 90s, 10m or 1.5h"})
    # how long a node the autoscaler adds takes to boot and join Ray, for the estimate (its
    # wall time, node-seconds and dollars); default: the price table's node_startup for the
    # node type, else costing.estimate.DEFAULT_NODE_STARTUP_SECONDS
    node_startup: float | str | None = field(default=None, metadata={
        "check": lambda v: v == 0 or _is_duration(v), "expect": "a duration like 45s or 2m, or 0"})
    # bytes of each node's object store the job's blocks may hold: a size ("600MB", bytes as an
    # integer) or a fraction of the store (0.5, "50%"); default DEFAULT_BUDGET_FRACTION
    memory_budget: str | int | float | None = field(default=None, metadata={
        "check": _is_budget, "expect": "a size such as \"600MB\", or a fraction of the object store (0.5 or \"50%\")"})
    # the object store of a local (private) Ray, e.g. "600MB"; a running cluster keeps its own
    object_store_memory: str | int | None = field(default=None, metadata={
        "check": _is_size, "expect": "a size such as \"600MB\" or a number of bytes"})

    def budget_bytes(self, store_bytes: int) -> int:
        """The memory budget per node, given the smallest node's object store."""
        value = self.memory_budget
        if value is None:
            return int(store_bytes * DEFAULT_BUDGET_FRACTION)
        if isinstance(value, float):
            return int(store_bytes * value)
        if isinstance(value, str) and value.strip().endswith("%"):
            return int(store_bytes * float(value.strip()[:-1]) / 100)
        return parse_bytes(value)

    @property
    def store_bytes(self) -> int | None:
        """``object_store_memory`` in bytes, if set."""
        return None if self.object_store_memory is None else parse_bytes(self.object_store_memory)

    @property
    def scale_timeout_seconds(self) -> float:
        return parse_duration(self.scale_timeout)

    @property
    def node_startup_seconds(self) -> float | None:
        """``node_startup`` in seconds, if set."""
        if self.node_startup is None:
            return None
        return 0.0 if self.node_startup == 0 else parse_duration(self.node_startup)


@dataclass(frozen=True)
class ClusterInfo:
    address: str
    node_ids: tuple[str, ...]  # alive nodes, in a stable order; the planner's node indices
    cpus: int  # in all
    started_here: bool
    memory_per_node: int = 0  # the smallest node's memory for tasks, in bytes
    object_store_per_node: int = 0  # the smallest node's object store, in bytes


def describe() -> ClusterInfo:
    """The cluster as it is now: its alive nodes with CPUs, their CPUs and smallest memory."""
    import ray

    # Nodes without CPUs (a head that only schedules) cannot run block tasks: not placed on.
    nodes = sorted((n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0),
                   key=lambda n: n["NodeID"])
    cpus = int(sum(n.get("Resources", {}).get("CPU", 0) for n in nodes))
    memory = int(min((n.get("Resources", {}).get("memory", 0) for n in nodes), default=0))
    store = int(min((n.get("Resources", {}).get("object_store_memory", 0) for n in nodes), default=0))
    address = ray.get_runtime_context().gcs_address
    return ClusterInfo(address, tuple(n["NodeID"] for n in nodes), max(1, cpus), False, memory, store)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a dead ``host:port``: Ray itself would retry the connection for minutes."""
    if address == "auto":
        return  # Ray finds the local cluster's address itself and fails at once if there is none
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"cluster.address: expected 'local', 'auto' or HOST:PORT, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ClusterError(f"cluster.address: cannot connect to Ray at {address!r}: {exc.strerror or exc}") from None


def _system_errors() -> tuple[type[BaseException], ...]:
    """Ray's errors that say Ray itself failed (a process of it died, its objects are lost),
    never the job's own code: each ends the job with ``ClusterError``."""
    import ray.exceptions as rx

    return (rx.RaySystemError, rx.LocalRayletDiedError, rx.NodeDiedError, rx.ObjectLostError,
            rx.WorkerCrashedError, rx.RpcError, rx.ObjectStoreFullError, rx.OutOfDiskError,
            rx.OutOfMemoryError)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _tell_session(watchdog: subprocess.Popen[bytes]) -> None:
    """Give the watchdog the session directory of the Ray started here: its agents and workers
    are known by the files they hold in it."""
    import ray._private.worker as worker

    node = worker._global_node
    if node is not None and watchdog.stdin is not None:
        with suppress(OSError):
            watchdog.stdin.write(f"{node.get_session_dir_path()}\n".encode())
            watchdog.stdin.flush()


@contextmanager
def ray_cluster(options: ClusterOptions, before_exit: Callable[[], None] | None = None,
                code: Sequence[str] = ()) -> Iterator[ClusterInfo]:
    """Connect to (or start) Ray for one job; a Ray already initialised in-process is reused.

    ``code``: the directories of packages (or files of modules) of a user's job, sent to the
    workers of a Ray this connects to (Ray's runtime environment, ``py_modules``), unless this
    process runs as a Ray job whose runtime environment brought them (``arrayjob submit``). A
    local Ray's workers import what this process imports (its PYTHONPATH, its directory).

    ``before_exit`` runs if a dying private Ray ends the process before the job can unwind
    (its raylet died: Ray's driver would end it within moments): e.g. giving up the output.

    Ray's failures under the job (a dead GCS, raylet or node, lost objects) leave it as
    ``ClusterError``. A Ray started here stops with the job, and with this process if it is
    killed (``runtime.reaper``).
    """
    import ray

    # Every task's failure reaches the driver through the results it feeds (load errors
    # through their stats), so Ray's log line for an unread failed block is only noise.
    os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
    if ray.is_initialized():
        with _ray_failures(None):
            yield describe()
        return
    # A local instance is private to this job: no dashboard, no usage stats, no log spam.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.ERROR,
        "configure_logging": True,
    }
    watchdog = None
    if options.address == "local":
        kwargs["address"] = "local"
        if options.num_cpus:
            kwargs["num_cpus"] = options.num_cpus
        if options.store_bytes is not None:
            kwargs["object_store_memory"] = options.store_bytes
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        # Nothing reads a private Ray's metrics or task events (it has no dashboard), and a
        # driver whose GCS died waits at shutdown to flush both to it: 10 s and more with
        # ray[default] installed (its metrics agent), before the job can say why it failed.
        os.environ.setdefault("RAY_enable_metrics_collection", "0")
        os.environ.setdefault("RAY_task_events_report_interval_ms", "0")
        # A raylet deletes the objects no one holds any more in batches, once a second by
        # default: an iterating job's dropped partials (k-means' (k, d) sums, 8 MB a block)
        # piled up for a second and raised the store's peak well above the blocks held;
        # freeing them every 0.1 s keeps the peak close to the blocks held.
        os.environ.setdefault("RAY_free_objects_period_milliseconds", "100")
        token = f"{os.getpid()}-{uuid.uuid4().hex}"
        watchdog = reaper.start(token)
        os.environ[reaper.OWNER_VARIABLE] = token  # inherited by every process of this Ray
    else:
        _check_reachable(options.address)
        kwargs["address"] = options.address
        if code and not os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
            kwargs["runtime_env"] = {"py_modules": list(code)}
        kwargs.pop("include_dashboard")
    watch = None
    try:
        with _keep_sigterm_handler():
            try:
                ray.init(**kwargs)
            except Exception as exc:  # noqa: BLE001 - Ray's start-up failures are plain Exceptions too
                if options.address == "local":
                    raise ClusterError(f"cannot start a local Ray: {_first_line(exc)}") from None
                raise ClusterError(f"cluster.address: cannot connect to Ray at {options.address!r}: "
                                   f"{_first_line(exc)}") from None
        # Ray's driver prints to sys.stdout what a raylet reports, its own death included: muted
        # from the death until Ray is shut down (which joins the thread that prints), so none of
        # it reaches stderr beside the job's own line, whichever of the two notices the death first.
        prints = ExitStack()
        try:
            if watchdog is not None:
                _tell_session(watchdog)
                watch = PrivateRayWatch(private_processes(), before_exit=before_exit)
                prints.callback(watch.release)  # last: once the prints are no longer muted
                prints.enter_context(redirect_stdout(watch.quiet_once_lost(sys.stdout)))
            with _ray_failures(watch):
                info = describe()
                yield dataclasses.replace(info, started_here=True)
        finally:
            with prints:
                if watch is not None:
                    watch.close()
                _shutdown(lost=watch is not None and watch.lost is not None)
    finally:
        if watchdog is not None:
            os.environ.pop(reaper.OWNER_VARIABLE, None)
            watchdog.stdin.close()  # type: ignore[union-attr]  # stop what is left of this Ray, now
            with suppress(subprocess.TimeoutExpired):  # it finishes on its own: never hold the exit longer
                watchdog.wait(timeout=10)


def _shutdown(*, lost: bool) -> None:
    import ray
    import ray._private.worker as worker

    node = worker._global_node  # a Ray this process started has processes in it (one joined has none)
    if node is not None and lost:
        # Half a private Ray is left: stop it by pid, not by asking its dead GCS or raylet.
        node.kill_all_processes(check_alive=False, allow_graceful=False)
    elif node is not None:
        # Ray stops its processes one after another, each given 1 s to exit on SIGTERM. The
        # autoscaler's monitor sleeps through its second and is then killed anyway: 1.0 of the
        # 1.1 s a private Ray took to stop, on every job. It has nothing to finish here.
        for info in node.all_processes.get("monitor", []):
            with suppress(OSError):
                info.process.kill()
    ray.shutdown()


@contextmanager
def _ray_failures(watch: PrivateRayWatch | None) -> Iterator[None]:
    """Ray's own failures, raised anywhere in the job, as ``ClusterError``."""
    try:
        yield
    except BaseException as exc:
        if watch is not None and watch.lost is not None:
            raise ClusterError(watch.message()) from None
        if isinstance(exc, _system_errors()):
            raise ClusterError(f"Ray failed under the job: {type(exc).__name__}: {_first_line(exc)}") from None
        raise


@contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """Keep this process's SIGTERM handling through ``ray.init``: Ray installs its own handler
    (a stack dump, then death by the signal), which would skip every ``finally`` of the job."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = signal.getsignal(signal.SIGTERM)
    try:
        yield
    except SystemExit as exc:  # SIGTERM during ray.init, by Ray's handler of the time
        if exc.code != signal.SIGTERM:
            raise
        import ray

        with suppress(Exception):
            ray.shutdown()
        raise Terminated() from None
    finally:
        if kept is not None:
            signal.signal(signal.SIGTERM, kept)


def cluster_shape(info: ClusterInfo) -> ClusterShape:
    """What the planner needs to know of a running cluster."""
    nodes = max(1, len(info.node_ids))
    shape = ClusterShape(nodes=nodes, workers_per_node=max(1, info.cpus // nodes))
    return dataclasses.replace(shape, memory_per_node=info.memory_per_node) if info.memory_per_node else shape
