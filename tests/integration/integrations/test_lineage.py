"""OpenLineage run events: START and COMPLETE of a published run, START and FAIL of one that
fails, sent by openlineage-python's client to a receiver on loopback (its HTTP transport,
``OPENLINEAGE_URL``) or to a file (its file transport, ``OPENLINEAGE_CONFIG``); every event is
checked against OpenLineage's schema (``tests/harness/openlineage_schema.py``), the datasets against
what zarr itself reads of the inputs and what ``_SUCCESS`` names."""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import zarr

from arrayjob.integrations.lineage import dataset_name, parent_id
from arrayjob.io.locations import parse_uri
from tests.harness.helpers import logreg_data, published, run_cli, write_array, write_spec
from tests.harness.openlineage_schema import validate

pytest.importorskip("openlineage.client", reason="the lineage extra: pip install 'arrayjob[lineage]'")

PARENT_RUN, ROOT_RUN = str(uuid.uuid4()), str(uuid.uuid4())


class Receiver(ThreadingHTTPServer):
    """An OpenLineage HTTP endpoint on loopback: keeps every event POSTed to /api/v1/lineage."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.paths.append(self.path)
                receiver.events.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A small logistic regression (4 row blocks), lineage settings cleared; afterwards, the
    OPENLINEAGE__TRANSPORT__... variables the client derives from OPENLINEAGE_URL removed too."""
    for name in ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG", "OPENLINEAGE_PARENT_ID", "OPENLINEAGE_ROOT_PARENT_ID",
                 "OPENLINEAGE_NAMESPACE", "OPENLINEAGE_DISABLED", "MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    X, y = logreg_data(400, 3)
    write_array(str(tmp_path / "X.zarr"), X, (100, 3))
    write_array(str(tmp_path / "y.zarr"), y, (100,))
    write_spec(tmp_path / "job.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out",
               params="max_iter = 5\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [n for n in os.environ if n.startswith("OPENLINEAGE__")]:
        del os.environ[name]


def test_dataset_names_follow_openlineage_naming():
    assert dataset_name(parse_uri("s3://bucket/data/X.zarr")) == ("s3://bucket", "data/X.zarr")
    assert dataset_name(parse_uri("/data/X.zarr/")) == ("file", "/data/X.zarr")
    # Airflow's lineage_parent_id: namespace/dag_id.task_id/run id (a task id may hold no slash, a
    # job name may)
    assert parent_id("airflow/arrayjob_daily.submit/" + PARENT_RUN) == ("airflow", "arrayjob_daily.submit", PARENT_RUN)
    assert parent_id("ns/a/b/" + PARENT_RUN) == ("ns", "a/b", PARENT_RUN)
    assert parent_id("nonsense") is None
    assert parent_id("") is None


@pytest.mark.ray
def test_published_run_sends_start_and_complete(job, receiver, ray_session, monkeypatch, capsys):
    monkeypatch.setenv("OPENLINEAGE_URL", receiver.url)
    monkeypatch.setenv("OPENLINEAGE_NAMESPACE", "nightly")
    # as the shipped DAG passes them from Airflow's lineage_parent_id / lineage_root_parent_id
    monkeypatch.setenv("OPENLINEAGE_PARENT_ID", f"airflow/arrayjob_daily.submit/{PARENT_RUN}")
    monkeypatch.setenv("OPENLINEAGE_ROOT_PARENT_ID", f"airflow/arrayjob_daily/{ROOT_RUN}")
    code, _, err = run_cli(["run", "job.toml", "-q"], capsys)
    assert code == 0, err
    assert "warning" not in err, err
    assert [e["eventType"] for e in receiver.events] == ["START", "COMPLETE"]
    assert set(receiver.paths) == {"/api/v1/lineage"}
    for event in receiver.events:
        validate(event)
    start, complete = receiver.events
    assert start["run"]["runId"] == complete["run"]["runId"]
    assert complete["job"]["namespace"] == "nightly" and complete["job"]["name"] == "test-logreg"
    parent = complete["run"]["facets"]["parent"]
    assert parent["run"]["runId"] == PARENT_RUN
    assert (parent["job"]["namespace"], parent["job"]["name"]) == ("airflow", "arrayjob_daily.submit")
    assert parent["root"]["run"]["runId"] == ROOT_RUN and parent["root"]["job"]["name"] == "arrayjob_daily"

    inputs = {d["name"]: d for d in complete["inputs"]}
    for name in ("X", "y"):
        stored = zarr.open_array(str(job / f"{name}.zarr"), mode="r")
        dataset = inputs[str(job / f"{name}.zarr")]
        assert dataset["namespace"] == "file"
        [field] = dataset["facets"]["schema"]["fields"]
        assert field["type"] == str(stored.dtype)
        assert " × ".join(map(str, stored.shape)) in field["description"]

    [output] = complete["outputs"]
    assert (output["namespace"], output["name"]) == ("file", str(job / "out"))
    manifest = json.loads((job / "out" / "_SUCCESS").read_text())
    assert output["facets"]["version"]["datasetVersion"] == manifest["run_id"]
    result = zarr.open_group(published(str(job / "out")) + "/result.zarr", mode="r")
    fields = {f["name"]: f for f in output["facets"]["schema"]["fields"]}
    assert set(fields) == {name for name, _ in result.arrays()}
    for name, array in result.arrays():
        assert fields[name]["type"] == str(array.dtype)
    statistics = output["outputFacets"]["outputStatistics"]
    assert statistics["size"] == sum(f["bytes"] for f in manifest["files"])
    assert "schema" not in start["outputs"][0]["facets"]  # nothing is known of the result at the start


@pytest.mark.ray
def test_failed_run_sends_fail_with_the_error_to_a_file(job, ray_session, monkeypatch, capsys):
    """The file transport (OPENLINEAGE_CONFIG); a chunk lost in the middle of X (a run checks only
    the first and last before it starts) fails the load: START, then FAIL with the error's line."""
    events = job / "events.jsonl"
    config = job / "openlineage.yml"
    config.write_text(f"transport:\n  type: file\n  log_file_path: {events}\n  append: true\n")
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(config))
    (job / "X.zarr" / "c" / "1" / "0").unlink()
    code, _, err = run_cli(["run", "job.toml", "-q"], capsys)
    assert code == 2, err
    sent = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["eventType"] for e in sent] == ["START", "FAIL"]
    for event in sent:
        validate(event)
    message = sent[1]["run"]["facets"]["errorMessage"]
    assert message["programmingLanguage"] == "python"
    assert message["message"].removeprefix("InputError: ") in err  # the one line the user saw
    assert "parent" not in sent[1]["run"]["facets"]
    assert not (job / "out" / "_SUCCESS").exists()


