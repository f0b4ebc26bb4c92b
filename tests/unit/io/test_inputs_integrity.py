"""Inputs that lie are refused, not computed on (issue 15 section 2): a missing chunk or
shard, a chunk whose checksum fails, metadata declaring far more data than is stored; and
plans that need more memory than a node has are warned of."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from arrayjob.errors import InputError, SpecError
from arrayjob.io.arrays import create_array, open_array_info, read_block
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.spec import read_spec, validate
from tests.harness.helpers import (
    run_cli,
    without_progress,
    write_spec,
)

L2 = 1e-3


def _one_error_line(err: str) -> str:
    lines = without_progress(err).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("arrayjob: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _spec(path: Path, inputs: dict[str, str], output: str, storage: str = "") -> Path:
    return write_spec(path, inputs=inputs, output=output, params=f"l2 = {L2}\nsolver = \"newton\"\n",
                      storage=storage)


# -- a missing chunk ------------------------------------------------------------------------


def _write(path: Path, **kwargs) -> None:
    z = zarr.create_array(str(path), shape=(40, 3), chunks=(10, 3), dtype="f8", **kwargs)
    z[...] = np.arange(1.0, 121.0).reshape(40, 3)


@pytest.mark.parametrize(("kwargs", "removed", "named"), [
    ({}, "c/1/0", "chunk (1, 0) (key 'c/1/0')"),
    ({"zarr_format": 2}, "1.0", "chunk (1, 0) (key '1.0')"),
    ({"shards": (20, 3)}, "c/1/0", "shard (1, 0) (key 'c/1/0')"),
])
def test_missing_chunk_or_shard_is_named_by_the_block_read(tmp_path, kwargs, removed, named):
    _write(tmp_path / "A.zarr", **kwargs)
    os.remove(tmp_path / "A.zarr" / removed)
    location, options = parse_uri(str(tmp_path / "A.zarr")), StorageOptions()
    info = open_array_info("A", location, options)
    first, _ = read_block(info, (slice(0, 10), slice(0, 3)), options)  # a block without the missing chunk
    np.testing.assert_array_equal(first, np.arange(1.0, 31.0).reshape(10, 3))
    with pytest.raises(InputError, match=r"inputs\.A: " + named.replace("(", r"\(").replace(")", r"\)")):
        read_block(info, (slice(0, 40), slice(0, 3)), options)
    sparse = open_array_info("A", location, options, missing_chunks="fill")
    block, _ = read_block(sparse, (slice(0, 40), slice(0, 3)), options)
    missing_rows = slice(20, 40) if "shards" in kwargs else slice(10, 20)
    assert (block[missing_rows] == 0).all() and block.sum() > 0


# -- metadata declaring more than is stored --------------------------------------------------


def test_declared_shape_beyond_the_data_is_refused_before_planning(data, capsys):
    """X's metadata says 10^12 rows over 4 stored chunks: refused at validation (two HEAD
    requests per input), before planning or starting Ray; before, it ground for minutes."""
    for name, shape in (("X", [10**12, 3]), ("y", [10**12])):
        meta = data / f"data/{name}.zarr/zarr.json"
        doc = json.loads(meta.read_text())
        doc["shape"] = shape
        meta.write_text(json.dumps(doc))
    spec = _spec(data / "job.toml", {"X": "data/X.zarr", "y": "data/y.zarr"}, "out")
    start = time.perf_counter()
    code, _, err = run_cli(["run", str(spec), "--set", "cluster.address=127.0.0.1:1"], capsys)
    seconds = time.perf_counter() - start
    line = _one_error_line(err)
    assert code == 2, err  # not 5: nothing reached for Ray
    assert "inputs.X: chunk (19999999999, 0) (key 'c/19999999999/0')" in line and "is missing" in line
    assert seconds < 20
    assert not (data / "out").exists()


# -- checksums -------------------------------------------------------------------------------


def _flip(raw: bytes) -> bytes:
    """The chunk with one float64 replaced by another finite one: garbage of the right size."""
    out = bytearray(raw)
    out[8:16] = np.float64(7.5).tobytes()
    return bytes(out)


def test_checksum_catches_what_plain_chunks_let_through(tmp_path):
    """The same damage to a chunk with and without zarr's crc32c codec: without it the read
    returns wrong numbers silently; with it, the read fails naming the chunk."""
    options = StorageOptions()
    for name, checksum in (("plain", False), ("checked", True)):
        array = create_array(parse_uri(str(tmp_path / name)), options, shape=(40, 3), chunks=(10, 3),
                             dtype="float64", checksum=checksum)
        array[...] = np.arange(120.0).reshape(40, 3)
        chunk = tmp_path / name / "c/2/0"
        chunk.write_bytes(_flip(chunk.read_bytes()))
    plain = open_array_info("plain", parse_uri(str(tmp_path / "plain")), options)
    block, _ = read_block(plain, (slice(0, 40), slice(0, 3)), options)
    assert block[20, 1] == 7.5  # computed on, unnoticed
    checked = open_array_info("checked", parse_uri(str(tmp_path / "checked")), options)
    with pytest.raises(InputError, match=r"inputs\.checked: chunk \(2, 0\) \(key 'c/2/0'\) .* CRC32C checksum"):
        read_block(checked, (slice(0, 40), slice(0, 3)), options)


# -- the [inputs] table ----------------------------------------------------------------------


def _validate(tmp_path: Path, x_entry: str) -> object:
    path = tmp_path / "job.toml"
    path.write_text(f'[job]\nname = "j"\nalgorithm = "logreg"\n[inputs]\nX = {x_entry}\ny = "y.zarr"\n'
                    f'[output]\nuri = "out"\n')
    return validate(read_spec(path))


def test_inputs_entry_forms(tmp_path):
    spec = _validate(tmp_path, '"x.zarr"')
    assert spec.inputs["X"].path.endswith("/x.zarr") and spec.missing_chunks["X"] == "error"
    spec = _validate(tmp_path, '{ uri = "x.zarr", missing_chunks = "fill" }')
    assert spec.inputs["X"].path.endswith("/x.zarr") and spec.missing_chunks == {"X": "fill", "y": "error"}
    assert _validate(tmp_path, '{ uri = "x.zarr" }').missing_chunks["X"] == "error"


@pytest.mark.parametrize(("entry", "message"), [
    ('{ uri = "x.zarr", missing_chunks = "zero" }',
     "inputs.X.missing_chunks: expected one of 'error', 'fill', got 'zero'"),
    ('{ uri = "x.zarr", missing_chunks = true }', "inputs.X.missing_chunks: expected one of 'error', 'fill', got True"),
    ('{ missing_chunks = "fill" }', "inputs.X.uri: required key is missing"),
    ('{ uri = "x.zarr", fill = true }',
     "inputs.X.fill: unknown key (expected one of: uri, format, missing_chunks, columns, column, nulls, id_column)"),
    ('{ uri = 3 }', "inputs.X.uri: expected a string, got 3"),
])
def test_inputs_entry_errors(tmp_path, entry, message):
    with pytest.raises(SpecError) as caught:
        _validate(tmp_path, entry)
    assert str(caught.value) == message


def test_bad_missing_chunks_is_one_line_exit_2(workdir, capsys):
    spec = write_spec(workdir / "job.toml", inputs={"y": "y.zarr"}, output="out")
    spec.write_text(spec.read_text().replace("[inputs]\n", '[inputs]\nX = { uri = "x.zarr", missing_chunks = "maybe" }\n'))
    code, out, err = run_cli(["plan", str(spec)], capsys)
    assert code == 2 and out == ""
    assert _one_error_line(err).endswith("inputs.X.missing_chunks: expected one of 'error', 'fill', got 'maybe'")


# -- plans bigger than a node ----------------------------------------------------------------


@pytest.fixture
def huge(workdir: Path) -> Path:
    """Metadata only: X 10^9 × 5 float64 (40 GB) in 20 chunks, y 10^9; plan and estimate read
    no data, so nothing more is stored."""
    for name, shape, chunks in (("X", (10**9, 5), (5 * 10**7, 5)), ("y", (10**9,), (5 * 10**7,))):
        zarr.create_array(str(workdir / f"{name}.zarr"), shape=shape, chunks=chunks, dtype="f8")
    return write_spec(workdir / "job.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out")


def _warning(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("arrayjob: warning: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_plan_and_estimate_warn_when_a_node_is_too_small(huge, capsys):
    code, out, err = run_cli(["plan", str(huge)], capsys)
    assert code == 0
    line = _warning(err)
    assert "the plan needs 48.0 GB of memory on a node, but one local node has 24 GiB" in line
    assert line.endswith("about 3 such nodes would hold it (--nodes 3)")
    assert "warning" not in out.lower()

    # estimate plans residency under the memory budget: on one node the inputs stream, the
    # peak stays within the budget (no warning), and the choice says how many would hold it
    code, out, err = run_cli(["estimate", str(huge), "--format", "json", "--instance-type", "m5.xlarge",
                              "--nodes", "1"], capsys)
    doc = json.loads(out)  # stdout stays JSON
    assert code == 0 and err == "" and doc["memory"]["resident_fraction"] < 0.2
    assert doc["memory"]["peak_bytes_per_node"][0] <= doc["memory"]["budget_bytes"] < 16 * 2**30
    assert doc["choice"]["needed"] > 1 and not doc["choice"]["fits"]
    code, out, err = run_cli(["estimate", str(huge), "--format", "json", "--instance-type", "m5.xlarge"], capsys)
    doc = json.loads(out)
    assert code == 0 and err == "" and doc["choice"]["rule"] == "unsized" and doc["nodes"]["count"] == 1

    code, out, err = run_cli(["plan", str(huge), "--nodes", "3"], capsys)  # the suggested count fits
    assert code == 0 and "warning" not in err


# -- what arrayjob writes passes its own checks --------------------------------------------------
def test_results_store_every_chunk_with_a_checksum(tmp_path: Path) -> None:
    """A result chunk of zeros is stored (Zarr skips fill-value chunks by default), so a
    result read as a later job's input is not refused as lost data; and it is checksummed."""
    from arrayjob.io.arrays import ResultGroup, write_block, write_group

    group = ResultGroup(parse_uri(str(tmp_path / "result.zarr")), StorageOptions())
    info = group.create_array("labels", shape=(8,), chunks=(4,), dtype="int64")
    write_block(info, StorageOptions(), ((0, 8),), np.array([0, 0, 0, 0, 1, 2, 3, 1]))  # chunk 0: fill values
    write_group(group.location, StorageOptions(), {"coef": np.zeros(3)}, {})
    assert (tmp_path / "result.zarr" / "labels" / "c" / "0").exists()
    assert (tmp_path / "result.zarr" / "coef" / "c" / "0").exists()
    for name in ("labels", "coef"):
        codecs = json.loads((tmp_path / "result.zarr" / name / "zarr.json").read_text())["codecs"]
        assert "crc32c" in [c["name"] for c in codecs]
        read = open_array_info(name, parse_uri(str(tmp_path / "result.zarr" / name)), StorageOptions())
        block, _ = read_block(read, tuple(slice(0, s) for s in read.shape), StorageOptions())
        assert not block.any() if name == "coef" else block[:4].sum() == 0
