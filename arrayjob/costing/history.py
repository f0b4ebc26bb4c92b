"""Estimates that learn: the recent runs of a spec correct the profile's prediction.

Every published run leaves a ``RunRecord`` in the history directory (``.arrayjob/history``
beside the machine profile, or ``ARRAYJOB_HISTORY``; ``off`` turns learning off): for each
stage, the seconds the profile predicted for the iterations the run did and the seconds the
run measured (report.json's ``stages`` and ``estimate.stages``), its wall time, and the
iterations it ran. The next ``estimate`` or ``run`` of the same spec (its digest: job,
inputs, params, output) made with the same profile multiplies each stage's predicted
seconds by the median of the recent runs' measured / predicted ratios, then scales the
stages together so that their sum is the profile's wall time times the median of the runs'
measured / predicted wall times (a sum of per-stage medians runs low when the stages' slow
runs are not the same runs: the median of the totals is the total's), and assumes the
median of their iteration counts; with no run of that spec, the recent runs of the same
algorithm on the same storage give the ratios alone (their data differ; their iteration
counts say nothing of this one's). Spartan refines its costs from observed runs; this is
that, per stage, on top of the calibrated rates.

The record holds the profile's own prediction, never the corrected one, so corrections do
not compound, and a record is named by its run id, so writing one twice is writing it once.
A record that cannot be read makes the estimate fall back to the profile, saying which.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from arrayjob.costing.profile import DEFAULT_PATH, MachineProfile

RECENT = 5  # the most runs a history uses: the median of their ratios
ENVIRONMENT = "ARRAYJOB_HISTORY"
OTHER = "(rest)"  # what no stage of the run measured: Ray's shutdown, validation, the report
FALLBACK = "estimated from the profile alone"


def history_dir() -> Path | None:
    """Where runs leave their records: ``ARRAYJOB_HISTORY``, else ``.arrayjob/history`` beside
    the profile ``calibrate`` saves; None when ``ARRAYJOB_HISTORY=off``."""
    given = os.environ.get(ENVIRONMENT, "")
    if given.lower() == "off":
        return None
    return Path(given) if given else DEFAULT_PATH.parent / "history"


def storage_key(spec: Any) -> str:
    """Where a spec's inputs live, as far as their speed goes: ``local``, or ``s3://bucket``."""
    places = sorted({"local" if not loc.is_s3 else "s3://" + loc.path.split("/", 1)[0]
                     for loc in spec.inputs.values()})
    return ",".join(places) or "none"


def profile_key(profile: MachineProfile) -> str:
    """A profile's identity: a record made with another profile corrects nothing here."""
    return f"{profile.name} @ {profile.measured_at or 'shipped'}"


@dataclass(frozen=True)
class RunRecord:
    """One published run, as the history keeps it: per stage, (predicted, measured) seconds."""

    run_id: str
    spec_sha256: str
    algorithm: str
    storage: str
    profile: str
    finished_at: float  # seconds since the epoch
    nodes: int
    iterations: int | None  # the iterations the run did (None: not an iterative job)
    wall_seconds: tuple[float, float]  # (predicted for the iterations done, measured)
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)

    def as_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        raw = json.loads(text)
        stages = {str(k): (float(v[0]), float(v[1])) for k, v in raw["stages"].items()}
        wall = raw["wall_seconds"]
        return cls(run_id=str(raw["run_id"]), spec_sha256=str(raw["spec_sha256"]), algorithm=str(raw["algorithm"]),
                   storage=str(raw["storage"]), profile=str(raw["profile"]), finished_at=float(raw["finished_at"]),
                   nodes=int(raw["nodes"]), iterations=None if raw["iterations"] is None else int(raw["iterations"]),
                   wall_seconds=(float(wall[0]), float(wall[1])), stages=stages)


