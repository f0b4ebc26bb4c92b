"""Remote runs through Ray Jobs: ``arrayjob submit`` sends ``arrayjob run`` to a cluster's
job server, follows its logs and ends with the job's own exit code.

The spec is validated here, on the submitting machine, and sent resolved (``--set``
applied, ``${VAR}`` read from this machine's environment) in the job's working directory:
what runs on the cluster is exactly what was validated. The job server is Ray's
(``JobSubmissionClient``, the dashboard's HTTP API, port 8265 by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arrayjob.catalog import get_job, job_code
from arrayjob.errors import ClusterError, SpecError
from arrayjob.spec import JobSpec

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

# Where Ray's own CLI (``ray job ...``) looks for the job server when no --address is given.
ADDRESS_VARIABLES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
HEADERS_VARIABLE = "RAY_JOB_HEADERS"
SPEC_FILE = "spec.toml"
# Seconds Ray waits after its SIGTERM before SIGKILL when a job is stopped (Ray's default is
# 3): ``arrayjob run`` needs up to 8 to remove its staging and release the output's lease.
STOP_GRACE_SECONDS = 10
QUIET_LOGGERS = ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk",
                 "ray._private.runtime_env.packaging")
COMMAND_NOT_FOUND = 127
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


# what the remote run is recorded by (docs/operating.md, "Runs in MLflow", "Lineage"): passed on
# from this machine's environment; not OPENLINEAGE_API_KEY (a runtime env is shown in Ray's
# dashboard) nor OPENLINEAGE_CONFIG (a file on this machine)
TRACKING_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID",
                      "OPENLINEAGE_URL", "OPENLINEAGE_ENDPOINT", "OPENLINEAGE_NAMESPACE", "OPENLINEAGE_PARENT_ID",
                      "OPENLINEAGE_ROOT_PARENT_ID", "OPENLINEAGE_DISABLED")


def tracking_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tracking and lineage settings set here, for the remote run's environment."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in TRACKING_VARIABLES if environ.get(name)}


def job_server_address(address: str | None) -> str:
    """``--address`` if given, else ``RAY_API_SERVER_ADDRESS``, else ``RAY_ADDRESS``, as Ray's CLI."""
    if address:
        return address
    for variable in ADDRESS_VARIABLES:
        if os.environ.get(variable):
            return os.environ[variable]
    raise SpecError("--address: no Ray job server given (--address http://HEAD:8265, or RAY_ADDRESS)")


def job_headers() -> dict[str, Any] | None:
    """HTTP headers for the job server from ``RAY_JOB_HEADERS`` (a JSON object), as Ray's CLI."""
    text = os.environ.get(HEADERS_VARIABLE)
    if text is None:
        return None
    try:
        headers = json.loads(text)
    except ValueError:
        headers = None
    if not isinstance(headers, dict):
        raise SpecError(f'{HEADERS_VARIABLE}: expected a JSON object such as {{"Authorization": "Bearer ..."}}, '
                        f"got {text[:40]!r}")
    return headers


