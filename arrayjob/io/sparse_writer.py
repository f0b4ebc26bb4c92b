"""Writing a sparse matrix as a CSR group in AnnData's layout (the one ``io.sparse`` reads), a
piece of rows at a time, so a matrix far bigger than memory is never held whole.

The group (Zarr v3) carries ``encoding-type`` "csr_matrix", ``encoding-version`` "0.1.0" and
``shape``; its arrays ``data``, ``indices`` and ``indptr`` are uncompressed with a CRC32C on
every chunk, and every chunk is stored (``io.arrays.create_array``)::

    writer = CsrGroupWriter(location, options, shape=(n, d), nnz=nnz, chunk_rows=1000, row_nnz=30)
    for indptr, indices, data in pieces:  # indptr of the piece's rows, from 0
        writer.write(indptr, indices, data)
    writer.close()

Pieces whose rows and values start on chunk boundaries write every chunk once; others are
still right, at the price of reading back the chunks two pieces share.
"""

from __future__ import annotations

import numpy as np
import zarr

from arrayjob.io.arrays import create_array
from arrayjob.io.locations import Location, StorageCounters, StorageOptions
from arrayjob.io.storage import zarr_store

CSR_ATTRS = {"encoding-type": "csr_matrix", "encoding-version": "0.1.0"}


class CsrGroupWriter:
    """A CSR group of ``shape`` holding ``nnz`` values, created (replacing) at ``location``.

    ``chunk_rows`` rows per chunk of ``indptr``, and ``chunk_rows × row_nnz`` values per chunk of
    ``data`` and ``indices`` (``row_nnz``: the non-zeros of a row on average), so that pieces of
    whole row chunks of ``row_nnz`` values a row start every array on a chunk boundary."""

    def __init__(self, location: Location, options: StorageOptions, *, shape: tuple[int, int], nnz: int,
                 chunk_rows: int, row_nnz: int, dtype: str = "float64", counters: StorageCounters | None = None) -> None:
        self.location, self.shape, self.nnz = location, shape, nnz
        self.counters = counters if counters is not None else StorageCounters()
        group = zarr.open_group(store=zarr_store(location, options, read_only=False, counters=self.counters),
                                mode="w", zarr_format=3)
        group.update_attributes({**CSR_ATTRS, "shape": list(shape)})  # one PUT
        index_dtype = "int32" if shape[1] <= np.iinfo(np.int32).max else "int64"
        indptr_dtype = "int32" if nnz <= np.iinfo(np.int32).max else "int64"
        value_chunk = max(1, min(nnz, chunk_rows * max(1, row_nnz)))
        self._arrays = {
            name: create_array(location.join(name), options, shape=(length,), chunks=(chunk,), dtype=kind,
                               counters=self.counters, checksum=True)
            for name, length, chunk, kind in (
                ("data", nnz, value_chunk, dtype), ("indices", nnz, value_chunk, index_dtype),
                ("indptr", shape[0] + 1, max(1, min(shape[0] + 1, chunk_rows)), indptr_dtype))}
        self._rows = 0  # rows written so far
        self._values = 0  # values written so far

    def write(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray) -> None:
        """Append the rows of one piece: ``indptr`` (its rows + 1 offsets, from 0) into its
        ``indices`` and ``data``."""
        rows, values = len(indptr) - 1, int(indptr[-1])
        if self._rows + rows > self.shape[0] or self._values + values > self.nnz:
            raise ValueError(f"{self.location}: {self._rows + rows} rows and {self._values + values} values "
                             f"are more than the group's {self.shape[0]} and {self.nnz}")
        offsets = np.asarray(indptr, dtype=np.int64) + self._values
        last = self._rows + rows == self.shape[0]  # the last piece writes indptr[n] too: no chunk written twice
        self._arrays["indptr"][self._rows: self._rows + rows + last] = offsets if last else offsets[:-1]
        if values:
            for name, part in (("indices", indices), ("data", data)):
                array = self._arrays[name]
                array[self._values: self._values + values] = np.asarray(part[:values], dtype=array.dtype)
        self._rows += rows
        self._values += values

    def close(self) -> None:
        """Check every row and value was written (an empty matrix writes its one offset here)."""
        if self._rows == 0 and self.shape[0] == 0:
            self._arrays["indptr"][0:1] = np.zeros(1, dtype=np.int64)
        if (self._rows, self._values) != (self.shape[0], self.nnz):
            raise ValueError(f"{self.location}: {self._rows} of {self.shape[0]} rows and {self._values} of "
                             f"{self.nnz} values written")
