"""Jobs on Parquet inputs: logreg, linreg and kmeans from a Parquet dataset (several files and
row groups, y a column of the same files) match the same data from Zarr to the last bit, end to
end on Ray, on local disk and on S3; the estimate reads footers only and prices the run's
reads exactly; bad data is one line, exit 2, and nothing written."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest

from arrayjob.io.backend import StorageBackend
from tests.harness.helpers import (
    feature_tables,
    logreg_data,
    run_cli,
    without_progress,
    write_parquet,
    write_spec,
)

SIZES = [800, 700, 750, 750]  # rows per file: row groups of 250, and a short one at two files' ends
PARAMS = {"logreg": "l2 = 1e-3\ntol = 1e-9\nmax_iter = 100\n", "linreg": "", "kmeans": "k = 3\nmax_iter = 20\n"}


def _data(algorithm: str) -> tuple[np.ndarray, np.ndarray | None]:
    X, y = logreg_data(3000, 5, seed=4)
    if algorithm == "linreg":
        y = X @ np.arange(1.0, 6.0) + 0.5 + 0.01 * np.random.default_rng(4).standard_normal(3000)
    return X, (None if algorithm == "kmeans" else y)


def _stage_reads(stages: list[dict]) -> dict[str, tuple[int, int]]:
    return {s["name"]: (s["storage.bytes_read"], s["storage.get_requests"]) for s in stages}


def footer_length(path) -> int:
    with open(path, "rb") as f:
        f.seek(-8, 2)
        return int.from_bytes(f.read(4), "little")


def test_plan_and_estimate_read_the_footers_and_nothing_else(workdir, capsys, monkeypatch):
    X, y = _data("logreg")
    keys = write_parquet(str(workdir / "features"), feature_tables(X, y, SIZES), row_group_size=250)
    ranges: list[tuple[str, int, int]] = []
    read_range, read_tail = StorageBackend.read_range, StorageBackend.read_tail

    def recording_range(self, key, start, stop, counters=None):
        ranges.append((str(self.location.join(key) if key else self.location), start, stop))
        return read_range(self, key, start, stop, counters)

    def recording_tail(self, key, length, counters=None):
        data, size = read_tail(self, key, length, counters)
        ranges.append((str(self.location.join(key) if key else self.location), size - len(data), size))
        return data, size

    monkeypatch.setattr(StorageBackend, "read_range", recording_range)
    monkeypatch.setattr(StorageBackend, "read_tail", recording_tail)
    # X as a directory whose files are all Parquet: the format found from what is there
    spec = write_spec(workdir / "spec.toml", inputs={"X": str(workdir / "features"), "y": {
        "uri": str(workdir / "features"), "column": "label"}}, output=str(workdir / "out"))
    for command in (["plan", str(spec)], ["estimate", str(spec), "--format", "json"]):
        ranges.clear()
        code, out, err = run_cli(command, capsys)
        assert code == 2 and "column 'note'" in err  # every column by default: the string one is refused
    spec = write_spec(workdir / "spec.toml", inputs={"X": {"uri": str(workdir / "features"), "columns": "f*"},
                                                     "y": {"uri": str(workdir / "features"), "column": "label"}},
                      output=str(workdir / "out"))
    for command in (["plan", str(spec)], ["estimate", str(spec), "--format", "json"], ["estimate", str(spec)]):
        ranges.clear()
        code, out, err = run_cli(command, capsys)
        assert code == 0, err
        assert len(ranges) == 2 * 2 * len(keys)  # X's and y's: each file's last 8 bytes, then its footer
        for path, start, stop in ranges:
            size = (workdir / "features" / path.rsplit("/", 1)[1]).stat().st_size
            assert size - footer_length(path) - 8 <= start < stop <= size, (path, start, stop)
    # the table shows the footer reads, and the fit stage after load (not load twice)
    assert re.search(r"\n validate +\n ├─ Storage read \(metadata\) +[\d.]+ kB +\n └─ GET requests +16 +requests", out)
    assert "\n fit (101 passes) " in out
    assert not (workdir / "out").exists()


def _case(workdir, case: str) -> tuple[dict[str, object], str]:
    """A dataset with one thing wrong, the inputs naming it, and what the error line says."""
    X, y = _data("logreg")
    features = str(workdir / "features")
    X_in: dict[str, object] = {"uri": features, "columns": "f*"}
    y_in: dict[str, object] = {"uri": features, "column": "label"}
    if case == "empty dataset":
        (workdir / "features").mkdir()
        (workdir / "features" / "_SUCCESS").write_text("")
        return {"X": X_in, "y": y_in}, f"inputs.X: no Parquet files at {features}: an empty dataset"
    if case == "no rows":
        write_parquet(features, [feature_tables(X, y, SIZES)[0].slice(0, 0)], row_group_size=250)
        return {"X": X_in, "y": y_in}, f"inputs.X: the dataset at {features} holds no rows (1 file(s)): an empty dataset"
    tables = feature_tables(X, y, SIZES)
    if case == "schemas disagree":
        tables[2] = tables[2].set_column(1, "f1", tables[2]["f1"].cast(pa.float32()))
    write_parquet(features, tables, row_group_size=250)
    first, third = f"{features}/part-00000.parquet", f"{features}/part-00002.parquet"
    if case == "missing column":
        return {"X": {"uri": features, "columns": ["f0", "f9"]}, "y": y_in}, (
            f"inputs.X: column 'f9' is not in {first} (its columns: f0, f1, f2, f3, f4, label, note)")
    if case == "non-numeric column":
        return {"X": {"uri": features, "columns": ["f0", "note"]}, "y": y_in}, (
            f"inputs.X: column 'note' of {first} is string, not numeric (integers, floats or booleans; a "
            "fixed-size list of them is a matrix)")
    if case == "schemas disagree":
        return {"X": X_in, "y": y_in}, f"inputs.X: schemas disagree: column 'f1' is double in {first} but float in {third}"
    if case == "rows of X and y differ":
        write_parquet(str(workdir / "labels"), [pa.table({"label": y[:2000]})], row_group_size=250)
        return {"X": X_in, "y": {"uri": str(workdir / "labels"), "column": "label"}}, (
            "inputs.y: expected shape (3000,) to match the rows of inputs.X (3000, 5), got (2000,)")
    assert case == "not a Parquet file"
    (workdir / "features" / "part-00004.parquet").write_bytes(b"id,f0\n1,0.5\n")
    return {"X": X_in, "y": y_in}, (f"inputs.X: {features}/part-00004.parquet is not a Parquet file: it does not "
                                    "end in the Parquet magic bytes 'PAR1'")


@pytest.mark.parametrize("case", ["missing column", "non-numeric column", "schemas disagree", "rows of X and y differ",
                                  "empty dataset", "no rows", "not a Parquet file"])
def test_bad_parquet_found_by_the_driver_is_one_line_exit_2_and_nothing_written(workdir, capsys, case):
    inputs, message = _case(workdir, case)
    spec = write_spec(workdir / "spec.toml", inputs=inputs, output=str(workdir / "out"))
    code, out, err = run_cli(["run", str(spec)], capsys)
    lines = without_progress(err).strip().splitlines()
    assert (code, out, lines) == (2, "", [f"arrayjob: error: {message}"])
    assert not (workdir / "out").exists()


