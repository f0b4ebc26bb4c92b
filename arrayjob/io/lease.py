"""One output, one publisher: the lease a run holds on its output while it writes it.

The lease is a chain of small JSON objects ``<output>/_lease/<epoch>`` (run id, host,
pid, since, heartbeat, expiry), each made by a conditional create
(``StorageBackend.write_bytes(..., exclusive=True)``: a hard link on disk, a PUT with
If-None-Match on S3), so that of two runs creating the same epoch exactly one succeeds.
The run whose object is the highest epoch holds the output.

- A run takes a free output by creating epoch 1; while another run holds it, it waits.
- The holder renews its heartbeat from a background thread every ``expiry / 6`` seconds
  by overwriting its own object, after checking that it is still the highest epoch.
- A lease whose heartbeat is older than its expiry may be taken over by creating the next
  epoch: a conditional create again, so of two takers only one wins.
- A holder whose renewals came more than ``expiry / 2`` apart (a stall, a storage outage)
  may have been seen as expired, so it does not overwrite: it takes the next epoch itself,
  and a taker who saw it expired then loses that create. ``check`` renews this way just
  before publishing; a run publishes only if it still holds the lease. This assumes hosts'
  clocks agree to well within ``expiry / 2``.
- Releasing deletes its own object and the older epochs.

The lease reads time, waits and beats through a ``LeaseClock`` (the system's by default): a
test hands it one it advances by hand, so a lease expires without anyone sleeping.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from arrayjob.errors import LeaseHeldError, SpecError
from arrayjob.io.backend import StorageBackend

LEASES = "_lease"
DEFAULT_EXPIRY = 60.0
EXPIRY_ENV = "ARRAYJOB_LEASE_SECONDS"


def lease_expiry() -> float:
    """Seconds without a heartbeat after which a lease may be taken over (``ARRAYJOB_LEASE_SECONDS``)."""
    text = os.environ.get(EXPIRY_ENV, "")
    if not text:
        return DEFAULT_EXPIRY
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise SpecError(f"{EXPIRY_ENV}: expected a number of seconds above 0, got {text!r}")
    return seconds


class LeaseClock:
    """The lease's notion of time: the wall clock its heartbeats are written in (compared
    across hosts), a monotonic clock for its own renewals' spacing, the pause while another
    run holds the output, and the heartbeat that renews the lease beside the job (a thread)."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def beat(self, every: float, renew: Callable[[], bool], stop: threading.Event, name: str) -> Callable[[], None]:
        """Call ``renew`` every ``every`` seconds until ``stop`` is set or ``renew`` returns
        False; returns what waits for the beating to end."""

        def loop() -> None:
            while not stop.wait(every) and renew():
                pass

        thread = threading.Thread(target=loop, name=name, daemon=True)
        thread.start()
        return lambda: thread.join(timeout=30)


SYSTEM_CLOCK = LeaseClock()


def _now_iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class LeaseRecord:
    """What one lease object says: who holds the output, since when, and their last heartbeat."""

    epoch: int
    run_id: str
    host: str
    pid: int
    since: str  # ISO 8601, UTC
    heartbeat: float  # Unix time of the last renewal
    expiry: float  # seconds after ``heartbeat`` when others may take over

    @classmethod
    def parse(cls, epoch: int, data: bytes) -> LeaseRecord:
        """The record in ``data``; one that cannot be read never blocks anyone: it is expired."""
        try:
            doc = json.loads(data)
            return cls(epoch, str(doc["run_id"]), str(doc["host"]), int(doc["pid"]), str(doc["since"]),
                       dt.datetime.fromisoformat(doc["heartbeat_at"]).timestamp(), float(doc["expiry_seconds"]))
        except (ValueError, KeyError, TypeError):
            return cls(epoch, "?", "?", 0, "?", 0.0, 0.0)

    def to_json(self) -> bytes:
        return json.dumps({"run_id": self.run_id, "host": self.host, "pid": self.pid, "since": self.since,
                           "heartbeat_at": _now_iso(self.heartbeat), "expiry_seconds": self.expiry}).encode()

    def expired(self, now: float) -> bool:
        return now - self.heartbeat > self.expiry

    @property
    def holder(self) -> str:
        return f"run {self.run_id} on {self.host} (pid {self.pid}, since {self.since})"


