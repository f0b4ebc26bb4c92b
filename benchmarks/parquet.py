"""Parquet inputs (issue 25, "Performance"): arrayjob's load of N × 64 float64 features from a
Parquet dataset, against pyarrow reading the same files and against arrayjob's load of the same
numbers from Zarr, in one run.

    .venv/bin/python benchmarks/parquet.py [--size full|quick|tiny] [--repeat 3]
                                           [--workdir DIR] [--json FILE] [--markdown FILE]
    make bench                          # the same, full size, after the other benchmarks

Data are written once into ``--workdir`` (default .arrayjob/bench/parquet/SIZE; ``data.json``
beside them says they are complete) and reused: standard normal features ``f0`` … ``f63``
(seed 0), as 16 Parquet files of one row group each (Snappy, pyarrow's writer) and as one
Zarr v3 array whose chunks are those row groups (zarr's default codec, Zstandard), so both
are read as the same 16 blocks. Sizes: ``full`` (the issue's: 4,000,000 rows, 2.05 GB, row
groups of 250,000 rows, 128 MB), ``quick`` (400,000 rows, 12.8 MB row groups) and ``tiny``
(16,000 rows: tests/system/benchmarks/test_bench_parquet.py runs it).

Rows (all load seconds; the median of ``--repeat`` runs after a warm-up run of each):

- *arrayjob (Parquet)*: the load stage of a run of KMeans (k = 2, one iteration) with
  ``X = { uri = …, columns = "f*" }``, from its report: every row block read by a worker into
  the object store, and the column statistics pass over them. Every run in this process, on
  one local Ray it starts (``runner.run`` reuses it; its start is no run's), one worker a core.
- *arrayjob (Zarr)*: the same job on the Zarr array.
- *pyarrow, one process*: ``pyarrow.dataset.dataset(dir).to_table(columns=[f0 … f63])`` in
  this process (pyarrow's own thread pool, one thread a core), and, beside it in the note, the
  same with ``.to_numpy()`` of every column into one float64 matrix, the form arrayjob holds.

Targets (reported, never asserted): arrayjob's Parquet load at most pyarrow's ``to_table``
(× best peer <= 1), and within 1.2× of arrayjob's Zarr load (× limit <= 1.2; the Zarr load is
the row's limit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_harness import Row, commit, finish, machine_line, markdown, timed, versions  # noqa: E402

FILES = 16
COLUMNS = 64
SIZES = {"full": 4_000_000, "quick": 400_000, "tiny": 16_000}
WORKLOAD = "Parquet load"
CASE_TIMEOUT = 3600  # seconds for one arrayjob run


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prepare(work: Path, rows: int) -> Path:
    """The features written once as Parquet (``features/``) and as Zarr (``X.zarr``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zarr

    marker = work / "data.json"
    wanted = {"rows": rows, "columns": COLUMNS, "files": FILES, "seed": 0}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return work
    marker.unlink(missing_ok=True)  # until the new data are complete
    per_file = rows // FILES
    log(f"writing {rows:,} × {COLUMNS} float64 as {FILES} Parquet files and as Zarr into {work}")
    (work / "features").mkdir(parents=True, exist_ok=True)
    array = zarr.create_array(str(work / "X.zarr"), shape=(rows, COLUMNS), chunks=(per_file, COLUMNS),
                              dtype="float64", overwrite=True)
    rng = np.random.default_rng(0)
    for i in range(FILES):
        part = rng.standard_normal((per_file, COLUMNS))
        table = pa.table({f"f{j}": part[:, j] for j in range(COLUMNS)})
        pq.write_table(table, work / "features" / f"part-{i:05d}.parquet", row_group_size=per_file,
                       compression="snappy")
        array[i * per_file:(i + 1) * per_file] = part
    marker.write_text(json.dumps(wanted))
    return work


def spec(work: Path, kind: str) -> Path:
    X = '{ uri = "features", columns = "f*" }' if kind == "parquet" else '"X.zarr"'
    path = work / f"{kind}.toml"
    path.write_text(f'[job]\nname = "bench-{kind}-load"\nalgorithm = "kmeans"\n\n[inputs]\nX = {X}\n\n'
                    f'[params]\nk = 2\nmax_iter = 1\ninit = "random"\n\n[output]\nuri = "out-{kind}"\n')
    return path


def arrayjob_load(work: Path, kind: str) -> tuple[float, dict[str, Any]]:
    """One run of the job on the local Ray this process started: its load stage."""
    from arrayjob.runner import run
    from arrayjob.spec import load_spec

    report = run(load_spec(spec(work, kind)), overwrite=True).report
    assert report is not None
    load = next(s for s in report["stages"] if s["name"] == "load")
    return float(load["wall_seconds"]), {"bytes_read": load["storage.bytes_read"],
                                         "get_requests": load["storage.get_requests"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), default="quick")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each system (median)")
    parser.add_argument("--workdir", type=Path, default=REPO / ".arrayjob" / "bench" / "parquet")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    started = time.perf_counter()
    rows = SIZES[args.size]
    work = prepare((args.workdir.resolve() / args.size), rows)
    label = f"X {rows:,} × {COLUMNS} float64 ({rows * COLUMNS * 8 / 1e9:.2f} GB), {FILES} files"
    log(f"size {args.size}: {label}; {machine_line()}")

    import pyarrow.dataset as ds

    columns = [f"f{j}" for j in range(COLUMNS)]
    dataset = ds.dataset(str(work / "features"), format="parquet")
    table = timed(lambda: dataset.to_table(columns=columns), args.repeat)
    matrix = timed(lambda: np.column_stack([c.to_numpy() for c in dataset.to_table(columns=columns).columns]),
                   args.repeat)
    log(f"pyarrow to_table {table.median:.3f} s, to a matrix {matrix.median:.3f} s")
    import ray

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             configure_logging=False)  # one Ray for every run: the runner reuses it
    loads: dict[str, list[float]] = {"parquet": [], "zarr": []}
    reads: dict[str, dict[str, Any]] = {}
    for kind in loads:  # a warm-up of each: the workers start and import zarr, pyarrow, numba
        arrayjob_load(work, kind)
    for _ in range(args.repeat):  # alternated, so both see the same load on the machine
        for kind in loads:
            seconds, reads[kind] = arrayjob_load(work, kind)
            loads[kind].append(seconds)
            log(f"arrayjob {kind} load {seconds:.3f} s")
    ray.shutdown()
    median = {kind: float(np.median(runs)) for kind, runs in loads.items()}
    result = finish([
        Row(WORKLOAD, args.size, "arrayjob (Parquet)", "load of X", median["parquet"], median["parquet"],
            arrayjob=True, limit_s=median["zarr"], load_runs=loads["parquet"], compute_runs=loads["parquet"],
            extra=reads["parquet"], note="limit: arrayjob's load of the same data from Zarr"),
        Row(WORKLOAD, args.size, "arrayjob (Zarr)", "load of X", median["zarr"], median["zarr"], peer=False,
            load_runs=loads["zarr"], compute_runs=loads["zarr"], extra=reads["zarr"]),
        Row(WORKLOAD, args.size, "pyarrow, one process", "load of X", table.median, table.median,
            load_runs=table.runs, compute_runs=table.runs,
            note=f"to_table; with to_numpy into one matrix {matrix.median:.3g} s", extra={"matrix_s": matrix.median}),
    ])
    text = markdown(result)
    doc = {"size": args.size, "data": label, "machine": machine_line(), "uptime": _uptime(), "commit": commit(),
           "versions": versions(), "rows": [r.as_dict() for r in result], "complete": True,
           "seconds": time.perf_counter() - started}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(f"{label}; {doc['machine']}; {doc['uptime']}; commit {doc['commit']}\n\n{text}\n")
    print(text)
    log(f"{time.perf_counter() - started:.0f} s in all; {_uptime()}")
    return 0


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"load average {os.getloadavg()[0]:.2f}"


if __name__ == "__main__":
    sys.exit(main())
