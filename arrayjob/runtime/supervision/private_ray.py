"""The Ray a job starts for itself, watched: its GCS and raylet by pidfd, so that their death
ends the job at once with one line (``ClusterError``), and what Ray prints about it is muted."""

from __future__ import annotations

import io
import os
import select
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TextIO, cast

from arrayjob.errors import ClusterError

# How Ray's driver prints a raylet's unexpected death (ray._private.process_watcher)
RAYLET_DEATH = "Raylet is terminated. Termination is unexpected."


def private_processes() -> dict[str, int]:
    """The pids of the GCS and raylet of the Ray started in this process."""
    import ray._private.worker as worker

    node = worker._global_node
    found: dict[str, int] = {}
    for name in ("gcs_server", "raylet"):
        processes: list[Any] = node.all_processes.get(name, []) if node is not None else []
        for info in processes:
            found[name] = info.process.pid
    return found


class PrivateRayWatch:
    """Watches the GCS and raylet of the Ray this job started, by pidfd; ``lost`` names the
    one that died.

    A dead GCS: Ray's driver would wait a minute for it to come back (a private one never
    does), then end the process itself. So the main thread is interrupted at once, and the
    job unwinds as ``ClusterError``. A dead raylet: Ray's driver ends the process (``_Exit(1)``)
    the next time it touches the object store, typically within 0.1 s, before any Python code
    can run; so this says why and ends the process first, with ClusterError's exit code.
    Likewise if the main thread is held in Ray for ``grace`` seconds after an interruption.
    """

    def __init__(self, processes: dict[str, int], grace: float = 5.0,
                 before_exit: Callable[[], None] | None = None) -> None:
        self.lost: str | None = None
        self.grace = grace
        self.before_exit = before_exit  # what must not wait for a lease to expire (best effort)
        self._fds: dict[int, str] = {}
        for name, pid in processes.items():
            try:
                self._fds[os.pidfd_open(pid)] = f"{name} (pid {pid})"
            except (AttributeError, OSError):  # no pidfd here: Ray's own errors still apply
                continue
        self._wake_r, self._wake_w = os.pipe()
        self._closed = threading.Event()
        self._released = False
        self._thread = threading.Thread(target=self._watch, name="arrayjob-ray-watch", daemon=True)
        self._thread.start()

    def message(self) -> str:
        return f"the job's Ray stopped under it: its {self.lost} died; nothing published"

    def has_lost_one(self) -> bool:
        """Whether the GCS or raylet is dead now, asked of the kernel (not of the watch thread,
        which may not have woken up yet), until ``release``; after it, whether it was then."""
        if self.lost is None and not self._released:
            self.lost = self._dead_now()
        return self.lost is not None

    def reported(self, text: str) -> bool:
        """Whether ``text`` is Ray's account of this Ray's raylet dying (its dashboard agent
        reads the raylet's end of a pipe, which closes as the process dies, and publishes it;
        that can reach the driver before the kernel reports the process gone): if so, the
        raylet is recorded as lost, as the watch would have."""
        if RAYLET_DEATH not in text:
            return False
        if self.lost is None:
            self.lost = next((name for name in self._fds.values() if name.startswith("raylet")), "raylet")
        return True

    def _dead_now(self) -> str | None:
        with suppress(OSError, ValueError):
            ready, _, _ = select.select(list(self._fds), [], [], 0)
            return self._fds[ready[0]] if ready else None
        return None

    def _watch(self) -> None:
        ready, _, _ = select.select([*self._fds, self._wake_r], [], [])
        died = [self._fds[fd] for fd in ready if fd in self._fds]
        if not died or self._closed.is_set():
            return
        self.lost = died[0]
        quiet_native_stderr()
        if not self.lost.startswith("raylet"):
            import _thread

            _thread.interrupt_main()  # a KeyboardInterrupt in the main thread, read as ClusterError
            if self._closed.wait(self.grace):
                return
        sys.stderr.write(f"arrayjob: error: {self.message()}\n")
        sys.stderr.flush()
        if self.before_exit is not None:
            with suppress(Exception):
                self.before_exit()
        os._exit(ClusterError.exit_code)

    def quiet_once_lost(self, stream: TextIO) -> TextIO:
        """``stream`` for what Ray's driver prints (a raylet's account of its own death), mute
        once this Ray has lost its GCS or raylet: the watch says that in one line."""
        return cast(TextIO, _MuteOnceLost(stream, self))

    def close(self) -> None:
        """Stop watching (the job is ending). A death the kernel already knows of is recorded
        even if the watch thread has not woken up for it (the job's own error may have come
        first): the shutdown must not wait for the dead process. The processes stay asked
        about (``has_lost_one``) until ``release``: a raylet killed outright closes its
        sockets, which fails the job, a moment before the kernel reports it dead, and Ray's
        account of its death may arrive during the shutdown that follows."""
        self.has_lost_one()
        self._closed.set()
        os.write(self._wake_w, b"x")
        self._thread.join()

    def release(self) -> None:
        """Close the pidfds (after ``close``, once nothing of Ray prints any more)."""
        if self._released:
            return
        self._released = True
        for fd in [*self._fds, self._wake_r, self._wake_w]:
            os.close(fd)


class _MuteOnceLost(io.TextIOBase):
    """A text stream that passes writes to ``stream`` until ``watch`` finds its Ray lost.

    Asked at each write, so a message that arrives because the raylet died is always dropped,
    however the threads are scheduled.
    """

    def __init__(self, stream: TextIO, watch: PrivateRayWatch) -> None:
        self._stream = stream
        self._watch = watch

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not (self._watch.has_lost_one() or self._watch.reported(text)):
            self._stream.write(text)
        return len(text)

    def flush(self) -> None:
        with suppress(OSError, ValueError):
            self._stream.flush()


def quiet_native_stderr() -> None:
    """Once its Ray is gone, the driver's Ray core logs every RPC that fails to file
    descriptor 2; the job says what happened in one line. Python's ``sys.stderr`` keeps the
    terminal (a copy of the descriptor); the descriptor itself goes to /dev/null."""
    with suppress(OSError, ValueError):
        sys.stderr.flush()
        kept = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        sys.stderr = open(kept, "w", buffering=1, encoding=sys.stderr.encoding or "utf-8",  # noqa: SIM115
                          errors="backslashreplace")
