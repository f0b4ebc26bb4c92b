"""The output is checked before anything runs: a file in its place, no write access, a full
disk, a missing bucket, an endpoint that does not answer, an output inside an input.

Each case runs ``arrayjob`` in-process with ``RAY_ADDRESS`` pointing at a closed port: a run
that got past validation would go on to connect (exit 5, or a run on a Ray this process already
holds), so the one line and its exit code show that the check came before the cluster. A
read-only file system needs a mount namespace: that case runs the installed command as a process.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arrayjob.errors import StorageError
from arrayjob.io.backend import backend_for
from arrayjob.io.locations import StorageOptions, parse_uri
from arrayjob.io.output import JobOutput
from tests.harness.helpers import logreg_data, run_cli, write_array, write_spec

ARRAYJOB = shutil.which("arrayjob", path=str(Path(sys.executable).parent)) or "arrayjob"
NO_RAY = "127.0.0.1:9"  # nothing listens there: reaching the connect stage exits 5


def process(*args: str, cwd: Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """The installed ``arrayjob`` as a process (after ``prefix``, a command it runs under)."""
    environ = {**os.environ, "RAY_ADDRESS": NO_RAY}
    return subprocess.run([*prefix, ARRAYJOB, *args], env=environ, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def arrayjob(monkeypatch, capsys):
    """``arrayjob(*args, cwd=, env=)``: the command run in-process, as a finished process."""

    def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        monkeypatch.chdir(cwd)
        for key, value in {"RAY_ADDRESS": NO_RAY, **(env or {})}.items():
            monkeypatch.setenv(key, value)
        code, out, err = run_cli(list(args), capsys)
        return subprocess.CompletedProcess(["arrayjob", *args], code, out, err)

    return run


def assert_one_line(run: subprocess.CompletedProcess[str], code: int, message: str) -> None:
    assert run.returncode == code, run.stderr
    assert run.stderr == f"arrayjob: error: {message}\n"
    assert run.stdout == ""


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def logreg(tmp_path: Path) -> Path:
    X, y = logreg_data(200, 3)
    write_array(str(tmp_path / "data/X.zarr"), X, (50, 3))
    write_array(str(tmp_path / "data/y.zarr"), y, (50,))
    return tmp_path


def logreg_spec(cwd: Path, output: str, storage: str = "") -> str:
    write_spec(cwd / "s.toml", inputs={"X": "data/X.zarr", "y": "data/y.zarr"}, output=output, storage=storage)
    return "s.toml"


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(not _can_mount(), reason="needs a private mount namespace (unshare -m, mount)")


def in_tmpfs(directory: Path, options: str) -> tuple[str, ...]:
    """A command prefix that runs the command with a tmpfs (``options``) mounted on ``directory``,
    in a mount namespace of its own: the mount goes away with the process."""
    directory.mkdir(exist_ok=True)
    return ("unshare", "-m", "sh", "-c", f'mount -t tmpfs -o {options} tmpfs "$0" && exec "$@"', str(directory))


# a file where the output must be a directory


@pytest.mark.parametrize("output", ["afile", "afile/out"])
def test_output_on_a_file_exit_4_before_anything_runs(logreg, output, arrayjob):
    (logreg / "afile").write_text("not a directory\n")
    run = arrayjob("run", logreg_spec(logreg, output), cwd=logreg)
    where = "a file stands there" if output == "afile" else f"{logreg}/afile is a file"
    assert_one_line(run, 4, f"output.uri: {logreg}/{output}: {where}; an output is a directory")
    assert (logreg / "afile").read_text() == "not a directory\n"


# no write access


def test_permission_denied_exit_4(logreg, arrayjob):
    if os.geteuid() == 0:  # root writes into a 0555 directory; sysfs refuses root too
        target, reason = Path("/sys/fs/arrayjob-out"), "Operation not permitted"
        if not Path("/sys/fs").is_dir():
            pytest.skip("no /sys/fs to refuse root a write")
    else:
        (logreg / "locked").mkdir(mode=0o555)
        target, reason = logreg / "locked/out", "Permission denied"
    run = arrayjob("run", logreg_spec(logreg, str(target)), cwd=logreg)
    assert_one_line(run, 4, f"output.uri: {target} is not writable: {reason}")
    assert not target.exists()


@pytest.mark.timeout(30)
def test_a_file_named_like_the_lease_directory_fails_the_lease_instead_of_looping(tmp_path):
    """The lease reads ``FileExistsError`` from an exclusive create as another run's win and
    tries again; a file where its directory goes must not look like that, or it loops forever."""
    from arrayjob.io.lease import Lease

    (tmp_path / "out").mkdir()
    (tmp_path / "out/_lease").write_text("x")
    backend = backend_for(parse_uri(str(tmp_path / "out")), StorageOptions())
    with pytest.raises(NotADirectoryError):
        backend.write_bytes("_lease/0000000001", b"{}", exclusive=True)
    with pytest.raises(NotADirectoryError):
        Lease(backend, "r1", expiry=5).acquire(wait=False)


# a full disk


def test_room_compares_the_result_with_the_free_bytes(tmp_path):
    from arrayjob.io.output import check_room

    where = parse_uri(str(tmp_path / "out"))
    check_room(where, 1_000, 1_000)
    check_room(where, 10**12, None)  # an object store: no limit known
    with pytest.raises(StorageError, match=r": the result needs about 1.0 kB \(1,001 bytes\) but its disk has "
                                           r"999 bytes free$"):
        check_room(where, 1_001, 999)


# S3: a missing bucket, an endpoint that does not answer


def test_unreachable_endpoint_exit_4_promptly(logreg, arrayjob):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    spec = logreg_spec(logreg, "s3://bucket/out", storage=f'endpoint_url = "{closed}"')
    started = time.monotonic()
    run = arrayjob("run", spec, cwd=logreg)
    assert_one_line(run, 4, f"output.uri: s3://bucket/out: the S3 endpoint {closed} does not answer: "
                            "Connection refused")
    assert time.monotonic() - started < 60


def test_endpoint_that_accepts_but_never_answers_exit_4_in_seconds_not_minutes(logreg, arrayjob, monkeypatch):
    """A server that takes connections and never replies: object_store would retry it for
    3 minutes; the check gives up after its own 15 s (here made 2 s: the test is of the giving up)."""
    import datetime as dt
    import socket

    from arrayjob.io import _s3

    assert _s3._PROBE_CLIENT["timeout"] == _s3._PROBE_RETRY["retry_timeout"] == dt.timedelta(seconds=15)
    monkeypatch.setitem(_s3._PROBE_CLIENT, "timeout", dt.timedelta(seconds=2))
    monkeypatch.setitem(_s3._PROBE_CLIENT, "connect_timeout", dt.timedelta(seconds=2))
    monkeypatch.setitem(_s3._PROBE_RETRY, "retry_timeout", dt.timedelta(seconds=2))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel accepts; nobody reads or answers
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        spec = logreg_spec(logreg, "s3://bucket/out", storage=f'endpoint_url = "{endpoint}"')
        started = time.monotonic()
        run = arrayjob("run", spec, cwd=logreg)
    assert run.returncode == 4, run.stderr
    assert re.fullmatch(rf"arrayjob: error: output.uri: s3://bucket/out: the S3 endpoint {endpoint} does not "
                        r"answer: no answer in \d+ s\n", run.stderr)
    assert time.monotonic() - started < 60


# the output inside an input


@pytest.mark.parametrize("output", ["data/X.zarr/out", "link/out"])
def test_output_inside_an_input_exit_2_nothing_written(logreg, output, arrayjob):
    (logreg / "link").symlink_to(logreg / "data/X.zarr")
    before = files(logreg / "data")
    run = arrayjob("run", logreg_spec(logreg, output), cwd=logreg)
    assert_one_line(run, 2, f"output.uri: {logreg}/{output} lies inside inputs.X ({logreg}/data/X.zarr); "
                            "the result would be written into an input")
    assert files(logreg / "data") == before


def test_output_inside_an_input_on_s3_is_a_spec_error(tmp_path):
    from arrayjob.errors import SpecError
    from arrayjob.spec import load_spec

    write_spec(tmp_path / "s.toml", inputs={"X": "s3://b/in/X.zarr", "y": "s3://b/in/y.zarr"},
               output="s3a://b/in/y.zarr/model")
    with pytest.raises(SpecError, match=r"^output.uri: s3://b/in/y.zarr/model lies inside inputs.y \(s3://b/in/y.zarr\)"):
        load_spec(str(tmp_path / "s.toml"), [])
    write_spec(tmp_path / "s.toml", inputs={"X": "s3://b/in/X.zarr", "y": "s3://b/in/y.zarr"},
               output="s3://b/in/X.zarr2")  # a sibling sharing a name's beginning is not inside
    assert load_spec(str(tmp_path / "s.toml"), []).output.path == "b/in/X.zarr2"


# the checks leave nothing and disturb no published result


@pytest.fixture(params=["local", "s3"])
def published_output(request, tmp_path):
    """An output holding a published result, as (location, options, its objects)."""
    if request.param == "local":
        location, options = parse_uri(str(tmp_path / "out")), StorageOptions()
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        location = parse_uri(f"s3://{request.getfixturevalue('s3_bucket')}/out")
        options = StorageOptions(endpoint_url=endpoint)
    backend = backend_for(location, options)
    backend.write_bytes("runs/r1/result.zarr/zarr.json", b"{}")
    backend.write_bytes("_SUCCESS", b'{"run_id": "r1", "prefix": "runs/r1", "spec_sha256": "old", "files": []}')
    return location, options, backend.list()


def test_checks_leave_nothing_and_keep_the_published_result(published_output, tmp_path):
    location, options, before = published_output
    output = JobOutput(location, options, "new")
    assert output.check(overwrite=True, expected_bytes=1_000) is None  # the run would go ahead
    assert backend_for(location, options).list() == before
    if not location.is_s3:
        assert sorted(p.name for p in Path(location.path).iterdir()) == ["_SUCCESS", "runs"]


def test_probe_of_a_new_output_leaves_no_directory(tmp_path):
    location = parse_uri(str(tmp_path / "results/deep/out"))
    JobOutput(location, StorageOptions(), "d").check(overwrite=False, expected_bytes=0)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_another_run_removes_meanwhile_is_never_taken_for_a_file(tmp_path):
    """Racing runs' probes make and remove the output's directories; a check between must not see a file."""
    import threading

    out = tmp_path / "out"
    backend = backend_for(parse_uri(str(out / "a" / "b")), StorageOptions())
    stop = threading.Event()

    def churn() -> None:  # what another run's probe_write does to the directories it made
        while not stop.is_set():
            out.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):
                out.rmdir()

    other = threading.Thread(target=churn)
    other.start()
    try:
        for _ in range(20_000):  # the old check saw "a file" about once in 40 here
            backend.check_reachable()
    finally:
        stop.set()
        other.join()


