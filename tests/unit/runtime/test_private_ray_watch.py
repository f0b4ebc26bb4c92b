"""What Ray's driver prints about its private Ray's death stays muted, however the threads and
the kernel are ordered (``runtime.private_ray``): the job says it in one line. Real processes
stand in for the raylet; no Ray is started."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from arrayjob.runtime.supervision.private_ray import RAYLET_DEATH, PrivateRayWatch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfd")

RAY_LINE = f"\x1b[33m(raylet)\x1b[0m {RAYLET_DEATH} Possible reasons include: (1) SIGKILL by the user"


@pytest.fixture
def raylet():
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def test_rays_account_of_the_raylets_death_is_muted_before_the_kernel_reports_it(raylet):
    """The dashboard agent sees the raylet's pipe close and Ray publishes the death while the
    process is not yet reported dead: the line, and the newline print() writes after it,
    never reach the stream, and the raylet is taken as lost."""
    out = io.StringIO()
    watch = PrivateRayWatch({"raylet": raylet.pid})
    try:
        stream = watch.quiet_once_lost(out)
        print("before", file=stream)
        print(RAY_LINE, file=stream)
        print("anything after", file=stream)
        assert out.getvalue() == "before\n"
        assert watch.lost == f"raylet (pid {raylet.pid})"
        assert watch.message().startswith(f"the job's Ray stopped under it: its raylet (pid {raylet.pid}) died")
    finally:
        watch.close()
        watch.release()


def test_a_death_the_kernel_reports_after_close_is_still_muted_until_release(raylet):
    """The job ends because the raylet's sockets closed, a moment before the kernel reports it
    dead: the watch is closed with nothing lost, and what Ray prints during the shutdown that
    follows is muted once the death is known."""
    out = io.StringIO()
    watch = PrivateRayWatch({"raylet": raylet.pid})
    stream = watch.quiet_once_lost(out)
    watch.close()
    assert watch.lost is None
    print("still alive", file=stream)
    raylet.kill()
    raylet.wait()
    print("a line of Ray's about the dead raylet", file=stream)
    watch.release()
    assert out.getvalue() == "still alive\n"
    assert watch.has_lost_one() and watch.lost == f"raylet (pid {raylet.pid})"
