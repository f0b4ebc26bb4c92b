"""Where a run is recorded besides its own report: an MLflow run (``integrations.mlflow``) and
OpenLineage run events (``integrations.lineage``), each a ``RunObserver`` (``integrations.base``).

``RunTracking`` is the one hook the runner calls: ``for_spec`` before anything runs (a missing
extra the spec asks for is a ``SpecError`` then), ``start`` once the run holds its output,
``complete`` once it is published, ``fail`` when it is not. None of them fails the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arrayjob.integrations.base import (
    Guarded,
    RunObserver,
    RunPublished,
    RunStarted,
    Warn,
    first_line,
)

if TYPE_CHECKING:
    from arrayjob.runtime.metrics import ProgressEvent, RunMetrics
    from arrayjob.spec import JobSpec

__all__ = ["RunPublished", "RunStarted", "RunTracking"]


class RunTracking:
    """The observers a run has (none, MLflow, lineage or both), each guarded (``base.Guarded``)."""

    def __init__(self, observers: list[RunObserver], warn: Warn) -> None:
        self.observers = [Guarded(o, warn) for o in observers]
        self.run: RunStarted | None = None

    @classmethod
    def for_spec(cls, spec: JobSpec, warn: Warn) -> RunTracking:
        """The observers ``spec`` and the environment ask for. The spec asking for MLflow
        without its client installed is a ``SpecError``; the environment asking for one whose
        client is missing is a warning."""
        from arrayjob.integrations import lineage, mlflow

        observers: list[RunObserver] = []
        uri = mlflow.tracking_uri(spec)
        if uri is not None:
            if mlflow.check_installed(spec):
                observers.append(mlflow.MlflowRun(uri, spec))
            else:
                warn(f"mlflow: MLFLOW_TRACKING_URI is set but MLflow's client is not installed ({mlflow.EXTRA}); "
                     "the run is not tracked")
        if lineage.wanted():
            if not lineage.installed():
                warn(f"lineage: OPENLINEAGE_URL or OPENLINEAGE_CONFIG is set but openlineage-python is not "
                     f"installed ({lineage.EXTRA}); no lineage events")
            else:
                try:
                    observers.append(lineage.LineageEvents())
                except Exception as exc:  # the client's own settings (a bad config file): not the job's failure
                    warn(f"lineage: cannot make the OpenLineage client: {first_line(exc)}; no lineage events")
        return cls(observers, warn)

    def start(self, run: RunStarted, metrics: RunMetrics) -> None:
        self.run = run
        for guard in self.observers:
            guard.call("starting the run", guard.observer.start, run)
        if self.observers:
            metrics.listen(self._event)

    def _event(self, event: ProgressEvent) -> None:
        for guard in self.observers:
            guard.call("logging progress", guard.observer.event, event)

    def complete(self, published: RunPublished) -> None:
        assert self.run is not None
        for guard in self.observers:
            guard.call("recording the published run", guard.observer.complete, self.run, published)

    def fail(self, error: BaseException) -> None:
        if self.run is None:  # the run failed before it started: nothing was told
            return
        for guard in self.observers:
            guard.call("recording the failure", guard.observer.fail, self.run, error)

