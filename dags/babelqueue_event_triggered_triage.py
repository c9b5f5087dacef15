"""Event-driven triage: a dead letter arriving starts a run, which drains the DLQ and triages it on Spark.

The DAG is scheduled on an asset whose ``AssetWatcher`` runs ``BabelQueueDeadLetterTrigger`` in the triggerer:
the trigger polls the DLQ's depth without holding a worker slot and fires an asset event (with the new dead
letters' ids and reasons) when messages arrive. The run then moves the dead letters into a JSON Lines file and
runs the Spark triage with its HTML report. Dead letters already waiting when the watcher starts (after a pause,
a deploy or a triggerer restart) start a run too (``since_start=False``); a restart may so start one run more,
which is harmless: the run drains what is there and triage drops duplicates by ``meta.id``.

As in ``babelqueue_dlq_triage_report``, the Spark connection is checked before the drain, and the drain writes
into the DAG's pending folder, which the triage reads whole and empties only when it succeeded: a failed triage
leaves its dead letters to the next run.

The watched connection and queue are fixed when the DAG is parsed (an asset's watcher is part of the schedule),
so they are the constants below; change them for your queue. The trigger only connects in the triggerer, never
at parse time. The tasks read their connection and queue from params, whose defaults are the same values.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, Param, get_current_context, task

from airflow_provider_babelqueue.operators import BabelQueueDrainDeadLettersOperator, BabelQueueSparkTriageOperator
from airflow_provider_babelqueue.triggers import BabelQueueDeadLetterTrigger

log = logging.getLogger(__name__)

#: The DLQ the watcher polls: edit these for your deployment.
WATCHED_CONN_ID = "babelqueue_default"
WATCHED_QUEUE = "orders"

# --8<-- [start:trigger_asset_watcher]
dead_letters = Asset(
    f"babelqueue://{WATCHED_CONN_ID}/{WATCHED_QUEUE}/dead-letters",
    watchers=[
        AssetWatcher(
            name=f"{WATCHED_QUEUE}_dead_letters",
            trigger=BabelQueueDeadLetterTrigger(
                babelqueue_conn_id=WATCHED_CONN_ID, queue_name=WATCHED_QUEUE, poll_interval=30,
                since_start=False,  # a backlog waiting when the watcher starts fires too
            ),
        )
    ],
)
# --8<-- [end:trigger_asset_watcher]

PARAMS = {
    "babelqueue_conn_id": Param(WATCHED_CONN_ID, type="string", description="the connection whose DLQ is drained"),
    "queue_name": Param(WATCHED_QUEUE, type="string", description="the logical queue whose DLQ is drained"),
    "output_root": Param(None, type=["null", "string"], description="folder or URL for the run's files; null or "
                                                                    "blank = $AIRFLOW_HOME/babelqueue/runs"),
    "spark_conn_id": Param("spark_default", type="string", description="the Spark connection for spark-submit"),
    "spark_conf": Param({"spark.sql.shuffle.partitions": "8", "spark.ui.enabled": "false"}, type=["null", "object"],
                        description="extra spark-submit --conf values; empty = the recommended ones only"),
}

with DAG(
    dag_id="babelqueue_event_triggered_triage",
    description="Triage BabelQueue dead letters on Spark as soon as they arrive (AssetWatcher)",
    schedule=[dead_letters],
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    render_template_as_native_obj=True,
    tags=["babelqueue", "dead-letters", "spark", "event-driven"],
    doc_md=__doc__,
) as dag:

    @task
    def plan(triggering_asset_events: Any = None) -> dict[str, str]:
        """Log what fired the run, and decide the run's folders."""
        from airflow.configuration import conf

        from airflow_provider_babelqueue.workspace import run_workspace, shared_storage_warning

        context = get_current_context()
        for asset, events in (triggering_asset_events or {}).items():
            for event in events:
                extra = dict(event.extra or {})
                log.info("dead letters on %s: %s new, DLQ depth %s, sample %s", asset, extra.get("new"),
                         extra.get("depth"), extra.get("sample"))
        folders = run_workspace(context["params"]["output_root"], context["dag"].dag_id, context["run_id"])
        warning = shared_storage_warning(folders["root"], conf.get("core", "executor", fallback=""))
        if warning:
            log.warning("%s", warning)
        return folders

    folders = plan()

    @task
    def check_spark() -> str:
        """Fail before the drain when spark-submit could not run, so no dead letter leaves the broker for nothing."""
        from airflow_provider_babelqueue.operators.spark_connection import check_spark_connection

        return check_spark_connection(get_current_context()["params"]["spark_conn_id"]).master

    drain = BabelQueueDrainDeadLettersOperator(
        task_id="drain",
        babelqueue_conn_id="{{ params.babelqueue_conn_id }}",
        queue_name="{{ params.queue_name }}",
        destination=folders["pending"],
    )

    triage = BabelQueueSparkTriageOperator(
        task_id="triage",
        job="triage",
        conn_id="{{ params.spark_conn_id }}",
        conf="{{ params.spark_conf }}",
        input="{{ ti.xcom_pull(task_ids='drain')['path'] }}",
        output=folders["triage"],
        report_output=folders["report"],
        pending=folders["pending"],
        archive_to=folders["drain"],
    )

    check_spark() >> drain >> triage
