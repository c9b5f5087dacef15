"""The message trigger on every binding (see conftest.BINDINGS), driven the way the triggerer drives it.

Airflow's own ``SharedStreamManager`` runs the trigger's producer here, and the test plays the triggerer's part
around it: it takes each event off the trigger, binds it (``bind_pending_event``) and, when the event counts as
stored, confirms it (``confirm_persisted``), exactly the calls ``TriggerRunner`` makes. Nothing of the broker is
faked: the bindings are the real ones against the real servers (SQS on moto, Service Bus on the AMQP double, Pulsar
on its fake client). The connection lookup is the one seam: ``get_hook`` is replaced by a hook that returns a
binding from the suite's factory, since these brokers' configurations (a moto endpoint, the double's CA file, the
fake Pulsar client) are made per test; the hooks' own connection handling is tested in tests/hooks and end to end
in tests/sensors/test_e2e_message_trigger.py.

What must hold: a message makes an event once its event is stored, and only then is it settled; an event that is
never stored (the triggerer died first, or the ack timeout passed) leaves its message on the broker, which hands it
out again; a message the filter does not take is handed back with its bytes, never acked or dead-lettered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.triggers.shared_stream import SharedStreamManager

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.core.errors import NotSupportedError
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.triggers import thread as trigger_thread
from airflow_provider_babelqueue.triggers.messages import BabelQueueMessageTrigger, event_entries, held_receipts
from tests.bindings.conftest import Factory

URN = "urn:babel:orders:created"
OTHER = "urn:babel:invoices:paid"
#: Where a reservation lives on the connection: closing it (the triggerer dying) gives it back at once.
HELD_BY_CONNECTION = {"rabbitmq", "pulsar"}
#: Service Bus's smallest lock duration (5 s) rather than the 1 s used elsewhere: a hand-back there sends a copy
#: and then completes the original, and opening the sender's link on first use can take most of a second.
LOCK_SECONDS = {"azure-service-bus": 5.0}
#: Brokers that count every receive: a message handed back is received again with the broker's count up by one.
COUNTS_RECEIVES = {"sqs"}


class _Hook:
    """What ``get_hook`` returns to the trigger's broker thread: one real binding, closed with the hook."""

    def __init__(self, binding: Binding) -> None:
        self.binding = binding

    def get_binding(self) -> Binding:
        return self.binding

    def close(self) -> None:
        self.binding.close()


def twin(binding: Binding) -> Binding:
    """A second binding with the same configuration: what a triggerer builds from the same connection."""
    if binding.name == "pulsar":  # the fake broker's client stands in for pulsar.Client
        return type(binding)(binding.config, client_factory=binding._factory)  # type: ignore[call-arg,attr-defined]
    return type(binding)(binding.config)  # type: ignore[call-arg]


@pytest.fixture
def hooks(make_binding: Factory, monkeypatch: pytest.MonkeyPatch) -> Callable[[], Binding]:
    """The test's binding (with the short visibility timeout the "comes back" checks need, where a reservation
    does not live on the connection); the trigger's connection resolves to a twin of it."""

    def fresh() -> Binding:
        probe = make_binding()
        if probe.name == "memory":
            pytest.skip("the in-memory binding's store is the binding itself: a twin would be another queue")
        if probe.name in HELD_BY_CONNECTION:
            return probe
        return make_binding(visibility_timeout=LOCK_SECONDS.get(probe.name, 1.0))

    made: list[Binding] = []

    def first() -> Binding:
        if not made:
            made.append(fresh())
        return made[0]

    monkeypatch.setattr(trigger_thread, "get_hook", lambda conn_id: _Hook(twin(first())))
    return first


def envelope_bodies(queue_name: str, urns: list[str]) -> list[bytes]:
    return [bq.encode(bq.make_envelope(urn, {"n": n, "amount": 10 * n}, queue_name=queue_name))
            for n, urn in enumerate(urns)]


def meta_ids(events: list[dict[str, Any]]) -> list[str]:
    return [entry["meta_id"] for event in events for entry in event["messages"]]


