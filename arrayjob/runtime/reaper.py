"""A private Ray never outlives its driver.

Ray ties its GCS and raylet to the driver (the kernel kills them when it dies), but not
what the raylet starts: the dashboard and runtime-env agents and the workers poll for
their raylet and linger for minutes after a ``SIGKILL`` of the driver. So a job that
starts its own Ray also starts this watchdog. Every process of that Ray inherits the
environment variable ``ARRAYJOB_RAY_OWNER=<token>`` (Ray rewrites the agents' and
workers' command lines, but not their environment). The watchdog reads a pipe whose
only writer is the driver: the end of the pipe comes when the driver closes it after
``ray.shutdown()`` or when the driver dies, however it dies. Then the watchdog stops
every process that carries the token, and exits.

Run as a script (``python reaper.py TOKEN``): the standard library only, so it
costs a bare interpreter, and it never imports arrayjob or Ray.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

OWNER_VARIABLE = "ARRAYJOB_RAY_OWNER"


def start(token: str) -> subprocess.Popen[bytes]:
    """Start the watchdog for the Ray processes that will carry ``token``; closing its
    ``stdin`` (or the end of this process) tells it to stop them.

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


def owned(token: str) -> list[int]:
    """The pids of live processes whose environment carries ``token``."""
    marker = f"{OWNER_VARIABLE}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone, or not ours to read
            continue
    return found


def stop(token: str, grace: float = 2.0) -> int:
    """SIGTERM every process of the token, SIGKILL what is left after ``grace`` seconds;
    repeated while new ones appear (a raylet may start a worker while it is stopped)."""
    stopped: set[int] = set()
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.5), (signal.SIGKILL, 0.5)):
        pids = owned(token)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
                stopped.add(pid)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and owned(token):
            time.sleep(0.1)
    return len(stopped)


def main(argv: list[str]) -> int:
    (token,) = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # outlive the driver's interruption, then clean up
    while sys.stdin.buffer.read(4096):  # until the driver closes the pipe, or dies
        pass
    if sys.platform.startswith("linux"):
        stop(token)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
