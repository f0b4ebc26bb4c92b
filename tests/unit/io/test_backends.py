"""Storage conformance: what every ``StorageBackend`` must do, run against each one for real
(a local directory and the loopback S3 server), as zarr-python's ``StoreTests``."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import zarr

from arrayjob.io._local import MAP_BYTES
from arrayjob.io.backend import StorageBackend, backend_for
from arrayjob.io.locations import Location, StorageCounters, StorageOptions, parse_uri


@pytest.fixture(params=["local", "s3"])
def backend(request, tmp_path) -> StorageBackend:
    """A backend rooted at a fresh, empty place of each storage system."""
    if request.param == "local":
        return backend_for(parse_uri(str(tmp_path / "bucket" / "root")), StorageOptions())
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    return backend_for(parse_uri(f"s3://{bucket}/root"), StorageOptions(endpoint_url=endpoint))


class TestStorageBackend:
    def test_objects_round_trip(self, backend):
        assert not backend.exists("a/b.json")
        backend.write_bytes("a/b.json", b"one")
        assert backend.exists("a/b.json") and backend.read_bytes("a/b.json") == b"one"
        backend.write_bytes("a/b.json", b"two")  # a plain write replaces
        assert backend.read_bytes("a/b.json") == b"two"

    def test_missing_object_is_file_not_found(self, backend):
        with pytest.raises(FileNotFoundError):
            backend.read_bytes("nothing")

    def test_a_prefix_is_not_an_object(self, backend):
        backend.write_bytes("dir/x", b"x")
        assert not backend.exists("dir")

    def test_exclusive_write_creates_once(self, backend):
        backend.write_bytes("lease", b"first", exclusive=True)
        with pytest.raises(FileExistsError):
            backend.write_bytes("lease", b"second", exclusive=True)
        assert backend.read_bytes("lease") == b"first"

    def test_exclusive_write_has_one_winner_in_a_race(self, backend):
        outcomes: list[str] = []
        start = threading.Barrier(4)

        def take(i: int) -> None:
            start.wait()
            try:
                backend.write_bytes("lease", f"writer {i}".encode(), exclusive=True)
                outcomes.append(f"writer {i}")
            except FileExistsError:
                outcomes.append("refused")

        threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if o != "refused"]
        assert len(outcomes) == 4 and len(winners) == 1
        assert backend.read_bytes("lease") == winners[0].encode()

    def test_list_is_recursive_relative_sorted_and_by_path_segment(self, backend):
        # (no key is both an object and a prefix: a filesystem cannot hold that)
        for key, data in {"p/b/c": b"333", "p/a": b"22", "pa/x": b"4", "q": b"5"}.items():
            backend.write_bytes(key, data)
        assert backend.list("p") == {"p/a": 2, "p/b/c": 3}  # not "pa/x"
        assert list(backend.list()) == ["p/a", "p/b/c", "pa/x", "q"]
        assert backend.list("q") == {}  # an object is not a prefix
        assert backend.list("missing") == {}

    def test_move_replaces_targets_and_removes_sources(self, backend):
        backend.write_bytes("stage/r/one", b"1")
        backend.write_bytes("stage/r/two/deep", b"22")
        backend.write_bytes("one", b"old")
        requests = backend.move([("stage/r/one", "one"), ("stage/r/two/deep", "two/deep")])
        assert isinstance(requests, int) and requests >= 0
        assert backend.read_bytes("one") == b"1" and backend.read_bytes("two/deep") == b"22"
        assert backend.list("stage") == {}

    def test_delete_takes_the_object_and_everything_under_it_only(self, backend):
        for key in ("out/a", "out/b/c", "outer/x", "keep", "kept"):
            backend.write_bytes(key, b"x")
        backend.delete("out")
        backend.delete("keep")
        assert list(backend.list()) == ["kept", "outer/x"]
        backend.delete("never-written")  # nothing there is fine
        backend.delete()
        assert backend.list() == {}

    def test_child_is_rooted_below_and_the_empty_key_is_the_location(self, backend):
        child = backend.child("sub", "leaf.json")
        assert child.location == backend.location.join("sub/leaf.json")
        child.write_bytes("", b"{}")
        assert child.exists() and child.read_bytes() == b"{}"
        assert backend.list() == {"sub/leaf.json": 2}

    def test_zarr_store_writes_and_block_store_reads_counted(self, backend):
        written = StorageCounters()
        array = zarr.create_array(store=backend.zarr_store(read_only=False, counters=written), shape=(8, 2),
                                  chunks=(4, 2), dtype="float64", compressors=None)
        array[:] = np.arange(16.0).reshape(8, 2)
        assert written.put_requests == 3 and written.bytes_written > 128  # zarr.json and two chunks
        read = StorageCounters()
        blocks = zarr.open_array(store=backend.block_store(read), mode="r")
        before = StorageCounters(**read.as_dict())
        np.testing.assert_array_equal(blocks[4:8], np.arange(8.0, 16.0).reshape(4, 2))
        # one GET of one uncompressed chunk of 4 × 2 float64
        assert (read.get_requests - before.get_requests, read.bytes_read - before.bytes_read) == (1, 64)
        assert backend.list().keys() >= {"zarr.json", "c/0/0", "c/1/0"}

    def test_byte_ranges_and_tails_are_one_get_each_counted(self, backend):
        backend.write_bytes("dir/file", bytes(range(100)))
        counters = StorageCounters()
        assert backend.read_range("dir/file", 10, 14, counters) == bytes([10, 11, 12, 13])
        assert backend.read_range("dir/file", 95, 120, counters) == bytes(range(95, 100))  # ends with the object
        assert backend.read_tail("dir/file", 3, counters) == (bytes([97, 98, 99]), 100)
        assert backend.read_tail("dir/file", 500, counters) == (bytes(range(100)), 100)  # all of a shorter one
        assert (counters.get_requests, counters.bytes_read) == (4, 4 + 5 + 3 + 100)
        backend.write_bytes("empty", b"")
        assert backend.read_tail("empty", 8) == (b"", 0)  # S3 answers a suffix range of nothing with a 200
        with pytest.raises(FileNotFoundError):
            backend.read_range("missing", 0, 4)
        with pytest.raises(FileNotFoundError):
            backend.read_tail("missing", 4)


    def test_a_big_byte_range_is_a_read_only_view_of_exactly_its_bytes(self, backend):
        # past MAP_BYTES a local range is the file's pages mapped (from a page boundary below
        # ``start``), an S3 range the response's body: neither copied, both exactly the range
        data = np.random.default_rng(0).integers(0, 256, 3 * MAP_BYTES, dtype=np.uint8).tobytes()
        backend.write_bytes("big", data)
        counters = StorageCounters()
        start, stop = 12_345, 2 * MAP_BYTES + 6_789
        view = backend.read_range("big", start, stop, counters)
        assert isinstance(view, memoryview) and view.readonly
        assert view == data[start:stop]
        tail = backend.read_range("big", 2 * MAP_BYTES, 5 * MAP_BYTES, counters)  # ends with the object
        assert tail == data[2 * MAP_BYTES:]
        assert (counters.get_requests, counters.bytes_read) == (2, (stop - start) + MAP_BYTES)
    def test_read_only_store_refuses_writes(self, backend):
        zarr.create_array(store=backend.zarr_store(read_only=False), shape=(2,), chunks=(2,), dtype="int8")
        array = zarr.open_array(store=backend.zarr_store(read_only=True), mode="r")
        with pytest.raises(ValueError, match="read.only|read-only"):
            array[:] = 1


def test_unknown_scheme_names_the_known_ones():
    with pytest.raises(ValueError, match="no storage backend for scheme 'gs' .*file, s3"):
        backend_for(Location("gs", "bucket/key"), StorageOptions())