def record_from_report(report: dict[str, Any], *, run_id: str, spec: Any, profile: MachineProfile,
                       finished_at: float | None = None) -> RunRecord:
    """The record of a published run from its report.json: the profile's prediction for the
    iterations it did (``estimate_rescaled`` when those differ from what was assumed) beside what
    each stage measured. A stage the prediction has and the run did not time (Ray's shutdown)
    goes with what the run's wall time holds beyond its stages, as ``OTHER``."""
    predicted = report.get("estimate_rescaled") or report["estimate"]
    profile_seconds = {s["name"]: float(s.get("profile_wall_seconds", s["wall_seconds"]))
                       for s in predicted["stages"]}
    # a sized run waits for its nodes inside its connect stage: the prediction's wait goes there too
    scale_up = float(predicted.get("nodes", {}).get("scale_up_seconds", 0.0))
    if "connect" in profile_seconds:
        profile_seconds["connect"] += scale_up
    measured = {s["name"]: float(s["wall_seconds"]) for s in report["stages"]}
    both = sorted(set(profile_seconds) & set(measured))
    stages = {name: (round(profile_seconds[name], 4), round(measured[name], 4)) for name in both}
    wall_predicted = sum(profile_seconds.values())
    wall = float(report["wall_seconds"])
    rest = (wall_predicted - sum(p for p, _ in stages.values()), wall - sum(m for _, m in stages.values()))
    if rest[0] > 0:
        stages[OTHER] = (round(rest[0], 4), round(max(0.0, rest[1]), 4))
    ran = report.get("result", {}).get("iterations")
    return RunRecord(run_id=run_id, spec_sha256=spec.digest(), algorithm=spec.algorithm, storage=storage_key(spec),
                     profile=profile_key(profile), finished_at=time.time() if finished_at is None else finished_at,
                     nodes=int(report.get("cluster", {}).get("nodes", 1)),
                     iterations=ran if isinstance(ran, int) and ran > 0 else None,
                     wall_seconds=(round(wall_predicted, 4), round(wall, 4)), stages=stages)


def save_record(record: RunRecord, directory: Path | None = None) -> Path | None:
    """Write ``record`` into the history (atomically; the same run twice is one file)."""
    root = directory if directory is not None else history_dir()
    if root is None:
        return None
    target = root / record.algorithm / record.spec_sha256[:16] / f"{record.run_id}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(record.as_json() + "\n")
    os.replace(partial, target)
    return target


