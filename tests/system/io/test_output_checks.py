"""The system tests of ``tests.unit.io.test_output_checks``: what needs processes, clusters or a job server of their own."""

from __future__ import annotations

import pytest

from tests.harness.helpers import logreg_data, write_array, write_spec
from tests.unit.io.test_output_checks import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    ARRAYJOB,
    NO_RAY,
    _can_mount,
    arrayjob,
    assert_one_line,
    files,
    in_tmpfs,
    logreg,
    logreg_spec,
    needs_mount,
    process,
    published_output,
)


@needs_mount
@pytest.mark.cli
def test_full_disk_refused_with_both_figures_and_a_complete_output_still_skipped(tmp_path):
    """TSQR's Q (20,000 × 8 float64, 1.28 MB) cannot fit a 256 kB disk: refused before the fit.
    A rerun of a complete output needs no room: it is skipped as before."""
    A = logreg_data(20_000, 8)[0]
    write_array(str(tmp_path / "A.zarr"), A, (2500, 8))
    write_spec(tmp_path / "t.toml", algorithm="tsqr", inputs={"A": "A.zarr"}, output="disk/out")
    run = process("run", "t.toml", cwd=tmp_path, prefix=in_tmpfs(tmp_path / "disk", "size=256k"))
    assert_one_line(run, 4, f"output.uri: {tmp_path}/disk/out: the result needs about 1.5 MB (1,542,656 bytes) "
                            "but its disk has 262.1 kB (262,144 bytes) free")

    from arrayjob.spec import load_spec

    digest = load_spec(str(tmp_path / "t.toml"), []).digest()
    manifest = f'{{"run_id": "r1", "prefix": "runs/r1", "spec_sha256": "{digest}", "files": []}}'
    script = f"mkdir -p \"$0\"/out && printf '%s' '{manifest}' > \"$0\"/out/_SUCCESS && exec \"$@\""
    prefix = ("unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size=64k tmpfs "$0" && {script}',
              str(tmp_path / "disk"))
    again = process("run", "t.toml", "--json", cwd=tmp_path, prefix=prefix)
    assert again.returncode == 0, again.stderr
    assert '"already_complete": true' in again.stdout


@pytest.mark.cli
def test_read_only_filesystem_exit_4(logreg):
    if not _can_mount():
        pytest.skip("needs a private mount namespace (unshare -m, mount)")
    run = process("run", logreg_spec(logreg, "ro/out"), cwd=logreg, prefix=in_tmpfs(logreg / "ro", "ro,size=64k"))
    assert_one_line(run, 4, f"output.uri: {logreg}/ro/out is not writable: Read-only file system")
