"""Checkpoints: the driver state of an iterative job, kept so a run that dies can be resumed.

A checkpoint lives beside the runs, not in one (``io.output``)::

    <output>/_checkpoint/<spec sha256>.npz

so removing a dead run's prefix (``JobOutput.abandon``, the next publish) leaves it, and a
checkpoint of another spec is never read: its name is another digest. It is written only by
the run holding the output's lease, so one found by the next holder is that of a run that
died (or failed). Each write replaces the object whole (``StorageBackend.write_bytes``: a
temporary file and a rename on disk, one PUT on S3): a kill mid-write leaves the previous
checkpoint. A publish removes every checkpoint of the output; ``run --restart`` removes
them before it starts.

The state is a flat mapping of NumPy arrays and JSON scalars (floats round-trip exactly), as
an ``.npz`` without pickles; what the state holds is each job's business (``jobs/``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arrayjob.errors import StorageError
from arrayjob.io.backend import StorageBackend
from arrayjob.io.locations import StorageCounters

CHECKPOINTS = "_checkpoint"
_META = "__meta__"
KILL_ENV = "ARRAYJOB_TEST_KILL_AT"  # tests only: "fit:3" SIGKILLs this process at that point

State = Mapping[str, Any]


def _sigkill(point: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# what reaching the named kill point does: a SIGKILL; an in-process test raises instead
die: Callable[[str], None] = _sigkill


def kill_point(point: str) -> None:
    """Die if ``ARRAYJOB_TEST_KILL_AT`` names ``point`` (``load``, ``fit:<iteration>``, ``write``,
    ``publish``): how the resume tests stop a run at a chosen place, as a killed run would."""
    if os.environ.get(KILL_ENV) == point:
        die(point)


@dataclass(frozen=True)
class Checkpoint:
    """A saved state: the run that wrote it, at which iteration, the job's state."""

    run_id: str
    iteration: int
    job: str
    state: dict[str, Any]


def encode(checkpoint: Checkpoint) -> bytes:
    arrays: dict[str, Any] = {k: np.asarray(v) for k, v in checkpoint.state.items() if isinstance(v, np.ndarray)}
    # NumPy scalars as Python ones: JSON holds those, and a float64 round-trips exactly
    scalars = {k: v.item() if isinstance(v, np.generic) else v for k, v in checkpoint.state.items() if k not in arrays}
    meta = {"run_id": checkpoint.run_id, "iteration": checkpoint.iteration, "job": checkpoint.job,
            "values": scalars}
    buffer = io.BytesIO()
    arrays[_META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def decode(data: bytes) -> Checkpoint:
    """The checkpoint in ``data``; ``ValueError`` if it cannot be read."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        meta = json.loads(arrays.pop(_META).tobytes())
        state = dict(meta["values"]) | arrays
        return Checkpoint(str(meta["run_id"]), int(meta["iteration"]), str(meta["job"]), state)
    except (OSError, KeyError, TypeError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"unreadable checkpoint: {exc}") from None


class CheckpointStore:
    """The checkpoints of one output (``backend`` is rooted at it), for one spec."""

    def __init__(self, backend: StorageBackend, spec_digest: str) -> None:
        self.backend = backend
        self.key = f"{CHECKPOINTS}/{spec_digest}.npz"

    def load(self) -> Checkpoint | None:
        """This spec's checkpoint, or None (none, or unreadable: a run then starts afresh)."""
        try:
            return decode(self.backend.read_bytes(self.key))
        except (FileNotFoundError, ValueError):
            return None
        except OSError as exc:
            raise StorageError(f"checkpoint: reading {self.backend.location.join(self.key)} failed: {exc}") from None

    def save(self, checkpoint: Checkpoint) -> int:
        """Replace this spec's checkpoint whole; the bytes written."""
        data = encode(checkpoint)
        try:
            self.backend.write_bytes(self.key, data)
        except OSError as exc:
            raise StorageError(f"checkpoint: writing {self.backend.location.join(self.key)} failed: {exc}") from None
        return len(data)

    def clear(self) -> None:
        """Remove every checkpoint of the output (of any spec: only dead runs wrote them)."""
        with contextlib.suppress(OSError):
            self.backend.delete(CHECKPOINTS)


@dataclass
class Checkpoints:
    """What a running job sees: the state to resume from, and ``tick`` at each iteration's end.

    ``tick`` saves at most once per iteration, when ``every`` seconds have passed since the
    last save (or the start of the fit) by ``clock``; ``every = 0`` saves each iteration.
    Without a store (a job run in-process by a test or a library user) nothing is saved or
    resumed.
    """

    store: CheckpointStore | None = None
    run_id: str = ""
    job: str = ""
    every: float = 60.0
    notify: Callable[[str], None] = lambda line: None
    count: Callable[[StorageCounters], None] = lambda counters: None  # the run's storage metrics
    resumed: Checkpoint | None = None  # what this run resumed from, if anything
    saved: int = 0  # checkpoints written by this run
    clock: Callable[[], float] = time.monotonic  # seconds, for ``every``
    _last: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._last = self.clock()

    def restore(self) -> Checkpoint | None:
        """The checkpoint to resume from, read once at the start of the fit, after the load
        (then the clock starts); a resume is told to ``notify``."""
        kill_point("load")
        self._last = self.clock()
        if self.store is None:
            return None
        found = self.store.load()
        if found is None or found.job != self.job:
            return None
        self.resumed = found
        self.notify(f"resumed run {found.run_id} from iteration {found.iteration}")
        return found

    def tick(self, iteration: int, state: State) -> None:
        """The end of ``iteration``: save ``state`` if due. ``state`` is everything the job needs
        to go on from here exactly as it would have (arrays and JSON scalars)."""
        if self.store is not None and self.clock() - self._last >= self.every:
            written = self.store.save(Checkpoint(self.run_id, iteration, self.job, dict(state)))
            self.count(StorageCounters(bytes_written=written, put_requests=1))
            self.saved += 1
            self._last = self.clock()
        kill_point(f"fit:{iteration}")
