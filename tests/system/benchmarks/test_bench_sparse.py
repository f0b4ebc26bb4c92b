"""benchmarks/bench_sparse.py end to end at its tiny size (5,000 rows): the data made by arrayjob
datagen, two ``arrayjob run`` processes each with its own Ray, scikit-learn beside them, a
Spark MLlib row each that says it was skipped (no JVM at the tiny size), and every row in the
JSON and Markdown it writes. About 25 s on a quiet machine (two Ray starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.helpers import run_tiny_benchmark

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("ray_session")]

SYSTEMS = ["arrayjob", "one read of the CSR bytes (the floor)", "scikit-learn"]


@pytest.mark.timeout(360)
def test_the_sparse_benchmark_runs_at_tiny_size(tmp_path: Path) -> None:
    doc = run_tiny_benchmark("bench_sparse.py", tmp_path, timeout=340)
    assert doc["complete"] is True
    rows = {(r["workload"], r["system"]): r for r in doc["rows"]}
    workloads = ("sparse logreg loss+grad", "sparse KMeans")
    assert sorted(rows) == sorted((w, s) for w in workloads for s in [*SYSTEMS, "Spark MLlib"])
    for workload in workloads:
        spark = rows.pop((workload, "Spark MLlib"))
        assert spark["compute_s"] is None and "skipped at tiny size" in spark["note"], spark
    for row in rows.values():
        assert row["compute_s"] > 0 and not row["note"].startswith("failed"), row
        assert row["limit_s"] == rows[(row["workload"], SYSTEMS[1])]["compute_s"]
    for workload in ("sparse logreg loss+grad", "sparse KMeans"):
        aj = rows[(workload, "arrayjob")]
        assert aj["target"] and aj["target_met"] in (True, False)  # reported, whatever the verdict
        assert aj["ratio_best_peer"] == pytest.approx(aj["compute_s"] / rows[(workload, "scikit-learn")]["compute_s"])

    logreg = rows[("sparse logreg loss+grad", "arrayjob")]["extra"]
    assert logreg["iterations"] == 3 and logreg["evaluations"] >= 3  # max_iter, tol tiny: every iteration made
    # scikit-learn's loss at the coefficients arrayjob published is arrayjob's objective
    sk_loss = rows[("sparse logreg loss+grad", "scikit-learn")]["extra"]["loss_at_arrayjob_coef"]
    assert sk_loss == pytest.approx(logreg["objective"], rel=1e-9)
    kmeans = rows[("sparse KMeans", "scikit-learn")]
    assert "centroids match arrayjob's" in kmeans["note"]
    assert kmeans["extra"]["inertia"] == pytest.approx(rows[("sparse KMeans", "arrayjob")]["extra"]["inertia"],
                                                       rel=1e-9)

    memory = {m["workload"]: m for m in doc["memory"]}
    assert sorted(memory) == ["sparse KMeans", "sparse logreg"]
    for m in memory.values():
        assert min(m["input_block_bytes_per_node"]) > 0 and m["ratio"] > 0 and m["target_met"] in (True, False)

    table = (tmp_path / "bench_sparse.md").read_text()
    assert table.count("| **arrayjob** |") == 2 and "scikit-learn" in table and "× held" in table
