"""A run as OpenLineage run events: START when it has taken its output, COMPLETE when it is
published, FAIL (ABORT when interrupted or terminated) when it is not.

On when ``OPENLINEAGE_URL`` or ``OPENLINEAGE_CONFIG`` is set (the client's own settings choose
the transport: HTTP, a file, Kafka, ...), off otherwise; ``OPENLINEAGE_DISABLED=true`` turns it
off too. The job is ``OPENLINEAGE_NAMESPACE`` (else ``arrayjob``) / the job's name. The
datasets are named from their URIs as OpenLineage's naming convention says: ``s3://bucket`` and
the key for S3, ``file`` and the absolute path for local disk. Inputs carry a schema facet
(an array: one field, its dtype, shape and chunks; a Parquet table: its selected columns);
the output, the spec's ``output.uri``, carries the published run as its version and, on
COMPLETE, the result's arrays and the bytes written.

The parent run: ``OPENLINEAGE_PARENT_ID`` (``namespace/job/run id``, as Airflow's
``lineage_parent_id`` macro renders it and as openlineage-dbt reads it) and
``OPENLINEAGE_ROOT_PARENT_ID`` (the DAG run, ``lineage_root_parent_id``); the shipped DAG
(``deploy/airflow``) passes both when Airflow's OpenLineage provider is installed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from arrayjob import __version__
from arrayjob.integrations.base import RunObserver, RunPublished, RunStarted, first_line

if TYPE_CHECKING:
    from arrayjob.io.locations import ArrayInfo, Location

EXTRA = "pip install 'arrayjob[lineage]'"
PRODUCER = f"urn:arrayjob:{__version__}"  # who made the events: a URI naming arrayjob and its version
DEFAULT_NAMESPACE = "arrayjob"
CLOSE_SECONDS = 10.0  # at most this long for the transport to send what it holds, at the end


def wanted() -> bool:
    """Whether the environment asks for lineage (``OPENLINEAGE_URL`` or ``OPENLINEAGE_CONFIG``)."""
    return bool(os.environ.get("OPENLINEAGE_URL") or os.environ.get("OPENLINEAGE_CONFIG"))


def installed() -> bool:
    try:
        import openlineage.client  # noqa: F401
    except ImportError:
        return False
    return True


def dataset_name(location: Location) -> tuple[str, str]:
    """(namespace, name) of a stored dataset, by OpenLineage's naming convention."""
    if location.is_s3:
        bucket, _, key = location.path.partition("/")
        return f"s3://{bucket}", key.rstrip("/")
    return "file", os.path.abspath(location.path)


def parent_id(value: str | None) -> tuple[str, str, str] | None:
    """``namespace/job/run id`` -> its parts; the job name may hold slashes, the namespace not."""
    if not value:
        return None
    namespace, _, rest = value.partition("/")
    job, _, run_id = rest.rpartition("/")
    return (namespace, job, run_id) if namespace and job and run_id else None


def _schema(fields: list[Any]) -> Any:
    from openlineage.client.facet_v2 import schema_dataset

    return schema_dataset.SchemaDatasetFacet(fields=fields, producer=PRODUCER)


def input_schema(info: ArrayInfo) -> Any:
    """An array: one field of its dtype, its shape and chunks in the description; a table: a
    field per selected column (read as float64)."""
    from openlineage.client.facet_v2 import schema_dataset

    Field = schema_dataset.SchemaDatasetFacetFields
    if info.table is not None:
        return _schema([Field(name=c, type="float64", description="a column of the matrix read")
                        for c in info.table.columns])
    shape = " × ".join(str(n) for n in info.shape)
    layout = "sparse CSR" if info.sparse is not None else f"Zarr v{info.zarr_format}"
    return _schema([Field(name=info.name, type=info.dtype,
                          description=f"{layout} array, shape {shape}, chunks {tuple(info.chunks)}")])