class Lease:
    """This run's lease on the output that ``backend`` is rooted at."""

    def __init__(self, backend: StorageBackend, run_id: str, *, expiry: float | None = None,
                 heartbeat: float | None = None, clock: LeaseClock = SYSTEM_CLOCK) -> None:
        self.backend = backend
        self.run_id = run_id
        self.expiry = lease_expiry() if expiry is None else expiry
        self.heartbeat = self.expiry / 6 if heartbeat is None else heartbeat  # seconds between renewals
        self.clock = clock
        self.epoch: int | None = None
        self.since = ""
        self.lost: str | None = None  # why this run no longer holds the lease
        self._renewed = 0.0  # clock.monotonic() of the last renewal's heartbeat
        self._lock = threading.Lock()  # renewals come from the heartbeat thread and from check()
        self._stop = threading.Event()
        self._beating: Callable[[], None] | None = None  # waits for the heartbeat to end

    def __repr__(self) -> str:
        return f"Lease({self.backend.location}, run {self.run_id}, epoch {self.epoch})"

    @property
    def held(self) -> bool:
        return self.epoch is not None and self.lost is None

    def current(self) -> LeaseRecord | None:
        """The lease on the output now (its highest epoch), or None if it is free."""
        for _ in range(10):
            epochs = sorted(int(k.rsplit("/", 1)[1]) for k in self.backend.list(LEASES) if k.rsplit("/", 1)[1].isdigit())
            if not epochs:
                return None
            try:
                return LeaseRecord.parse(epochs[-1], self.backend.read_bytes(_key(epochs[-1])))
            except FileNotFoundError:
                continue  # released between the listing and the read
        return None

    def acquire(self, *, wait: bool = True, notify: Callable[[str], None] = lambda line: None) -> None:
        """Take the lease: at once if the output is free or its lease expired (a takeover, told
        to ``notify``), else wait for the holder (told once per holder), or, unless ``wait``,
        raise ``LeaseHeldError`` naming it."""
        where = self.backend.location
        told = None
        while True:
            now = self.clock.time()
            held = self.current()
            if held is not None and not held.expired(now):
                if not wait:
                    raise LeaseHeldError(f"output.uri: {where} is being written by {held.holder}; "
                                         "run without --no-wait to wait for it")
                if told != (held.epoch, held.run_id):
                    notify(f"waiting for {held.holder}, which is writing {where}")
                    told = (held.epoch, held.run_id)
                self.clock.sleep(min(2.0, self.heartbeat))
                continue
            if self._create(1 if held is None else held.epoch + 1):
                if held is not None:
                    silent = "never" if held.heartbeat == 0 else f"{now - held.heartbeat:.0f} s"
                    notify(f"took over {where} from {held.holder}: no heartbeat for {silent} "
                           f"(expiry {held.expiry:g} s)")
                self._beating = self.clock.beat(self.heartbeat, self._beat, self._stop, f"lease-{self.run_id}")
                return
            # another run created that epoch first: look again

    def check(self) -> None:
        """Renew now and raise ``LeaseHeldError`` unless this run still holds the lease: called
        just before publishing."""
        if self.epoch is None:
            raise LeaseHeldError(f"output.uri: {self.backend.location}: this run holds no lease on it")
        try:
            self._renew()
        except OSError as exc:
            self.lost = self.lost or f"renewing the lease failed: {exc}"
        if self.lost:
            raise LeaseHeldError(f"output.uri: {self.backend.location}: {self.lost}; nothing was published")

    def release(self) -> None:
        """Stop renewing and delete this run's lease object and older ones (best effort: a
        lease left behind expires)."""
        self.stop_heartbeat()
        if self.epoch is None:
            return
        try:
            for key in self.backend.list(LEASES):
                name = key.rsplit("/", 1)[1]
                if name.isdigit() and int(name) <= self.epoch:
                    self.backend.delete(key)
        except OSError:
            pass
        self.epoch = None

    def stop_heartbeat(self) -> None:
        """Stop renewing (and wait for the heartbeat to end); ``check`` still renews."""
        self._stop.set()
        if self._beating is not None:
            self._beating()

    def _record(self, epoch: int, heartbeat: float) -> LeaseRecord:
        return LeaseRecord(epoch, self.run_id, socket.gethostname(), os.getpid(), self.since, heartbeat, self.expiry)

    def _create(self, epoch: int) -> bool:
        """Create ``epoch`` by a conditional create; whether this run won it."""
        stamp, now = self.clock.monotonic(), self.clock.time()
        self.since = self.since or _now_iso(now)
        try:
            self.backend.write_bytes(_key(epoch), self._record(epoch, now).to_json(), exclusive=True)
        except FileExistsError:
            return False
        self.epoch, self._renewed = epoch, stamp
        return True

    def _renew(self) -> None:
        with self._lock:
            if self.lost is not None or self.epoch is None:
                return
            stamp, now = self.clock.monotonic(), self.clock.time()
            held = self.current()
            if held is None or (held.epoch, held.run_id) != (self.epoch, self.run_id):
                self.lost = f"the lease was taken over by {held.holder}" if held else "the lease was removed"
                return
            if stamp - self._renewed <= self.expiry / 2:
                self.backend.write_bytes(_key(self.epoch), self._record(self.epoch, now).to_json())
                self._renewed = stamp
                return
            # renewals lapsed long enough for another run to see this lease expired: a plain
            # overwrite could race its takeover, a conditional create of the next epoch cannot
            previous = self.epoch
            if not self._create(previous + 1):
                taker = self.current()
                self.lost = (f"the heartbeat lapsed and {taker.holder} took the lease over" if taker
                             else "the heartbeat lapsed and the lease was taken over")
                return
            self.backend.delete(_key(previous))

    def _beat(self) -> bool:
        """One heartbeat: renew; whether to go on beating (not once the lease is lost)."""
        try:
            self._renew()
        except Exception:  # noqa: BLE001 - storage trouble: retried next beat; check() decides
            return True
        return self.lost is None


def _key(epoch: int) -> str:
    return f"{LEASES}/{epoch:010d}"
