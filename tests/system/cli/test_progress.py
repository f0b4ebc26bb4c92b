"""The system tests of ``tests.unit.cli.test_progress``: what needs processes, clusters or a job server of their own."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.unit.cli.test_progress import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    ARRAYJOB,
    LINE,
    STAGES,
    _event,
    arrayjob,
    small_job,
)


@pytest.mark.cli
@pytest.mark.ray
def test_live_view_on_a_terminal(small_job, ray_session):
    """stderr a terminal (a pty): the view is redrawn in place (rich), stage ends are kept as
    lines above it, and the view is cleared at the end; stdout (a pipe) keeps the summary.
    The installed command as a process, a driver of the session's Ray."""
    import pty
    import select

    import ray

    controller, terminal = pty.openpty()
    env = os.environ | {"COLUMNS": "120", "TERM": "xterm", "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    proc = subprocess.Popen([ARRAYJOB, "run", "job.toml", "--overwrite"], cwd=small_job, env=env,
                            stdout=subprocess.PIPE, stderr=terminal, text=True)
    os.close(terminal)
    seen = b""
    while True:
        ready, _, _ = select.select([controller], [], [], 240)
        if not ready:
            proc.kill()
            pytest.fail("no output from the live view for 240 s")
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the process is done with it
            break
        if not chunk:
            break
        seen += chunk
    out, _ = proc.communicate(timeout=60)
    os.close(controller)
    assert proc.returncode == 0, seen.decode(errors="replace")
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))
    assert "\x1b[1A" in seen.decode(errors="replace") or "\x1b[2K" in seen.decode(errors="replace")  # redrawn in place
    assert re.search(r"job\s+test-logreg\s+[\d.]+ s elapsed", shown)
    assert re.search(r"stage\s+(validate|connect|load|fit)", shown)
    for stage in STAGES:
        assert re.search(rf"\[ *\d+\.\d\d s\] {stage} done in ", shown), stage
    assert "published run " in shown
    assert "result:" in out and "arrayjob:" not in out
