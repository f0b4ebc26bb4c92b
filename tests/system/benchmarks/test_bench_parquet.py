"""benchmarks/parquet.py end to end at its tiny size (16,000 × 64): the data written as Parquet
and as Zarr, two arrayjob runs on the one Ray the script starts, pyarrow beside them, and every
row in the JSON and Markdown it writes. About 20 s on a quiet machine (one Ray start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.helpers import run_tiny_benchmark

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("ray_session")]

SYSTEMS = ["arrayjob (Parquet)", "arrayjob (Zarr)", "pyarrow, one process"]


@pytest.mark.timeout(360)
def test_the_parquet_benchmark_runs_at_tiny_size(tmp_path: Path) -> None:
    doc = run_tiny_benchmark("parquet.py", tmp_path, timeout=340)
    assert doc["complete"] is True and "load average" in doc["uptime"]
    rows = {r["system"]: r for r in doc["rows"]}
    assert sorted(rows) == sorted(SYSTEMS)
    for row in rows.values():
        assert row["load_s"] > 0 and row["compute_s"] == row["load_s"], row
    parquet, zarr = rows["arrayjob (Parquet)"], rows["arrayjob (Zarr)"]
    assert parquet["limit_s"] == zarr["load_s"]  # the Zarr load is the Parquet row's limit
    assert parquet["ratio_best_peer"] == pytest.approx(parquet["load_s"] / rows["pyarrow, one process"]["load_s"])
    assert parquet["target"] and parquet["target_met"] in (True, False)  # reported, whatever the verdict
    # both runs read all of X: the Parquet run its 16 files' column chunks, the Zarr run its 16 chunks
    assert parquet["extra"]["get_requests"] == zarr["extra"]["get_requests"] == 16
    assert parquet["extra"]["bytes_read"] >= 16_000 * 64 * 8
    assert "| **arrayjob (Parquet)** |" in (tmp_path / "parquet.md").read_text()
