"""Nothing is published until it is complete.

A run writes everything under ``<output>/_staging/<run_id>/``, then publishes: the staged
files are moved into ``<output>/`` (``StorageBackend.move``: a rename on local disk,
server-side copies on S3) and
``<output>/_SUCCESS``, a JSON manifest, is written last. A reader that sees ``_SUCCESS``
sees a complete result; a run that dies before it leaves only a staging prefix, which
the next run of the same output removes.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any

from arrayjob import __version__
from arrayjob.errors import SpecError, StorageError
from arrayjob.io.backend import backend_for
from arrayjob.io.locations import Location, StorageCounters, StorageOptions

SUCCESS = "_SUCCESS"
STAGING = "_staging"


@dataclass(frozen=True)
class Completed:
    """An output whose ``_SUCCESS`` manifest exists."""

    manifest: dict[str, Any]


class JobOutput:
    """The output prefix of one job: its state, its staging area and its commit."""

    def __init__(self, location: Location, options: StorageOptions, spec_digest: str) -> None:
        self.location = location
        self.options = options
        self.spec_digest = spec_digest
        self.run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:8]
        self.staging = location.join(STAGING, self.run_id)
        self.counters = StorageCounters()
        self.backend = backend_for(location, options)

    def completed(self) -> Completed | None:
        """The manifest of a complete output here, or None."""
        try:
            return Completed(json.loads(self.backend.read_bytes(SUCCESS)))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StorageError(f"output.uri: cannot read {self.location}/{SUCCESS}: {exc}") from None

    def check_rerun(self, *, overwrite: bool) -> Completed | None:
        """The completed output this run would skip, or None if the run must go ahead.

        A complete output of the same spec is skipped (idempotent reruns); one written by
        a different spec is an error unless ``overwrite``.
        """
        done = self.completed()
        if done is None or overwrite:
            return None
        if done.manifest.get("spec_sha256") != self.spec_digest:
            raise SpecError(
                f"output.uri: {self.location} holds a complete result of a different spec "
                f"(run {done.manifest.get('run_id', '?')}); pass --overwrite to replace it"
            )
        return done

    def write_json(self, name: str, document: Any) -> None:
        """Write a JSON document into the staging area."""
        data = json.dumps(document, indent=2, sort_keys=False).encode() + b"\n"
        self._put(f"{self._staged}/{name}", data)

    def write_text(self, name: str, text: str) -> None:
        """Write a text file (e.g. report.html) into the staging area."""
        self._put(f"{self._staged}/{name}", text.encode())

    @property
    def _staged(self) -> str:
        return f"{STAGING}/{self.run_id}"

    def _put(self, key: str, data: bytes) -> None:
        try:
            self.backend.write_bytes(key, data)
        except OSError as exc:
            raise StorageError(f"output: writing {self.location.join(key)} failed: {exc}") from None
        self.counters.put_requests += 1
        self.counters.bytes_written += len(data)

    def commit(self) -> dict[str, Any]:
        """Publish the staged files and write ``_SUCCESS`` last; returns the manifest."""
        backend = self.backend
        try:
            staged = backend.list(self._staged)
            backend.delete(SUCCESS)  # unpublish before replacing
            relative = {key[len(self._staged) + 1 :]: size for key, size in staged.items()}
            for top in {r.split("/", 1)[0] for r in relative}:
                backend.delete(top)
            self.counters.put_requests += backend.move((f"{self._staged}/{r}", r) for r in relative)
            manifest = {
                "run_id": self.run_id,
                "spec_sha256": self.spec_digest,
                "arrayjob_version": __version__,
                "committed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "files": [{"path": r, "bytes": size} for r, size in relative.items()],
            }
            self._put(SUCCESS, json.dumps(manifest, indent=2).encode() + b"\n")
            self.remove_staging()
        except OSError as exc:
            raise StorageError(f"output: publishing {self.location} failed: {exc}") from None
        return manifest

    def abandon(self) -> None:
        """After a failed run: remove this run's staging, and the output prefix if now empty."""
        try:
            self.backend.delete(self._staged)
            if not self.backend.list():
                self.backend.delete()  # empty directories left behind on disk
        except OSError:
            pass  # best effort: nothing published, and the next run cleans staging

    def remove_staging(self) -> None:
        """Remove every staging prefix under the output (ours and those of dead runs)."""
        self.backend.delete(STAGING)
