"""One output, one publisher; nothing is published until it is complete.

The published layout of an output prefix::

    <output>/_SUCCESS                       JSON manifest naming the current run: "prefix": "runs/<run id>"
    <output>/runs/<run id>/result.zarr      that run's files: result.zarr, report.json, report.html
    <output>/_lease/<epoch>                 only while a run holds the output (``io.lease``)

A run first takes the output's lease (waiting while another live run holds it), then
writes everything under its own ``runs/<run id>/`` and publishes by writing ``_SUCCESS``:
one whole-object write, so a reader sees the old manifest or the new one, each naming a
complete prefix. Only then are older runs' prefixes removed: those of the run it replaced
and of dead runs (whoever holds the lease is the only live writer). A reader reads
``_SUCCESS`` and opens the prefix it names (``published``); if a file it names has gone,
the output was replaced meanwhile: read ``_SUCCESS`` again.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arrayjob import __version__
from arrayjob.errors import InputError, SpecError, StorageError
from arrayjob.io.backend import StorageBackend, backend_for, describe_failure
from arrayjob.io.lease import LEASES, Lease
from arrayjob.io.locations import Location, StorageCounters, StorageOptions
from arrayjob.units import size

SUCCESS = "_SUCCESS"
RUNS = "runs"
LEGACY_STAGING = "_staging"  # staging of the layout before runs/ (files published at the top)
ROOM_FOR_REPORTS = 256 * 1024  # report.json, report.html, Zarr metadata: tens of kB in practice


@dataclass(frozen=True)
class Completed:
    """An output whose ``_SUCCESS`` manifest exists."""

    manifest: dict[str, Any]

    @property
    def prefix(self) -> str:
        """Where the published files are, relative to the output ("" for the layout before runs/)."""
        return str(self.manifest.get("prefix", ""))


def read_manifest(backend: StorageBackend) -> Completed | None:
    try:
        return Completed(json.loads(backend.read_bytes(SUCCESS)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StorageError(f"output.uri: cannot read {backend.location}/{SUCCESS}: {exc}") from None


def published(location: Location, options: StorageOptions) -> Location | None:
    """Where the complete result at ``location`` is (``<output>/runs/<run id>``), or None.

    What every reader does: read ``_SUCCESS``, open the prefix it names.
    """
    done = read_manifest(backend_for(location, options))
    if done is None:
        return None
    return location.join(done.prefix) if done.prefix else location


def read_published_report(location: Location, options: StorageOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``_SUCCESS`` manifest at ``location`` and the report.json of the run it names, read
    as every reader reads: the manifest, then the prefix it names; a report gone meanwhile (the
    output was replaced) means reading the manifest again, once.

    Nothing published there (no ``_SUCCESS``, no such bucket), or a manifest or report that is
    not JSON: ``InputError`` (exit 2); storage that refuses or does not answer:
    ``StorageError`` (exit 4)."""
    backend = backend_for(location, options)
    try:
        backend.check_reachable()  # an endpoint that does not answer fails in seconds, not minutes of retries
    except (FileNotFoundError, NotADirectoryError) as exc:  # no bucket there, a file there
        raise InputError(f"{location}: nothing published there: {exc}") from None
    except OSError as exc:
        raise StorageError(f"{location}: {exc}") from None
    for attempt in range(2):
        try:
            manifest_bytes = backend.read_bytes(SUCCESS)
        except FileNotFoundError:
            raise InputError(f"{location}: nothing published there (no {SUCCESS}; a run publishes it last)") from None
        except OSError as exc:
            raise StorageError(f"{location}: cannot read {SUCCESS}: {describe_failure(exc)}") from None
        try:
            manifest = json.loads(manifest_bytes)
            prefix = str(manifest.get("prefix", ""))
        except (ValueError, AttributeError):
            raise InputError(f"{location}/{SUCCESS}: not a manifest arrayjob wrote (not a JSON object)") from None
        key = f"{prefix}/report.json" if prefix else "report.json"
        try:
            report_bytes = backend.read_bytes(key)
        except FileNotFoundError:
            if attempt == 0:
                continue  # replaced while we read: the new manifest names the new run
            raise InputError(f"{location}: {SUCCESS} names run {manifest.get('run_id', '?')}, "
                             f"but {key} is missing") from None
        except OSError as exc:
            raise StorageError(f"{location}: cannot read {key}: {describe_failure(exc)}") from None
        try:
            report = json.loads(report_bytes)
            if not isinstance(report, dict):
                raise ValueError
        except ValueError:
            raise InputError(f"{location}/{key}: not a report arrayjob wrote (not a JSON object)") from None
        return manifest, report
    raise AssertionError("unreachable")