@dataclass(frozen=True)
class History:
    """The recent runs an estimate learns from (``kind``: ``spec`` or ``algorithm``), or none
    and why (``note``)."""

    kind: str | None
    records: tuple[RunRecord, ...] = ()
    where: str = ""
    note: str = ""

    @property
    def used(self) -> bool:
        return bool(self.records)

    def factors(self) -> dict[str, float]:
        """Per stage, the median over the records of measured / predicted seconds."""
        ratios: dict[str, list[float]] = {}
        for record in self.records:
            for name, (predicted, measured) in record.stages.items():
                if predicted > 0:
                    ratios.setdefault(name, []).append(measured / predicted)
        return {name: statistics.median(values) for name, values in ratios.items()}

    def wall_factor(self) -> float | None:
        """The median over the records of their measured / predicted wall times."""
        ratios = [m / p for p, m in (r.wall_seconds for r in self.records) if p > 0]
        return statistics.median(ratios) if ratios else None

    @property
    def iterations(self) -> int | None:
        """The iterations this spec's runs did (their median): only a spec's own history says."""
        done = [r.iterations for r in self.records if r.iterations]
        return int(statistics.median_low(done)) if self.kind == "spec" and done else None

    def line(self) -> str:
        """One line: which history the estimate used, or why none."""
        if not self.used:
            return self.note
        runs = len(self.records)
        what = "this spec" if self.kind == "spec" else f"{self.records[0].algorithm} on the same storage"
        wall = self.wall_factor() or 1.0
        told = f"the last {runs} run{'s' if runs > 1 else ''} of {what} ({self.where}): the wall time ×{wall:.2f} " \
               f"of the profile's (the median of theirs), shared by the stages' measured / predicted times"
        if self.iterations:
            told += f", {self.iterations} iteration(s) assumed"
        return told

    def correct(self, stages: Sequence[StageTimes], scale_up_seconds: float) -> None:
        """Correct the stages' times by the recent runs' measured / predicted ratios, keeping the
        profile's own in ``profile_wall_seconds``. A sized run waits for its nodes in its connect
        stage, so connect's ratio covers the scale-up (``scale_up_seconds``); stages a run does
        not time (shutdown) take the ratio of what the run's wall time held beyond its stages.
        The stages are then scaled together to the runs' median wall ratio (``wall_factor``)."""
        factors = self.factors()
        if not factors:
            return
        profile_total = sum(stage.wall_seconds for stage in stages)
        for stage in stages:
            stage.profile_wall_seconds = stage.wall_seconds
            factor = factors.get(stage.name, factors.get(OTHER))
            if factor is None:
                continue
            if stage.name == "connect" and scale_up_seconds:
                waited = (stage.wall_seconds + scale_up_seconds) * factor
                stage.wall_seconds = max(0.0, waited - scale_up_seconds)
            else:
                stage.wall_seconds *= factor
        wall = self.wall_factor()
        corrected = sum(stage.wall_seconds for stage in stages)
        if wall is not None and corrected > 0:
            share = max(0.0, (profile_total + scale_up_seconds) * wall - scale_up_seconds) / corrected
            for stage in stages:
                stage.wall_seconds *= share

    def as_dict(self) -> dict[str, Any]:
        return {"used": self.used, "kind": self.kind, "where": self.where or None, "line": self.line(),
                "run_ids": [r.run_id for r in self.records],
                "factors": {k: round(v, 4) for k, v in sorted(self.factors().items())}}


NO_HISTORY = History(None)  # learning turned off (ARRAYJOB_HISTORY=off): nothing to say


class StageTimes(Protocol):
    """What ``History.correct`` reads and sets of an estimate's stage (``costing.estimate.StageEstimate``)."""
    name: str
    wall_seconds: float
    profile_wall_seconds: float | None


def recent_history(spec: Any, profile: MachineProfile, directory: Path | None = None,
                   limit: int = RECENT) -> History:
    """The last ``limit`` runs of ``spec`` made with ``profile``, else of its algorithm on the
    same storage; none (with the reason) when there are none or one cannot be read."""
    root = directory if directory is not None else history_dir()
    if root is None:
        return NO_HISTORY
    by_algorithm = root / spec.algorithm
    own = by_algorithm / spec.digest()[:16]
    mine, key = profile_key(profile), storage_key(spec)
    try:
        records = _read(own)
        same = [r for r in records if r.profile == mine and r.spec_sha256 == spec.digest()]
        if same:
            return History("spec", tuple(same[-limit:]), str(own))
        others = [r for d in sorted(by_algorithm.iterdir()) if d.is_dir() and d != own for r in _read(d)] \
            if by_algorithm.is_dir() else []
    except _Unreadable as exc:
        return History(None, note=f"{exc}; {FALLBACK}")
    alike = sorted((r for r in others if r.profile == mine and r.storage == key), key=lambda r: r.finished_at)
    if alike:
        return History("algorithm", tuple(alike[-limit:]), str(by_algorithm))
    why = "none made with this profile" if records or others else "none"
    return History(None, note=f"no runs of this spec or of {spec.algorithm} on {key} in {root} ({why}); {FALLBACK}")


class _Unreadable(Exception):
    pass


def _read(directory: Path) -> list[RunRecord]:
    """The records in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    records = []
    for path in sorted(directory.glob("*.json")):
        try:
            records.append(RunRecord.from_json(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            reason = f"no {exc} key" if isinstance(exc, KeyError) else (str(exc).splitlines() or [""])[0][:80]
            raise _Unreadable(f"history {path} is unreadable ({reason})") from None
    return sorted(records, key=lambda r: r.finished_at)