@contextlib.contextmanager
def _address_variables_hidden() -> Iterator[None]:
    # Ray's client lets RAY_ADDRESS override the address it is given; an explicit --address wins here.
    saved = {v: os.environ.pop(v) for v in ADDRESS_VARIABLES if v in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@dataclass
class JobServer:
    """One Ray cluster's job server, reached over HTTP."""

    address: str
    client: JobSubmissionClient

    @classmethod
    def connect(cls, address: str | None, *, debug: bool = False) -> JobServer:
        from ray.job_submission import JobSubmissionClient

        if not debug:  # Ray's SDK logs each upload and the end of each log stream at INFO
            for name in QUIET_LOGGERS:
                logging.getLogger(name).setLevel(logging.WARNING)
        address = job_server_address(address)
        headers = job_headers()
        try:
            with _address_variables_hidden():
                client = JobSubmissionClient(address, headers=headers)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ClusterError(f"--address: cannot reach the Ray job server at {address}: {_first_line(exc)}") from None
        return cls(address, client)

    def _call(self, what: str, job_id: str, call: Callable[[], Any]) -> Any:
        from aiohttp import ClientError  # the log stream's websocket

        try:
            return call()
        except ClientError as exc:
            raise ClusterError(f"{what} {job_id}: the Ray job server at {self.address} failed: "
                               f"{_first_line(exc)}") from None
        except RuntimeError as exc:
            if "404" in str(exc) or "does not exist" in str(exc):
                raise SpecError(f"JOB_ID: no job {job_id!r} on {self.address}") from None
            raise ClusterError(f"{what} {job_id}: {_first_line(exc)}") from None
        except ConnectionError as exc:
            raise ClusterError(f"{what} {job_id}: cannot reach the Ray job server at {self.address}: "
                               f"{_first_line(exc)}") from None

    def submit(self, spec: JobSpec, run_options: list[str], *, upload_package: bool = False) -> str:
        """Submit ``arrayjob run`` of the resolved ``spec``; returns the job's submission id."""
        import tomli_w

        submission_id = f"arrayjob-{spec.name}-{uuid.uuid4().hex[:8]}"
        with tempfile.TemporaryDirectory(prefix="arrayjob-submit-") as workdir:
            Path(workdir, SPEC_FILE).write_text(tomli_w.dumps(sent_spec(spec)))
            runtime_env: dict[str, Any] = {
                "working_dir": workdir,
                "env_vars": {**tracking_environment(), "RAY_JOB_STOP_WAIT_TIME_S": str(STOP_GRACE_SECONDS)},
            }
            command = ["arrayjob", "run", SPEC_FILE, *run_options]
            # a user's job (``algorithm = "module:Class"``) goes with it: its package (Ray's
            # py_modules take directories), or its one module, beside the spec in the job's
            # working directory (on the job's PYTHONPATH)
            code = []
            for path in job_code(get_job(spec.algorithm)):
                if os.path.isdir(path):
                    code.append(path)
                else:
                    shutil.copy(path, workdir)
            if upload_package:
                import arrayjob

                code.insert(0, str(Path(arrayjob.__file__).parent))
                command = ["python", "-m", "arrayjob", "run", SPEC_FILE, *run_options]
            if code:
                runtime_env["py_modules"] = code
            metadata = {"arrayjob_job": spec.name, "arrayjob_output": str(spec.output)}
            return self._call("submitting", submission_id, lambda: self.client.submit_job(
                entrypoint=shlex.join(command), submission_id=submission_id, runtime_env=runtime_env,
                metadata=metadata))

    def details(self, job_id: str) -> JobDetails:
        return self._call("status of", job_id, lambda: self.client.get_job_info(job_id))

    def logs(self, job_id: str) -> str:
        return self._call("logs of", job_id, lambda: self.client.get_job_logs(job_id))

    def stop(self, job_id: str) -> bool:
        """Ask Ray to stop the job (SIGTERM, SIGKILL after ``STOP_GRACE_SECONDS``); False if it had ended."""
        return self._call("stopping", job_id, lambda: self.client.stop_job(job_id))

    def follow(self, job_id: str, write: Callable[[str], None]) -> None:
        """Write the job's logs as they come, until it ends."""

        async def tail() -> None:
            async for chunk in self.client.tail_job_logs(job_id):
                write(chunk)

        self._call("logs of", job_id, lambda: asyncio.run(tail()))

    def wait(self, job_id: str, timeout: float = 60.0) -> JobDetails:
        """The job's details once it has ended (its status lags its logs by a moment)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.details(job_id)
            if str(info.status) in TERMINAL or time.monotonic() > deadline:
                return info
            time.sleep(0.2)


def sent_spec(spec: JobSpec) -> dict[str, Any]:
    """The resolved spec as the cluster gets it: local paths made absolute, since the job runs
    in a directory of its own (they must name the same files on the cluster's nodes, e.g. a
    shared filesystem; ``s3://`` needs nothing)."""
    sent = copy.deepcopy(dict(spec.resolved))
    for name, location in spec.inputs.items():
        entry = sent["inputs"][name]
        if isinstance(entry, dict):
            entry["uri"] = str(location)
        else:
            sent["inputs"][name] = str(location)
    sent["output"]["uri"] = str(spec.output)
    return sent


@dataclass(frozen=True)
class JobEnd:
    """How a job ended, as ``arrayjob`` exits for it."""

    exit_code: int
    line: str  # for stderr; empty when the job succeeded


def job_end(job_id: str, info: JobDetails) -> JobEnd:
    """The job's own exit code (``driver_exit_code`` in its details): a failed ``arrayjob run``
    exits 2 to 6 as documented, and ``submit`` passes that on. A job that never ran its
    command (its runtime environment failed, the cluster lost it) is a cluster failure, 5."""
    status = str(info.status)
    code = info.driver_exit_code
    if status == "SUCCEEDED":
        return JobEnd(0, "")
    if status == "STOPPED":
        return JobEnd(143, f"job {job_id} was stopped")
    if status != "FAILED":
        return JobEnd(ClusterError.exit_code, f"job {job_id} has not ended: {status}")
    if code is None:
        return JobEnd(ClusterError.exit_code, f"job {job_id} failed before its command ran: "
                                              f"{_first_line(info.message or 'no message')}")
    if code == COMMAND_NOT_FOUND:  # the shell's: the cluster has no arrayjob command
        return JobEnd(ClusterError.exit_code, f"job {job_id}: the cluster has no arrayjob command (exit 127); "
                                              "install arrayjob there, or submit with --upload-package")
    if code < 0:  # ended by a signal
        return JobEnd(128 - code, f"job {job_id} was killed by signal {-code}")
    return JobEnd(code, f"job {job_id} failed with exit code {code}")


def describe(job_id: str, info: JobDetails) -> dict[str, Any]:
    """What ``arrayjob status`` shows of a job."""
    status = str(info.status)
    described: dict[str, Any] = {
        "job_id": job_id,
        "status": status,
        "exit_code": info.driver_exit_code,
        "entrypoint": info.entrypoint,
        "start_time": _iso(info.start_time),
        "end_time": _iso(info.end_time),
        "metadata": dict(info.metadata or {}),
    }
    if status == "FAILED" and info.message:
        described["message"] = _first_line(info.message)
    return described


def status_lines(described: Mapping[str, Any]) -> list[str]:
    lines = [f"{described['job_id']}: {described['status']}"
             + (f" (exit code {described['exit_code']})" if described["exit_code"] is not None else "")]
    for key in ("entrypoint", "start_time", "end_time", "message"):
        if described.get(key):
            lines.append(f"  {key.replace('_', ' ')}: {described[key]}")
    for key, value in described["metadata"].items():
        lines.append(f"  {key.removeprefix('arrayjob_')}: {value}")
    return lines


def _iso(milliseconds: int | None) -> str | None:
    if not milliseconds:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(milliseconds / 1000))


def _first_line(exc: object) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def write_stdout(chunk: str) -> None:
    sys.stdout.write(chunk)
    sys.stdout.flush()
