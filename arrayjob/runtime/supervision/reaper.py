"""A private Ray never outlives its driver.

Ray ties its GCS and raylet to the driver (the kernel kills them when it dies), but not
what the raylet starts: the dashboard and runtime-env agents and the workers poll for
their raylet and linger for minutes after a ``SIGKILL`` of the driver. So a job that
starts its own Ray also starts this watchdog. It knows that Ray's processes two ways:
each inherits the environment variable ``ARRAYJOB_RAY_OWNER=<token>`` (unless it renamed
itself, which overwrites the environment block ``/proc`` shows: Ray's agents and workers
do), and each holds files open in the Ray's session directory, which the driver writes to
the watchdog's ``stdin`` once Ray is up. The end of that pipe comes when the driver closes
it after ``ray.shutdown()`` or when the driver dies, however it dies; then the watchdog
stops every process of that Ray, removes the job's spill of streamed blocks, and exits.

Run as a script (``python reaper.py TOKEN``, session directories one a line on stdin): the standard library only, so it
costs a bare interpreter, and it never imports arrayjob or Ray.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

OWNER_VARIABLE = "ARRAYJOB_RAY_OWNER"
DRIVER = os.getppid()  # as a script: the driver that started this watchdog


def start(token: str) -> subprocess.Popen[bytes]:
    """Start the watchdog for the Ray processes that will carry ``token``. Write the Ray's
    session directory to its ``stdin`` once known; closing it (or the end of this process)
    tells it to stop them.

    It runs in its own session (a Ctrl-C or a signal to the caller's process group does not
    reach it before it has done its work) and holds none of the caller's streams (a caller
    reading our stdout to its end is not kept waiting by it).
    """
    env = {k: v for k, v in os.environ.items() if k != OWNER_VARIABLE}
    return subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), token],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env, start_new_session=True, close_fds=True,
    )


def _holds(pid: str, sessions: list[str]) -> bool:
    """Whether ``pid`` runs in, or holds a file open in, one of the session directories."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode(errors="replace")
        if any(s in cmdline for s in sessions):
            return True
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if any(target.startswith(s) for s in sessions):
                return True
    except OSError:  # gone, or not ours to read
        return False
    return False


def owned(token: str, sessions: list[str]) -> list[int]:
    """The pids of live processes of the Ray of ``token`` and ``sessions``, but the driver's
    (which holds its own log in the session directory until it exits)."""
    marker = f"{OWNER_VARIABLE}={token}".encode()
    prefixes = [s.rstrip("/") + "/" for s in sessions if s.strip("/")]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (os.getpid(), DRIVER):
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(entry))
                    continue
        except OSError:
            pass
        if prefixes and _holds(entry, prefixes):
            found.append(int(entry))
    return found


def stop(token: str, sessions: list[str], grace: float = 2.0) -> int:
    """SIGTERM every process of the Ray, SIGKILL what is left after ``grace`` seconds;
    repeated while new ones appear (a raylet may start a worker while it is stopped)."""
    stopped: set[int] = set()
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.5), (signal.SIGKILL, 0.5)):
        pids = owned(token, sessions)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
                stopped.add(pid)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and owned(token, sessions):
            time.sleep(0.1)
    return len(stopped)


def spill_directory(token: str) -> str:
    """Where the jobs of ``token`` (a private Ray; "" for any other) spill streamed blocks on
    this machine, each executor in a directory of its own below it (``runtime.ray_executor``)."""
    return os.path.join(tempfile.gettempdir(), "arrayjob-spill", token)


def main(argv: list[str]) -> int:
    (token,) = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # outlive the driver's interruption, then clean up
    sessions = [line.decode(errors="replace").strip() for line in sys.stdin.buffer]  # until the pipe ends
    if sys.platform.startswith("linux"):
        stop(token, [s for s in sessions if s])
    if token:
        shutil.rmtree(spill_directory(token), ignore_errors=True)  # its workers are gone: nothing writes there
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
