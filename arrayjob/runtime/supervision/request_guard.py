"""A job's request for nodes never outlives the job.

Ray's ``request_resources`` is persistent: the request stays with the cluster until someone
replaces it, and the autoscaler keeps its nodes up meanwhile. A job clears its own request on
every way out it sees (``runtime.scaling``); a job killed outright (``SIGKILL``, the OOM
killer) sees none. So a job that asks for nodes also starts this guard. The job writes
``cleared`` to the guard's ``stdin`` once it has withdrawn the request itself; if the pipe
ends without that line (the job died), the guard connects to the cluster and clears it.

Run as a script (``python request_guard.py ADDRESS``). It imports Ray only when it has work
to do, and gives up after ``GIVE_UP_SECONDS`` (a cluster that is gone has no request left).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

CLEARED = b"cleared\n"
GIVE_UP_SECONDS = 120


def start(address: str) -> subprocess.Popen[bytes]:
    """Start the guard of the request made on the Ray at ``address``; tell it with ``done``.

    It runs in its own session (a signal to the job's process group does not reach it) and
    holds none of the job's streams.
    """
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), address],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )


def done(guard: subprocess.Popen[bytes], *, cleared: bool) -> None:
    """The job is ending: the guard clears the request unless the job did (``cleared``)."""
    stdin = guard.stdin
    if stdin is None:
        return
    try:
        if cleared:
            stdin.write(CLEARED)
        stdin.close()
    except OSError:  # the guard is gone already: nothing to tell it
        pass
    if cleared:
        try:
            guard.wait(timeout=5)
        except subprocess.TimeoutExpired:
            guard.kill()


def _clear(address: str) -> None:
    import ray
    from ray.autoscaler.sdk import request_resources

    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    try:
        request_resources(bundles=[])
    finally:
        ray.shutdown()


def main(address: str) -> int:
    told = sys.stdin.buffer.read()  # to the end of the pipe: the job's end, however it came
    if told == CLEARED:
        return 0
    signal.alarm(GIVE_UP_SECONDS)
    _clear(address)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
