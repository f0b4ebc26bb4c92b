"""``arrayjob submit``, ``status``, ``logs`` and ``stop`` against a real Ray job server.

    unshare --pid --fork --mount-proc --net bash -c 'ip link set lo up; exec python tests/harness/submit_cases.py --out FILE'

Run inside its own PID and network namespace (``tests/unit/cli/test_submit.py`` does): it starts a
loopback S3 server and a Ray head with its job server (``ray start --head``, dashboard on
127.0.0.1:8265), runs the ``arrayjob`` command as a user would for each case (independent
cases at once), and ends: the namespace's end kills that Ray and whatever else is left.
Writes one JSON document to FILE: per case, the commands' exit codes and output and what was
found in the bucket, and each case's seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.harness.jobserver import (  # noqa: E402
    ENV,
    JOBS,
    REPO,
    S3,
    SPEC,
    arrayjob,
    colstats_data,
    start_moto,
    start_ray,
)

os.environ.clear()  # this process reads the bucket and the job server as the cluster's nodes do
os.environ.update(ENV)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default="", help="only these cases, by name, comma-separated (by hand)")
    arguments = parser.parse_args()
    out = Path(arguments.out)
    begun = time.monotonic()

    import boto3

    from tests.harness.helpers import logreg_data, published, read_group, write_array

    server = start_moto()
    endpoint = S3
    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket="jobs")
    X, y = logreg_data(4000, 4)
    write_array("s3://jobs/in/X.zarr", X, (1000, 4), endpoint=endpoint)
    write_array("s3://jobs/in/y.zarr", y, (1000,), endpoint=endpoint)
    spec = ["--set", f"storage.endpoint_url={endpoint}", "--set", "inputs.X=s3://jobs/in/X.zarr",
            "--set", "inputs.y=s3://jobs/in/y.zarr"]

    def keys(prefix: str) -> list[str]:
        listed = s3.list_objects_v2(Bucket="jobs", Prefix=prefix)
        return sorted(o["Key"] for o in listed.get("Contents", []))

    def jobs_submitted() -> int:
        from ray.job_submission import JobSubmissionClient

        return len(JobSubmissionClient(JOBS).list_jobs())

    def submit_ok() -> None:
        # submit, follow, exit 0, published; the address from RAY_ADDRESS as Ray's CLI reads it
        env = {**ENV, "RAY_ADDRESS": JOBS, "RAY_JOB_HEADERS": '{"X-Arrayjob-Test": "1"}'}
        ok = arrayjob("submit", str(SPEC), *spec, "--set", "output.uri=s3://jobs/out/ok", env=env)
        prefix = published("s3://jobs/out/ok", endpoint)
        group = read_group(f"{prefix}/result.zarr", endpoint)
        ok["coef"] = [float(v) for v in group["coef"][:]]
        ok["intercept"] = [float(v) for v in group["intercept"][:]]
        ok["published"] = keys("out/ok/_SUCCESS")
        cases["submit"] = ok

    def missing_input() -> None:  # failures at run time: their exit codes passed through
        cases["missing_input"] = arrayjob("submit", str(SPEC), "--address", JOBS, *spec,
                                          "--set", "inputs.X=s3://jobs/in/nothing.zarr",
                                          "--set", "output.uri=s3://jobs/out/missing")
        cases["missing_input"]["published"] = keys("out/missing/")

    def no_wait() -> None:
        # --no-wait, then status, logs, logs --follow; the package sent with the job (the
        # entrypoint is then python -m arrayjob, from the job's py_modules)
        detached = arrayjob("submit", str(SPEC), "--address", JOBS, *spec, "--set", "output.uri=s3://jobs/out/nowait",
                            "--no-wait", "--upload-package")
        job_id = detached["stdout"].strip()
        detached["status_at_once"] = arrayjob("status", job_id, "--address", JOBS)
        detached["follow"] = arrayjob("logs", job_id, "--address", JOBS, "--follow")
        detached["status"] = arrayjob("status", job_id, "--address", JOBS, "--json")
        detached["logs"] = arrayjob("logs", job_id, "--address", JOBS)
        detached["published"] = keys("out/nowait/_SUCCESS")
        cases["no_wait"] = detached

    def user_job() -> None:
        # a job of the user's own (examples/colstats) in a directory outside the checkout, named
        # as module:Class: its module goes with the job (Ray's py_modules, beside arrayjob's
        # with --upload-package); the cluster's nodes have it nowhere else
        import shutil
        import tempfile

        home = Path(tempfile.mkdtemp(prefix="user-job-"))
        shutil.copy(REPO / "examples" / "colstats" / "colstats.py", home / "colstats.py")
        write_array("s3://jobs/in/C.zarr", colstats_data(), (1000, 4), endpoint=endpoint)
        (home / "colstats.toml").write_text(
            '[job]\nname = "colstats"\nalgorithm = "colstats:ColumnStatistics"\n'
            '[inputs]\nX = "s3://jobs/in/C.zarr"\n[output]\nuri = "s3://jobs/out/user"\n'
            f'[storage]\nendpoint_url = "{endpoint}"\n')
        env = {**ENV, "PYTHONPATH": os.pathsep.join([str(REPO), str(home)])}  # this side imports it
        run = arrayjob("submit", str(home / "colstats.toml"), "--address", JOBS, "--upload-package", env=env)
        run["published"] = keys("out/user/_SUCCESS")
        if run["published"]:
            group = read_group(f"{published('s3://jobs/out/user', endpoint)}/result.zarr", endpoint)
            run["mean"], run["std"] = ([float(v) for v in group[k][:]] for k in ("mean", "std"))
        cases["user_job"] = run

    def held() -> None:
        # stop, and SIGTERM to a following submit: the output is held by another run, so the
        # job waits for it until stopped
        from arrayjob.io.backend import backend_for
        from arrayjob.io.lease import Lease
        from arrayjob.io.locations import StorageOptions, parse_uri

        options = StorageOptions(endpoint_url=endpoint)
        lease = Lease(backend_for(parse_uri("s3://jobs/out/held"), options), "holder-run")
        lease.acquire()
        try:
            held = [*spec, "--set", "output.uri=s3://jobs/out/held"]
            blocked = arrayjob("submit", str(SPEC), "--address", JOBS, *held, "--no-wait")
            job_id = blocked["stdout"].strip()
            # the following submit waits beside it (it tells its own job from this one by id)
            with ThreadPoolExecutor(max_workers=1) as beside:
                sigterm = beside.submit(sigterm_while_following, [*held, "--address", JOBS], exclude={job_id})
                blocked["waiting"] = wait_for_log(job_id, "waiting for run holder-run")
                blocked["stop"] = arrayjob("stop", job_id, "--address", JOBS)
                blocked["status"] = arrayjob("status", job_id, "--address", JOBS, "--json")
                blocked["logs"] = arrayjob("logs", job_id, "--address", JOBS)
                cases["stop"] = blocked
                cases["sigterm"] = sigterm.result()
        finally:
            lease.release()
        cases["leases_left"] = keys("out/held/_lease/")

    cases: dict[str, Any] = {}

    def wanted(case: Callable[[], None]) -> bool:
        return not arguments.cases or case.__name__ in arguments.cases.split(",")
    seconds: dict[str, float] = {}
    cases["seconds"] = seconds  # each case's wall time, for whoever makes this faster next

    def timed(name: str, case: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            begun = time.monotonic()
            try:
                case()
            finally:
                seconds[name] = round(time.monotonic() - begun, 2)

        return run

    started = time.monotonic()
    seconds["prepare"] = round(started - begun, 2)  # imports, the S3 server, the input data
    start_ray()
    seconds["ray_start"] = round(time.monotonic() - started, 2)
    try:
        # a bad spec: exit 2 on this side, nothing submitted (alone: it counts the jobs)
        before = jobs_submitted()
        cases["bad_spec"] = arrayjob("submit", str(SPEC), "--address", JOBS, *spec, "--set", "params.l3=1")
        cases["bad_spec"]["jobs_after"] = jobs_submitted() - before
        # the rest are independent jobs on their own outputs: at once, so their start-ups overlap
        with ThreadPoolExecutor(max_workers=4) as pool:
            for future in [pool.submit(timed(case.__name__, case))
                           for case in (held, no_wait, submit_ok, missing_input) if wanted(case)]:
                future.result()
        if wanted(user_job):  # after them, not beside: a fifth job at once starves the 2-CPU head under load
            timed("user_job", user_job)()
        seconds["cases"] = round(time.monotonic() - started, 2)
    except Exception:  # noqa: BLE001 - reported to the test, which fails with it
        cases["error"] = traceback.format_exc()
    finally:
        # no `ray stop`: this process is the namespace's first, and when it exits the kernel kills
        # every process left in it, Ray's included (`ray stop --force` here waited out its grace
        # period for the processes it killed, zombies until this process reaped them: 20 s)
        stopping = time.monotonic()
        server.stop()
        seconds["stop"] = round(time.monotonic() - stopping, 2)
    out.write_text(json.dumps(cases, indent=2))


def wait_for_log(job_id: str, text: str, timeout: float = 180) -> bool:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(JOBS)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in client.get_job_logs(job_id):
            return True
        time.sleep(0.25)
    return False


def sigterm_while_following(args: list[str], exclude: set[str]) -> dict[str, Any]:
    """``arrayjob submit`` following a job that waits, then SIGTERM (as Airflow or Kubernetes send)."""
    proc = subprocess.Popen([sys.executable, "-m", "arrayjob", "submit", str(SPEC), *args], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    deadline = time.monotonic() + 180
    job_id = ""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(JOBS)
    while time.monotonic() < deadline and not job_id:
        running = [j for j in client.list_jobs() if str(j.status) == "RUNNING" and j.submission_id not in exclude
                   and "waiting for run holder-run" in client.get_job_logs(j.submission_id)]
        job_id = running[0].submission_id if running else ""
        time.sleep(0.25)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    exited = time.monotonic() - sent
    status = "none"
    for _ in range(60):
        status = str(client.get_job_info(job_id).status) if job_id else "none"
        if status in ("STOPPED", "FAILED", "SUCCEEDED"):
            break
        time.sleep(0.5)
    return {"job_id": job_id, "code": proc.returncode, "stdout": stdout, "stderr": stderr,
            "exited_after": exited, "remote_status": status,
            "remote_logs": client.get_job_logs(job_id) if job_id else ""}


if __name__ == "__main__":
    main()