def check_room(location: Location, expected_bytes: int, free: int | None) -> None:
    """``StorageError`` if ``expected_bytes`` will not fit in the ``free`` bytes (None: no limit)."""
    if free is not None and expected_bytes > free:
        raise StorageError(f"output.uri: {location}: the result needs about {_size(expected_bytes)} "
                           f"but its disk has {_size(free)} free")


def probe_writable(location: Location, options: StorageOptions, key: str) -> int | None:
    """Write an empty probe object under ``location`` and delete it, before anything is
    written there: ``StorageError`` (exit 4) naming ``key`` when it cannot be (no bucket, no
    answer, refused, read-only); else the space free there, where storage says."""
    try:
        return backend_for(location, options).probe_write(f"_probe-{uuid.uuid4().hex}")
    except OSError as exc:
        raise StorageError(f"{key}: {location} is not writable: {_reason(exc)}") from None


def _size(n: int) -> str:
    """``size`` and the exact count, for a message that compares two sizes."""
    return f"{size(n)} ({n:,} bytes)" if n >= 1000 else f"{n:,} bytes"


def _reason(exc: OSError) -> str:
    """An ``OSError`` as a short reason: the system's words (``strerror``) when it has them."""
    if exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class JobOutput:
    """The output prefix of one job: its state, its lease, this run's prefix and the commit."""

    def __init__(self, location: Location, options: StorageOptions, spec_digest: str) -> None:
        self.location = location
        self.options = options
        self.spec_digest = spec_digest
        self.run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:8]
        self.staging = location.join(RUNS, self.run_id)  # published when _SUCCESS names it
        self.counters = StorageCounters()
        self.backend = backend_for(location, options)
        self.lease = Lease(self.backend, self.run_id)
        self._published = False
        self._seen: tuple[str | None] | None = None  # (run published when check_rerun looked,)

    def completed(self) -> Completed | None:
        """The manifest of a complete output here, or None."""
        return read_manifest(self.backend)

    def check_rerun(self, *, overwrite: bool) -> Completed | None:
        """The completed output this run would skip, or None if the run must go ahead.

        A complete output of the same spec is skipped (idempotent reruns); one written by
        a different spec is an error unless ``overwrite``.
        """
        done = self.completed()
        self._seen = (None if done is None else done.manifest.get("run_id"),)
        if done is None or overwrite:
            return None
        if done.manifest.get("spec_sha256") != self.spec_digest:
            raise SpecError(
                f"output.uri: {self.location} holds a complete result of a different spec "
                f"(run {done.manifest.get('run_id', '?')}); pass --overwrite to replace it"
            )
        return done

    def check(self, *, overwrite: bool, expected_bytes: int) -> Completed | None:
        """``check_rerun``, with the output checked around it before anything runs: first that
        its storage answers and could hold it (reading only), and, if the run goes ahead,
        that it is writable and has room for ``expected_bytes``. A rerun that skips a
        complete output needs neither write access nor room."""
        try:
            self.backend.check_reachable()
        except OSError as exc:
            raise StorageError(f"output.uri: {self.location}: {_reason(exc)}") from None
        done = self.check_rerun(overwrite=overwrite)
        if done is None:
            self.check_writable(expected_bytes)
        return done

    def check_writable(self, expected_bytes: int) -> None:
        """Write an empty probe object into this run's prefix and delete it (leaving nothing),
        and compare ``expected_bytes`` with the space free where the output goes, if storage
        says (a local disk does, an object store does not)."""
        try:
            free = self.backend.probe_write(f"{self._staged}/_probe")
        except OSError as exc:
            raise StorageError(f"output.uri: {self.location} is not writable: {_reason(exc)}") from None
        check_room(self.location, expected_bytes + ROOM_FOR_REPORTS, free)

    def take(self, *, overwrite: bool, wait: bool = True,
             notify: Callable[[str], None] = lambda line: None) -> Completed | None:
        """Take the output's lease (see ``io.lease``), then look again: the completed output this
        run now skips (the lease released), or None: the run goes ahead holding the lease.

        A run that waited for another skips what that run published if the spec is the same,
        ``overwrite`` or not: the output it was asked to replace has been replaced.
        """
        try:
            self.lease.acquire(wait=wait, notify=notify)
        except OSError as exc:
            raise StorageError(f"output.uri: cannot take the lease on {self.location}: {exc}") from None
        try:
            done = self.completed()
            fresh = done is not None and self._seen is not None and done.manifest.get("run_id") != self._seen[0]
            if done is not None and fresh and done.manifest.get("spec_sha256") == self.spec_digest:
                self.release()
                return done
            done = self.check_rerun(overwrite=overwrite)
        except BaseException:
            self.release()
            raise
        if done is not None:
            self.release()
        return done

    def release(self) -> None:
        """Give up the lease, and remove the output prefix if nothing is left in it."""
        self.lease.release()
        with contextlib.suppress(OSError):
            self.backend.prune()

    def write_json(self, name: str, document: Any) -> None:
        """Write a JSON document into this run's prefix."""
        data = json.dumps(document, indent=2, sort_keys=False).encode() + b"\n"
        self._put(f"{self._staged}/{name}", data)

    def write_text(self, name: str, text: str) -> None:
        """Write a text file (e.g. report.html) into this run's prefix."""
        self._put(f"{self._staged}/{name}", text.encode())

    @property
    def _staged(self) -> str:
        return f"{RUNS}/{self.run_id}"

    def _put(self, key: str, data: bytes) -> None:
        try:
            self.backend.write_bytes(key, data)
        except OSError as exc:
            raise StorageError(f"output: writing {self.location.join(key)} failed: {exc}") from None
        self.counters.put_requests += 1
        self.counters.bytes_written += len(data)

    def commit(self) -> dict[str, Any]:
        """Publish this run's prefix by writing ``_SUCCESS`` (holding the lease, checked just
        before), then remove what it replaced; returns the manifest."""
        backend = self.backend
        try:
            staged = backend.list(self._staged)
            previous = self.completed()
            manifest = {
                "run_id": self.run_id,
                "prefix": self._staged,
                "spec_sha256": self.spec_digest,
                "arrayjob_version": __version__,
                "committed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "files": [{"path": key[len(self._staged) + 1 :], "bytes": size} for key, size in staged.items()],
            }
            self.lease.check()
            self._put(SUCCESS, json.dumps(manifest, indent=2).encode() + b"\n")
        except OSError as exc:
            raise StorageError(f"output: publishing {self.location} failed: {exc}") from None
        self._published = True
        with contextlib.suppress(OSError):  # published: what is left over, the next publish removes
            self._remove_replaced(previous)
        return manifest

    def _remove_replaced(self, previous: Completed | None) -> None:
        """After publishing: remove every other run's prefix. The lease holder is the only
        live writer, so these are the replaced result and the staging of dead runs."""
        backend = self.backend
        others = {key.split("/", 2)[1] for key in backend.list(RUNS)} - {self.run_id}
        for run_id in sorted(others):
            backend.delete(f"{RUNS}/{run_id}")
        backend.delete(LEGACY_STAGING)
        if previous is not None and not previous.prefix:  # the layout before runs/: files at the top
            tops = {str(f["path"]).split("/", 1)[0] for f in previous.manifest.get("files", [])}
            for top in sorted(tops - {SUCCESS, RUNS, LEASES}):
                backend.delete(top)
        backend.prune()

    def give_up(self) -> None:
        """When this process is about to end without unwinding: remove this run's prefix and
        release the lease, so a rerun starts at once instead of waiting for it to expire."""
        self.abandon()
        self.release()

    def abandon(self) -> None:
        """After a failed run: remove this run's prefix, unless ``_SUCCESS`` already names it."""
        with contextlib.suppress(OSError, StorageError):  # best effort: the next publish removes it
            # a _SUCCESS write that failed on the client may still have reached the storage
            if self._published or (self.completed() or Completed({})).manifest.get("run_id") == self.run_id:
                return
            self.backend.delete(self._staged)
