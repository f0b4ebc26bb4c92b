"""Sparse inputs (issue 24, the reading): CSR groups in AnnData's layout, written with plain zarr
as a user's pipeline would, opened on the driver (``indptr`` read whole and checked) and read
block by block as the workers do, on local disk and on the loopback S3 server. Every block
equals SciPy's rows of the same matrix, and costs exactly the requests the planner priced."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.linalg
import zarr

from arrayjob.datagen import DatagenRequest, generate
from arrayjob.errors import InputError
from arrayjob.io.arrays import check_chunks_stored, open_array_info, read_block
from arrayjob.io.locations import StorageCounters, StorageOptions, parse_uri
from arrayjob.io.sparse import is_sparse_group, member_info, open_sparse_info, read_sparse_block
from arrayjob.planner.physical import BlockGrid, InputArray
from arrayjob.runner import open_inputs
from arrayjob.runtime.executor import load_and_check
from arrayjob.spec import load_spec
from tests.harness.helpers import run_cli, storage_options, write_array, write_spec

ROWS, COLS = 120, 40


def matrix(seed: int = 0, rows: int = ROWS, cols: int = COLS, density: float = 0.08) -> scipy.sparse.csr_matrix:
    """A random CSR matrix with some empty rows (a row chunk may hold no value at all)."""
    m = scipy.sparse.random(rows, cols, density=density, format="lil", random_state=seed)
    m[10:30] = 0  # 20 empty rows in a run
    return m.tocsr()


def write_csr(uri: str, m: scipy.sparse.csr_matrix | scipy.sparse.csc_matrix, *, chunks: tuple[int, int, int] = (7, 7, 7),
              zarr_format: int = 3, index_dtype: str = "int32", indptr_dtype: str = "int64",
              endpoint: str | None = None, encoding: str = "csr_matrix", **crc: bool) -> None:
    """A CSR (CSC) group with plain zarr: ``chunks`` for data, indices and indptr; uncompressed,
    so the bytes a read takes are known; ``crc=True`` adds the CRC32C codec (v3)."""
    group = zarr.open_group(uri, mode="w", zarr_format=zarr_format, storage_options=storage_options(uri, endpoint))
    group.attrs.update({"encoding-type": encoding, "encoding-version": "0.1.0", "shape": list(m.shape)})
    compressors = [zarr.codecs.Crc32cCodec()] if crc.get("crc") else None
    for name, values, chunk in (("data", m.data, chunks[0]), ("indices", m.indices.astype(index_dtype), chunks[1]),
                                ("indptr", m.indptr.astype(indptr_dtype), chunks[2])):
        array = group.create_array(name, shape=values.shape, chunks=(chunk,), dtype=values.dtype,
                                   compressors=compressors, config={"write_empty_chunks": True})
        array[:] = values


@pytest.fixture(params=["local", "s3"])
def backend(request, tmp_path):
    """(base URI, StorageOptions, endpoint) for a fresh, empty place in each backend."""
    if request.param == "local":
        return str(tmp_path / "bucket"), StorageOptions(), None
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}", StorageOptions(endpoint_url=endpoint), endpoint


def blocks(info, rows_per_block: int):
    n, d = info.shape
    for start in range(0, n, rows_per_block):
        yield (slice(start, min(start + rows_per_block, n)), slice(0, d))


def assert_blocks_read_as_priced(info, m, options, rows_per_block: int) -> None:
    """Every block equals the matrix's rows, and takes exactly the GETs and bytes
    ``info.block_reads`` says (the arrays are uncompressed)."""
    total = 0
    for selection in blocks(info, rows_per_block):
        block, counters = read_block(info, selection, options)
        assert isinstance(block, scipy.sparse.csr_matrix) and block.shape == (selection[0].stop - selection[0].start, m.shape[1])
        np.testing.assert_array_equal(block.toarray(), m[selection[0]].toarray())
        assert (counters.bytes_read, counters.get_requests) == info.block_reads(selection), selection
        assert info.block_nbytes(selection) >= block.data.nbytes + block.indices.nbytes + block.indptr.nbytes
        total += block.nnz
    assert total == m.nnz == info.sparse.nnz


# -- reading ------------------------------------------------------------------------------


@pytest.mark.parametrize(("zarr_format", "chunks", "index_dtype", "indptr_dtype"), [
    (3, (7, 7, 7), "int32", "int64"),
    (3, (13, 5, 9), "int64", "int64"),  # data's chunk is not indices'
    (2, (7, 11, 4), "int32", "int32"),
    (2, (1000, 1000, 1000), "int64", "int32"),  # one chunk each
])
def test_every_block_equals_scipy_and_costs_what_was_priced(backend, zarr_format, chunks, index_dtype, indptr_dtype):
    base, options, endpoint = backend
    m = matrix()
    write_csr(f"{base}/X.zarr", m, chunks=chunks, zarr_format=zarr_format, index_dtype=index_dtype,
              indptr_dtype=indptr_dtype, endpoint=endpoint)
    location = parse_uri(f"{base}/X.zarr")
    assert is_sparse_group(location, options) == "csr_matrix"
    opened = open_sparse_info("X", location, options)
    info, layout = opened.info, opened.info.sparse
    assert (info.shape, info.dtype, info.zarr_format) == ((ROWS, COLS), "float64", zarr_format)
    assert (layout.format, layout.nnz, layout.index_dtype, layout.indptr_dtype) == ("csr", m.nnz, index_dtype, indptr_dtype)
    assert (layout.data_chunk, layout.indices_chunk, layout.indptr_chunk) == chunks
    # rows per chunk: about a chunk of data's non-zeros each, on average
    assert info.chunks == (max(1, min(ROWS, round(chunks[0] * ROWS / m.nnz))), COLS)
    assert layout.offsets == tuple(int(o) for o in m.indptr[::info.chunks[0]]) + (
        () if ROWS % info.chunks[0] == 0 else (m.nnz,))
    # the driver read indptr whole: its chunks, counted
    itemsize = np.dtype(indptr_dtype).itemsize
    indptr_gets = -(-(ROWS + 1) // chunks[2])
    assert opened.counters.get_requests > indptr_gets
    assert opened.counters.bytes_read >= indptr_gets * chunks[2] * itemsize
    for row_chunks in (1, 2, 5):
        assert_blocks_read_as_priced(info, m, options, info.chunks[0] * row_chunks)


@pytest.mark.parametrize("target", [1, 10, 10**6])
def test_target_nnz_per_chunk_sets_the_row_chunk(tmp_path, target):
    m = matrix(seed=1)
    write_csr(str(tmp_path / "X.zarr"), m)
    info = open_sparse_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions(),
                            target_nnz_per_chunk=target).info
    assert info.chunks[0] == max(1, min(ROWS, round(target * ROWS / m.nnz)))
    assert_blocks_read_as_priced(info, m, StorageOptions(), info.chunks[0])


def test_checksummed_chunks_are_priced_with_their_crc(tmp_path):
    m = matrix(seed=2)
    write_csr(str(tmp_path / "X.zarr"), m, chunks=(9, 6, 8), crc=True)
    info = open_sparse_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions()).info
    assert info.sparse.chunk_overhead == (4, 4, 4)
    assert_blocks_read_as_priced(info, m, StorageOptions(), info.chunks[0])


def test_a_csc_group_is_read_in_column_blocks(tmp_path):
    m = matrix(seed=3).tocsc()
    write_csr(str(tmp_path / "X.zarr"), m, encoding="csc_matrix", chunks=(6, 6, 5))
    location = parse_uri(str(tmp_path / "X.zarr"))
    assert is_sparse_group(location, StorageOptions()) == "csc_matrix"
    info = open_sparse_info("X", location, StorageOptions()).info
    assert info.sparse.format == "csc" and info.chunks[0] == ROWS and info.shape == (ROWS, COLS)
    step = info.chunks[1]
    for start in range(0, COLS, step):
        selection = (slice(0, ROWS), slice(start, min(start + step, COLS)))
        block, counters = read_sparse_block(info, selection, StorageOptions())
        assert isinstance(block, scipy.sparse.csc_matrix)
        np.testing.assert_array_equal(block.toarray(), m[:, selection[1]].toarray())
        assert (counters.bytes_read, counters.get_requests) == info.block_reads(selection)


def test_an_empty_matrix_reads_empty_blocks(tmp_path):
    m = scipy.sparse.csr_matrix((9, 4))
    write_csr(str(tmp_path / "X.zarr"), m, chunks=(4, 4, 4))
    info = open_sparse_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions()).info
    assert info.chunks == (9, 4) and info.sparse.offsets == (0, 0)
    block, counters = read_block(info, (slice(0, 9), slice(0, 4)), StorageOptions())
    assert block.nnz == 0 and block.shape == (9, 4)
    assert (counters.bytes_read, counters.get_requests) == info.block_reads((slice(0, 9), slice(0, 4)))


def test_is_sparse_group_is_none_for_anything_else(tmp_path):
    options = StorageOptions()
    write_array(str(tmp_path / "A.zarr"), np.ones((4, 2)), (2, 2))
    zarr.open_group(str(tmp_path / "G.zarr"), mode="w").attrs["encoding-type"] = "dataframe"
    for path in ("A.zarr", "G.zarr", "nothing.zarr"):
        assert is_sparse_group(parse_uri(str(tmp_path / path)), options) is None


# -- a pattern: where the non-zeros are, not their values (PageRank's adjacency) -------------


@pytest.mark.parametrize("layout", ["anndata", "without data", "without encoding-type"])
def test_a_pattern_reads_no_data_and_its_values_are_ones(tmp_path, layout):
    import shutil

    m = matrix(seed=7)
    uri = str(tmp_path / "X.zarr")
    write_csr(uri, m, chunks=(9, 6, 8))
    group = zarr.open_group(uri, mode="r+")
    if layout == "anndata":
        shutil.rmtree(f"{uri}/data/c")  # a read of data would fail
    else:
        del group["data"]
    if layout == "without encoding-type":  # the group arrayjob took for a graph before AnnData's
        del group.attrs["encoding-type"]
        del group.attrs["encoding-version"]
    options = StorageOptions()
    location = parse_uri(uri)
    if layout != "anndata":
        with pytest.raises(InputError):  # values are needed: not a sparse matrix then
            open_sparse_info("X", location, options)
    info = open_sparse_info("X", location, options, pattern=True).info
    layout_ = info.sparse
    assert layout_.pattern and info.dtype == "bool" and layout_.nnz == m.nnz and info.shape == m.shape
    assert layout_.data_chunk == layout_.indices_chunk and layout_.chunk_overhead[0] == 0
    check_chunks_stored(info, options)  # indices' chunks only
    with pytest.raises(ValueError, match="only the pattern of X is read, not its 'data'"):
        member_info(info, "data")
    pattern = scipy.sparse.csr_matrix((np.ones(m.nnz, dtype=bool), m.indices, m.indptr), shape=m.shape)
    assert_blocks_read_as_priced(info, pattern, options, info.chunks[0] * 2)
    everything = (slice(0, ROWS), slice(0, COLS))
    block, _ = read_block(info, everything, options)
    assert block.dtype == bool and block.data.nbytes == m.nnz  # a byte a value, as block_nbytes counts them


# -- the driver's checks --------------------------------------------------------------------


def _attrs(**attrs):
    def change(group):
        group.attrs.update(attrs)
    return change


def _del_attr(name):
    def change(group):
        del group.attrs[name]
    return change


def _replace(member, values):
    def change(group):
        del group[member]
        group.create_array(member, data=np.asarray(values))
    return change


def _set(member, position, value):
    def change(group):
        group[member][position] = value
    return change


SMALL = scipy.sparse.csr_matrix(np.array([[1.0, 0, 2], [0, 0, 3], [4, 5, 0], [0, 0, 0]]))  # indptr 0 2 3 5 5


@pytest.mark.parametrize(("change", "problem"), [
    (_attrs(**{"encoding-type": "dataframe"}), "encoding-type 'dataframe': not a sparse matrix group (expected AnnData's 'csr_matrix' or 'csc_matrix')"),
    (_del_attr("encoding-type"), "no encoding-type attribute: not a sparse matrix group (expected AnnData's 'csr_matrix' or 'csc_matrix')"),
    (_del_attr("shape"), "no shape attribute (expected shape = [rows, columns])"),
    (_attrs(shape=[4]), "shape attribute [4] is not two non-negative integers [rows, columns]"),
    (_attrs(shape=["4", 3]), "shape attribute ['4', 3] is not two non-negative integers [rows, columns]"),
    (_attrs(shape=[5, 3]), "'indptr' holds 5 offsets, expected 6 for shape [5, 3] (one per row, plus one)"),
    (_replace("indptr", [0, 2, 1, 5, 5]), "'indptr' decreases at row 1 (indptr[1] = 2, indptr[2] = 1)"),
    (_replace("indptr", [1, 2, 3, 5, 5]), "'indptr' starts at 1, expected 0"),
    (_replace("indptr", [0, 2, 3, 4, 4]), "'indptr' ends at 4 but 'data' holds 5 values"),
    (_replace("indices", [0, 2, 2, 0]), "'data' holds 5 values but 'indices' 4 (one column index per value)"),
    (lambda group: group.__delitem__("indices"), "member array 'indices' is missing (a csr_matrix group holds data, indices and indptr)"),
    (_replace("indices", [0.0, 2, 2, 0, 1]), "'indices' holds float64, expected integers"),
    (_replace("indptr", np.array([0, 2, 3, 5, 5], dtype="f4")), "'indptr' holds float32, expected integers"),
    (_replace("data", [True, True, False, True, True]), "'data' holds bool, expected numbers"),
    (_replace("data", np.ones((5, 1))), "'data' is 2-D, expected a 1-D array"),
])
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_bad_group_is_one_input_error_naming_the_problem(tmp_path, change, problem, zarr_format):
    uri = str(tmp_path / "X.zarr")
    write_csr(uri, SMALL, chunks=(2, 2, 2), zarr_format=zarr_format)
    change(zarr.open_group(uri, mode="r+"))
    with pytest.raises(InputError) as raised:
        open_sparse_info("X", parse_uri(uri), StorageOptions())
    message = str(raised.value)
    assert message == f"inputs.X: {uri}: {problem}"
    assert "\n" not in message


@pytest.mark.parametrize(("change", "problem"), [
    (lambda group: group.__delitem__("indices"),
     "member array 'indices' is missing (the pattern of a csr_matrix group is read from indices and indptr)"),
    (_replace("indptr", [0, 2, 3, 4, 4]), "'indptr' ends at 4 but 'indices' holds 5 values"),
])
def test_a_bad_pattern_is_one_input_error_naming_the_problem(tmp_path, change, problem):
    uri = str(tmp_path / "X.zarr")
    write_csr(uri, SMALL, chunks=(2, 2, 2))
    group = zarr.open_group(uri, mode="r+")
    del group["data"]
    change(group)
    with pytest.raises(InputError) as raised:
        open_sparse_info("X", parse_uri(uri), StorageOptions(), pattern=True)
    assert str(raised.value) == f"inputs.X: {uri}: {problem}"


def test_a_column_index_outside_the_matrix_names_its_row(backend):
    base, options, endpoint = backend
    write_csr(f"{base}/X.zarr", SMALL, chunks=(2, 2, 2), endpoint=endpoint)
    zarr.open_group(f"{base}/X.zarr", mode="r+", storage_options=storage_options(base, endpoint))["indices"][3] = 3
    info = open_sparse_info("X", parse_uri(f"{base}/X.zarr"), options, target_nnz_per_chunk=1).info
    assert info.chunks[0] == 1
    read_block(info, (slice(0, 2), slice(0, 3)), options)  # rows 0 and 1 are sound
    with pytest.raises(InputError, match=rf"^inputs\.X: {base}/X\.zarr: row 2 holds column index 3, outside \[0, 3\)$"):
        read_block(info, (slice(2, 4), slice(0, 3)), options)


def test_a_missing_or_corrupt_chunk_is_named_in_its_member_array(tmp_path):
    m = matrix(seed=4)
    uri = str(tmp_path / "X.zarr")
    write_csr(uri, m, chunks=(7, 7, 7), crc=True)
    options = StorageOptions()
    info = open_sparse_info("X", parse_uri(uri), options).info
    check_chunks_stored(info, options)
    os.remove(f"{uri}/data/c/3")
    everything = (slice(0, ROWS), slice(0, COLS))
    with pytest.raises(InputError, match=rf"^inputs\.X: chunk \(3,\) \(key 'c/3'\) of {uri}/data is missing: lost data"):
        read_block(info, everything, options)
    last = -(-m.nnz // 7) - 1
    os.remove(f"{uri}/indices/c/{last}")
    with pytest.raises(InputError, match=rf"^inputs\.X: chunk \({last},\) \(key 'c/{last}'\) of {uri}/indices is missing"):
        check_chunks_stored(info, options)
    path = Path(f"{uri}/indptr/c/1")
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(InputError, match=rf"^inputs\.X: chunk \(1,\) \(key 'c/1'\) of {uri}/indptr is corrupt: "
                                         "its CRC32C checksum does not match its bytes"):
        open_sparse_info("X", parse_uri(uri), options)


# -- where the run meets it ----------------------------------------------------------------


def test_open_inputs_opens_a_sparse_group_as_one_input(tmp_path):
    m = matrix(seed=5)
    write_csr(str(tmp_path / "X.zarr"), m, zarr_format=2)
    write_array(str(tmp_path / "y.zarr"), np.zeros(ROWS), (50,))
    spec = load_spec(write_spec(tmp_path / "job.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out"))
    reads = StorageCounters()
    arrays = open_inputs(spec, reads)
    assert set(arrays) == {"X", "y"} and arrays["y"].sparse is None
    assert arrays["X"].sparse is not None and arrays["X"].sparse.nnz == m.nnz
    assert reads.get_requests > 0 and reads.bytes_read > 0
    with pytest.raises(InputError, match="is a Zarr group, expected an array"):
        open_array_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions())


def test_a_sparse_block_is_checked_and_sized_by_its_arrays(tmp_path):
    m = matrix(seed=6)
    uri = str(tmp_path / "X.zarr")
    write_csr(uri, m)
    options = StorageOptions()
    info = open_sparse_info("X", parse_uri(uri), options).info
    source = InputArray(info, BlockGrid(info.shape, (info.chunks[0] * 3, COLS)))
    block, stats = load_and_check(source, (1, 0), options)
    assert stats["nbytes"] == block.data.nbytes + block.indices.nbytes + block.indptr.nbytes
    assert (stats["bytes_read"], stats["get_requests"]) == info.block_reads(source.grid.selection((1, 0)))
    row = int(np.flatnonzero(np.diff(m.indptr))[-1])  # the last row that holds a value
    zarr.open_group(uri, mode="r+")["data"][m.indptr[row]] = np.nan
    last = (row // source.grid.block_shape[0], 0)
    where = source.grid.selection(last)[0]
    with pytest.raises(InputError, match=rf"^inputs\.X: NaN or infinite values in \[{where.start}:{where.stop}, 0:{COLS}\]"):
        load_and_check(source, last, options)


# -- arrayjob datagen --nnz-per-row ----------------------------------------------------------


def load_csr(uri: str, endpoint: str | None = None) -> scipy.sparse.csr_matrix:
    """The group as any AnnData reader would load it: its three arrays and its shape."""
    group = zarr.open_group(uri, mode="r", storage_options=storage_options(uri, endpoint))
    assert group.attrs["encoding-type"] == "csr_matrix" and group.attrs["encoding-version"] == "0.1.0"
    return scipy.sparse.csr_matrix((group["data"][:], group["indices"][:], group["indptr"][:]),
                                   shape=tuple(group.attrs["shape"]))


@pytest.mark.parametrize("algorithm", ["logreg", "linreg", "kmeans"])
def test_datagen_writes_a_csr_group_read_back_block_by_block(backend, algorithm):
    base, options, endpoint = backend
    request = DatagenRequest(parse_uri(f"{base}/demo"), rows=1000, cols=300, chunk_rows=128, seed=3,
                             options=options, k=4, nnz_per_row=6)
    generate(algorithm, request)
    m = load_csr(f"{base}/demo/X.zarr", endpoint)
    assert m.shape == (1000, 300) and m.nnz == 6000 and (np.diff(m.indptr) == 6).all()
    assert m.has_sorted_indices and np.isfinite(m.data).all()
    info = open_sparse_info("X", parse_uri(f"{base}/demo/X.zarr"), options).info
    layout = info.sparse
    assert (layout.data_chunk, layout.indices_chunk, layout.indptr_chunk) == (128 * 6, 128 * 6, 128)
    assert (layout.index_dtype, layout.indptr_dtype, layout.chunk_overhead) == ("int32", "int32", (4, 4, 4))
    assert info.chunks == (128, 300)  # a row chunk holds a data chunk's values exactly
    assert_blocks_read_as_priced(info, m, options, 256)
    if algorithm == "kmeans":  # points around 4 centres: 4 sets of columns
        assert len({tuple(m.indices[m.indptr[i]:m.indptr[i + 1]]) for i in range(1000)}) == 4
        return
    y = zarr.open_array(f"{base}/demo/y.zarr", mode="r", storage_options=storage_options(base, endpoint))[:]
    assert y.shape == (1000,)
    if algorithm == "logreg":
        assert set(np.unique(y)) == {0.0, 1.0}
    else:  # y = X w + 0.5 + noise: least squares on X recovers it to the noise
        design = scipy.sparse.hstack([m, np.ones((1000, 1))]).tocsr()
        residual = y - design @ scipy.sparse.linalg.lsqr(design, y, atol=1e-10, btol=1e-10)[0]
        assert residual.std() < 0.15


def test_datagen_sparse_on_the_command_line(tmp_path, capsys):
    code, out, err = run_cli(["datagen", "logreg", str(tmp_path / "demo"), "--nnz-per-row", "5", "--rows", "1000",
                              "--cols", "5000"], capsys)
    assert code == 0, err
    assert out.startswith(f"wrote logreg demo data to {tmp_path / 'demo'}: ") and out.count("\n") == 1
    m = load_csr(str(tmp_path / "demo/X.zarr"))
    assert m.shape == (1000, 5000) and m.nnz == 5000 and m.indices.max() < 5000
    assert m.has_canonical_format  # sorted, no column twice in a row


@pytest.mark.parametrize(("args", "problem"), [
    (["tsqr", "--nnz-per-row", "5"],
     "datagen: a sparse X (--nnz-per-row, --density) is made for logreg, linreg, kmeans, als, not tsqr"),
    (["als"], "datagen: als writes a sparse matrix: give --nnz-per-row (or --density)"),
    (["logreg", "--nnz-per-row", "5", "--density", "0.1"], "datagen: give --nnz-per-row or --density, not both"),
    (["logreg", "--nnz-per-row", "40", "--cols", "32"], "datagen: --nnz-per-row must be from 1 to --cols (32), got 40"),
    (["logreg", "--density", "1.5"], "datagen: --density must be in (0, 1], got 1.5"),
])
def test_datagen_sparse_refuses_what_it_cannot_make(tmp_path, capsys, args, problem):
    code, out, err = run_cli(["datagen", args[0], str(tmp_path / "demo"), *args[1:]], capsys)
    assert code == 2 and err.strip().splitlines() == [f"arrayjob: error: {problem}"]
    assert not (tmp_path / "demo").exists()


def test_a_wide_matrix_is_held_by_columns_and_sized_so(tmp_path):
    """Past HELD_BY_COLUMNS_ABOVE columns a row block is converted to CSC as it is read (its
    products then touch row-length vectors), and the plan sizes it with d + 1 pointers."""
    from arrayjob.io.locations import HELD_BY_COLUMNS_ABOVE
    from arrayjob.kernels.sparse import nbytes

    d = HELD_BY_COLUMNS_ABOVE + 1
    rng = np.random.default_rng(3)
    m = scipy.sparse.random(60, d, density=4 / d, format="csr", random_state=rng, dtype=np.float64)
    write_csr(str(tmp_path / "X.zarr"), m, chunks=(50, 50, 20))
    info = open_sparse_info("X", parse_uri(str(tmp_path / "X.zarr")), StorageOptions()).info
    assert info.held_by_columns
    rows = (slice(0, info.chunks[0]), slice(0, d))
    block, _ = read_sparse_block(info, rows, StorageOptions())
    assert block.format == "csc" and block.shape == (info.chunks[0], d)
    assert (block != m[: info.chunks[0]]).nnz == 0
    per_value = 8 + np.dtype(info.sparse.index_dtype).itemsize
    assert info.block_nbytes(rows) == block.nnz * per_value + (d + 1) * np.dtype(info.sparse.indptr_dtype).itemsize
    assert info.block_nbytes(rows) >= nbytes(block)
