"""Publishing BabelQueue envelopes from a DAG: one message, a batch, and both on the same trace.

``start_trace`` takes the ``trace_id`` param (to continue a trace an upstream service started) or begins a new
one; ``publish_order`` sends one ``urn:babel:orders:created`` envelope and ``publish_lines`` a batch of
``urn:babel:orders:line-added`` envelopes (the broker's native batch), all carrying that trace id, so a
tracing backend shows them as one story. Each publish returns its messages' ``meta.id`` values as XCom.
"""

from __future__ import annotations

import datetime
import uuid

from airflow.sdk import DAG, Param, get_current_context, task

from airflow_provider_babelqueue.operators import BabelQueuePublishOperator

PARAMS = {
    "babelqueue_conn_id": Param("babelqueue_default", type="string", description="where to publish"),
    "queue_name": Param("orders", type="string", description="the logical queue"),
    # Nullable with a null default: the UI's trigger form counts a blank string param as missing.
    "trace_id": Param(None, type=["null", "string"],
                      description="continue this trace; null or blank = start a new one"),
    "order": Param({"order_id": "A-1001", "customer": "c-42", "total": 129.9, "currency": "EUR"}, type="object",
                   description="the order payload"),
    "lines": Param([{"order_id": "A-1001", "sku": "SKU-1", "quantity": 2},
                    {"order_id": "A-1001", "sku": "SKU-7", "quantity": 1}], type="array",
                   description="one batch message per line"),
}

with DAG(
    dag_id="babelqueue_publish_example",
    description="Publish a BabelQueue envelope and a batch on one trace",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    tags=["babelqueue", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def start_trace() -> str:
        """The run's trace id: the one given, else a new UUID."""
        given = (get_current_context()["params"]["trace_id"] or "").strip()
        return given or str(uuid.uuid4())

    trace_id = start_trace()

    # --8<-- [start:operator_publish]
    publish_order = BabelQueuePublishOperator(
        task_id="publish_order",
        babelqueue_conn_id="{{ params.babelqueue_conn_id }}",
        queue_name="{{ params.queue_name }}",
        urn="urn:babel:orders:created",
        data="{{ params.order }}",
        trace_id=trace_id,
    )
    # --8<-- [end:operator_publish]

    # --8<-- [start:operator_publish_batch]
    publish_lines = BabelQueuePublishOperator(
        task_id="publish_lines",
        babelqueue_conn_id="{{ params.babelqueue_conn_id }}",
        queue_name="{{ params.queue_name }}",
        urn="urn:babel:orders:line-added",
        data="{{ params.lines }}",
        trace_id=trace_id,
    )
    # --8<-- [end:operator_publish_batch]

    publish_order >> publish_lines
