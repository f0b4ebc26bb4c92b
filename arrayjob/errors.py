"""The one exception hierarchy. Each class carries the exit code the CLI returns for it.

The classes are the one place the codes live: README.md's exit-code table names the class
of each code and ``tests/unit/test_docs.py`` checks it against them (docs/guarantees.md gives
every case of each code). The CLI adds two of its own: 0 for success and 130 for
``KeyboardInterrupt``; any other exception is a bug and exits 1, as ``ArrayJobError`` does.
``arrayjob submit`` exits with the submitted job's own code (``RemoteJobFailed``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback


class ArrayJobError(Exception):
    """An error a user can cause or fix; printed as one line, never with a traceback."""

    exit_code = 1


class SpecError(ArrayJobError):
    """The job spec is malformed: unknown key, wrong type, bad value."""

    exit_code = 2


class InputError(ArrayJobError):
    """An input array is missing, unreadable, corrupt, mis-shaped or holds invalid values."""

    exit_code = 2


class ArrayNotFound(InputError):
    """No Zarr array (and no group) is stored where an input names one."""


class GroupNotArray(InputError):
    """An input names a Zarr group where an array was expected (a sparse matrix, a pattern)."""


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


class JobCodeError(ArrayJobError):
    """A job's own code failed: a user's job (``algorithm = "module:Class"`` or an entry point)
    raised an exception, on the driver or in a block function on a worker, or a block function
    returned a block unlike the one it declared. The line names the job, the exception and the
    file and line in the job's code; ``--debug`` prints the traceback (the worker's, for a
    block function). Nothing is published and the output's lease is released."""

    exit_code = 8

    def __init__(self, message: str, traceback_text: str = "") -> None:
        super().__init__(message)
        self.traceback_text = traceback_text

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # across Ray, from a worker: keep the traceback
        return type(self), (str(self), self.traceback_text)

    @classmethod
    def raised(cls, exc: BaseException, job: str, module: str, where: str = "") -> JobCodeError:
        """The error for ``exc``, raised by the code of ``job`` (defined in ``module``): named
        with the innermost line of the job's own package that it passed through."""
        home = code_home(module)
        location = ""
        for frame, line in traceback.walk_tb(exc.__traceback__):
            if _under(frame.f_code.co_filename, home):
                location = f"{frame.f_code.co_filename}:{line}"
        detail = " ".join(str(exc).split()) or "(no message)"
        at = f" at {location}" if location else ""
        return cls(f"job {job}{where}: {type(exc).__name__}: {detail}{at}",
                   "".join(traceback.format_exception(exc)))


def is_arrayjob_module(module: str) -> bool:
    return module == "arrayjob" or module.startswith("arrayjob.")


def code_home(module: str) -> tuple[str, ...]:
    """Where the code of ``module`` lives: its top-level package's directories, or the file of a
    top-level module (a job's helpers in the same package are the job's code too)."""
    top = module.partition(".")[0]
    loaded = sys.modules.get(top)
    paths = list(getattr(loaded, "__path__", []) or [])
    file = getattr(loaded, "__file__", None)
    if loaded is None:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            paths = list(spec.submodule_search_locations or [])
            file = spec.origin
    if paths:
        return tuple(os.path.join(os.path.realpath(p), "") for p in paths)
    return (os.path.realpath(file),) if file else ()


def _under(filename: str, home: tuple[str, ...]) -> bool:
    path = os.path.realpath(filename)
    return any(path == h or (h.endswith(os.sep) and path.startswith(h)) for h in home)


def blames_job(exc: BaseException, module: str) -> bool:
    """Whether ``exc`` is the job's to answer for: raised in the job's own code (or a library
    it called), or a misuse the public API refused (a ``TypeError``, ``ValueError`` or
    ``KeyError`` raised by arrayjob under the job's call). Anything else raised inside
    arrayjob is arrayjob's bug (exit 1), even with the job's code on the stack."""
    home = code_home(module)
    frames = [frame.f_code.co_filename for frame, _ in traceback.walk_tb(exc.__traceback__)]
    if not any(_under(f, home) for f in frames):
        return False
    arrayjob_dir = os.path.join(os.path.dirname(os.path.realpath(__file__)), "")
    for filename in reversed(frames):  # innermost first: whose code raised it
        if _under(filename, home):
            return True
        if os.path.realpath(filename).startswith(arrayjob_dir):
            return isinstance(exc, TypeError | ValueError | KeyError)
    return True


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
