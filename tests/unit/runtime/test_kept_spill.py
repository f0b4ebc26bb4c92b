"""Kept blocks in a node's spill: written whole, mapped back in place, lost loudly."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import scipy.sparse

from arrayjob.runtime import kept_spill


@dataclass(frozen=True)
class Block:  # the shape of PageRank's graph blocks: a matrix and a mask, in an object array
    matrix: scipy.sparse.csr_matrix
    dangling: np.ndarray
    name: str


def test_a_block_comes_back_equal_read_only_and_mapped(tmp_path) -> None:
    rng = np.random.default_rng(0)
    m = scipy.sparse.random(300, 500, density=0.02, format="csr", random_state=rng)
    row = np.empty((1, 1), dtype=object)
    row[0, 0] = Block(m, rng.random(300) > 0.5, "b0")
    path = str(tmp_path / "spill" / "b0.bin")
    size = kept_spill.write(path, row)
    assert size >= m.data.nbytes + m.indices.nbytes + m.indptr.nbytes
    back = kept_spill.read(path)[0, 0]
    assert back.name == "b0" and np.array_equal(back.dangling, row[0, 0].dangling)
    assert (back.matrix != m).nnz == 0
    x = rng.random(500)
    np.testing.assert_array_equal(back.matrix @ x, m @ x)
    for array in (back.matrix.data, back.matrix.indices, back.dangling):
        assert not array.flags.writeable  # a view of the mapped file, as a block from the object store
        assert array.ctypes.data % kept_spill.ALIGN == 0
    assert not list((tmp_path / "spill").glob("*.tmp"))  # written whole, then renamed


def test_plain_arrays_and_scalars_round_trip(tmp_path) -> None:
    for i, value in enumerate([np.arange(10.0).reshape(2, 5)[:, ::2], np.zeros(0), 3.5, {"a": np.ones(3)}]):
        path = str(tmp_path / f"{i}.bin")
        kept_spill.write(path, value)
        back = kept_spill.read(path)
        if isinstance(value, dict):
            np.testing.assert_array_equal(back["a"], value["a"])
        else:
            np.testing.assert_array_equal(back, value)


def test_a_block_whose_file_is_gone_says_so(tmp_path) -> None:
    kept = kept_spill.KeptFile(str(tmp_path / "gone.bin"), "a" * 56, 100)
    with pytest.raises(kept_spill.KeptBlockLost, match="not on this node"):
        kept.read()


def test_a_worker_keeps_blocks_mapped_between_tasks_until_their_files_go(tmp_path) -> None:
    cache = kept_spill._Mapped(limit=250)
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"{i}.bin"))
        kept_spill.write(paths[-1], np.full(10, float(i)))
    first = cache.get(paths[0], 100)
    assert cache.get(paths[0], 100) is first  # mapped once, found again
    cache.get(paths[1], 100)
    cache.get(paths[2], 100)  # over the limit: the least recently used goes
    assert list(cache.blocks) == paths[1:] and cache.bytes == 200
    (tmp_path / "1.bin").unlink()
    cache.get(paths[2], 100)  # a block whose file is gone is dropped at the next read
    assert list(cache.blocks) == paths[2:] and cache.bytes == 100
    with pytest.raises(FileNotFoundError):
        cache.get(paths[1], 100)
