"""A run as an MLflow run: the spec's params, a metric per iteration, the final figures, the
spec and the report as artifacts, and a tag naming the published result.

On with ``[tracking] mlflow = "http://host:5000"`` or ``MLFLOW_TRACKING_URI`` (the spec wins).
The experiment is ``[tracking] experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else
``MLFLOW_EXPERIMENT_ID``, else the job's name (created if missing). With ``MLFLOW_RUN_ID`` set,
as ``mlflow run`` and a parent process's ``mlflow.start_run`` set it, the arrayjob run is
that run's child (``mlflow.parentRunId``), in its experiment: a run's params cannot change
once logged, so each arrayjob run is a run of its own.

A server that cannot be reached costs one warning, not the job: requests time out after
``MLFLOW_HTTP_REQUEST_TIMEOUT`` seconds (5 here unless set) and are tried again at most
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` times (1 here unless set); MLflow's own defaults, 120 s and
7 retries with backoff, would hold a nightly job for minutes.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from arrayjob.errors import SpecError
from arrayjob.integrations.base import RunObserver, RunPublished, RunStarted, first_line
from arrayjob.report.build import lookup

if TYPE_CHECKING:
    from arrayjob.runtime.metrics import ProgressEvent
    from arrayjob.spec import JobSpec

EXTRA = "pip install 'arrayjob[mlflow]'"
TIMEOUTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "5", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}
# the figures an iteration event may carry (runtime.metrics.RunMetrics.iteration)
ITERATION_FIGURES = ("objective", "gradient_norm", "l1_change", "shift", "fit")
FLUSH_SECONDS = 5.0  # iteration metrics are sent in batches, at most this often (and at the end)
BATCH = 1000  # MLflow's most metrics in one log_batch
PARAM_CHARS = 6000  # MLflow's longest param value
# the final figures: metric name -> report key (costing.report: report.json's keys, docs/report.md)
FINAL_FIGURES = {
    "wall_seconds": "wall_seconds",
    "bytes_read": "storage.bytes_read",
    "bytes_written": "storage.bytes_written",
    "get_requests": "storage.get_requests",
    "put_requests": "storage.put_requests",
    "bytes_between_nodes": "network.bytes_between_nodes",
    "node_seconds": "nodes.node_seconds",
    "dollars": "dollars.total",
    "estimate.wall_seconds": "estimate.wall_seconds",
    "estimate.dollars": "estimate.dollars.total",
}


def tracking_uri(spec: JobSpec) -> str | None:
    """The tracking server the run logs to, or None: the spec's, else ``MLFLOW_TRACKING_URI``."""
    return spec.tracking.mlflow or os.environ.get("MLFLOW_TRACKING_URI") or None


def check_installed(spec: JobSpec) -> bool:
    """Whether MLflow's client can be imported. The spec asking for it without it is a
    ``SpecError``; only the environment asking for it is False (the caller warns)."""
    try:
        import mlflow.tracking  # noqa: F401
    except ImportError:
        if spec.tracking.mlflow:
            raise SpecError(f"tracking.mlflow: MLflow's client is not installed ({EXTRA})") from None
        return False
    return True


def _flat(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flat(f"{prefix}.{k}", v)
    else:
        yield prefix, value


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and value == value and abs(value) != float("inf"):
        return float(value)
    return None


class MlflowRun(RunObserver):
    """The MLflow run of one arrayjob run (``mlflow.tracking.MlflowClient``: no global state)."""

    name = "mlflow"

    def __init__(self, uri: str, spec: JobSpec) -> None:
        self.uri = uri
        self.experiment = spec.tracking.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or None
        self.experiment_id = None if self.experiment else os.environ.get("MLFLOW_EXPERIMENT_ID") or None
        self.parent = os.environ.get("MLFLOW_RUN_ID") or None
        self.run_id: str | None = None
        self._pending: list[Any] = []  # iteration metrics not yet sent
        self._sent_at = time.monotonic()

    def start(self, run: RunStarted) -> None:
        for variable, value in TIMEOUTS.items():
            os.environ.setdefault(variable, value)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        spec = run.spec
        if self.parent:
            experiment_id = self.client.get_run(self.parent).info.experiment_id
        elif self.experiment_id:
            experiment_id = self.experiment_id
        else:
            name = self.experiment or spec.name
            found = self.client.get_experiment_by_name(name)
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(name)
        tags = {"arrayjob.job": spec.name, "arrayjob.algorithm": spec.algorithm, "arrayjob.run_id": run.run_id,
                "arrayjob.output": str(spec.output), "mlflow.source.name": "arrayjob", "mlflow.source.type": "JOB"}
        if self.parent:
            tags["mlflow.parentRunId"] = self.parent
        self.run_id = self.client.create_run(experiment_id, tags=tags, run_name=f"{spec.name}-{run.run_id}").info.run_id
        # every parameter the algorithm ran with, defaults included, not only those the spec wrote
        given = spec.resolved.get("params", {})
        if dataclasses.is_dataclass(spec.params) and not isinstance(spec.params, type):
            given = dataclasses.asdict(spec.params)
        params = dict(_flat("params", given))
        params.update({f"inputs.{name}": str(location) for name, location in spec.inputs.items()})
        params["output.uri"] = str(spec.output)
        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:PARAM_CHARS]) for k, v in sorted(params.items())])

    def event(self, event: ProgressEvent) -> None:
        if event.kind != "iteration" or self.run_id is None:
            return
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        step = int(event.data["iteration"])  # type: ignore[call-overload]
        for key in ITERATION_FIGURES:
            value = _number(event.data.get(key))
            if value is not None:
                self._pending.append(Metric(key, value, stamp, step))
        if time.monotonic() - self._sent_at >= FLUSH_SECONDS:
            self._flush()

    def _flush(self) -> None:
        assert self.run_id is not None
        pending, self._pending = self._pending, []
        for at in range(0, len(pending), BATCH):
            self.client.log_batch(self.run_id, metrics=pending[at:at + BATCH])
        self._sent_at = time.monotonic()

    def complete(self, run: RunStarted, published: RunPublished) -> None:
        import tomli_w
        from mlflow.entities import Metric

        assert self.run_id is not None
        self._flush()
        report, stamp = published.report, int(time.time() * 1000)
        figures = {name: lookup(report, key) for name, key in FINAL_FIGURES.items()}
        figures.update({f"estimate_error.{k}": v for k, v in (report.get("estimate_error") or {}).items()})
        figures.update({f"result.{k}": v for k, v in (report.get("result") or {}).items()})
        metrics = [Metric(k, n, stamp, 0) for k, v in figures.items() if (n := _number(v)) is not None]
        for at in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[at:at + BATCH])
        self.client.log_text(self.run_id, tomli_w.dumps(run.spec.redacted()), "spec.toml")
        self.client.log_dict(self.run_id, report, "report.json")
        self.client.log_text(self.run_id, published.html, "report.html")
        self.client.set_tag(self.run_id, "arrayjob.result_uri", published.result_uri)
        self.client.set_terminated(self.run_id, "FINISHED")

    def fail(self, run: RunStarted, error: BaseException) -> None:
        if self.run_id is None:
            return
        try:
            self._flush()
        finally:
            self.client.set_tag(self.run_id, "arrayjob.error", first_line(error)[:PARAM_CHARS])
            self.client.set_terminated(self.run_id, "FAILED" if isinstance(error, Exception) else "KILLED")