def test_off_without_settings_and_a_warning_without_the_client(job, monkeypatch, capsys):
    """No OPENLINEAGE_URL or OPENLINEAGE_CONFIG: no client at all. One set without the client
    installed: one warning naming the extra."""
    from arrayjob.integrations import RunTracking
    from arrayjob.spec import load_spec

    spec = load_spec(job / "job.toml")
    warnings: list[str] = []
    assert RunTracking.for_spec(spec, warnings.append).observers == []
    monkeypatch.setenv("OPENLINEAGE_URL", "http://127.0.0.1:9")
    monkeypatch.setitem(sys.modules, "openlineage.client", None)  # as if the lineage extra were not installed
    assert RunTracking.for_spec(spec, warnings.append).observers == []
    assert warnings == ["lineage: OPENLINEAGE_URL or OPENLINEAGE_CONFIG is set but openlineage-python is not "
                        "installed (pip install 'arrayjob[lineage]'); no lineage events"]


def test_the_events_of_each_end_are_valid_and_a_dead_receiver_is_one_warning(job, receiver, monkeypatch):
    """The hook alone, on the inputs' real metadata (no Ray): START, COMPLETE, FAIL and ABORT
    validate; a receiver that is gone is one warning, then nothing more is tried."""
    from arrayjob.integrations import RunPublished, RunStarted, RunTracking
    from arrayjob.runner import prepare
    from arrayjob.runtime.metrics import RunMetrics
    from arrayjob.spec import load_spec

    monkeypatch.setenv("OPENLINEAGE_URL", receiver.url)
    spec = load_spec(job / "job.toml")
    started = RunStarted(spec, "20260101T000000Z-00000000", prepare(spec).arrays)
    published = RunPublished({}, "", {"prefix": "runs/r", "files": [{"path": "result.zarr/w", "bytes": 10}]},
                             str(job / "out/runs/r"), {"coef": ((3,), "float64")})
    warnings: list[str] = []
    for end in ("COMPLETE", "FAIL", "ABORT"):
        tracking = RunTracking.for_spec(spec, warnings.append)
        tracking.start(started, RunMetrics())
        if end == "COMPLETE":
            tracking.complete(published)
        else:
            tracking.fail(ValueError("boom\nmore") if end == "FAIL" else KeyboardInterrupt())
    assert warnings == []
    assert [e["eventType"] for e in receiver.events] == ["START", "COMPLETE", "START", "FAIL", "START", "ABORT"]
    for event in receiver.events:
        validate(event)
    assert receiver.events[3]["run"]["facets"]["errorMessage"]["message"] == "ValueError: boom"
    assert receiver.events[1]["outputs"][0]["facets"]["schema"]["fields"] == [
        {"name": "coef", "type": "float64", "description": "result.zarr/coef, shape 3", "fields": []}]

    receiver.shutdown()
    receiver.server_close()  # nothing listens now; the client's HTTP transport without its retries
    # (5, with backoff: 9 s of this test), from a config file as OPENLINEAGE_CONFIG gives one
    monkeypatch.delenv("OPENLINEAGE_URL")
    for name in [n for n in os.environ if n.startswith("OPENLINEAGE__")]:
        monkeypatch.delenv(name)
    config = job / "openlineage.yml"
    config.write_text(f"transport:\n  type: http\n  url: {receiver.url}\n  retry:\n    total: 0\n")
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(config))
    tracking = RunTracking.for_spec(spec, warnings.append)
    tracking.start(started, RunMetrics())
    tracking.complete(published)
    assert len(warnings) == 1 and warnings[0].startswith("lineage: starting the run: "), warnings
    assert warnings[0].endswith("; the run goes on without it")
