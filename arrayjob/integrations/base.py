"""What a tracking integration sees of a run: it starts, it iterates, it is published or it fails.

``RunObserver`` is the one seam (MLflow in ``integrations.mlflow``, OpenLineage in
``integrations.lineage``); ``integrations.RunTracking`` calls each observer at the run's
lifecycle points. An observer never fails the run: whatever goes wrong in it is told as one
warning line and the observer goes quiet (``Guarded``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arrayjob.io.locations import ArrayInfo, Location
    from arrayjob.runtime.metrics import ProgressEvent
    from arrayjob.spec import JobSpec

Warn = Callable[[str], None]


@dataclass(frozen=True)
class RunStarted:
    """A run that has taken its output and is about to connect: what is known before it computes."""

    spec: JobSpec
    run_id: str  # arrayjob's run id: the prefix the run is staged and published under
    inputs: Mapping[str, ArrayInfo]  # the inputs read as arrays (published models are not)
    models: Mapping[str, Location] = field(default_factory=dict)  # inputs read as published models


@dataclass(frozen=True)
class RunPublished:
    """A run whose ``_SUCCESS`` is written: its report, its rendered report.html, its manifest,
    where the published run is (the output URI, then the prefix ``_SUCCESS`` names), and the
    small arrays of its result (name -> shape, dtype)."""

    report: dict[str, Any]
    html: str
    manifest: dict[str, Any]
    result_uri: str
    arrays: Mapping[str, tuple[tuple[int, ...], str]]


class RunObserver(ABC):
    """One integration's view of a run. Called in the driver's thread, in this order: ``start``
    once, ``event`` for each progress event, then ``complete`` or ``fail`` once."""

    name: str  # in warnings: "mlflow", "lineage"

    @abstractmethod
    def start(self, run: RunStarted) -> None: ...

    def event(self, event: ProgressEvent) -> None:  # noqa: B027 - most observers take only the ends
        pass

    @abstractmethod
    def complete(self, run: RunStarted, published: RunPublished) -> None: ...

    @abstractmethod
    def fail(self, run: RunStarted, error: BaseException) -> None: ...


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class Guarded:
    """An observer whose every call is guarded: the first error is one warning
    (``<name>: <what failed>: <error>; the run goes on without it``), then it is left alone."""

    def __init__(self, observer: RunObserver, warn: Warn) -> None:
        self.observer = observer
        self.warn = warn
        self.broken = False

    def call(self, what: str, method: Callable[..., None], *args: Any) -> None:
        if self.broken:
            return
        try:
            method(*args)
        except Exception as exc:  # never the run's failure: a tracking server is not the job
            self.broken = True
            self.warn(f"{self.observer.name}: {what}: {first_line(exc)}; the run goes on without it")
