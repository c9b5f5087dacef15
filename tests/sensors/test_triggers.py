"""Triggers: serialization round trips, events, a responsive event loop, continuous arrival events."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import time
import uuid

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.triggers import (
    BabelQueueDeadLetterTrigger,
    BabelQueueDepthTrigger,
    BabelQueueMessageTrigger,
)

REDIS = {"conn_type": "babelqueue_redis", "host": "127.0.0.1", "port": 6379, "extra": {"key_prefix": "bqtrig:"}}


@pytest.fixture
def redis_conn(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_BQ_TRIG", json.dumps(REDIS))
    return "bq_trig"


def rebuild(trigger: object) -> object:
    path, kwargs = trigger.serialize()  # type: ignore[attr-defined]
    module, _, name = path.rpartition(".")
    json.dumps(kwargs)  # what the triggerer stores must be JSON
    return getattr(importlib.import_module(module), name)(**kwargs)


def test_depth_trigger_round_trip() -> None:
    trigger = BabelQueueDepthTrigger(
        queue_name="orders",
        babelqueue_conn_id="c",
        which="dead_letter",
        comparison="<",
        threshold=4,
        consecutive=3,
        observation_interval=0.5,
        poll_interval=7,
    )
    assert rebuild(trigger).serialize() == trigger.serialize()
    assert trigger.serialize()[0] == "airflow_provider_babelqueue.triggers.queue.BabelQueueDepthTrigger"


def test_dead_letter_trigger_round_trip() -> None:
    trigger = BabelQueueDeadLetterTrigger(
        queue_name="orders",
        babelqueue_conn_id="c",
        min_count=2,
        baseline=5,
        since_start=False,
        reasons=["failed"],
        urns=["urn:babel:orders:*", "urn:babel:billing:charged"],
        jsonpath="$[?$.amount > 100]",
        sample_size=3,
        poll_interval=9,
    )
    again = rebuild(trigger)
    assert again.serialize() == trigger.serialize()
    kwargs = trigger.serialize()[1]
    assert (kwargs["urns"], kwargs["jsonpath"]) == (["urn:babel:orders:*", "urn:babel:billing:charged"],
                                                    "$[?$.amount > 100]")
    assert again.jsonpath == "$[?$.amount > 100]"  # type: ignore[attr-defined]


def test_dead_letter_trigger_serialised_before_jsonpath_still_deserializes() -> None:
    """A trigger row written by the previous release (no ``jsonpath`` key) must load in the upgraded triggerer."""
    old_kwargs = {"queue_name": "orders", "babelqueue_conn_id": "c", "min_count": 1, "baseline": 2,
                  "since_start": False, "reasons": ["failed"], "urns": ["urn:babel:orders:created"],
                  "sample_size": 5, "poll_interval": 30.0}
    trigger = BabelQueueDeadLetterTrigger(**old_kwargs)  # type: ignore[arg-type]
    assert trigger.serialize()[1] == old_kwargs | {"jsonpath": None}
    assert trigger.urns == ["urn:babel:orders:created"]


@pytest.mark.parametrize(("bad", "message"), [
    ({"jsonpath": "$[?amount"}, r"The JSONPath filter '\$\[\?amount' is not valid RFC 9535"),
    ({"jsonpath": "$.items[?@.qty >"}, r"'\$\.items\[\?@\.qty >' is not valid RFC 9535"),
    ({"jsonpath": " "}, "A JSONPath filter must be a non-empty string"),
    ({"urns": [""]}, "A URN filter must be a non-empty string pattern"),
])
def test_dead_letter_trigger_refuses_bad_filters_when_the_dag_is_parsed(bad: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BabelQueueDeadLetterTrigger(queue_name="orders", **bad)  # type: ignore[arg-type]


def test_bad_trigger_arguments() -> None:
    with pytest.raises(ValueError, match="comparison must be one of"):
        BabelQueueDepthTrigger(queue_name="q", comparison="~")
    with pytest.raises(ValueError, match="min_count must be at least 1"):
        BabelQueueDeadLetterTrigger(queue_name="q", min_count=0)


def test_depth_trigger_fires_without_blocking_the_event_loop(redis_conn: str) -> None:
    queue = f"trig-{uuid.uuid4().hex[:8]}"
    hook = get_hook(redis_conn)
    binding = hook.get_binding()
    trigger = BabelQueueDepthTrigger(queue_name=queue, babelqueue_conn_id=redis_conn, threshold=2, poll_interval=0.1)

    async def scenario() -> tuple[dict, float]:
        gaps: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not stop.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        async def producer() -> None:
            await asyncio.sleep(0.5)
            for i in range(2):
                await asyncio.to_thread(binding.publish, bq.encode(bq.make_envelope("urn:x", {"i": i})), queue)

        tick = asyncio.create_task(ticker())
        asyncio.create_task(producer())
        event = await asyncio.wait_for(anext(trigger.run()), timeout=20)
        stop.set()
        await tick
        return event.payload, max(gaps)

    try:
        payload, worst_gap = asyncio.run(scenario())
    finally:
        hook.close()
    assert payload == {"status": "success", "depth": 2, "queue_name": queue}
    assert worst_gap < 0.5  # broker calls ran off the loop


def test_dead_letter_trigger_reports_each_arrival_after_start(redis_conn: str) -> None:
    queue = f"trig-{uuid.uuid4().hex[:8]}"
    hook = get_hook(redis_conn)
    binding = hook.get_binding()

    def dead_letter(reason: str) -> str:
        binding.publish(bq.encode(bq.make_envelope("urn:babel:orders:created", {}, queue_name=queue)), queue)
        message = binding.reserve(queue, timeout=1)
        binding.dead_letter(message, reason)
        return message.meta_id

    old = dead_letter("failed")  # a backlog that must not fire an event with since_start=True
    trigger = BabelQueueDeadLetterTrigger(
        queue_name=queue, babelqueue_conn_id=redis_conn, poll_interval=0.1, sample_size=10, since_start=True
    )

    async def scenario() -> list[dict]:
        events = trigger.run()
        waiting = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        first_id = await asyncio.to_thread(dead_letter, "unknown_urn")
        first = await asyncio.wait_for(waiting, timeout=10)
        second_id = await asyncio.to_thread(dead_letter, "poison")
        second = await asyncio.wait_for(anext(events), timeout=10)
        await events.aclose()
        return [first.payload | {"id": first_id}, second.payload | {"id": second_id}]

    try:
        first, second = asyncio.run(scenario())
    finally:
        hook.close()
    assert (first["status"], first["new"], first["depth"]) == ("success", 1, 2)
    assert [e["meta_id"] for e in first["sample"]] == [old, first["id"]]
    assert (second["new"], second["depth"]) == (1, 3)
    assert first["queue_name"] == queue and first["babelqueue_conn_id"] == redis_conn


def test_dead_letter_trigger_fires_for_a_waiting_backlog_by_default(redis_conn: str) -> None:
    """The default watches the level, not only arrivals: what waits when the watcher starts fires at once, the
    same dead letters do not fire again while it runs, and a restarted trigger fires once more for them."""
    queue = f"trig-{uuid.uuid4().hex[:8]}"
    hook = get_hook(redis_conn)
    binding = hook.get_binding()
    for _ in range(2):
        binding.publish(bq.encode(bq.make_envelope("urn:babel:orders:created", {}, queue_name=queue)), queue)
        binding.dead_letter(binding.reserve(queue, timeout=1), "failed")

    async def first_event_then_quiet() -> tuple[dict, bool]:
        events = BabelQueueDeadLetterTrigger(queue_name=queue, babelqueue_conn_id=redis_conn, poll_interval=0.1).run()
        first = await asyncio.wait_for(anext(events), timeout=10)
        again = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.6)  # six more polls of an unchanged DLQ
        quiet = not again.done()
        again.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await again
        await events.aclose()
        return first.payload, quiet

    try:
        first, quiet = asyncio.run(first_event_then_quiet())
        restarted, _ = asyncio.run(first_event_then_quiet())
    finally:
        hook.close()
    assert (first["status"], first["new"], first["depth"]) == ("success", 2, 2)
    assert quiet, "the same backlog fired twice within one trigger's run"
    assert (restarted["new"], restarted["depth"]) == (2, 2)


def test_trigger_errors_become_error_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_BQ_DOWN", json.dumps({"conn_type": "babelqueue_redis", "port": 1}))
    trigger = BabelQueueDepthTrigger(queue_name="q", babelqueue_conn_id="bq_down", poll_interval=0.1)
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), timeout=30))
    assert event.payload["status"] == "error" and "127.0.0.1:1" in event.payload["message"]


def test_message_trigger_round_trip_and_key() -> None:
    trigger = BabelQueueMessageTrigger(queue_name="orders", babelqueue_conn_id="c", urns="urn:babel:orders:*",
                                       jsonpath="$[?$.amount > 100]", batch_size=5, max_event_bytes=4096,
                                       reserve_timeout=2, unmatched_delay=1, max_pending=50)
    again = rebuild(trigger)
    assert again.serialize() == trigger.serialize()
    assert trigger.serialize()[1]["urns"] == ["urn:babel:orders:*"]
    assert again.shared_stream_key() == trigger.shared_stream_key()  # one reader for equal triggers
    other = BabelQueueMessageTrigger(queue_name="orders", babelqueue_conn_id="c", urns="urn:babel:orders:*")
    assert other.shared_stream_key() != trigger.shared_stream_key()  # another filter or shape: its own reader


@pytest.mark.parametrize("bad", [{"jsonpath": "$.[["}, {"batch_size": 0}, {"max_event_bytes": True},
                                 {"batch_size": 10, "max_pending": 5}, {"urns": [""]}])
def test_message_trigger_refuses_bad_arguments_when_the_dag_is_parsed(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        BabelQueueMessageTrigger(queue_name="orders", **bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("scheme", ["babelqueue+sql", "babelqueue+redis", "babelqueue+rabbitmq", "babelqueue+sqs",
                                    "babelqueue+azure-service-bus", "babelqueue+pulsar"])
def test_schemes_mean_messages(scheme: str) -> None:
    """``MessageQueueTrigger(scheme="babelqueue+...")`` reads live messages, as the official schemes do."""
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    trigger = MessageQueueTrigger(scheme=scheme, babelqueue_conn_id="c", queue_name="orders", urns=["urn:x:*"])
    path, kwargs = trigger.serialize()
    assert path == "airflow_provider_babelqueue.triggers.messages.BabelQueueMessageTrigger"
    assert (kwargs["queue_name"], kwargs["babelqueue_conn_id"], kwargs["urns"]) == ("orders", "c", ["urn:x:*"])
