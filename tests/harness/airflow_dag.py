"""``make test-airflow``: the shipped DAG (``deploy/airflow/arrayjob_dag.py``) run for real.

    unshare --pid --fork --mount-proc --net bash -c \\
        'ip link set lo up && exec .venv/bin/python tests/harness/airflow_dag.py --airflow .venv-airflow/bin'

Inside its own PID and network namespace it starts a loopback S3 server and a Ray head with
its job server (``tests/harness/jobserver.py``), writes a small logistic-regression input, then runs
the DAG with Airflow's ``dag.test()`` (in Airflow's own virtualenv, with a fresh SQLite
metadata database) for five days:

  within_budget    the estimate passes the gate; submit publishes <root>/<ds>
  rerun            the same day again: success, the same published run (idempotent)
  over_budget      --max-cost 0: the gate exits 3, the gate and submit are skipped
  bad_input        a missing input: exit 2, failed on the first try, not retried
  storage_failure  an output bucket that does not exist: exit 4, retried (2 tries)

Prints one line per day and exits 1 if any expectation fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.harness.jobserver import BIN, ENV, JOBS, REPO, S3, SPEC, start_moto, start_ray, stop_ray  # noqa: E402

os.environ.clear()
os.environ.update(ENV)

ROOT = "s3://jobs/daily"
CONF = {
    "spec": str(SPEC),
    "output_root": ROOT,
    "address": JOBS,
    "max_cost": 1.0,
    "nodes": 1,
    "instance_type": "r5.2xlarge",
    "set": [f"storage.endpoint_url={S3}", "inputs.X=s3://jobs/in/X.zarr", "inputs.y=s3://jobs/in/y.zarr"],
    "arrayjob": str(BIN / "arrayjob"),
}
RUNS = [
    {"name": "within_budget", "logical_date": "2026-11-20T00:00:00", "conf": CONF},
    {"name": "rerun", "logical_date": "2026-11-20T00:00:00", "conf": CONF},
    {"name": "over_budget", "logical_date": "2026-11-21T00:00:00", "conf": {**CONF, "max_cost": 0}},
    {"name": "bad_input", "logical_date": "2026-11-22T00:00:00",
     "conf": {**CONF, "set": [*CONF["set"], "inputs.X=s3://jobs/in/nothing.zarr"]}},
    {"name": "storage_failure", "logical_date": "2026-11-23T00:00:00",
     "conf": {**CONF, "output_root": "s3://no-such-bucket/daily"}},
]
EXPECTED = {  # task -> (state, try number)
    "within_budget": {"estimate_gate": ("success", 1), "submit": ("success", 1)},
    "rerun": {"estimate_gate": ("success", 1), "submit": ("success", 1)},
    "over_budget": {"estimate_gate": ("skipped", 1), "submit": ("skipped", 0)},
    "bad_input": {"estimate_gate": ("failed", 1), "submit": ("upstream_failed", 0)},
    "storage_failure": {"estimate_gate": ("success", 1), "submit": ("failed", 2)},
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--airflow", required=True, help="bin/ of the virtualenv Airflow is installed in")
    airflow_bin = Path(parser.parse_args().airflow).resolve()

    import boto3

    from tests.harness.helpers import logreg_data, write_array

    server = start_moto()
    failures: list[str] = []
    try:
        s3 = boto3.client("s3", endpoint_url=S3)
        s3.create_bucket(Bucket="jobs")
        X, y = logreg_data(4000, 4)
        write_array("s3://jobs/in/X.zarr", X, (1000, 4), endpoint=S3)
        write_array("s3://jobs/in/y.zarr", y, (1000,), endpoint=S3)
        started = time.monotonic()
        start_ray()
        print(f"ray head and job server up in {time.monotonic() - started:.1f} s", flush=True)

        with tempfile.TemporaryDirectory(prefix="arrayjob-airflow-") as home:
            env = {
                **ENV,
                "AIRFLOW_HOME": home,
                "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "deploy" / "airflow"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "ARRAYJOB_RETRIES": "1",
                "ARRAYJOB_RETRY_DELAY": "1",
            }
            version = subprocess.run([str(airflow_bin / "airflow"), "version"], env=env, capture_output=True,
                                     text=True, check=True).stdout.strip()
            print(f"Apache Airflow {version} ({airflow_bin / 'python'})", flush=True)
            subprocess.run([str(airflow_bin / "airflow"), "db", "migrate"], env=env, check=True,
                           capture_output=True, timeout=600)
            log = Path(home, "dag-test.log")
            started = time.monotonic()
            # the first day alone, then the rest: its manifest is read before its rerun
            results = dag_test(airflow_bin, env, RUNS[:1], Path(home), log)
            manifests = {"within_budget": manifest(s3, RUNS[0])}
            results.update(dag_test(airflow_bin, env, RUNS[1:], Path(home), log))
            manifests.update({run["name"]: manifest(s3, run) for run in RUNS[1:]})
            print(f"dag.test() of {len(RUNS)} runs: {time.monotonic() - started:.1f} s", flush=True)
            for run in RUNS:
                name = run["name"]
                tasks = {t: (r["state"], r["try_number"]) for t, r in results[name]["tasks"].items()}
                ok = tasks == EXPECTED[name]
                print(f"{'ok  ' if ok else 'FAIL'} {name} ({run['logical_date'][:10]}): dag run {results[name]['state']}, "
                      + ", ".join(f"{t} {s} (try {n})" for t, (s, n) in sorted(tasks.items()))
                      + (f"; published {manifests[name]['key']}" if manifests[name] else ""))
                if not ok:
                    failures.append(f"{name}: expected {EXPECTED[name]}, got {tasks}")
            published = {name for name, m in manifests.items() if m}
            if published != {"within_budget", "rerun"}:
                failures.append(f"published outputs for {sorted(published)}, expected within_budget and rerun")
            elif manifests["within_budget"]["run_id"] != manifests["rerun"]["run_id"]:
                failures.append("the rerun of a day published again")
            if failures:
                print(log.read_text()[-5000:])
    finally:
        stop_ray()
        server.stop()
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


def dag_test(airflow_bin: Path, env: dict[str, str], runs: list[dict[str, Any]], home: Path,
             log: Path) -> dict[str, Any]:
    """Each run's task states, from ``tests/harness/airflow_dag_run.py`` in Airflow's virtualenv."""
    (home / "runs.json").write_text(json.dumps(runs))
    with log.open("a") as sink:
        done = subprocess.run([str(airflow_bin / "python"), str(REPO / "tests" / "harness" / "airflow_dag_run.py"),
                               str(home / "runs.json"), str(home / "out.json")], env=env, stdout=sink,
                              stderr=subprocess.STDOUT, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"dag.test() failed:\n{log.read_text()[-5000:]}")
    return json.loads((home / "out.json").read_text())


def manifest(s3: Any, run: dict[str, Any]) -> dict[str, Any] | None:
    """The day's ``_SUCCESS`` manifest (read after all runs), or None."""
    root = run["conf"]["output_root"]
    if not root.startswith("s3://jobs/"):
        return None
    key = f"{root.removeprefix('s3://jobs/')}/{run['logical_date'][:10]}/_SUCCESS"
    try:
        body = s3.get_object(Bucket="jobs", Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    return {"key": key, **json.loads(body)}


if __name__ == "__main__":
    sys.exit(main())
