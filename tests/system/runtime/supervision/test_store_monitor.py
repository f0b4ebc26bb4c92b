"""The report reads the object stores themselves: a job's store peak as its raylet saw it, and
Ray's own spilling when a store overflows (which the replayed peak cannot see).

Each run starts its own Ray (a process of its own: the store size is the run's setting).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.helpers import write_spec

pytestmark = pytest.mark.cli

ROWS, COLS, CHUNK = 600_000, 32, 50_000  # X: 12 blocks of 12.8 MB, 154 MB
STORE = 100_000_000


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stores")
    subprocess.run([sys.executable, "-m", "arrayjob.cli.main", "datagen", "logreg", str(root / "data"),
                    "--rows", str(ROWS), "--cols", str(COLS), "--chunk-rows", str(CHUNK)],
                   check=True, capture_output=True, timeout=300)
    return root


def run(root: Path, name: str, *sets: str) -> dict:
    spec = write_spec(root / f"{name}.toml", inputs={"X": str(root / "data" / "X.zarr"), "y": str(root / "data" / "y.zarr")},
                      output=str(root / name), params="max_iter = 5\n")
    args = [a for s in sets for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "arrayjob.cli.main", "run", str(spec), "--json", "--quiet", *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["memory"]


@pytest.mark.timeout(360)
def test_the_store_peak_is_read_from_the_raylet_and_matches_the_replay(data):
    memory = run(data, "fits")
    x_bytes = ROWS * COLS * 8
    (replayed,), (read,) = memory["peak_bytes_per_node"], memory["store_peak_bytes_per_node"]
    assert x_bytes <= read <= 1.1 * replayed  # X stays resident for the whole fit: no sample misses it
    assert memory["ray_spilled_bytes"] == 0 and memory["ray_restored_bytes"] == 0


@pytest.mark.timeout(360)
def test_ray_spilling_behind_the_job_is_reported(data):
    """No budget to plan by (lifted), a store smaller than X: Ray spills to disk on its own."""
    memory = run(data, "spills", f"cluster.object_store_memory={STORE}", "cluster.memory_budget=1TB")
    (replayed,), (read,) = memory["peak_bytes_per_node"], memory["store_peak_bytes_per_node"]
    assert replayed > STORE  # what the job put in the store, by the plan's accounting
    assert 0 < read <= STORE  # what the store held: it never grew past its size
    assert memory["ray_spilled_bytes"] >= replayed - STORE
    assert memory["ray_restored_bytes"] > 0  # the fit's iterations brought spilled blocks back



def test_the_summary_says_when_ray_spilled():
    from arrayjob.cli.format import memory_line

    report = {"memory": {"peak_bytes_per_node": [154_000_000], "store_peak_bytes_per_node": [99_000_000],
                         "ray_spilled_bytes": 120_000_000, "ray_restored_bytes": 480_000_000, "budget_bytes": None},
              "storage": {}}
    assert memory_line(report) == ["  memory: Ray spilled 120.0 MB to its nodes' disks and restored 480.0 MB: "
                                   "an object store overflowed (its peak 99.0 MB)"]
    report["memory"]["ray_spilled_bytes"] = 0
    assert memory_line(report) == []
