"""``fire_on="new_fingerprint"``: the dead-letter trigger and sensor fire once per error fingerprint never reported
before, never for a repeat, and not again after a restart (the known fingerprints live on the broker), on the
brokers that can browse their DLQ (SQLite, PostgreSQL, Redis; Azure Service Bus with the fingerprints kept on a SQL
connection). RabbitMQ and SQS cannot browse: a clear error. Every DLQ depth read is sent as a gauge.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.core.fingerprint import error_fingerprint, error_pattern
from airflow_provider_babelqueue.core.idempotency import seen_many
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.observability import metrics
from airflow_provider_babelqueue.sensors import BabelQueueDeadLetterSensor, BabelQueueQueueDepthSensor
from airflow_provider_babelqueue.triggers import BabelQueueDeadLetterTrigger, BabelQueueDepthTrigger
from tests.airflow_harness import run_dag, task_states, xcom
from tests.connections import BROWSABLE, define

TIMEOUT = "App\\Exceptions\\GatewayTimeout"
REFUSED = "psycopg2.OperationalError"
DISK = "OSError"


def kind(exception: str, error: str) -> str:
    """The fingerprint the triage job writes for this exception and error text."""
    return error_fingerprint(exception, error_pattern(error))


def dead_letter(binding: Binding, queue: str, error: str, exception: str, reason: str = "failed") -> str:
    binding.publish(bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": 1}, queue_name=queue)), queue)
    message = binding.reserve(queue, timeout=2)
    assert message is not None
    binding.dead_letter(message, reason, error=error, exception=exception)
    return message.meta_id


def rebuild(trigger: BabelQueueDeadLetterTrigger) -> BabelQueueDeadLetterTrigger:
    """What the triggerer does after a restart: a new instance from the stored (JSON) kwargs."""
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    kwargs = json.loads(json.dumps(kwargs))
    return getattr(importlib.import_module(module), name)(**kwargs)  # type: ignore[no-any-return]


async def quiet(events: AsyncIterator[Any], seconds: float) -> asyncio.Future[Any]:
    """Ask for the next event and check none comes within ``seconds``; returns the pending request."""
    waiting = asyncio.ensure_future(anext(events))
    await asyncio.sleep(seconds)
    assert not waiting.done(), f"an event fired: {waiting.result().payload}"
    return waiting


async def stop(events: AsyncIterator[Any], waiting: asyncio.Future[Any] | None = None) -> None:
    if waiting is not None:
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
    await events.aclose()  # type: ignore[attr-defined]


@pytest.fixture(params=BROWSABLE)
def broker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Binding, str]]:
    """(connection id, a binding on it, a fresh queue) for each broker that can browse its DLQ."""
    conn_id = define(monkeypatch, request.param)
    hook = get_hook(conn_id)
    try:
        yield conn_id, hook.get_binding(), f"fp-{uuid.uuid4().hex[:8]}"
    finally:
        hook.close()


def test_the_trigger_fires_once_per_new_fingerprint_and_not_again_after_a_restart(
        broker: tuple[str, Binding, str]) -> None:
    conn_id, binding, queue = broker
    first_id = dead_letter(binding, queue, "timeout after 30s for order 1042", TIMEOUT)
    dead_letter(binding, queue, "timeout after 45s for order 77", TIMEOUT)  # the same kind
    trigger = BabelQueueDeadLetterTrigger(queue_name=queue, babelqueue_conn_id=conn_id, fire_on="new_fingerprint",
                                          poll_interval=0.1, sample_size=10)

    async def first_run() -> tuple[dict[str, Any], dict[str, Any], str]:
        events = trigger.run()
        first = await asyncio.wait_for(anext(events), timeout=20)
        waiting = await quiet(events, 0.8)
        await asyncio.to_thread(dead_letter, binding, queue, "timeout after 5s for order 9", TIMEOUT)  # a repeat
        await asyncio.sleep(0.8)
        assert not waiting.done(), "a known fingerprint fired again"
        new_id = await asyncio.to_thread(dead_letter, binding, queue, "connection to db-7:5432 refused", REFUSED)
        second = await asyncio.wait_for(waiting, timeout=20)
        # as the triggerer does, ask for the next event: the trigger remembers what it reported once it is out
        await stop(events, await quiet(events, 0.5))
        return first.payload, second.payload, new_id

    async def after_restart() -> dict[str, Any]:
        events = rebuild(trigger).run()
        waiting = await quiet(events, 1.0)  # both known kinds are still in the DLQ: nothing fires
        await asyncio.to_thread(dead_letter, binding, queue, "disk full on /var/7", DISK)
        third = await asyncio.wait_for(waiting, timeout=20)
        await stop(events, await quiet(events, 0.5))
        return third.payload

    first, second, refused_id = asyncio.run(first_run())
    timeout_kind = kind(TIMEOUT, "timeout after 30s for order 1042")
    assert first == {
        "status": "success", "queue_name": queue, "babelqueue_conn_id": conn_id, "fire_on": "new_fingerprint",
        "depth": 2, "browsed": 2, "matching": 2, "new": 2, "new_fingerprint_count": 1, "known_fingerprints": 0,
        "new_fingerprints": [{"fingerprint": timeout_kind, "count": 2, "sample": {
            "meta_id": first_id, "urn": "urn:babel:orders:created", "reason": "failed",
            "exception_type": "GatewayTimeout", "error_pattern": "timeout after <n>s for order <n>"}}],
        "sample": [{"meta_id": first_id, "urn": "urn:babel:orders:created", "reason": "failed",
                    "exception_type": "GatewayTimeout", "error_pattern": "timeout after <n>s for order <n>"}],
    }
    refused_kind = kind(REFUSED, "connection to db-7:5432 refused")
    assert [(f["fingerprint"], f["count"], f["sample"]["meta_id"]) for f in second["new_fingerprints"]] == [
        (refused_kind, 1, refused_id)]
    assert (second["depth"], second["new"], second["known_fingerprints"]) == (4, 1, 1)
    assert second["new_fingerprints"][0]["sample"]["error_pattern"] == "connection to db-<n>:<n> refused"

    third = asyncio.run(after_restart())
    disk_kind = kind(DISK, "disk full on /var/7")
    assert [f["fingerprint"] for f in third["new_fingerprints"]] == [disk_kind]
    assert (third["depth"], third["known_fingerprints"]) == (5, 2)
    # kept on the broker, under the default name
    store = binding.seen_store(f"dlq-fingerprints:{queue}")
    assert seen_many(store, [timeout_kind, refused_kind, disk_kind, "0" * 16]) == {timeout_kind, refused_kind,
                                                                                   disk_kind}


def test_a_trigger_stopped_right_after_its_event_reports_it_again(broker: tuple[str, Binding, str]) -> None:
    """At least once: the fingerprints are remembered once the event is out (when the trigger is asked for the
    next one), so a trigger stopped before that fires again after a restart rather than lose the alert."""
    conn_id, binding, queue = broker
    dead_letter(binding, queue, "timeout after 30s", TIMEOUT)
    trigger = BabelQueueDeadLetterTrigger(queue_name=queue, babelqueue_conn_id=conn_id, fire_on="new_fingerprint",
                                          poll_interval=0.1)
    first = asyncio.run(asyncio.wait_for(_first_or_none(trigger, 1.0), timeout=30))
    assert first is not None
    again = asyncio.run(asyncio.wait_for(_first_or_none(rebuild(trigger), 1.0), timeout=30))
    assert again is not None and again["new_fingerprints"] == first["new_fingerprints"]


def test_min_count_filters_and_since_start(broker: tuple[str, Binding, str]) -> None:
    """A new kind fires once it has ``min_count`` dead letters; filters narrow what counts; ``since_start`` learns
    the kinds already there without an event."""
    conn_id, binding, queue = broker
    dead_letter(binding, queue, "old failure 1", "Old")
    trigger = BabelQueueDeadLetterTrigger(queue_name=queue, babelqueue_conn_id=conn_id, fire_on="new_fingerprint",
                                          poll_interval=0.1, min_count=2, since_start=True, reasons=["failed"],
                                          fingerprint_store=f"alerts-{queue}")

    async def scenario() -> dict[str, Any]:
        events = trigger.run()
        waiting = await quiet(events, 0.6)  # the old kind is learnt, not reported
        await asyncio.to_thread(dead_letter, binding, queue, "old failure 2", "Old")
        await asyncio.to_thread(dead_letter, binding, queue, "quota 1 exceeded", "Quota")
        await asyncio.to_thread(dead_letter, binding, queue, "quota 2 exceeded", "Quota", "unknown_urn")  # filtered
        await asyncio.sleep(0.6)
        assert not waiting.done(), "fired below min_count"
        await asyncio.to_thread(dead_letter, binding, queue, "quota 3 exceeded", "Quota")
        event = await asyncio.wait_for(waiting, timeout=20)
        await stop(events)
        return event.payload

    payload = asyncio.run(scenario())
    assert [(f["fingerprint"], f["count"]) for f in payload["new_fingerprints"]] == [
        (kind("Quota", "quota 1 exceeded"), 2)]
    assert (payload["depth"], payload["matching"], payload["known_fingerprints"]) == (5, 4, 1)
    old = kind("Old", "old failure 9")
    assert seen_many(binding.seen_store(f"alerts-{queue}"), [old]) == {old}


def test_the_sensor_pokes_remember_what_they_report(broker: tuple[str, Binding, str]) -> None:
    conn_id, binding, queue = broker
    sensor = BabelQueueDeadLetterSensor(task_id="new_kinds", babelqueue_conn_id=conn_id, queue_name=queue,
                                        fire_on="new_fingerprint", deferrable=False)
    try:
        assert sensor.poke({}).is_done is False  # an empty DLQ
        meta_id = dead_letter(binding, queue, "timeout after 30s", TIMEOUT)
        value = sensor.poke({})
        assert value.is_done is True
        assert value.xcom_value["new_fingerprints"][0]["fingerprint"] == kind(TIMEOUT, "timeout after 1s")
        assert value.xcom_value["sample"][0]["meta_id"] == meta_id
        assert value.xcom_value["fire_on"] == "new_fingerprint"
        dead_letter(binding, queue, "timeout after 31s", TIMEOUT)
        assert sensor.poke({}).is_done is False  # reported by the poke before
        again = BabelQueueDeadLetterSensor(task_id="later_run", babelqueue_conn_id=conn_id, queue_name=queue,
                                           fire_on="new_fingerprint", deferrable=False)
        assert again.poke({}).is_done is False  # a later run: known on the broker
        again._close()
        learner = BabelQueueDeadLetterSensor(task_id="learner", babelqueue_conn_id=conn_id, queue_name=queue,
                                             fire_on="new_fingerprint", new_only=True, deferrable=False,
                                             fingerprint_store=f"other-{queue}")
        assert learner.poke({}).is_done is False  # new_only: the first poke learns the timeouts
        dead_letter(binding, queue, "disk full", DISK)
        assert [f["fingerprint"] for f in learner.poke({}).xcom_value["new_fingerprints"]] == [kind(DISK, "disk full")]
        learner._close()
    finally:
        sensor._close()


@pytest.mark.parametrize("conn_id", ["babelqueue_default", "bq_redis"])
def test_a_deferred_sensor_in_a_dag_reports_only_the_new_kind(conn_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    define(monkeypatch, conn_id)
    queue = f"fp-dag-{uuid.uuid4().hex[:8]}"
    hook = get_hook(conn_id)
    binding = hook.get_binding()
    dead_letter(binding, queue, "timeout after 30s", TIMEOUT)
    known = BabelQueueDeadLetterSensor(task_id="earlier", babelqueue_conn_id=conn_id, queue_name=queue,
                                       fire_on="new_fingerprint", deferrable=False)
    assert known.poke({}).is_done is True  # an earlier run reported the timeouts
    known._close()
    started, errors = threading.Event(), []

    def later() -> None:
        try:
            assert started.wait(timeout=60)
            time.sleep(1.5)
            dead_letter(binding, queue, "timeout after 99s", TIMEOUT)  # a repeat: must not end the wait
            time.sleep(1.0)
            dead_letter(binding, queue, "connection to db-7 refused", REFUSED)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            hook.close()

    with DAG(f"bq_fp_{uuid.uuid4().hex[:6]}", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
        BabelQueueDeadLetterSensor(task_id="new_kinds", babelqueue_conn_id=conn_id, queue_name=queue,
                                   fire_on="new_fingerprint", deferrable=True, poke_interval=0.5, timeout=60,
                                   on_execute_callback=lambda context: started.set())
    thread = threading.Thread(target=later, daemon=True)
    thread.start()
    run = run_dag(dag)
    thread.join(timeout=30)
    assert not errors, errors
    assert task_states(run) == {"new_kinds": "success"}
    result = xcom(run, "new_kinds")
    assert [f["fingerprint"] for f in result["new_fingerprints"]] == [kind(REFUSED, "connection to db-1 refused")]
    # the depth is read after the DLQ is browsed: the refusal found new is counted in it
    assert (result["depth"], result["known_fingerprints"]) == (3, 1)
    # dag.test() keeps the inline trigger's first event only: the sensor remembered the new kind itself
    later_run = BabelQueueDeadLetterSensor(task_id="later_run", babelqueue_conn_id=conn_id, queue_name=queue,
                                           fire_on="new_fingerprint", deferrable=False)
    assert later_run.poke({}).is_done is False
    later_run._close()


def test_azure_service_bus_keeps_its_fingerprints_on_another_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Service Bus can peek its DLQ but holds no seen-set: the fingerprints go to a SQL connection."""
    from tests.bindings.asb_double import shared_double

    double = shared_double()
    monkeypatch.setenv("AIRFLOW_CONN_BQ_FP_ASB", json.dumps({
        "conn_type": "babelqueue+servicebus", "password": double.connection_string,
        "extra": {"connection_verify": double.ca_file, "create_queues": True}}))
    queue = f"fp-asb-{uuid.uuid4().hex[:8]}"
    hook = get_hook("bq_fp_asb")
    binding = hook.get_binding()
    try:
        dead_letter(binding, queue, "timeout after 30s", TIMEOUT)
        alone = BabelQueueDeadLetterTrigger(queue_name=queue, babelqueue_conn_id="bq_fp_asb", poll_interval=0.1,
                                            fire_on="new_fingerprint")
        error = asyncio.run(asyncio.wait_for(anext(alone.run()), timeout=30)).payload
        assert error["status"] == "error" and "pass fingerprint_conn_id" in error["message"]
        kept = BabelQueueDeadLetterTrigger(queue_name=queue, babelqueue_conn_id="bq_fp_asb", poll_interval=0.1,
                                           fire_on="new_fingerprint", fingerprint_conn_id="babelqueue_default")

        async def scenario() -> dict[str, Any]:
            events = kept.run()
            event = await asyncio.wait_for(anext(events), timeout=30)
            waiting = await quiet(events, 1.0)
            await stop(events, waiting)
            return event.payload

        payload = asyncio.run(scenario())
        assert [f["fingerprint"] for f in payload["new_fingerprints"]] == [kind(TIMEOUT, "timeout after 1s")]
        sql = get_hook("babelqueue_default")
        assert seen_many(sql.get_binding().seen_store(f"dlq-fingerprints:{queue}"), [kind(TIMEOUT, "timeout after 2s")])
        sql.close()
        restarted = asyncio.run(asyncio.wait_for(_first_or_none(rebuild(kept), 1.0), timeout=30))
        assert restarted is None
    finally:
        hook.close()


