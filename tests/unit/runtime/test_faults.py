"""Faults are survived and counted: storage retries (through a misbehaving S3 proxy), task
retries (a worker killed mid-task), and a permanent storage failure or a missing bucket is
one clear line. Nodes lost mid-job: ``tests/system/runtime/test_node_loss.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from arrayjob.errors import SpecError
from arrayjob.io.locations import StorageOptions
from tests.harness.helpers import logreg_data, write_array, write_spec

REPO = Path(__file__).resolve().parents[3]


def _logreg_on_s3(tmp_path: Path, bucket: str, endpoint: str, *, storage: str = "", out: str = "out") -> Path:
    X, y = logreg_data(2000, 4)
    write_array(f"s3://{bucket}/X.zarr", X, (250, 4), endpoint=endpoint)
    write_array(f"s3://{bucket}/y.zarr", y, (250,), endpoint=endpoint)
    return write_spec(tmp_path / f"{out}.toml", inputs={"X": f"s3://{bucket}/X.zarr", "y": f"s3://{bucket}/y.zarr"},
                      output=f"s3://{bucket}/{out}", params="max_iter = 50\n", storage=storage)


def _run(spec: Path, endpoint: str) -> Any:
    from arrayjob import runner
    from arrayjob.spec import load_spec

    return runner.run(load_spec(str(spec), [f"storage.endpoint_url={json.dumps(endpoint)}"]))


# -- storage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "transient"), [
    ("Server returned non-2xx status code: 503 Service Unavailable; retry_timeout: 180s", True),
    ("Server returned non-2xx status code: 429 Too Many Requests", True),
    ("Server returned non-2xx status code: 400 Bad Request: <Error><Code>RequestTimeout</Code></Error>", True),
    ("Server returned non-2xx status code: 404 Not Found: <Code>NoSuchBucket</Code>; retry_timeout: 180s", False),
    ("Server returned non-2xx status code: 403 Forbidden; retry_timeout: 180s", False),
    ("HTTP error: error sending request for url (http://127.0.0.1:9/b?list-type=2)", True),
])
def test_which_s3_failures_are_retried(text: str, transient: bool) -> None:
    """An answer decides by its status alone (the text of every obstore error names its
    retry_timeout); a request with no answer is retried, except a create-only PUT."""
    from obstore.exceptions import GenericError

    from arrayjob.io.transient import transient as _transient

    assert _transient(GenericError(text)) == transient
    if "status code" not in text:
        assert not _transient(GenericError(text), answered_only=True)


@pytest.mark.parametrize("setting", ["max_attempts = 0", "max_attempts = 1.5", "retry_timeout = 0",
                                     "retry_timeout = -1"])
def test_retry_settings_are_checked(tmp_path: Path, setting: str) -> None:
    from arrayjob.spec import load_spec

    spec = write_spec(tmp_path / "spec.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out", storage=setting)
    with pytest.raises(SpecError, match=rf"^storage\.{setting.split()[0]}: expected "):
        load_spec(str(spec))
    good = write_spec(tmp_path / "good.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out",
                      storage="max_attempts = 3\nretry_timeout = 20\n")
    assert load_spec(str(good)).storage == StorageOptions(max_attempts=3, retry_timeout=20.0)


# -- tasks --------------------------------------------------------------------------------------


# -- reporting ----------------------------------------------------------------------------------


def _report_with_faults() -> dict[str, Any]:
    return {"job": "j", "algorithm": "logreg", "wall_seconds": 3.0,
            "stages": [{"name": "fit", "wall_seconds": 3.0}],
            "cluster": {"nodes": 3, "nodes_lost": 1, "cpus": 3},
            "timeline": [{"seconds": 1.0, "network_bytes": 10, "memory_bytes_per_node": {"a": 5}},
                         {"seconds": 2.5, "network_bytes": 20, "memory_bytes_per_node": {"a": 7}}],
            "faults": {"nodes_lost": 1, "lost_node_ids": ["b"], "blocks_reconstructed": 4, "task_retries": 2,
                       "storage_retries": 0,
                       "events": [{"seconds": 1.5, "kind": "node_lost", "count": 1, "stage": "fit", "node": "b"},
                                  {"seconds": 1.6, "kind": "block_reconstructed", "count": 4, "stage": "fit"}]}}


def test_report_html_marks_faults_on_its_timeline() -> None:
    from arrayjob.report.html import render

    page = render(_report_with_faults())
    assert page.count('class="fault"') == 2 * 2  # both events on both charts
    assert "node lost" in page and "4 blocks rebuilt" in page
    assert "Faults" in page
    calm = render({**_report_with_faults(), "faults": {"events": []}})
    assert 'class="fault"' not in calm


def test_summary_says_how_many_nodes_were_lost() -> None:
    from arrayjob.cli.format import faults_line

    report = _report_with_faults()
    assert faults_line(report) == ["  faults: 1 node lost, 4 blocks rebuilt, 2 task retries"]
    assert faults_line({"faults": {"nodes_lost": 0}}) == []