async def run_trigger(trigger: BabelQueueMessageTrigger, count: int, *, store: bool = True, within: float = 30.0,
                      ack_timeout: float = 300.0) -> list[dict[str, Any]]:
    """Take ``count`` messages' worth of events as the triggerer does; ``store``: confirm each as stored."""
    manager = SharedStreamManager(ack_timeout=ack_timeout)
    key = trigger.shared_stream_key()
    events: list[dict[str, Any]] = []
    stream = trigger.filter_shared_stream(manager.subscribe(trigger_id=1, trigger=trigger, key=key))

    async def take() -> None:
        async for event in stream:
            seq = manager.bind_pending_event(trigger_id=1, key=key)
            assert seq is not None, "ack mode: every event is bound to its messages"
            events.append(event.payload)
            if store:
                manager.confirm_persisted([seq])
            if sum(e["count"] for e in events) >= count:
                return

    try:
        await asyncio.wait_for(take(), within)
    finally:
        await manager.unsubscribe(1, key)
        await stream.aclose()  # type: ignore[attr-defined]
    return events


def drain(binding: Binding, queue_name: str, within: float = 20.0) -> list[ReceivedMessage]:
    """Everything the queue hands out until it stays empty for longer than its visibility timeout (acked)."""
    quiet = LOCK_SECONDS.get(binding.name, 1.0) + 0.5
    got: list[ReceivedMessage] = []
    deadline, last = time.monotonic() + within, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - last < quiet:
        batch = binding.reserve_many(queue_name, 50, timeout=0.3)
        if batch:
            binding.ack_many(batch)
            got += batch
            last = time.monotonic()
    return got


def trigger_for(queue_name: str, **options: Any) -> BabelQueueMessageTrigger:
    """A trigger whose held reservations run out after 1 s, as the bindings' visibility timeout here does (the
    default, 600 s, outlasts the triggerer's ack timeout; these tests play a triggerer that dies)."""
    options.setdefault("reservation_timeout", 1.0)
    return BabelQueueMessageTrigger(queue_name=queue_name, babelqueue_conn_id="bq_test", reserve_timeout=0.3,
                                    **options)


def test_each_message_makes_one_event_and_is_settled_once_stored(hooks: Callable[[], Binding],
                                                                   queue_name: str) -> None:
    binding = hooks()
    bodies = envelope_bodies(queue_name, [URN] * 5)
    binding.publish_batch(bodies, queue_name)
    events = asyncio.run(run_trigger(trigger_for(queue_name), 5))
    published = [bq.meta_id_of(bq.decode(body)) for body in bodies]
    assert meta_ids(events) == published  # one event each, in publish order
    assert [e["count"] for e in events] == [1] * 5
    assert events[0]["messages"][0]["envelope"] == bq.decode(bodies[0])
    assert {e["queue_name"] for e in events} == {queue_name}
    assert drain(binding, queue_name) == []  # settled, and nothing comes back after the visibility timeout
    assert binding.dead_letter_depth(queue_name) == 0


def test_events_never_stored_leave_their_messages_on_the_broker(hooks: Callable[[], Binding],
                                                                 queue_name: str) -> None:
    binding = hooks()
    bodies = envelope_bodies(queue_name, [URN] * 3)
    binding.publish_batch(bodies, queue_name)
    events = asyncio.run(run_trigger(trigger_for(queue_name), 3, store=False))
    assert sorted(meta_ids(events)) == sorted(bq.meta_id_of(bq.decode(b)) for b in bodies)
    # the triggerer went away before storing them: every message is handed out again, bytes unchanged
    assert sorted(m.body for m in drain(binding, queue_name)) == sorted(bodies)


