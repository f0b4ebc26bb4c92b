"""Small helpers for tests: write arrays with plain zarr, write specs, run the CLI in-process."""

from __future__ import annotations

import json
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse
import zarr

from arrayjob.cli.main import main
from arrayjob.io.lease import LeaseClock


def storage_options(uri: str, endpoint: str | None) -> dict[str, Any] | None:
    return {"endpoint_url": endpoint} if uri.startswith("s3://") and endpoint else None


def write_array(uri: str, data: np.ndarray, chunks: tuple[int, ...], *, endpoint: str | None = None,
                zarr_format: int = 3, compressors: Any = "auto") -> None:
    """Write ``data`` with plain zarr, as a user's own pipeline would."""
    z = zarr.create_array(uri, shape=data.shape, chunks=chunks, dtype=data.dtype, zarr_format=zarr_format,
                          overwrite=True, storage_options=storage_options(uri, endpoint), compressors=compressors)
    z[...] = data


def write_adjacency_group(uri: str, edges: np.ndarray, n: int, layout: str = "anndata",
                          chunks: tuple[int, int] = (300, 100), compressors: Any = "auto") -> scipy.sparse.csr_matrix:
    """The adjacency matrix of ``edges`` (n × n, CSR, duplicates summed) as a PageRank input:
    AnnData's layout with random weights as ``data`` ("anndata"; PageRank ignores them), or the
    group arrayjob took before it read AnnData's ("arrayjob": ``indices`` and ``indptr`` and a
    ``shape`` attribute, no ``data``, no encoding-type); ``chunks`` of indices and indptr
    (``compressors=None``: stored as many bytes as the estimate plans)."""
    matrix = scipy.sparse.csr_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    matrix.sum_duplicates()
    if layout == "anndata":
        weighted = scipy.sparse.csr_matrix((np.random.default_rng(0).uniform(0.1, 5.0, matrix.nnz), matrix.indices,
                                            matrix.indptr), shape=matrix.shape)
        write_csr_group(uri, weighted, (chunks[0], *chunks), compressors=compressors)
        return matrix
    group = zarr.open_group(uri, mode="w", attributes={"shape": [n, n]})
    group.create_array("indptr", data=matrix.indptr.astype(np.int64), chunks=(chunks[1],), compressors=compressors)
    group.create_array("indices", data=matrix.indices.astype(np.int64), chunks=(chunks[0],), compressors=compressors)
    return matrix


def write_csr_group(uri: str, matrix, chunks: tuple[int, int, int] = (1000, 1000, 1000), *,
                    endpoint: str | None = None, zarr_format: int = 3, encoding: str = "csr_matrix",
                    compressors: Any = "auto") -> None:
    """Write a SciPy CSR (or CSC) matrix as AnnData lays one out in Zarr, with plain zarr: a
    group with ``encoding-type``, ``encoding-version`` and ``shape``, and 1-D ``data``,
    ``indices`` and ``indptr`` chunked as given (a user's own pipeline, not arrayjob's)."""
    group = zarr.open_group(uri, mode="w", zarr_format=zarr_format, storage_options=storage_options(uri, endpoint))
    group.attrs.update({"encoding-type": encoding, "encoding-version": "0.1.0", "shape": list(matrix.shape)})
    for name, chunk in zip(("data", "indices", "indptr"), chunks, strict=True):
        values = getattr(matrix, name)
        array = group.create_array(name, shape=values.shape, chunks=(chunk,), dtype=values.dtype,
                                   compressors=compressors)
        array[...] = values


def write_parquet(uri: str, tables: list[Any], *, row_group_size: int, endpoint: str | None = None,
                  names: list[str] | None = None) -> list[str]:
    """Write each pyarrow table as one Parquet file under the directory or S3 prefix ``uri``
    (``part-00000.parquet``, … unless ``names`` says), with plain pyarrow, as a user's own
    pipeline would; returns the files' keys under ``uri``."""
    import io

    import pyarrow.parquet as pq

    keys = names or [f"part-{i:05d}.parquet" for i in range(len(tables))]
    for key, table in zip(keys, tables, strict=True):
        if uri.startswith("s3://"):
            import boto3

            buffer = io.BytesIO()
            pq.write_table(table, buffer, row_group_size=row_group_size)
            bucket, _, prefix = uri.removeprefix("s3://").partition("/")
            boto3.client("s3", endpoint_url=endpoint).put_object(
                Bucket=bucket, Key=f"{prefix.rstrip('/')}/{key}".lstrip("/"), Body=buffer.getvalue())
        else:
            path = Path(uri) / key
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, str(path), row_group_size=row_group_size)
    return keys


