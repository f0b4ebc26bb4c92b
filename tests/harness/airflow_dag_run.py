"""Run ``deploy/airflow/arrayjob_dag.py`` with ``dag.test()``, in Airflow's own virtualenv.

    AIRFLOW_HOME=... python tests/harness/airflow_dag_run.py RUNS_JSON OUT_JSON

RUNS_JSON is a list of ``{"name", "logical_date", "conf"}``; each is one DAG run. OUT_JSON
gets, per run, each task's final state and try number. Started by ``tests/harness/airflow_dag.py``.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

DAG_FILE = Path(__file__).resolve().parents[2] / "deploy" / "airflow" / "arrayjob_dag.py"


def main() -> None:
    runs = json.loads(Path(sys.argv[1]).read_text())
    import importlib.util

    spec = importlib.util.spec_from_file_location("arrayjob_dag", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    results = {}
    for run in runs:
        logical_date = datetime.fromisoformat(run["logical_date"]).replace(tzinfo=UTC)
        dagrun = dag.test(logical_date=logical_date, run_conf=run["conf"])
        results[run["name"]] = {
            "state": str(dagrun.state),
            "tasks": {ti.task_id: {"state": str(ti.state), "try_number": ti.try_number}
                      for ti in dagrun.get_task_instances()},
        }
    Path(sys.argv[2]).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
