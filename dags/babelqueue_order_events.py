"""Event-driven orders: an order message starts a run, which processes it once and settles it.

The DAG is scheduled on an asset whose ``AssetWatcher`` runs ``BabelQueueMessageTrigger`` in the triggerer: it
reads ``order-events`` (URNs ``urn:babel:orders:*`` only; other messages stay on the queue for their own readers)
and makes one asset event per message. With ``settle="run_finished"`` the message stays reserved until the run
settles it: the last task, ``settle``, acks it when ``process_orders`` succeeded and hands it back when it failed,
so a failed run's order starts a new run. A triggerer that dies never loses a message; it may make an event twice
for one instead, so ``process_orders`` processes each ``meta.id`` once: it remembers what it processed in a
seen-set on the same connection and skips what is already there. The embedded SQLite queue, Redis and SQS let a
run settle its messages; on the other brokers use the default ``settle="event_stored"`` and drop the last task
(docs/events.md).

The watched connection and queue are fixed when the DAG is parsed (an asset's watcher is part of the schedule), so
they are the constants below; change them for your queue. The trigger connects only in the triggerer.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_babelqueue.operators import BabelQueueSettleRunOperator
from airflow_provider_babelqueue.triggers import BabelQueueMessageTrigger

log = logging.getLogger(__name__)

#: The queue the watcher reads: edit these for your deployment.
WATCHED_CONN_ID = "babelqueue_default"
WATCHED_QUEUE = "order-events"
#: The seen-set of processed ``meta.id`` values, kept on the same connection.
PROCESSED = f"{WATCHED_QUEUE}:processed"

# --8<-- [start:message_asset_watcher]
order_events = Asset(
    f"babelqueue://{WATCHED_CONN_ID}/{WATCHED_QUEUE}",
    watchers=[
        AssetWatcher(
            name=f"{WATCHED_QUEUE}_messages",
            trigger=BabelQueueMessageTrigger(
                babelqueue_conn_id=WATCHED_CONN_ID, queue_name=WATCHED_QUEUE,
                urns=["urn:babel:orders:*"],  # the others are handed back untouched
                settle="run_finished",  # the run's last task settles the message
            ),
        )
    ],
)
# --8<-- [end:message_asset_watcher]


def process(envelopes: list[dict[str, Any]], conn_id: str = WATCHED_CONN_ID) -> dict[str, Any]:
    """Process each order once: what the seen-set already holds was processed by an earlier run."""
    from airflow_provider_babelqueue.core.idempotency import remember_many, seen_many
    from airflow_provider_babelqueue.hooks import get_hook

    with get_hook(conn_id) as hook:  # closes the broker connection when the block ends
        store = hook.get_binding().seen_store(PROCESSED)
        done = seen_many(store, [e["meta"]["id"] for e in envelopes])
        fresh = [e for e in envelopes if e["meta"]["id"] not in done]
        total = 0.0
        for envelope in fresh:
            order = envelope["data"]
            total += float(order.get("amount") or 0)
            log.info("order %s: %s (trace %s)", order.get("order_id"), order.get("amount"), envelope["trace_id"])
        remember_many(store, [e["meta"]["id"] for e in fresh])
    return {"received": len(envelopes), "processed": len(fresh), "already_processed": len(envelopes) - len(fresh),
            "total_amount": round(total, 2)}


with DAG(
    "babelqueue_order_events",
    schedule=[order_events],
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["babelqueue", "events"],
    doc_md=__doc__,
):

    @task
    def process_orders(triggering_asset_events: Any = None) -> dict[str, Any]:
        from airflow_provider_babelqueue.triggers.messages import envelopes_from

        return process(envelopes_from(triggering_asset_events))

    process_orders() >> BabelQueueSettleRunOperator(task_id="settle")
