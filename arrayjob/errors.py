"""The one exception hierarchy. Each class carries the exit code the CLI returns for it.

The classes are the one place the codes live: README.md's exit-code table names the class
of each code and ``tests/test_docs.py`` checks it against them (docs/guarantees.md gives
every case of each code). The CLI adds two of its own: 0 for success and 130 for
``KeyboardInterrupt``; any other exception is a bug and exits 1, as ``ArrayJobError`` does.
``arrayjob submit`` exits with the submitted job's own code (``RemoteJobFailed``).
"""

from __future__ import annotations


class ArrayJobError(Exception):
    """An error a user can cause or fix; printed as one line, never with a traceback."""

    exit_code = 1


class SpecError(ArrayJobError):
    """The job spec is malformed: unknown key, wrong type, bad value."""

    exit_code = 2


class InputError(ArrayJobError):
    """An input array is missing, unreadable, corrupt, mis-shaped or holds invalid values."""

    exit_code = 2


class CostLimitError(ArrayJobError):
    exit_code = 3


class StorageError(ArrayJobError):
    """Storage failed while running: the output could not be written, a request kept failing."""

    exit_code = 4


class ClusterError(ArrayJobError):
    """Ray could not be reached or started, or failed under the job (a dead GCS, raylet or node)."""

    exit_code = 5


class LeaseHeldError(ArrayJobError):
    """Another live run holds the output: it is writing it now (``run --no-wait``), or it took
    the output over from this run after this run's heartbeat lapsed (nothing was published)."""

    exit_code = 6


class CapacityError(ArrayJobError):
    """The cluster cannot hold the job: ``cluster.max_nodes`` is below the node count whose
    object stores hold the plan, or too few nodes arrived within ``cluster.scale_timeout``."""

    exit_code = 7


class Terminated(BaseException):
    """SIGTERM received. Like ``KeyboardInterrupt`` it is no error of the job and unwinds every
    ``with`` and ``finally`` on its way out (leases released, a private Ray stopped)."""

    exit_code = 143


class RemoteJobFailed(ArrayJobError):
    """A job submitted to a Ray cluster ended unsuccessfully; ``arrayjob submit`` exits with
    the job's own exit code (its ``arrayjob run`` exited 2 to 6, or was stopped: 143)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