def test_an_event_not_stored_within_the_ack_timeout_is_read_again(hooks: Callable[[], Binding],
                                                                    queue_name: str) -> None:
    binding = hooks()
    (body,) = envelope_bodies(queue_name, [URN])
    binding.publish(body, queue_name)
    manager_timeout = 0.3  # well inside the 1 s visibility timeout: the ack timeout is what hands it back

    async def scenario() -> list[dict[str, Any]]:
        trigger = trigger_for(queue_name)
        manager = SharedStreamManager(ack_timeout=manager_timeout)
        key = trigger.shared_stream_key()
        stream = trigger.filter_shared_stream(manager.subscribe(trigger_id=1, trigger=trigger, key=key))
        seen: list[dict[str, Any]] = []
        try:
            first = await asyncio.wait_for(stream.__anext__(), 20)  # type: ignore[attr-defined]
            manager.bind_pending_event(trigger_id=1, key=key)  # never confirmed: the database did not answer
            seen.append(first.payload)
            with pytest.raises(Exception, match="did not finish processing|AckTimeout|ack"):
                await asyncio.wait_for(stream.__anext__(), 20)  # type: ignore[attr-defined]
        finally:
            await manager.unsubscribe(1, key)
        # the failed event was handed back (not counted): a new reader gets the same message
        seen += await run_trigger(trigger_for(queue_name), 1)
        return seen

    seen = asyncio.run(scenario())
    assert meta_ids(seen) == [bq.meta_id_of(bq.decode(body))] * 2
    counted = 1 if binding.name in COUNTS_RECEIVES else 0
    assert seen[1]["messages"][0]["attempts"] == seen[0]["messages"][0]["attempts"] + counted
    assert drain(binding, queue_name) == []


def test_a_filter_takes_only_its_messages_and_hands_back_the_others(hooks: Callable[[], Binding],
                                                                      queue_name: str) -> None:
    binding = hooks()
    bodies = envelope_bodies(queue_name, [URN, OTHER, URN, OTHER, URN])
    binding.publish_batch(bodies, queue_name)
    trigger = trigger_for(queue_name, urns=["urn:babel:orders:*"], jsonpath="$[?$.amount >= 20]",
                          unmatched_delay=0.5)
    events = asyncio.run(run_trigger(trigger, 2))
    assert meta_ids(events) == [bq.meta_id_of(bq.decode(bodies[n])) for n in (2, 4)]
    others = drain(binding, queue_name)
    assert sorted(m.body for m in others) == sorted(bodies[n] for n in (0, 1, 3))  # exact bytes, still queued
    assert binding.dead_letter_depth(queue_name) == 0


def test_batched_events_and_what_is_dead_lettered(hooks: Callable[[], Binding], queue_name: str) -> None:
    binding = hooks()
    bodies = envelope_bodies(queue_name, [URN] * 7)
    large = bq.encode(bq.make_envelope(URN, {"blob": "x" * 2000}, queue_name=queue_name))
    binding.publish_batch([*bodies[:3], b"\xffnot json", *bodies[3:], large], queue_name)
    events = asyncio.run(run_trigger(trigger_for(queue_name, batch_size=3, max_event_bytes=1500), 7))
    assert meta_ids(events) == [bq.meta_id_of(bq.decode(b)) for b in bodies]
    assert all(1 <= e["count"] <= 3 and e["count"] == len(e["messages"]) for e in events)
    dead = drain_dead(binding, queue_name)
    assert sorted(dead, key=str) == sorted([("poison", b"\xffnot json"),
                                            ("failed", bq.meta_id_of(bq.decode(large)))], key=str)


def drain_dead(binding: Binding, queue_name: str) -> list[tuple[str, bytes | str]]:
    """(reason, the poison's exact bytes or the envelope's meta.id) of each dead letter, once both are written."""
    deadline = time.monotonic() + 10
    while binding.dead_letter_depth(queue_name) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    out: list[tuple[str, bytes | str]] = []
    for message in binding.reserve_dead_letters(queue_name, 10, timeout=1):
        wrapper = poison_wrapper(message.body)
        if wrapper is not None:
            out.append((wrapper.reason, wrapper.raw))
        else:
            assert message.envelope is not None
            block = message.envelope["dead_letter"]
            assert "max_event_bytes=1,500" in block["error"], block
            out.append((block["reason"], message.meta_id))
        binding.ack(message)
    return out


def test_event_entries_bound_each_event() -> None:
    messages = [ReceivedMessage(b"", "q", {"job": URN, "data": {"s": "y" * size}, "meta": {"id": str(n)}},
                                None, 0) for n, size in enumerate((10, 10, 400, 10, 900))]
    groups, too_large = event_entries(messages, batch_size=2, max_event_bytes=600)
    assert [[entry["meta_id"] for _, entry in group] for group in groups] == [["0", "1"], ["2"], ["3"]]
    assert [(m.envelope or {})["meta"]["id"] for m, _ in too_large] == ["4"]