def feature_tables(X: np.ndarray, y: np.ndarray | None, sizes: list[int]) -> list[Any]:
    """X's columns as f0, f1, … and y as ``label`` (beside a string column ``note``), cut into
    tables of ``sizes`` rows: the files of one dataset."""
    import pyarrow as pa

    tables, start = [], 0
    for rows in sizes:
        part = slice(start, start + rows)
        columns = {f"f{j}": X[part, j] for j in range(X.shape[1])}
        if y is not None:
            columns["label"] = y[part]
        columns["note"] = [f"row {i}" for i in range(part.start, part.stop)]
        tables.append(pa.table(columns))
        start += rows
    assert start == X.shape[0]
    return tables


def sparse_logreg_data(n: int = 3000, d: int = 200, nnz_per_row: int = 8, seed: int = 0):
    """A CSR X of ``nnz_per_row`` non-zeros per row (some rows empty) and 0/1 labels from a
    sparse true weight vector."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 2 * nnz_per_row + 1, n)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    indices = np.concatenate([np.sort(rng.choice(d, c, replace=False)) for c in counts]).astype(np.int32)
    data = rng.standard_normal(indptr[-1])
    X = scipy.sparse.csr_matrix((data, indices, indptr), shape=(n, d))
    w = rng.standard_normal(d) * (rng.random(d) < 0.3)
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ w + 0.2)))).astype(np.float64)
    return X, y


def read_group(uri: str, endpoint: str | None = None) -> zarr.Group:
    return zarr.open_group(uri, mode="r", storage_options=storage_options(uri, endpoint))


def published(output: str, endpoint: str | None = None) -> str:
    """The URI of the published run under ``output``, found as a reader does: read ``_SUCCESS``,
    take the prefix it names."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(output, **(storage_options(output, endpoint) or {}))
    manifest = json.loads(fs.cat_file(f"{root}/_SUCCESS"))
    return f"{output.rstrip('/')}/{manifest['prefix']}"


def read_result(output: str, endpoint: str | None = None) -> zarr.Group:
    """The published ``result.zarr`` of the output prefix ``output``."""
    return read_group(f"{published(output, endpoint)}/result.zarr", endpoint)


def logreg_data(n: int = 3000, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n).astype(np.float64)
    X = rng.standard_normal((n, d)) + ((2 * y - 1) * 0.4)[:, None]
    X[:, 0] *= 3.0  # uneven scales make the problem less trivial for the solvers
    return X, y


