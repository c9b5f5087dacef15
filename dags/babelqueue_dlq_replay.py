"""Manual replay of dead letters, driven by params: pick the source, filter, choose the target, dry-run first.

Trigger it from the UI (the params form) or ``airflow dags trigger babelqueue_dlq_replay -c '{...}'``. The
source is either a DLQ (``source_conn_id`` + ``queue_name``: a redrive) or a replay set on disk or in object
storage (``replay_set``, e.g. a triage run's ``replay_set`` folder, each dead letter going back to its own
original queue; leave ``queue_name`` blank then). ``dry_run`` is on by default: the first run only reports what
would be replayed. The replay ledger (on the target's broker) makes a second run republish nothing already
replayed.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, Param

from airflow_provider_babelqueue.operators import BabelQueueReplayOperator

PARAMS = {
    "source_conn_id": Param("babelqueue_default", type="string", description="the connection holding the DLQ"),
    "queue_name": Param("orders", type=["null", "string"],
                        description="the logical queue whose DLQ is redriven; blank when replaying a replay_set"),
    "replay_set": Param(None, type=["null", "string"],
                        description="a JSON Lines file or folder to replay instead of a DLQ; null or blank = use "
                                    "queue_name"),
    # Lists are nullable: a list emptied by hand in the form becomes null (null and [] both mean "any").
    "reasons": Param([], type=["null", "array"], description="only these dead_letter.reason values; empty = any"),
    "urns": Param([], type=["null", "array"], description="only these URNs; empty = any"),
    "exception_types": Param([], type=["null", "array"],
                             description="only these exception types; empty = any"),
    "min_age_seconds": Param(None, type=["null", "number"], description="only dead letters at least this old"),
    "max_messages": Param(None, type=["null", "integer"], description="at most this many in this run"),
    "target_conn_id": Param(None, type=["null", "string"], description="publish on this connection; null = source"),
    "target_queue_name": Param(None, type=["null", "string"],
                               description="publish everything to this queue; null = each message's own queue"),
    "dry_run": Param(True, type="boolean", description="report what would be replayed; publish nothing"),
    "max_messages_per_second": Param(None, type=["null", "number"], description="rate limit; null = none"),
}

with DAG(
    dag_id="babelqueue_dlq_replay",
    description="Replay BabelQueue dead letters with filters, a target, a rate limit and a dry run",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    tags=["babelqueue", "dead-letters", "replay"],
    doc_md=__doc__,
) as dag:
    # --8<-- [start:operator_replay]
    BabelQueueReplayOperator(
        task_id="replay",
        source_conn_id="{{ params.source_conn_id }}",
        queue_name="{{ params.queue_name }}",
        replay_set="{{ params.replay_set }}",
        reasons="{{ params.reasons }}",
        urns="{{ params.urns }}",
        exception_types="{{ params.exception_types }}",
        min_age_seconds="{{ params.min_age_seconds }}",
        max_messages="{{ params.max_messages }}",
        target_conn_id="{{ params.target_conn_id or params.source_conn_id }}",
        target_queue_name="{{ params.target_queue_name }}",
        dry_run="{{ params.dry_run }}",
        max_messages_per_second="{{ params.max_messages_per_second }}",
    )
    # --8<-- [end:operator_replay]
