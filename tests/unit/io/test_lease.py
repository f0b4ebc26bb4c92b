"""One output, one publisher: the lease, racing runs, takeovers, and overwrites under a reader.

Everything runs against real storage (a local directory and the loopback S3 server): races
are real threads or real ``arrayjob run`` processes on one output.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

import numpy as np
import pytest
import zarr

from arrayjob.errors import LeaseHeldError
from arrayjob.io.arrays import write_group
from arrayjob.io.backend import backend_for
from arrayjob.io.lease import Lease, LeaseRecord
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.io.output import JobOutput
from tests.harness.helpers import (
    ManualClock,
    read_result,
    run_cli,
    storage_options,
    without_progress,
    write_array,
    write_spec,
)


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path):
    """(base URI, StorageOptions, endpoint) of a fresh, empty place in each backend."""
    if request.param == "local":
        return str(tmp_path / "bucket"), StorageOptions(), None
    endpoint = request.getfixturevalue("s3_endpoint")
    return f"s3://{request.getfixturevalue('s3_bucket')}", StorageOptions(endpoint_url=endpoint), endpoint


def _race(n, target):
    """Run ``target(i)`` in ``n`` threads released together; returns what each returned or raised."""
    start = threading.Barrier(n)
    results: list[object] = [None] * n

    def one(i):
        start.wait()
        try:
            results[i] = target(i)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return results


def _stale_lease(backend, epoch=1, run_id="20240101T000000Z-dead0000", age=3600.0):
    """The lease object a run that died long ago left behind."""
    record = LeaseRecord(epoch, run_id, "gone-host", 4242, "2024-01-01T00:00:00+00:00", time.time() - age, 60.0)
    backend.write_bytes(f"_lease/{epoch:010d}", record.to_json(), exclusive=True)


class TestLease:
    @pytest.mark.parametrize("takers", [2, 4])
    def test_racing_publishers_one_wins_the_others_skip(self, place, takers, monkeypatch):
        """Each racer is the whole publishing path (lease, check, write, commit) of one run."""
        monkeypatch.setenv("ARRAYJOB_LEASE_SECONDS", "3")
        base, options, _ = place
        location = parse_uri(f"{base}/out")
        lines: list[str] = []

        def run(i):
            out = JobOutput(location, options, "same-spec")
            if out.check_rerun(overwrite=False) is not None:
                return "skipped before the lease"
            done = out.take(overwrite=False, notify=lines.append)
            if done is not None:
                return f"already complete: {done.manifest['run_id']}"
            try:
                write_group(out.staging.join("result.zarr"), options, {"labels": np.full(50, i)}, {"writer": i})
                out.write_json("report.json", {"writer": i})
                return f"published: {out.commit()['run_id']}"
            finally:
                out.release()

        results = _race(takers, run)
        assert not [r for r in results if isinstance(r, Exception)], results
        winners = [r.split(": ")[1] for r in results if r.startswith("published")]
        assert len(winners) == 1, results
        assert all(r == f"already complete: {winners[0]}" or r == "skipped before the lease" for r in results
                   if not r.startswith("published"))
        assert all(re.fullmatch(r"waiting for run \S+ on \S+ \(pid \d+, since \S+\), which is writing \S+", x)
                   for x in lines), lines
        backend = backend_for(location, options)
        assert {k.split("/")[0] for k in backend.list()} == {"_SUCCESS", "runs"}
        writer = json.loads(backend.read_bytes(f"runs/{winners[0]}/report.json"))["writer"]
        group = zarr.open_group(store=backend.child("runs", winners[0], "result.zarr").zarr_store(read_only=True), mode="r")
        assert (group["labels"][:] == writer).all() and group.attrs["writer"] == writer

    def test_stale_lease_is_taken_over_by_exactly_one(self, place):
        base, options, _ = place
        backend = backend_for(parse_uri(f"{base}/out"), options)
        _stale_lease(backend)
        lines: list[list[str]] = [[] for _ in range(4)]
        leases = [Lease(backend, f"taker-{i}", expiry=30.0) for i in range(4)]
        try:
            results = _race(4, lambda i: leases[i].acquire(wait=False, notify=lines[i].append))
            winners = [i for i, r in enumerate(results) if r is None]
            assert len(winners) == 1, results
            (w,) = winners
            assert leases[w].epoch == 2 and backend.list("_lease")  # the next epoch, by conditional create
            assert len(lines[w]) == 1 and re.fullmatch(
                rf"took over {backend.location} from run 20240101T000000Z-dead0000 on gone-host "
                r"\(pid 4242, since 2024-01-01T00:00:00\+00:00\): no heartbeat for 36\d\d s \(expiry 60 s\)", lines[w][0])
            for i, r in enumerate(results):
                if i != w:
                    assert isinstance(r, LeaseHeldError) and f"being written by run taker-{w} on " in str(r)
        finally:
            for lease in leases:
                lease.release()
        assert not backend.list("_lease")

    def test_heartbeat_keeps_a_lease_and_a_lapsed_holder_cannot_publish(self, place):
        """On a clock the test moves (``ManualClock``): the heartbeats fall due as it advances."""
        base, options, _ = place
        backend = backend_for(parse_uri(f"{base}/out"), options)
        clock = ManualClock()
        holder = Lease(backend, "holder", expiry=2.0, clock=clock)
        other = Lease(backend, "other", expiry=2.0, clock=clock)
        try:
            holder.acquire()
            assert holder.heartbeat == pytest.approx(2.0 / 6)  # expiry / 6 by default
            clock.advance(3.0)  # longer than the expiry: only the heartbeat keeps it
            assert clock.now - holder.current().heartbeat <= holder.heartbeat + 1e-3  # renewed on time
            with pytest.raises(LeaseHeldError, match=r"is being written by run holder on "):
                other.acquire(wait=False)
            holder.check()

            # a stall longer than half the expiry, no taker: the holder re-takes the next epoch
            holder.stop_heartbeat()
            clock.advance(1.2)
            holder.check()
            assert holder.epoch == 2

            # a stall past the expiry: another run (waiting for it) takes over, the holder must not publish
            told: list[str] = []
            other.acquire(notify=told.append)  # its waits move the clock
            assert other.epoch == 3 and len(told) == 2, told
            assert told[0].startswith("waiting for run holder on ")
            assert re.fullmatch(rf"took over {backend.location} from run holder on .+: no heartbeat for 2 s "
                                r"\(expiry 2 s\)", told[1]), told
            with pytest.raises(LeaseHeldError, match=r": the lease was taken over by run other on .*; "
                                                     r"nothing was published$"):
                holder.check()
            holder.release()  # deletes only its own, older epochs
            assert other.current() is not None and other.current().run_id == "other"
        finally:
            holder.release()
            other.release()

    def test_heartbeat_thread_renews_on_the_system_clock(self, place):
        """The real heartbeat: a thread renewing the lease object every ``heartbeat`` seconds."""
        base, options, _ = place
        backend = backend_for(parse_uri(f"{base}/out"), options)
        holder = Lease(backend, "holder", expiry=60.0, heartbeat=0.05)
        try:
            holder.acquire()
            first = holder.current().heartbeat
            deadline = time.monotonic() + 30
            while holder.current().heartbeat == first and time.monotonic() < deadline:
                time.sleep(0.05)
            assert holder.current().heartbeat > first and holder.epoch == 1
            holder.check()
        finally:
            holder.release()
        assert not backend.list("_lease")

    def test_overwrite_under_a_reader_never_shows_a_mix(self, place, monkeypatch):
        """The reader does what README says: read _SUCCESS, open the prefix it names, and
        read _SUCCESS again: the same run means what it read was whole."""
        base, options, endpoint = place
        location = parse_uri(f"{base}/out")
        uri = f"{base}/out"
        writes = 3 if endpoint else 6

        def publish(value):
            out = JobOutput(location, options, "spec")
            assert out.take(overwrite=True) is None
            try:
                write_group(out.staging.join("result.zarr"), options,
                            {"a": np.full((40, 3), value), "b": np.full(40, value)}, {"value": value})
                out.write_json("report.json", {"value": value})
                out.commit()
            finally:
                out.release()

        publish(0.0)
        done = threading.Event()
        seen: list[float] = []
        torn = 0
        problems: list[str] = []

        def read():
            nonlocal torn
            backend = backend_for(location, options)
            while not done.is_set():
                try:
                    first = json.loads(backend.read_bytes("_SUCCESS"))
                except FileNotFoundError:
                    problems.append("no _SUCCESS during an overwrite")
                    continue
                try:
                    prefix = f"{uri}/{first['prefix']}"
                    group = zarr.open_group(f"{prefix}/result.zarr", mode="r",
                                            storage_options=storage_options(prefix, endpoint))
                    values = {float(v) for v in np.unique(group["a"][:])} | {float(v) for v in np.unique(group["b"][:])}
                    values.add(float(group.attrs["value"]))
                    values.add(float(json.loads(backend.read_bytes(f"{first['prefix']}/report.json"))["value"]))
                except (FileNotFoundError, KeyError, zarr.errors.NodeNotFoundError):
                    torn += 1  # replaced while reading: read again
                    continue
                if json.loads(backend.read_bytes("_SUCCESS"))["run_id"] != first["run_id"]:
                    torn += 1
                    continue
                if len(values) != 1:
                    problems.append(f"a mix: {sorted(values)} in run {first['run_id']}")
                seen.append(values.pop())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            for value in range(1, writes + 1):
                publish(float(value))
        finally:
            done.set()
            reader.join(timeout=60)
        assert not reader.is_alive() and not problems, problems
        assert len(seen) >= writes and seen == sorted(seen)  # whole results, never going back
        assert read_result(uri, endpoint).attrs["value"] == writes


def test_no_wait_exits_6_naming_the_holder(workdir, capsys):
    """Checked before Ray starts: no cluster needed."""
    from tests.harness.helpers import logreg_data

    X, y = logreg_data(100, 2)
    write_array("X.zarr", X, (50, 2))
    write_array("y.zarr", y, (50,))
    spec = write_spec(workdir / "s.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out")
    holder = Lease(backend_for(parse_uri(str(workdir / "out")), StorageOptions()), "20250101T000000Z-holder00")
    holder.acquire()
    try:
        code, out, err = run_cli(["run", str(spec), "--no-wait"], capsys)
    finally:
        holder.release()
    assert code == 6 and out == ""
    assert re.fullmatch(
        rf"arrayjob: error: output.uri: {workdir}/out is being written by run 20250101T000000Z-holder00 on "
        rf"\S+ \(pid {os.getpid()}, since \S+\); run without --no-wait to wait for it\n", without_progress(err)), err


