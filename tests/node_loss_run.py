"""Run ``arrayjob run`` on a local 3-node Ray cluster and remove a worker node under it.

    python tests/node_loss_run.py WORKDIR [--kill-after SECONDS] [--no-kill]

Starts a ``ray.cluster_utils.Cluster`` (a head and two workers, one CPU each; node death
noticed within about 2 s), writes logistic-regression demo data and a spec under WORKDIR,
runs ``arrayjob run --json`` once undisturbed ("calm"), then again to another output and,
once the job's tasks are running (a CPU in use), waits ``--kill-after`` seconds and removes
one worker node with ``allow_graceful=False``.
Writes WORKDIR/outcome.json: the disturbed run's exit code, its report (or None), its
stderr tail, the calm run's report and the bytes of X
(not printed: Ray's raylet may print to this process's stdout).
Everything it started is stopped before it exits. Tests run it in a subprocess: a process
talks to one Ray at a time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.pop("RAY_ADDRESS", None)

SPEC = """
[job]
name = "node-loss"
algorithm = "logreg"

[inputs]
X = "{root}/data/X.zarr"
y = "{root}/data/y.zarr"

[params]
solver = "lbfgs"
max_iter = {max_iter}
tol = 1e-12

[output]
uri = "{root}/{out}"

[cluster]
address = "{address}"
"""


def _report(stdout: str) -> dict[str, object]:
    """The report: the JSON document on stdout (Ray's raylet may print lines around it)."""
    start = stdout.find("\n{") + 1 if not stdout.startswith("{") else 0
    return json.JSONDecoder().raw_decode(stdout[start:])[0]  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--cols", type=int, default=16)
    parser.add_argument("--chunk-rows", type=int, default=10_000)
    parser.add_argument("--max-iter", type=int, default=60)
    parser.add_argument("--kill-after", type=float, default=1.0)
    parser.add_argument("--no-kill", action="store_true")
    parser.add_argument("--timeout", type=float, default=240)
    args = parser.parse_args(argv)

    import ray
    from ray.cluster_utils import Cluster

    root = args.workdir.resolve()
    arrayjob = [sys.executable, "-m", "arrayjob.cli.main"]
    subprocess.run([*arrayjob, "datagen", "logreg", str(root / "data"), "--rows", str(args.rows), "--cols",
                    str(args.cols), "--chunk-rows", str(args.chunk_rows)], check=True, capture_output=True)
    node_args = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
    health = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_timeout_ms": 500}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False,
                                                            "_system_config": health})
    job = None
    try:
        workers = [cluster.add_node(**node_args) for _ in range(2)]
        cluster.wait_for_nodes()
        specs = {}
        for out in ("calm", "out"):
            specs[out] = root / f"{out}.toml"
            specs[out].write_text(SPEC.format(root=root, out=out, max_iter=args.max_iter, address=cluster.address))
        calm = subprocess.run([*arrayjob, "run", str(specs["calm"]), "--json"], capture_output=True, text=True,
                              timeout=args.timeout)
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
        while ray.available_resources().get("CPU", 0) < 3:  # the calm run's workers are gone
            time.sleep(0.1)
        job = subprocess.Popen([*arrayjob, "run", str(specs["out"]), "--json"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        killed = None
        started = time.monotonic()
        deadline = started + args.timeout
        while not args.no_kill and job.poll() is None and time.monotonic() < deadline:
            if ray.available_resources().get("CPU", 3) < 3:  # the job's tasks are running
                time.sleep(args.kill_after)
                if job.poll() is not None:
                    break
                killed = round(time.monotonic() - started, 2)
                cluster.remove_node(workers[-1], allow_graceful=False)
                break
            time.sleep(0.05)
        out, err = job.communicate(timeout=max(1.0, deadline - time.monotonic()))
        ended = round(time.monotonic() - started, 2)
        report = _report(out) if job.returncode == 0 else None
        (root / "outcome.json").write_text(json.dumps({"exit": job.returncode, "killed": killed, "ended": ended, "report": report, "stderr": err[-3000:],
                          "stdout_other_lines": len(out.splitlines()) - len(json.dumps(report, indent=2).splitlines()) if report else None,
            "calm": _report(calm.stdout) if calm.returncode == 0 else None, "calm_stderr": calm.stderr[-3000:],
            "x_bytes": args.rows * args.cols * 8}))
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait()
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
