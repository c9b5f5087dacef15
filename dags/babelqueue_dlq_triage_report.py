"""Daily dead-letter triage: wait for dead letters → drain → Spark triage and report → replay set → gate → replay.

The whole dead-letter lifecycle in one DAG, on any BabelQueue connection (the embedded SQLite queue by
default):

1. ``wait_for_dead_letters`` waits (reschedule mode) until the DLQ holds at least one message; a day with none
   ends skipped, not failed.
2. ``check_spark`` fails the run before anything leaves the broker when the Spark connection is missing or
   unusable, with the fix in the error.
3. ``drain`` moves the dead letters into one JSON Lines file (the evidence, bytes unaltered) in the DAG's pending
   folder. Each message leaves the DLQ only once the file holding it is on disk.
4. ``triage`` (spark-submit) reads every file in the pending folder (this run's, and any an earlier run whose
   triage failed left there), deduplicates and partitions them by reason into Parquet and writes the HTML report
   from the same Spark application. Only then are the files moved into this run's ``drain`` folder.
5. ``replay_set`` (spark-submit) selects what the policy says is worth retrying (``replay_reasons`` and the
   other ``replay_*`` params) and writes those dead letters' drain records, untouched, into one folder.
6. ``gate`` logs the triage and what would be republished. With ``dry_run`` (the default) it stops there:
   nothing is republished until someone runs the DAG with ``{"dry_run": false}``.
7. ``replay`` replays that folder: it resets each dead letter and publishes it to its original queue. The replay
   ledger makes a re-run publish nothing twice.

Everything a run writes sits under ``<output_root>/babelqueue_dlq_triage_report/<run id>/``; drain files wait in
``<output_root>/babelqueue_dlq_triage_report/_pending/`` until a triage has read them. With workers on several
machines, the output root must be shared storage (an object-storage URL): ``plan`` warns when it is not.
Connection ids and queue names are params; nothing is looked up when the file is parsed.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from airflow.sdk import DAG, Param, get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_babelqueue.operators import (
    BabelQueueDrainDeadLettersOperator,
    BabelQueueReplayOperator,
    BabelQueueSparkTriageOperator,
)
from airflow_provider_babelqueue.sensors import BabelQueueDeadLetterSensor

log = logging.getLogger(__name__)

PARAMS = {
    "babelqueue_conn_id": Param("babelqueue_default", type="string",
                                description="the BabelQueue connection whose DLQ is triaged"),
    "queue_name": Param("orders", type="string", description="the logical queue whose dead letters are triaged"),
    # Optional values are nullable with a null default: the UI's trigger form counts a blank string param as
    # missing and keeps its Trigger button disabled (docs/dags.md, tests/dags/test_trigger_form.py).
    "output_root": Param(None, type=["null", "string"],
                         description="folder or object-storage URL for the run's files; null or blank = "
                                     "$AIRFLOW_HOME/babelqueue/runs"),
    "spark_conn_id": Param("spark_default", type="string", description="the Spark connection for spark-submit"),
    "spark_conf": Param({"spark.sql.shuffle.partitions": "8", "spark.ui.enabled": "false"}, type=["null", "object"],
                        description="extra spark-submit --conf values; empty = the recommended ones only"),
    # Lists are nullable too: a list emptied by hand in the form becomes null, which a plain "array" counts as
    # missing. Null and [] both mean "any".
    "replay_reasons": Param(["failed"], type=["null", "array"],
                            description="dead_letter.reason values worth replaying; 'failed' = handler errors; "
                                        "empty = any"),
    "replay_exception_types": Param([], type=["null", "array"],
                                    description="only these exception types (full name or last segment); "
                                                "empty = any"),
    "replay_urns": Param([], type=["null", "array"], description="only these URNs; empty = any"),
    "replay_min_age_seconds": Param(None, type=["null", "number"],
                                    description="only dead letters at least this old (let a fix deploy first)"),
    "replay_max_attempts": Param(None, type=["null", "integer"],
                                 description="only dead letters with at most this many attempts; null = any"),
    "target_conn_id": Param(None, type=["null", "string"],
                            description="publish replays on this connection; null = babelqueue_conn_id"),
    "max_messages_per_second": Param(None, type=["null", "number"], description="replay rate limit; null = none"),
    "dry_run": Param(True, type="boolean", description="log what would be replayed and republish nothing"),
}

with DAG(
    dag_id="babelqueue_dlq_triage_report",
    description="Daily BabelQueue dead-letter triage: drain, Spark triage + HTML report, policy replay",
    schedule="@daily",
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    render_template_as_native_obj=True,
    tags=["babelqueue", "dead-letters", "spark"],
    doc_md=__doc__,
) as dag:

    @task
    def plan() -> dict[str, str]:
        """The run's folders, decided when the run starts (not at parse time)."""
        from airflow.configuration import conf

        from airflow_provider_babelqueue.workspace import run_workspace, shared_storage_warning

        context = get_current_context()
        folders = run_workspace(context["params"]["output_root"], context["dag"].dag_id, context["run_id"])
        log.info("this run's files go under %s; drain files wait in %s", folders["root"], folders["pending"])
        warning = shared_storage_warning(folders["root"], conf.get("core", "executor", fallback=""))
        if warning:
            log.warning("%s", warning)
        return folders

    folders = plan()

    @task
    def check_spark() -> str:
        """Fail before the drain when spark-submit could not run, so no dead letter leaves the broker for nothing."""
        from airflow_provider_babelqueue.operators.spark_connection import check_spark_connection

        target = check_spark_connection(get_current_context()["params"]["spark_conn_id"])
        log.info("Spark connection %s: master %s, %s", target.conn_id, target.master, target.binary)
        return target.master

    # --8<-- [start:sensor_dead_letters]
    wait_for_dead_letters = BabelQueueDeadLetterSensor(
        task_id="wait_for_dead_letters",
        babelqueue_conn_id="{{ params.babelqueue_conn_id }}",
        queue_name="{{ params.queue_name }}",
        min_count=1,
        mode="reschedule",
        poke_interval=datetime.timedelta(minutes=5),
        timeout=datetime.timedelta(hours=1),
        soft_fail=True,  # no dead letters today: the run ends skipped
    )
    # --8<-- [end:sensor_dead_letters]

    # --8<-- [start:operator_drain]
    drain = BabelQueueDrainDeadLettersOperator(
        task_id="drain",
        babelqueue_conn_id="{{ params.babelqueue_conn_id }}",
        queue_name="{{ params.queue_name }}",
        destination=folders["pending"],
        mode="move",
    )
    # --8<-- [end:operator_drain]

    # --8<-- [start:operator_spark_triage]
    triage = BabelQueueSparkTriageOperator(
        task_id="triage",
        job="triage",
        conn_id="{{ params.spark_conn_id }}",
        conf="{{ params.spark_conf }}",
        input="{{ ti.xcom_pull(task_ids='drain')['path'] }}",
        output=folders["triage"],
        report_output=folders["report"],
        pending=folders["pending"],  # with files earlier runs left there, if their triage failed
        archive_to=folders["drain"],  # where the files it read go once it succeeded
    )
    # --8<-- [end:operator_spark_triage]

    # --8<-- [start:operator_spark_replay_set]
    replay_set = BabelQueueSparkTriageOperator(
        task_id="replay_set",
        job="replay_set",
        conn_id="{{ params.spark_conn_id }}",
        conf="{{ params.spark_conf }}",
        input=folders["triage"],
        output=folders["replay_set"],
        reasons="{{ params.replay_reasons }}",
        exception_types="{{ params.replay_exception_types }}",
        urns="{{ params.replay_urns }}",
        min_age_seconds="{{ params.replay_min_age_seconds }}",
        max_attempts="{{ params.replay_max_attempts }}",
    )
    # --8<-- [end:operator_spark_replay_set]

    @task
    def gate(triage_result: dict[str, Any], replay_result: dict[str, Any]) -> str:
        """Log the triage and the replay set; stop here on a dry run or an empty set; else hand on the set."""
        from airflow_provider_babelqueue.workspace import read_json, summary_table

        params = get_current_context()["params"]
        triaged = read_json(triage_result["summary"])
        selected = read_json(replay_result["summary"])
        log.info("triage: %d records, %d after dedup, report at %s\n%s", triaged["records"], triaged["rows"],
                 triage_result.get("report"), summary_table(triaged["by_reason"]))
        log.info("replay set %s (policy %s): %d messages, left out %s\n%s", selected["path"], selected["policy"],
                 selected["lines"], selected["skipped"],
                 summary_table(selected["targets"], ("original queue", "messages")))
        if params["dry_run"]:
            raise AirflowSkipException(
                f"dry run: {selected['lines']} message(s) would be replayed to {sorted(selected['targets'])}; "
                "nothing was republished. Trigger with {\"dry_run\": false} to replay this set."
            )
        if not selected["lines"]:
            raise AirflowSkipException("the policy selected nothing to replay")
        return str(selected["path"])

    checked = gate(triage.output, replay_set.output)

    # --8<-- [start:operator_replay_set]
    replay = BabelQueueReplayOperator(
        task_id="replay",
        replay_set=checked,  # the replay set's folder, once the gate let it through
        source_conn_id="{{ params.babelqueue_conn_id }}",
        target_conn_id="{{ params.target_conn_id or params.babelqueue_conn_id }}",
        max_messages_per_second="{{ params.max_messages_per_second }}",
    )
    # --8<-- [end:operator_replay_set]

    wait_for_dead_letters >> check_spark() >> drain >> triage
    triage >> replay_set
