"""Nothing is published until it is complete.

A run writes everything under ``<output>/_staging/<run_id>/``, then publishes: the staged
files are moved into ``<output>/`` (a rename on local disk, server-side copies on S3) and
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
from arrayjob.io.locations import Location, StorageCounters, StorageOptions
from arrayjob.io.storage import filesystem

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
        self._fs = filesystem(location.scheme, options)

    def completed(self) -> Completed | None:
        """The manifest of a complete output here, or None."""
        path = self.location.join(SUCCESS).path
        try:
            if not self._fs.exists(path):
                return None
            with self._fs.open(path, "rb") as f:
                return Completed(json.loads(f.read()))
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
        self._put(self.staging.join(name), data)

    def write_text(self, name: str, text: str) -> None:
        """Write a text file (e.g. report.html) into the staging area."""
        self._put(self.staging.join(name), text.encode())

    def _put(self, location: Location, data: bytes) -> None:
        try:
            self._fs.pipe_file(location.path, data)
        except OSError as exc:
            raise StorageError(f"output: writing {location} failed: {exc}") from None
        self.counters.put_requests += 1
        self.counters.bytes_written += len(data)

    def commit(self) -> dict[str, Any]:
        """Publish the staged files and write ``_SUCCESS`` last; returns the manifest."""
        fs = self._fs
        try:
            staged = sorted(fs.find(self.staging.path, detail=True).items())
            if fs.exists(self.location.join(SUCCESS).path):
                fs.rm_file(self.location.join(SUCCESS).path)  # unpublish before replacing
            relative = [p[len(self.staging.path) + 1 :] for p, _ in staged]
            for top in {r.split("/", 1)[0] for r in relative}:
                target = self.location.join(top).path
                if fs.exists(target):
                    fs.rm(target, recursive=True)
            sources = [p for p, _ in staged]
            targets = [self.location.join(r).path for r in relative]
            if self.location.is_s3:
                # Server-side copies, issued concurrently by s3fs; staging is deleted below.
                fs.copy(sources, targets)
                self.counters.put_requests += len(staged)
            else:
                for source, target in zip(sources, targets, strict=True):
                    fs.mv(source, target)  # a rename
            manifest = {
                "run_id": self.run_id,
                "spec_sha256": self.spec_digest,
                "arrayjob_version": __version__,
                "committed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "files": [
                    {"path": r, "bytes": int(info.get("size") or 0)}
                    for r, (_, info) in zip(relative, staged, strict=True)
                ],
            }
            self._put(self.location.join(SUCCESS), json.dumps(manifest, indent=2).encode() + b"\n")
            self.remove_staging()
        except OSError as exc:
            raise StorageError(f"output: publishing {self.location} failed: {exc}") from None
        return manifest

    def abandon(self) -> None:
        """After a failed run: remove this run's staging, and the output prefix if now empty."""
        try:
            if self._fs.exists(self.staging.path):
                self._fs.rm(self.staging.path, recursive=True)
            if not self.location.is_s3 and not self._fs.find(self.location.path):
                self._fs.rm(self.location.path, recursive=True)  # empty directories left behind
        except OSError:
            pass  # best effort: nothing published, and the next run cleans staging

    def remove_staging(self) -> None:
        """Remove every staging prefix under the output (ours and those of dead runs)."""
        path = self.location.join(STAGING).path
        try:
            if self._fs.exists(path):
                self._fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