def multinomial_data(n: int = 3000, d: int = 5, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``classes`` overlapping Gaussian classes (labels 0..K−1 as floats), uneven feature scales."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    X = rng.standard_normal((classes, d))[y] + rng.standard_normal((n, d))
    X[:, 0] *= 3.0
    return X, y.astype(np.float64)


def write_spec(path: Path, *, inputs: dict[str, Any], output: str, algorithm: str = "logreg",
               params: str = "", storage: str = "", extra: str = "", output_format: str | None = None) -> Path:
    """A spec file; an input is a URI, or a dict written as an inline table (strings and lists
    of strings: ``{"uri": "…", "columns": ["f0"]}``); ``output_format``: ``[output] format``."""
    body = textwrap.dedent(f"""\
        [job]
        name = "test-{algorithm}"
        algorithm = "{algorithm}"

        [inputs]
        """)
    for k, v in inputs.items():
        value = "{ " + ", ".join(f"{kk} = {json.dumps(vv)}" for kk, vv in v.items()) + " }" \
            if isinstance(v, dict) else f'"{v}"'
        body += f"{k} = {value}\n"
    body += f"\n[params]\n{textwrap.dedent(params)}\n[output]\nuri = \"{output}\"\n"
    if output_format is not None:
        body += f"format = \"{output_format}\"\n"
    if storage:
        body += f"\n[storage]\n{textwrap.dedent(storage)}\n"
    body += textwrap.dedent(extra)
    path.write_text(body)
    return path


# a run's progress line off a terminal: "arrayjob: [   6.09 s] load done in 1.3 s, 8/8 blocks, ..."
PROGRESS_LINE = re.compile(r"arrayjob: \[ *\d+\.\d\d s\] .+")


def without_progress(err: str) -> str:
    """``err`` without the run's progress lines: what a test of a run's errors or noise
    compares (an error is the one line left, and the last)."""
    lines = err.splitlines(keepends=True)
    rest = [line for line in lines if not PROGRESS_LINE.fullmatch(line.rstrip("\n"))]
    assert not rest or not lines or lines[-1] == rest[-1] or not rest[-1].startswith("arrayjob: error"), err
    return "".join(rest)


def run_cli(args: list[str], capsys: Any) -> tuple[int, str, str]:
    """Run ``arrayjob ARGS`` in this process (sharing the session Ray); returns (code, out, err)."""
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def block_kernel(outputs: list[Any], values: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The block kernel of lazy ``outputs`` over ``la.value`` leaves, and its arguments
    (``values`` by leaf name): one fused group, as the planner would hand it to a task."""
    from arrayjob import lazy as la
    from arrayjob.planner.physical import BlockKernel, Step

    graph = la.capture(outputs)
    leaves = [i for i, node in enumerate(graph.nodes) if node.op == "value"]
    slot = {node: a for a, node in enumerate(leaves)}
    steps = []
    for i, node in enumerate(graph.nodes):
        if node.op != "value":
            slot[i] = len(leaves) + len(steps)
            steps.append(Step(node.op, node.attrs, tuple(slot[j] for j in node.inputs), node.dtype))
    kernel = BlockKernel("k", len(leaves), tuple(steps), tuple(slot[o] for o in graph.outputs))
    return kernel, [values[graph.nodes[i].attrs.name] for i in leaves]


@dataclass(frozen=True)
class CrashOnce:
    """A block check that kills its worker process the first time it runs (a lost worker);
    ``marker`` is a file it creates then, so later attempts pass."""

    marker: str

    def __call__(self, block: np.ndarray) -> None:
        if not os.path.exists(self.marker):
            Path(self.marker).write_text("crashed")
            os._exit(1)


def run_in_own_session(cmd: list[str], *, timeout: float, what: str, cwd: Path | None = None) -> None:
    """Run ``cmd`` (a script that starts a Ray cluster, or a private namespace) in a session
    of its own, and fail the test unless it exits 0 within ``timeout`` seconds. On a timeout its
    whole process group is killed (the driver and the raylets it started), whatever happens."""
    import signal
    import subprocess

    import pytest

    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"{what} did not finish in {timeout:g} s")
    assert proc.returncode == 0, stderr[-3000:]


class ManualClock(LeaseClock):
    """A lease clock that moves only when a test says (``advance``): the heartbeats of the leases
    given it run in the test's thread at their due times, and a lease waiting for a holder
    advances it. Its wall clock starts at the real time (a lease record holds a date)."""

    def __init__(self) -> None:
        import time

        self.now = time.time()  # wall clock
        self.elapsed = 0.0  # monotonic clock
        self._beats: list[list[Any]] = []  # [due, every, renew, stop]

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.elapsed

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def beat(self, every: float, renew: Any, stop: Any, name: str) -> Any:
        self._beats.append([self.elapsed + every, every, renew, stop])
        return lambda: None

    def advance(self, seconds: float) -> None:
        """Move both clocks on by ``seconds``, renewing each lease whose heartbeat falls due."""
        end = self.elapsed + seconds
        while due := [b for b in self._beats if not b[3].is_set() and b[0] <= end]:
            beat = min(due, key=lambda b: b[0])
            self._move_to(beat[0])
            if beat[2]():
                beat[0] += beat[1]
            else:
                self._beats.remove(beat)
        self._move_to(end)

    def _move_to(self, elapsed: float) -> None:
        self.now += elapsed - self.elapsed
        self.elapsed = elapsed


def publish_model(output: str | Path, algorithm: str, arrays: dict[str, np.ndarray], *,
                  params: dict[str, Any] | None = None, attrs: dict[str, Any] | None = None,
                  run_id: str = "20250101T000000Z-handmade") -> str:
    """Lay out a published arrayjob output by hand, as a run of ``algorithm`` publishes one
    (``io.output``): ``runs/<run id>/result.zarr`` holding ``arrays`` and ``attrs``, its
    ``report.json`` naming the algorithm and the spec's ``params``, and ``_SUCCESS`` naming the
    run. For models no arrayjob job fits yet (a multinomial logistic regression's (K, d) coef)."""
    root = Path(output)
    prefix = f"runs/{run_id}"
    group = zarr.open_group(str(root / prefix / "result.zarr"), mode="w", zarr_format=3)
    group.attrs.update(attrs or {})
    for name, value in arrays.items():
        # every chunk stored, as arrayjob writes results (zarr skips chunks of zeros otherwise)
        group.create_array(name, data=np.asarray(value), config={"write_empty_chunks": True})
    spec = {"job": {"name": f"{algorithm}-model", "algorithm": algorithm}, "params": params or {}}
    (root / prefix / "report.json").write_text(json.dumps({"algorithm": algorithm, "spec": spec}))
    (root / "_SUCCESS").write_text(json.dumps({"run_id": run_id, "prefix": prefix}))
    return str(root)


def run_tiny_benchmark(script: str, tmp_path: Path, timeout: float) -> dict[str, Any]:
    """``benchmarks/<script> --size tiny --repeat 1`` in a process of its own, its data and
    outputs under ``tmp_path``; the JSON document it wrote (asserts it exited 0).

    Its ``arrayjob run`` processes join this test process's Ray (``RAY_ADDRESS``, as a user's
    runs join a running cluster) rather than each starting one of its own."""
    import json
    import os
    import subprocess
    import sys

    import ray

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address} if ray.is_initialized() else None
    stem = Path(script).stem
    out = tmp_path / f"{stem}.json"
    done = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "benchmarks" / script),
                           "--size", "tiny", "--repeat", "1", "--workdir", str(tmp_path / "work"),
                           "--json", str(out), "--markdown", str(tmp_path / f"{stem}.md")],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())
