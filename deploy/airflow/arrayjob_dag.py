"""A daily arrayjob run from Airflow: an estimate gate, then ``arrayjob submit`` to a Ray cluster.

Copy this file into the DAGs folder of an Airflow whose workers have the ``arrayjob``
command (``pip install arrayjob``) and can reach the inputs' bucket (``estimate`` reads their
metadata) and the Ray cluster's job server. Set the defaults below through the environment
of the workers, or per run through the DAG's params (``airflow dags trigger -c '{...}'``):

    ARRAYJOB_SPEC         the job spec (TOML) on the workers
    ARRAYJOB_OUTPUT_ROOT  where results go; each day writes to <root>/<ds>
    RAY_ADDRESS           the Ray job server, http://HEAD:8265
    ARRAYJOB_MAX_COST     dollars; a day whose estimate is higher is skipped
    ARRAYJOB_NODES, ARRAYJOB_INSTANCE_TYPE   the cluster the estimate prices

Tasks:
  estimate_gate  ``arrayjob estimate ... --max-cost``: exit 3 (over budget) skips the task,
                 and so the day's submit.
  submit         ``arrayjob submit`` with ``output.uri`` keyed by the data interval (``{{ ds }}``):
                 a rerun of a day finds that day's output complete and exits 0. With Airflow's
                 OpenLineage provider, the run's lineage names this task's run as its parent.
Both retry exit 4 (storage) and 5 (Ray), which may pass on another try, and fail at once on
any other code: 2 (a bad spec or input) or 1 (a bug) would fail again.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.bash import BashOperator

try:  # Airflow 3
    from airflow.sdk import DAG, Param
    from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.exceptions import AirflowException, AirflowFailException, AirflowSkipException
    from airflow.models.param import Param

RETRIED_EXIT_CODES = (4, 5)  # storage failed, Ray failed: worth another try
SKIPPED_EXIT_CODE = 3  # estimated cost over --max-cost


class ArrayjobCommand(BashOperator):
    """An ``arrayjob`` command whose exit code decides what Airflow does: ``skip_on_exit_code``
    skips, ``retry_on_exit_codes`` are retried (``retries`` times), any other failure fails
    the task without a retry (``AirflowFailException``)."""

    def __init__(self, *, retry_on_exit_codes: Collection[int] = RETRIED_EXIT_CODES, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.retry_on_exit_codes = tuple(retry_on_exit_codes)

    def execute(self, context: Any) -> Any:
        try:
            return super().execute(context)
        except (AirflowSkipException, AirflowFailException):  # both are AirflowExceptions: passed on as they are
            raise
        except AirflowException:  # the command exited with a code that is neither 0 nor a skip
            process = self.subprocess_hook.sub_process
            code = process.returncode if process is not None else None
            if code in self.retry_on_exit_codes:
                raise
            raise AirflowFailException(f"arrayjob exited with code {code}: not retried "
                                       f"(only {', '.join(map(str, self.retry_on_exit_codes))} are)") from None


# The command lines, with every value shell-quoted (the ``sh`` filter).
OPTIONS = (
    "{{ params.spec | sh }} --set {{ ('output.uri=' ~ params.output_root ~ '/' ~ ds) | sh }}"
    "{% for item in params.set %} --set {{ item | sh }}{% endfor %}"
)
ESTIMATE = (
    "{{ params.arrayjob | sh }} estimate " + OPTIONS
    + " --nodes {{ params.nodes }} --instance-type {{ params.instance_type | sh }} --max-cost {{ params.max_cost }}"
)
SUBMIT = "{{ params.arrayjob | sh }} submit " + OPTIONS
ADDRESS = {"RAY_ADDRESS": "{{ params.address }}"}  # the job server, for arrayjob submit
# The run's OpenLineage events name this task's run as their parent (docs/operating.md, "Lineage"):
# the OpenLineage provider's macros where its plugin is loaded (installed and configured), else
# empty (no parent). OPENLINEAGE_URL and the rest come from the workers' environment.
LINEAGE_PARENT = {
    variable: f"{{{{ macros.OpenLineageProviderPlugin.{macro}(task_instance) "
              f"if macros.OpenLineageProviderPlugin is defined else '' }}}}"
    for variable, macro in (("OPENLINEAGE_PARENT_ID", "lineage_parent_id"),
                            ("OPENLINEAGE_ROOT_PARENT_ID", "lineage_root_parent_id"))
}

with DAG(
    dag_id="arrayjob_daily",
    description="arrayjob: estimate, then submit to Ray, one output per day",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    user_defined_filters={"sh": shlex.quote},
    params={
        "spec": Param(os.environ.get("ARRAYJOB_SPEC", "/opt/arrayjob/configs/logreg.toml"), type="string"),
        "output_root": Param(os.environ.get("ARRAYJOB_OUTPUT_ROOT", "s3://your-bucket/results/logreg-daily"),
                             type="string"),
        "address": Param(os.environ.get("RAY_ADDRESS", ""), type="string"),
        "max_cost": Param(float(os.environ.get("ARRAYJOB_MAX_COST", "5.0")), type="number", minimum=0),
        "nodes": Param(int(os.environ.get("ARRAYJOB_NODES", "4")), type="integer", minimum=1),
        "instance_type": Param(os.environ.get("ARRAYJOB_INSTANCE_TYPE", "r5.2xlarge"), type="string"),
        "set": Param([], type="array", description="more --set KEY=VALUE overrides of the spec"),
        "arrayjob": Param(os.environ.get("ARRAYJOB_BIN", "arrayjob"), type="string"),
    },
    default_args={
        "retries": int(os.environ.get("ARRAYJOB_RETRIES", "2")),
        "retry_delay": timedelta(seconds=float(os.environ.get("ARRAYJOB_RETRY_DELAY", "300"))),
    },
    tags=["arrayjob"],
) as dag:
    estimate_gate = ArrayjobCommand(
        task_id="estimate_gate",
        bash_command=ESTIMATE,
        skip_on_exit_code=SKIPPED_EXIT_CODE,
        env=ADDRESS,
        append_env=True,
    )
    submit = ArrayjobCommand(
        task_id="submit",
        bash_command=SUBMIT,
        skip_on_exit_code=None,  # BashOperator skips on 99 by default: arrayjob has no such code
        env={**ADDRESS, **LINEAGE_PARENT},  # arrayjob submit passes them on to the run
        append_env=True,
    )
    estimate_gate >> submit
