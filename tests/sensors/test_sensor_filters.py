"""The dead-letter sensor and trigger with a URN pattern and a JSONPath over ``data``, on the brokers that can browse
their dead-letter queue (the embedded SQLite queue, PostgreSQL, Redis) and on one that cannot (RabbitMQ).

The same six dead letters everywhere (``tests.bindings.test_checks.seed_orders_and_others``): two orders over 100
(``big_order``, ``big_refund``), a small order, a big billing charge, an order whose ``data`` is a list (quarantined
as ``invalid_data``) and a poison body. ``urns=["urn:babel:orders:*"]`` with ``jsonpath="$[?$.amount > 100]"``
counts exactly the two big orders.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import NotSupportedError
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.sensors import BabelQueueDeadLetterSensor, BabelQueueQueueDepthSensor
from airflow_provider_babelqueue.triggers import BabelQueueDeadLetterTrigger
from tests.airflow_harness import run_dag, task_states, xcom
from tests.bindings.test_checks import seed_orders_and_others
from tests.connections import BROWSABLE, define

BIG_ORDERS = {"urns": ["urn:babel:orders:*"], "jsonpath": "$[?$.amount > 100]"}


@pytest.fixture
def queue_name() -> str:
    return f"filt-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=BROWSABLE)
def seeded(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, queue_name: str
           ) -> Iterator[tuple[str, dict[str, str]]]:
    """(connection id, the six dead letters' ``meta.id`` by name) on a fresh queue of a browsable broker."""
    conn_id = define(monkeypatch, request.param)
    hook = get_hook(conn_id)
    try:
        yield conn_id, seed_orders_and_others(hook.get_binding(), queue_name)
    finally:
        hook.close()


def test_the_sensor_counts_exactly_the_matching_dead_letters(seeded: tuple[str, dict[str, str]],
                                                              queue_name: str) -> None:
    conn_id, ids = seeded
    sensor = BabelQueueDeadLetterSensor(task_id="big_orders", babelqueue_conn_id=conn_id, queue_name=queue_name,
                                        min_count=2, deferrable=False, **BIG_ORDERS)
    try:
        value = sensor.poke({})
        assert value.is_done is True
        assert (value.xcom_value["depth"], value.xcom_value["matching"]) == (6, 2)
        assert [e["meta_id"] for e in value.xcom_value["sample"]] == [ids["big_order"], ids["big_refund"]]
        sensor.min_count = 3  # two matches do not end a wait for three
        assert sensor.poke({}).is_done is False
        sensor.min_count, sensor.reasons = 1, ["unknown_urn"]
        assert sensor.poke({}).xcom_value["matching"] == 1  # the refund is the only big order with that reason
    finally:
        sensor._close()


def test_rendered_filters_are_read_like_the_consume_operators(seeded: tuple[str, dict[str, str]],
                                                              queue_name: str) -> None:
    """Templated values arrive as text: a JSON list or comma-separated patterns, ``"None"`` for an unset param."""
    conn_id, _ = seeded
    sensor = BabelQueueDeadLetterSensor(task_id="s", babelqueue_conn_id=conn_id, queue_name=queue_name,
                                        deferrable=False, urns='["urn:babel:orders:*"]', jsonpath="None")
    try:
        assert sensor.poke({}).xcom_value["matching"] == 4
        sensor.urns, sensor.jsonpath = "urn:babel:billing:*, urn:babel:orders:refunded", "$[?$.amount > 100]"
        assert sensor.poke({}).xcom_value["matching"] == 2
    finally:
        sensor._close()


def test_the_trigger_event_carries_the_exact_counts(seeded: tuple[str, dict[str, str]], queue_name: str) -> None:
    conn_id, ids = seeded
    trigger = BabelQueueDeadLetterTrigger(queue_name=queue_name, babelqueue_conn_id=conn_id, poll_interval=0.1,
                                          **BIG_ORDERS)

    async def first_event() -> dict[str, Any]:
        events = trigger.run()
        event = await asyncio.wait_for(anext(events), timeout=20)
        await events.aclose()
        return event.payload

    payload = asyncio.run(first_event())
    assert payload["status"] == "success", payload
    assert (payload["depth"], payload["matching"], payload["new"]) == (6, 2, 6)
    assert [(e["meta_id"], e["urn"]) for e in payload["sample"]] == [
        (ids["big_order"], "urn:babel:orders:created"), (ids["big_refund"], "urn:babel:orders:refunded")]


def test_a_broker_that_cannot_browse_refuses_a_jsonpath_clearly(monkeypatch: pytest.MonkeyPatch,
                                                                 queue_name: str) -> None:
    conn_id = define(monkeypatch, "bq_rabbitmq")
    sensor = BabelQueueDeadLetterSensor(task_id="s", babelqueue_conn_id=conn_id, queue_name=queue_name,
                                        deferrable=False, jsonpath="$[?$.amount > 100]")
    try:
        with pytest.raises(NotSupportedError, match="by reason, URN or JSONPath needs a broker that can browse its "
                                                    "dead-letter queue without removing messages; the rabbitmq"):
            sensor.poke({})
    finally:
        sensor._close()


@pytest.mark.parametrize(("bad", "message"), [
    ({"jsonpath": "$[?amount"}, r"The JSONPath filter '\$\[\?amount' is not valid RFC 9535"),
    ({"jsonpath": "$.amount >"}, r"'\$\.amount >' is not valid RFC 9535"),
    ({"urns": 5}, "urns must be a list of strings"),
])
def test_an_invalid_filter_is_refused_when_the_dag_is_parsed(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BabelQueueDeadLetterSensor(task_id="s", queue_name="orders", **bad)


def test_a_templated_filter_is_checked_once_rendered() -> None:
    sensor = BabelQueueDeadLetterSensor(task_id="s", queue_name="orders", deferrable=False,
                                        jsonpath="{{ params.jsonpath }}", urns=["{{ params.family }}:*"])
    assert "jsonpath" in sensor.template_fields and "urns" in sensor.template_fields
    sensor.jsonpath = "$[?amount"  # what a bad param renders to: refused before the broker is asked
    with pytest.raises(ValueError, match="is not valid RFC 9535"):
        sensor.execute({})  # type: ignore[arg-type]


def test_the_depth_sensor_takes_no_filter() -> None:
    """Depth is the broker's unfiltered count; filtered reactions are the message trigger's (docs/sensors.md)."""
    with pytest.raises(TypeError):
        BabelQueueQueueDepthSensor(task_id="s", queue_name="orders", jsonpath="$.x")  # type: ignore[call-arg]


@pytest.mark.parametrize("conn_id", BROWSABLE)
def test_a_deferred_sensor_in_a_dag_fires_on_a_matching_dead_letter(conn_id: str, monkeypatch: pytest.MonkeyPatch,
                                                                      queue_name: str) -> None:
    """Only non-matching dead letters wait when the sensor starts, so it defers; a small order that arrives then
    does not fire the trigger, a big one does. The JSONPath is templated from the DAG's params."""
    define(monkeypatch, conn_id)
    hook = get_hook(conn_id)  # made here, before the run: see tests/sensors/test_sensors.py's later()
    binding = hook.get_binding()
    for urn, data in (("urn:babel:orders:created", {"amount": 50}), ("urn:babel:billing:charged", {"amount": 900})):
        binding.publish(bq.encode(bq.make_envelope(urn, data, queue_name=queue_name)), queue_name)
        binding.dead_letter(binding.reserve(queue_name, timeout=5), "failed")
    started = threading.Event()
    arrived: dict[str, str] = {}
    errors: list[BaseException] = []

    def arrive() -> None:
        try:
            assert started.wait(timeout=60), "the sensor never started"
            for name, amount in (("small", 70), ("big", 250)):
                time.sleep(1.0)
                envelope = bq.make_envelope("urn:babel:orders:created", {"amount": amount}, queue_name=queue_name)
                binding.publish(bq.encode(envelope), queue_name)
                message = binding.reserve(queue_name, timeout=5)
                binding.dead_letter(message, "failed")
                arrived[name] = message.meta_id
        except BaseException as exc:  # surfaced by the test: a silent producer would look like a sensor bug
            errors.append(exc)
        finally:
            hook.close()

    completed: list[dict[str, Any]] = []
    execute_complete = BabelQueueDeadLetterSensor.execute_complete

    def record(self: BabelQueueDeadLetterSensor, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        completed.append(event)
        return execute_complete(self, context, event)

    monkeypatch.setattr(BabelQueueDeadLetterSensor, "execute_complete", record)
    with DAG(f"bq_dlq_filter_{uuid.uuid4().hex[:6]}", schedule=None, start_date=datetime.datetime(2026, 1, 1),
             params={"min_amount": 100}) as dag:
        BabelQueueDeadLetterSensor(
            task_id="big_orders", babelqueue_conn_id=conn_id, queue_name=queue_name, urns=["urn:babel:orders:*"],
            jsonpath="$[?$.amount > {{ params.min_amount }}]", poke_interval=0.2, timeout=60, deferrable=True,
            on_execute_callback=lambda context: started.set(),
        )
    thread = threading.Thread(target=arrive, daemon=True)
    thread.start()
    run = run_dag(dag)
    thread.join(timeout=30)
    assert not errors, errors
    assert task_states(run) == {"big_orders": "success"}
    assert len(completed) == 1, "the sensor did not finish through its trigger"
    result = xcom(run, "big_orders")
    assert (result["depth"], result["matching"]) == (4, 1)
    assert [(e["meta_id"], e["urn"]) for e in result["sample"]] == [(arrived["big"], "urn:babel:orders:created")]