async def _first_or_none(trigger: BabelQueueDeadLetterTrigger, seconds: float) -> dict[str, Any] | None:
    events = trigger.run()
    waiting = asyncio.ensure_future(anext(events))
    await asyncio.sleep(seconds)
    payload = waiting.result().payload if waiting.done() else None
    await stop(events, None if waiting.done() else waiting)
    return payload


@pytest.mark.parametrize("conn_id", ["bq_rabbitmq", "bq_sqs"])
def test_brokers_that_cannot_browse_say_so(conn_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    define(monkeypatch, conn_id)
    trigger = BabelQueueDeadLetterTrigger(queue_name=f"fp-{uuid.uuid4().hex[:8]}", babelqueue_conn_id=conn_id,
                                          fire_on="new_fingerprint", poll_interval=0.1)
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), timeout=60)).payload
    assert event["status"] == "error"
    assert "NotSupportedError" in event["message"] and "without removing messages" in event["message"]


def test_arguments_and_serialization() -> None:
    arrival = BabelQueueDeadLetterTrigger(queue_name="orders", babelqueue_conn_id="c")
    # an arrival trigger serializes exactly as before: an AssetWatcher's trigger keeps its identity
    assert set(arrival.serialize()[1]) == {"queue_name", "babelqueue_conn_id", "min_count", "baseline", "since_start",
                                           "reasons", "urns", "jsonpath", "sample_size", "poll_interval"}
    new = BabelQueueDeadLetterTrigger(queue_name="orders", babelqueue_conn_id="c", fire_on="new_fingerprint",
                                      fingerprint_conn_id="store", fingerprint_store="alerts")
    assert rebuild(new).serialize() == new.serialize()
    assert {k: new.serialize()[1][k] for k in ("fire_on", "fingerprint_conn_id", "fingerprint_store")} == {
        "fire_on": "new_fingerprint", "fingerprint_conn_id": "store", "fingerprint_store": "alerts"}
    with pytest.raises(ValueError, match="fire_on must be one of"):
        BabelQueueDeadLetterTrigger(queue_name="q", fire_on="always")
    with pytest.raises(ValueError, match="does not use it"):
        BabelQueueDeadLetterTrigger(queue_name="q", fire_on="new_fingerprint", baseline=3)
    with pytest.raises(ValueError, match="fire_on must be one of"):
        BabelQueueDeadLetterSensor(task_id="s", queue_name="q", fire_on="sometimes")
    with pytest.raises(ValueError, match="every poke is a first one"):
        BabelQueueDeadLetterSensor(task_id="s", queue_name="q", fire_on="new_fingerprint", new_only=True,
                                   mode="reschedule", deferrable=False)
    # without new_only, reschedule mode works: the known fingerprints live on the broker, not in the sensor
    BabelQueueDeadLetterSensor(task_id="s", queue_name="q", fire_on="new_fingerprint", mode="reschedule",
                               deferrable=False)


