"""tests/system/autoscale (Ray's fake autoscaling cluster) from the main suite.

Starting and stopping that cluster acts on every Ray process it can see, so its tests run in
a pytest process of their own inside a private PID, mount and network namespace
(``tests/system/autoscale/run.sh``, as ``make test-autoscale`` runs them), once, in the first such
test's setup. Each test here stands for the test of that name there and fails with its report.
Under ``make test`` one worker runs them, after or before the other tests that start clusters
of their own (``tests/conftest.py``).
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "tests" / "system" / "autoscale" / "test_autoscale.py"
TESTS = [node.name for node in ast.parse(SUITE.read_text()).body
         if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
TIMEOUT = 900  # the four take about 75 s on a quiet machine

pytestmark = [pytest.mark.autoscale, pytest.mark.timeout(TIMEOUT + 60)]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each test of tests/system/autoscale: "" if it passed, else its report."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("these tests need unshare and ip (util-linux, iproute2) and root")
    root = tmp_path_factory.mktemp("autoscale")
    junit, log = root / "junit.xml", root / "output.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RAY_ADDRESS"))}
    env["PYTHON"] = sys.executable
    # --kill-child: whatever ends unshare ends the namespace, and every process in it
    cmd = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "sh", "tests/system/autoscale/run.sh",
           f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    with open(log, "w") as out, subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, start_new_session=True) as proc:
        try:
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"tests/system/autoscale did not finish in {TIMEOUT} s:\n{log.read_text()[-3000:]}")
    if not junit.exists():
        pytest.fail(f"tests/system/autoscale/run.sh exited {proc.returncode} without a report:\n{log.read_text()[-3000:]}")
    found: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        problems = [p for p in case if p.tag in ("failure", "error", "skipped")]
        found[case.get("name", "")] = "\n".join(f"{p.tag}: {p.get('message', '')}\n{p.text or ''}" for p in problems)
    return found


@pytest.mark.parametrize("name", TESTS)
def test_on_the_fake_autoscaling_cluster(outcomes: dict[str, str], name: str) -> None:
    assert name in outcomes, f"{name} did not run: {sorted(outcomes)}"
    assert outcomes[name] == "", outcomes[name][-4000:]
