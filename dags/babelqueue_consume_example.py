"""Consuming a BabelQueue queue in a bounded task, with handlers per URN and an idempotency store.

``consume_orders`` reads ``orders`` until it is empty (or ``max_seconds`` pass), runs the handler mapped to each
message's URN, retries failures with backoff and dead-letters what cannot be handled, with a reason. The
seen-set of handled ``meta.id`` values lives on the same connection (``idempotency``), so a message delivered
again (at-least-once) does not run its handler twice. The summary goes to XCom.

Handlers here only log; in a real DAG they call your code (or name it as a dotted path string, imported when
the task runs).
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from airflow.sdk import DAG, Param

from airflow_provider_babelqueue.operators import BabelQueueConsumeOperator

log = logging.getLogger(__name__)


def record_order(envelope: dict[str, Any]) -> None:
    """Handle ``urn:babel:orders:created``: a real handler would write the order somewhere."""
    order = envelope["data"]
    log.info("order %s for %s (trace %s)", order.get("order_id"), order.get("total"), envelope["trace_id"])


def record_line(envelope: dict[str, Any]) -> None:
    """Handle ``urn:babel:orders:line-added``."""
    line = envelope["data"]
    log.info("line %s x%s on order %s", line.get("sku"), line.get("quantity"), line.get("order_id"))


PARAMS = {
    "babelqueue_conn_id": Param("babelqueue_default", type="string", description="the connection to consume"),
    "queue_name": Param("orders", type="string", description="the logical queue"),
    "idempotency": Param(True, type="boolean", description="remember handled meta.ids on the same connection"),
}

with DAG(
    dag_id="babelqueue_consume_example",
    description="Consume a BabelQueue queue with handlers per URN, retries and an idempotency store",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    tags=["babelqueue", "example"],
    doc_md=__doc__,
) as dag:
    # --8<-- [start:operator_consume]
    BabelQueueConsumeOperator(
        task_id="consume_orders",
        babelqueue_conn_id="{{ params.babelqueue_conn_id }}",
        queue_name="{{ params.queue_name }}",
        handlers={
            "urn:babel:orders:created": record_order,
            "urn:babel:orders:line-added": record_line,
        },
        max_seconds=300,
        max_attempts=3,
        backoff="exponential",
        backoff_base=1.0,
        unknown_urn_strategy="dead_letter",
        idempotency_conn_id="{{ params.babelqueue_conn_id if params.idempotency else '' }}",
    )
    # --8<-- [end:operator_consume]