class LineageEvents(RunObserver):
    """The run events of one run, sent by openlineage-python's client."""

    name = "lineage"

    def __init__(self) -> None:
        from openlineage.client import OpenLineageClient
        from openlineage.client.uuid import generate_new_uuid

        self.client = OpenLineageClient()
        self.run_uuid = str(generate_new_uuid())  # OpenLineage's run ids are UUIDs (v7)
        self.namespace = os.environ.get("OPENLINEAGE_NAMESPACE") or DEFAULT_NAMESPACE

    def _send(self, state: str, run: RunStarted, run_facets: Mapping[str, Any], outputs: list[Any],
              inputs: list[Any]) -> None:
        from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
        from openlineage.client.facet_v2 import job_type_job, parent_run, processing_engine_run

        facets: dict[str, Any] = {
            "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
                version=__version__, name="arrayjob", producer=PRODUCER),
            **run_facets,
        }
        parent = parent_id(os.environ.get("OPENLINEAGE_PARENT_ID"))
        if parent is not None:
            root = parent_id(os.environ.get("OPENLINEAGE_ROOT_PARENT_ID"))
            facets["parent"] = parent_run.ParentRunFacet(
                run=parent_run.Run(runId=parent[2]), job=parent_run.Job(namespace=parent[0], name=parent[1]),
                root=None if root is None else parent_run.Root(
                    run=parent_run.RootRun(runId=root[2]), job=parent_run.RootJob(namespace=root[0], name=root[1])),
                producer=PRODUCER)
        job_facets: dict[str, Any] = {"jobType": job_type_job.JobTypeJobFacet(
            processingType="BATCH", integration="ARRAYJOB", jobType="JOB", producer=PRODUCER)}
        event = RunEvent(eventType=getattr(RunState, state), eventTime=datetime.now(UTC).isoformat(),
                         run=Run(runId=self.run_uuid, facets=facets),
                         job=Job(namespace=self.namespace, name=run.spec.name, facets=job_facets),
                         inputs=inputs, outputs=outputs, producer=PRODUCER)
        self.client.emit(event)

    def _inputs(self, run: RunStarted) -> list[Any]:
        from openlineage.client.event_v2 import InputDataset

        datasets = []
        for info in run.inputs.values():
            namespace, name = dataset_name(info.location)
            datasets.append(InputDataset(namespace=namespace, name=name, facets={"schema": input_schema(info)}))
        for location in run.models.values():  # a published model read as an input: its output URI
            namespace, name = dataset_name(location)
            datasets.append(InputDataset(namespace=namespace, name=name))
        return datasets

    def _output(self, run: RunStarted, published: RunPublished | None = None) -> Any:
        from openlineage.client.event_v2 import OutputDataset
        from openlineage.client.facet_v2 import (
            dataset_version_dataset,
            output_statistics_output_dataset,
        )

        namespace, name = dataset_name(run.spec.output)
        facets: dict[str, Any] = {"version": dataset_version_dataset.DatasetVersionDatasetFacet(
            datasetVersion=run.run_id, producer=PRODUCER)}
        output_facets: dict[str, Any] = {}
        if published is not None:
            from openlineage.client.facet_v2 import schema_dataset

            Field = schema_dataset.SchemaDatasetFacetFields
            facets["schema"] = _schema([
                Field(name=array, type=dtype, description=f"result.zarr/{array}, shape "
                      + (" × ".join(str(n) for n in shape) or "()"))
                for array, (shape, dtype) in published.arrays.items()])
            written = sum(int(f.get("bytes", 0)) for f in published.manifest.get("files", []))
            output_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                size=written, fileCount=len(published.manifest.get("files", [])), producer=PRODUCER)
        return OutputDataset(namespace=namespace, name=name, facets=facets, outputFacets=output_facets)

    def start(self, run: RunStarted) -> None:
        self._send("START", run, {}, [self._output(run)], self._inputs(run))

    def complete(self, run: RunStarted, published: RunPublished) -> None:
        try:
            self._send("COMPLETE", run, {}, [self._output(run, published)], self._inputs(run))
        finally:
            self.client.close(CLOSE_SECONDS)

    def fail(self, run: RunStarted, error: BaseException) -> None:
        from openlineage.client.facet_v2 import error_message_run

        facets = {"errorMessage": error_message_run.ErrorMessageRunFacet(
            message=first_line(error), programmingLanguage="python", producer=PRODUCER)}
        try:
            self._send("FAIL" if isinstance(error, Exception) else "ABORT", run, facets, [self._output(run)],
                       self._inputs(run))
        finally:
            self.client.close(CLOSE_SECONDS)