#: Where another process (a task of the run) can settle a reservation: ``settle="run_finished"`` applies.
SETTLED_BY_RUN = {"sql", "redis", "sqs"}


def test_run_finished_messages_wait_for_their_run(hooks: Callable[[], Binding], queue_name: str) -> None:
    """``settle="run_finished"``: stored events leave their messages held; the run acks a success and hands a
    failure back, which then makes a new event (where the broker allows it; elsewhere the trigger says why not)."""
    binding = hooks()
    bodies = envelope_bodies(queue_name, [URN] * 3)
    binding.publish_batch(bodies, queue_name)
    trigger = trigger_for(queue_name, settle="run_finished", run_timeout=120)
    if binding.name not in SETTLED_BY_RUN:
        with pytest.raises(NotSupportedError, match="cannot hand a reservation to another process"):
            asyncio.run(run_trigger(trigger, 3, within=20))
        return
    events = asyncio.run(run_trigger(trigger, 3))
    assert meta_ids(events) == [bq.meta_id_of(bq.decode(b)) for b in bodies]
    receipts = held_receipts({"asset": [SimpleNamespace(extra={"payload": e}) for e in events]})
    assert list(receipts) == ["bq_test"] and len(receipts["bq_test"]) == 3
    # stored, yet not settled: nobody else gets them (held for the run, past the 1 s visibility timeout)
    time.sleep(1.5)
    assert binding.reserve_many(queue_name, 10, timeout=0.5) == []
    held = receipts["bq_test"]
    binding.settle_held(held[:2], succeeded=True)  # that run succeeded
    binding.settle_held(held[2:], succeeded=False)  # this one failed: its message comes back at once, unchanged
    again = asyncio.run(run_trigger(trigger_for(queue_name), 1))
    assert meta_ids(again) == [bq.meta_id_of(bq.decode(bodies[2]))]
    assert drain(binding, queue_name) == []
    binding.settle_held(held, succeeded=True)  # settled or handed out since: left alone


def test_a_run_succeeded_when_every_other_task_succeeded_or_was_skipped() -> None:
    from airflow_provider_babelqueue.operators.settle import run_succeeded

    assert run_succeeded({"work": "success", "notify": "skipped", "settle": "running"}, "settle")
    assert not run_succeeded({"work": "failed", "settle": "running"}, "settle")
    assert not run_succeeded({"work": "upstream_failed", "settle": "running"}, "settle")
    assert not run_succeeded({"work": None, "settle": "running"}, "settle")  # never ran: not a success


def test_a_slow_store_never_makes_the_broker_hand_the_message_out_again(hooks: Callable[[], Binding],
                                                                        queue_name: str) -> None:
    """Where reservations expire (SQL, Redis, SQS: 1 s here), the trigger holds them for ``reservation_timeout``:
    an event stored late (the metadata database under load) still settles its message, with no second event."""
    binding = hooks()
    if binding.name not in SETTLED_BY_RUN:
        pytest.skip(f"{binding.name}: a reservation lives on the connection or the receiver's lock, not held")
    (body,) = envelope_bodies(queue_name, [URN])
    binding.publish(body, queue_name)

    async def scenario() -> None:
        trigger = trigger_for(queue_name, reservation_timeout=10.0)
        manager = SharedStreamManager(ack_timeout=30.0)
        key = trigger.shared_stream_key()
        stream = trigger.filter_shared_stream(manager.subscribe(trigger_id=1, trigger=trigger, key=key))
        try:
            event = await asyncio.wait_for(stream.__anext__(), 20)  # type: ignore[attr-defined]
            seq = manager.bind_pending_event(trigger_id=1, key=key)
            assert seq is not None and meta_ids([event.payload]) == [bq.meta_id_of(bq.decode(body))]
            await asyncio.sleep(2.5)  # well past the binding's 1 s visibility timeout, the event not yet stored
            assert binding.reserve_many(queue_name, 10, timeout=0) == []  # still held: nobody else gets it
            manager.confirm_persisted([seq])
            with pytest.raises(TimeoutError):  # and the trigger does not read it twice
                await asyncio.wait_for(stream.__anext__(), 2)  # type: ignore[attr-defined]
        finally:
            await manager.unsubscribe(1, key)

    asyncio.run(scenario())
    assert drain(binding, queue_name) == []  # settled once stored
