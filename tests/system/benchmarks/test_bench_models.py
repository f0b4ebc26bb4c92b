"""benchmarks/models.py end to end at its tiny size (2,000 rows): the data made by arrayjob
datagen, every model's ``arrayjob run`` on the one Ray the benchmark starts, scikit-learn (ALS:
NumPy) beside each, a Spark MLlib row per workload that says it was skipped (no JVM at the tiny
size), and every row in the JSON and Markdown it writes. About 30 s on a quiet machine (one Ray start)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness.helpers import run_tiny_benchmark

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("ray_session")]

WORKLOADS = {"multinomial logreg": "scikit-learn", "elastic-net logreg": "scikit-learn",
             "elastic-net linreg": "scikit-learn", "PCA": "scikit-learn", "GMM": "scikit-learn",
             "ALS": "NumPy + SciPy (no scikit-learn ALS)", "predict": "scikit-learn"}


def agrees(note: str, what: str) -> float:
    """The agreement the peer's note states for ``what``, e.g. "coef agrees to 1.2e-09"."""
    found = re.search(re.escape(what) + r" (?:agrees?|to 1 −) (?:to )?([0-9.]+e[-+][0-9]+)", note)
    assert found, (what, note)
    return float(found.group(1))


@pytest.mark.timeout(420)
def test_the_models_benchmark_runs_at_tiny_size(tmp_path: Path) -> None:
    doc = run_tiny_benchmark("models.py", tmp_path, timeout=400)
    assert doc["complete"] is True
    rows = {(r["workload"], r["system"]): r for r in doc["rows"]}
    assert sorted(rows) == sorted((w, s) for w, peer in WORKLOADS.items() for s in ("arrayjob", peer, "Spark MLlib"))
    for workload, peer in WORKLOADS.items():
        aj, ref, spark = rows[(workload, "arrayjob")], rows[(workload, peer)], rows[(workload, "Spark MLlib")]
        for row in (aj, ref):
            assert row["compute_s"] > 0 and not row["note"].startswith("failed"), row
        assert aj["ratio_best_peer"] == pytest.approx(aj["compute_s"] / ref["compute_s"])
        assert aj["target"] == "faster than every peer" and aj["target_met"] in (True, False)
        assert spark["compute_s"] is None and ("tiny size" in spark["note"] or workload == "predict"), spark

    # each peer's result agrees with the one arrayjob published
    note = {w: rows[(w, p)]["note"] for w, p in WORKLOADS.items()}
    assert agrees(note["multinomial logreg"], "coef") < 1e-4  # both stop at a gradient norm of 1e-6
    assert agrees(note["elastic-net logreg"], "coef") < 1e-5
    assert agrees(note["elastic-net linreg"], "coef") < 1e-8
    assert agrees(note["PCA"], "explained variance") < 1e-10 and agrees(note["PCA"], "components") < 1e-10
    assert agrees(note["GMM"], "means") < 1e-6
    assert agrees(note["ALS"], "user factors") < 1e-8
    assert "labels equal on 100.00% of rows" in note["predict"] and agrees(note["predict"], "probabilities") < 1e-12
    assert rows[("GMM", "arrayjob")]["extra"]["iterations"] == rows[("GMM", "scikit-learn")]["extra"]["n_iter"]

    table = (tmp_path / "models.md").read_text()
    assert table.count("| **arrayjob** |") == len(WORKLOADS) and table.count("| Spark MLlib |") == len(WORKLOADS)