def test_every_dlq_depth_read_is_a_gauge(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, float, dict[str, Any]]] = []
    monkeypatch.setattr(metrics, "gauge", lambda name, value, **tags: sent.append((name, value, tags)))
    queue = f"fp.gauge-{uuid.uuid4().hex[:6]}"
    hook = get_hook()
    binding = hook.get_binding()
    try:
        dead_letter(binding, queue, "boom 1", "E")
        expected = (f"dlq_depth.babelqueue_default.{queue.replace('.', '_')}", 1,
                    {"conn_id": "babelqueue_default", "queue_name": queue})
        sensors = [
            BabelQueueDeadLetterSensor(task_id="a", queue_name=queue, deferrable=False),
            BabelQueueDeadLetterSensor(task_id="b", queue_name=queue, deferrable=False, new_only=True),
            BabelQueueDeadLetterSensor(task_id="c", queue_name=queue, deferrable=False, fire_on="new_fingerprint"),
            BabelQueueQueueDepthSensor(task_id="d", queue_name=queue, which="dead_letter", deferrable=False),
        ]
        for sensor in sensors:
            sent.clear()
            sensor.poke({})
            sensor._close()
            assert sent and all(item == expected for item in sent), (sensor.task_id, sent)
        sent.clear()
        BabelQueueQueueDepthSensor(task_id="e", queue_name=queue, deferrable=False).poke({})  # the ready queue
        assert sent == []
        for trigger in (BabelQueueDeadLetterTrigger(queue_name=queue, poll_interval=0.1),
                        BabelQueueDeadLetterTrigger(queue_name=queue, poll_interval=0.1, fire_on="new_fingerprint",
                                                    fingerprint_store=f"g-{queue}"),
                        BabelQueueDepthTrigger(queue_name=queue, which="dead_letter", poll_interval=0.1)):
            sent.clear()
            asyncio.run(asyncio.wait_for(anext(trigger.run()), timeout=20))
            assert sent and all(item == expected for item in sent), (trigger, sent)
    finally:
        hook.close()


def test_a_failing_metrics_client_never_fails_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("statsd is down")

    monkeypatch.setattr(metrics, "gauge", broken)
    sensor = BabelQueueDeadLetterSensor(task_id="a", queue_name=f"fp-{uuid.uuid4().hex[:6]}", deferrable=False)
    try:
        assert sensor.poke({}).is_done is False
    finally:
        sensor._close()
