"""The consume operator's filter (templated ``urns`` / ``jsonpath`` / ``unmatched_delay``) and the handlers' results
in its XCom return value, in a real DAG under dag.test() on the embedded SQLite queue."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.operators.consume import BabelQueueConsumeOperator
from airflow_provider_babelqueue.operators.publish import BabelQueuePublishOperator
from tests.airflow_harness import run_dag, task_states, xcom

CREATED, PAID = "urn:babel:orders:created", "urn:babel:invoices:paid"


def test_a_filtered_consume_task_returns_the_results_of_the_messages_it_took() -> None:
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    orders = [{"order_id": n, "amount": amount} for n, amount in enumerate((150, 20, 300, 101, 100))]
    with DAG(
        f"bq_consume_filter_{uuid.uuid4().hex[:6]}",
        schedule=None,
        start_date=datetime.datetime(2026, 1, 1),
        # a list param renders as Python's text of the list: ['urn:babel:orders:*', 'urn:babel:refunds:*']
        params={
            "urns": ["urn:babel:orders:*", "urn:babel:refunds:*"],
            "jsonpath": "$[?$.amount > 100]",
            "delay": "0.2",
        },
    ) as dag:
        publish_orders = BabelQueuePublishOperator(task_id="publish_orders", queue_name=queue, urn=CREATED,
                                                   data=orders)
        publish_invoice = BabelQueuePublishOperator(task_id="publish_invoice", queue_name=queue, urn=PAID,
                                                    data={"order_id": 9, "amount": 900})
        consume = BabelQueueConsumeOperator(
            task_id="consume",
            queue_name=queue,
            handlers={CREATED: "tests.operators.handlers.order_total", PAID: "tests.operators.handlers.order_total"},
            urns="{{ params.urns }}",
            jsonpath="{{ params.jsonpath }}",
            unmatched_delay="{{ params.delay }}",
            reserve_timeout=0.2,
        )
        publish_orders >> publish_invoice >> consume
    run = run_dag(dag)
    assert task_states(run) == {"publish_orders": "success", "publish_invoice": "success", "consume": "success"}
    order_ids = xcom(run, "publish_orders")
    summary = xcom(run, "consume")
    assert summary["results"] == [
        {"meta_id": order_ids[n], "urn": CREATED, "result": {"order_id": n, "total": orders[n]["amount"] * 2}}
        for n in (0, 2, 3)
    ]
    assert {key: summary[key] for key in ("received", "handled", "dead_lettered", "results_dropped",
                                          "results_unserialisable")} == {
        "received": 3, "handled": 3, "dead_lettered": {}, "results_dropped": 0, "results_unserialisable": 0}
    assert summary["unmatched"] >= 3  # orders 1 and 4, the invoice: handed back (again, if they came back in time)

    hook = get_hook()
    try:
        binding = hook.get_binding()
        left = []
        while (message := binding.reserve(queue, timeout=1)) is not None:
            left.append(message)
            binding.ack(message)
        assert all(m.envelope is not None for m in left)
        assert sorted((m.envelope["job"], m.envelope["data"]["order_id"], m.attempts)  # type: ignore[index]
                      for m in left) == [  # by URN
            (PAID, 9, 0), (CREATED, 1, 0), (CREATED, 4, 0)]
        assert binding.dead_letter_depth(queue) == 0
    finally:
        hook.close()


def test_filter_arguments_are_checked_when_the_dag_is_parsed() -> None:
    def consume(**kwargs: Any) -> BabelQueueConsumeOperator:
        return BabelQueueConsumeOperator(task_id="c", queue_name="q", handlers={}, **kwargs)

    with pytest.raises(ValueError, match=r"The JSONPath filter '\$\.items\[\?@\.qty >' is not valid RFC 9535"):
        consume(jsonpath="$.items[?@.qty >")
    with pytest.raises(ValueError, match="urns must be a list of strings, got 42"):
        consume(urns=42)
    with pytest.raises(ValueError, match="unmatched_delay must be a finite number >= 0"):
        consume(unmatched_delay=-1)
    with pytest.raises(ValueError, match="max_results must be a whole number >= 0"):
        consume(max_results=-5)
    with pytest.raises(ValueError, match="max_result_bytes must be a whole number >= 0"):
        consume(max_result_bytes="64k")
    # templates are checked once rendered (in execute), not at parse time
    templated = consume(urns=["{{ params.urn }}"], jsonpath="{{ params.path }}", unmatched_delay="{{ params.d }}")
    assert {"urns", "jsonpath", "unmatched_delay"} <= set(templated.template_fields)
    assert consume(urns="urn:a, urn:b", jsonpath="").urns == "urn:a, urn:b"
