"""Azure Service Bus binding specifics: the unmodified azure-servicebus SDK against the AMQP 1.0 test double.

There is no Service Bus emulator without Docker, so ``asb_double.py`` stands in for a namespace (its docstring
lists what it does and does not model). The shared behaviour is in test_contract.py and test_batch_ops.py.
Here: the conformance block ``asb`` (both parts, from the manifest), the projection as a plain SDK receiver
and the wire see it, delivery counts and lock expiry, release copies, native and plain dead letters and the
``dead_letter`` block every DLQ read adds, batches sized by the link, errors, and the hook.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.azure_service_bus import (
    AzureServiceBusBinding,
    AzureServiceBusConfig,
    application_properties,
    dead_letter_description,
    message_fields,
    native_dead_letter_body,
    parse_dead_letter_description,
    reconcile_attempts,
    service_delivery_count,
)
from airflow_provider_babelqueue.bindings.base import BindingError, NotSupportedError, PublishBatchError
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.hooks.azure_service_bus import BabelQueueAzureServiceBusHook
from airflow_provider_babelqueue.hooks.base import ConnectionConfigError
from tests.bindings.asb_double import AsbDouble, _sections, shared_double
from tests.conftest import compact, conformance_manifest, fixture_dict

ASB = conformance_manifest()["asb"]
CASES = ASB["attempts_reconciliation"]["cases"]
POISON = b'\xff\xfe{"job": not json'

Factory = Callable[..., AzureServiceBusBinding]


@pytest.fixture(scope="module")
def double() -> AsbDouble:
    return shared_double()


@pytest.fixture
def q(double: AsbDouble) -> Iterator[str]:
    name = f"bq-{uuid.uuid4().hex[:10]}"
    yield name
    for entity in [e for e in list(double.entities) if e.startswith(name)]:
        double.delete_queue(entity)


@pytest.fixture
def make(double: AsbDouble) -> Iterator[Factory]:
    made: list[AzureServiceBusBinding] = []

    def factory(**options: Any) -> AzureServiceBusBinding:
        options = {"connection_string": double.connection_string, "connection_verify": double.ca_file,
                   "create_queues": True} | options
        made.append(AzureServiceBusBinding(AzureServiceBusConfig(**options)))
        return made[-1]

    yield factory
    for binding in made:
        binding.close()


@pytest.fixture
def sdk(double: AsbDouble) -> Iterator[Any]:
    """A plain SDK client: the independent peer that sees what the binding wrote and writes as other apps do."""
    from azure.servicebus import ServiceBusClient

    client = ServiceBusClient.from_connection_string(double.connection_string)
    yield client
    client.close()


def envelope_for(queue_name: str, n: int = 0, **data: Any) -> bytes:
    return bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n, **data}, queue_name=queue_name))


def must(message: Any) -> Any:
    assert message is not None
    return message


# ------------------------------------------------------------------------------------- conformance


def test_property_projection_block() -> None:
    block = ASB["property_projection"]
    env = fixture_dict(block["envelope_file"])
    assert message_fields(env) == block["message"]
    props = application_properties(env)
    assert props == block["application_properties"]
    assert {k: type(v) for k, v in props.items()} == {k: type(v) for k, v in block["application_properties"].items()}
    assert list(props) == ["bq-schema-version", "bq-source-lang", "bq-created-at"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_attempts_reconciliation_block(case: dict[str, Any]) -> None:
    assert reconcile_attempts(case["body_attempts"], case["delivery_count"]) == case["expected_attempts"]


def test_projection_as_a_plain_receiver_and_the_wire_see_it(make: Factory, q: str, sdk: Any,
                                                            double: AsbDouble) -> None:
    block = ASB["property_projection"]
    body = compact(fixture_dict(block["envelope_file"]))
    make().publish(body, q)
    stored = double.entities[q].ready[0]
    wire = _sections(stored.application)[0][2]  # the AMQP types as sent: numbers stay numbers
    assert wire == block["application_properties"]
    assert [type(wire[k]).__name__ for k in wire] == ["int32", "str", "int"]  # int, string, long
    with sdk.get_queue_receiver(q) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert b"".join(message.body) == body
        assert {k: getattr(message, k) for k in block["message"]} == block["message"]
        assert message.application_properties == {
            b"bq-schema-version": 1, b"bq-source-lang": b"php", b"bq-created-at": 1749132727000,
        }
        assert message.delivery_count == 0  # the SDK's raw AMQP count: Service Bus's DeliveryCount 1
        receiver.complete_message(message)


# --------------------------------------------------------------------------------- locks and counts


def test_a_reservation_counts_as_active_until_completed(make: Factory, q: str) -> None:
    """test_contract's publish/reserve/ack flow, with Service Bus's depth: a locked message is still active."""
    binding = make()
    body = envelope_for(q, 1, title="Café ☕ / naïve")
    binding.publish(body, q)
    assert binding.depth(q) == 1
    message = must(binding.reserve(q, timeout=2))
    assert message.body == body and message.attempts == 0 and message.delivery_count == 1
    assert binding.depth(q) == 1
    binding.ack(message)
    assert binding.depth(q) == 0 and binding.reserve(q, timeout=0) is None and binding.dead_letter_depth(q) == 0


def test_lock_expiry_redelivers_with_a_higher_delivery_count_and_a_stale_ack_changes_nothing(
    make: Factory, q: str, caplog: pytest.LogCaptureFixture
) -> None:
    binding = make(lock_duration=1.0)
    body = envelope_for(q)
    binding.publish(body, q)
    stale = must(binding.reserve(q, timeout=2))
    time.sleep(1.3)
    again = must(binding.reserve(q, timeout=2))
    assert again.body == body and again.delivery_count == 2 and again.attempts == 1  # body attempts stay 0
    with caplog.at_level(logging.WARNING):
        binding.ack(stale)  # the broker refuses the old lock token: nothing is completed
    assert "expired (delivered again); nothing completed" in caplog.text
    assert binding.depth(q) == 1
    binding.ack(again)
    assert binding.depth(q) == 0


def test_release_sends_a_copy_with_one_more_attempt_then_completes(make: Factory, q: str, sdk: Any,
                                                                   double: AsbDouble) -> None:
    binding = make()
    body = envelope_for(q)
    binding.publish(body, q, headers={"tenant": "acme"})
    binding.release(must(binding.reserve(q, timeout=2)), delay=30)
    assert double.counts(q) == {"ActiveMessageCount": 0, "DeadLetterMessageCount": 0, "ScheduledMessageCount": 1,
                                "TransferMessageCount": 0, "TransferDeadLetterMessageCount": 0}
    with sdk.get_queue_receiver(q) as receiver:
        (copy,) = receiver.peek_messages(max_message_count=10, sequence_number=1)
    expected = bq.decode(body)
    expected["attempts"] = 1
    assert b"".join(copy.body) == bq.encode(expected)
    assert copy.message_id == expected["meta"]["id"] and copy.application_properties[b"tenant"] == b"acme"
    scheduled = copy.scheduled_enqueue_time_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(seconds=25) < scheduled <= dt.timedelta(seconds=30)


def test_with_duplicate_detection_a_retry_copy_gets_its_own_message_id(make: Factory, q: str, sdk: Any) -> None:
    binding = make(duplicate_detection=True)
    body = envelope_for(q)
    binding.publish(body, q)
    first = must(binding.reserve(q, timeout=2))
    binding.release(first)
    second = must(binding.reserve(q, timeout=2))
    assert second.attempts == 1 and second.receipt.message.message_id == f"{first.meta_id}:1"
    assert first.receipt.message.message_id == first.meta_id  # a publish keeps the projection
    binding.ack(second)


# ------------------------------------------------------------------------------------- dead letters


def test_native_dead_letter_keeps_the_body_and_reads_back_with_the_exact_block(make: Factory, q: str, sdk: Any) -> None:
    binding = make()
    body = envelope_for(q, 7)
    binding.publish(body, q)
    binding.dead_letter(must(binding.reserve(q, timeout=2)), bq.Reason.FAILED, error="Payment gateway timeout",
                        exception="GatewayTimeout")
    assert binding.dead_letter_name(q) == f"{q}/$DeadLetterQueue"
    assert binding.depth(q) == 0 and binding.dead_letter_depth(q) == 1
    from azure.servicebus import ServiceBusSubQueue

    with sdk.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        (native,) = receiver.peek_messages(max_message_count=10, sequence_number=1)
    assert b"".join(native.body) == body  # Service Bus never changes a dead letter's body
    assert native.dead_letter_reason == "failed"
    fields = json.loads(native.dead_letter_error_description)
    assert list(fields) == ["error", "exception", "failed_at", "attempts"]
    assert fields | {"failed_at": 0} == {"error": "Payment gateway timeout", "exception": "GatewayTimeout",
                                         "failed_at": 0, "attempts": 0}
    expected = bq.encode(bq.annotate_dead_letter(
        bq.decode(body), "failed", original_queue=q, attempts=0, error="Payment gateway timeout",
        exception="GatewayTimeout", failed_at=fields["failed_at"],
    ))
    (browsed,) = binding.browse_dead_letters(q)
    dead = must(binding.reserve_dead_letter(q, timeout=2))
    assert browsed.body == dead.body == expected and dead.from_dead_letter and dead.queue_name == q
    assert dead.headers["DeadLetterReason"] == "failed" and dead.delivery_count == 1
    with pytest.raises(BindingError, match="peeked"):
        binding.ack(browsed)
    with pytest.raises(NotSupportedError, match="already dead-lettered"):
        binding.dead_letter(dead, "failed")
    binding.ack(dead)
    assert binding.dead_letter_depth(q) == 0


def test_foreign_native_dead_letters_get_a_block_from_the_native_properties(make: Factory, q: str,
                                                                             sdk: Any) -> None:
    binding = make(lock_duration=1.0, max_delivery_count=1)
    from azure.servicebus import ServiceBusMessage

    other = envelope_for(q, 1)
    binding.publish(envelope_for(q, 0), q)
    with sdk.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage(other))
    assert must(binding.reserve(q, timeout=2)).envelope["data"]["n"] == 0  # held, never settled
    with sdk.get_queue_receiver(q) as receiver:  # an app on another SDK dead-letters the other one
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.dead_letter_message(message, reason="ValidationFailed", error_description="schema mismatch")
    time.sleep(1.3)  # the held lock expires: past MaxDeliveryCount 1, Service Bus dead-letters it itself
    dead = sorted(binding.reserve_dead_letters(q, 5, timeout=3), key=lambda m: m.envelope["data"]["n"])
    assert [m.envelope["dead_letter"] | {"failed_at": 0} for m in dead] == [
        {"reason": "MaxDeliveryCountExceeded", "error": "Message could not be consumed after 1 delivery attempts.",
         "exception": None, "failed_at": 0, "original_queue": q, "attempts": 1, "lang": "python"},
        {"reason": "ValidationFailed", "error": "schema mismatch", "exception": None, "failed_at": 0,
         "original_queue": q, "attempts": 0, "lang": "python"},
    ]
    enqueued = [round(m.receipt.message.enqueued_time_utc.timestamp() * 1000) for m in dead]
    assert [m.envelope["dead_letter"]["failed_at"] for m in dead] == enqueued  # no dead-lettering time is kept
    binding.ack_many(dead)


def test_plain_dead_letter_queue_is_read_counted_and_browsed_after_the_native_one(make: Factory, q: str,
                                                                                   sdk: Any, double: AsbDouble) -> None:
    binding = make(dead_letter_queue_suffix=".dlq")
    from azure.servicebus import ServiceBusMessage

    written = bq.encode(bq.annotate_dead_letter(bq.decode(envelope_for(q, 2)), "failed", original_queue=q,
                                                attempts=3, failed_at=1749132727000))
    double.create_queue(f"{q}.dlq")
    with sdk.get_queue_sender(f"{q}.dlq") as sender:  # what the official SDKs' apps write
        sender.send_messages(ServiceBusMessage(written))
    binding.publish(POISON, q)
    binding.dead_letter(must(binding.reserve(q, timeout=2)), bq.Reason.POISON)
    assert binding.dead_letter_depth(q) == 2

    def shown(body: bytes) -> tuple[bytes, str, str] | bytes:
        # a native dead letter that is no envelope is read as the poison wrapper of its exact bytes, with
        # DeadLetterReason as its reason and the queue it was quarantined from
        wrapper = poison_wrapper(body)
        if wrapper is None:
            return body
        return wrapper.raw, wrapper.reason, wrapper.dead_letter["original_queue"]

    poisoned = (POISON, "poison", q)
    assert [shown(m.body) for m in binding.browse_dead_letters(q)] == [poisoned, written]
    got = binding.reserve_dead_letters(q, 10, timeout=2)
    got += binding.reserve_dead_letters(q, 10 - len(got), timeout=2) if len(got) < 2 else []
    assert [shown(m.body) for m in got] == [poisoned, written] and all(m.from_dead_letter for m in got)
    binding.ack_many(got)
    assert binding.dead_letter_depth(q) == 0 and binding.reserve_dead_letters(q, 10, timeout=0) == []


def test_without_native_dead_lettering_the_annotated_copy_goes_to_the_plain_queue(make: Factory, q: str,
                                                                                   double: AsbDouble) -> None:
    binding = make(native_dead_letter=False, dead_letter_queue_suffix=".dlq")
    body = envelope_for(q)
    binding.publish(body, q)
    binding.dead_letter(must(binding.reserve(q, timeout=2)), bq.Reason.UNKNOWN_URN, error="no handler")
    assert binding.dead_letter_name(q) == f"{q}.dlq"
    assert double.counts(q)["DeadLetterMessageCount"] == 0 and double.counts(f"{q}.dlq")["ActiveMessageCount"] == 1
    dead = must(binding.reserve_dead_letter(q, timeout=2))
    block = dead.envelope["dead_letter"]
    assert dead.body == bq.encode(bq.annotate_dead_letter(bq.decode(body), "unknown_urn", original_queue=q,
                                                          attempts=0, error="no handler", failed_at=block["failed_at"]))
    binding.ack(dead)
    assert binding.dead_letter_depth(q) == 0


def test_a_missing_plain_dead_letter_queue_reads_as_empty(make: Factory, q: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    binding = make(dead_letter_queue_suffix=".dlq")
    binding.publish(envelope_for(q), q)
    # DEBUG, not WARNING: the SDKs' plain <queue>.dlq is read by default, and most queues have none.
    with caplog.at_level(logging.DEBUG, logger="airflow_provider_babelqueue.bindings.azure_service_bus.binding"):
        assert binding.reserve_dead_letters(q, 5, timeout=0) == []
    assert f"plain dead-letter queue '{q}.dlq' does not exist; read as empty" in caplog.text
    assert binding.dead_letter_depth(q) == 0 and binding.browse_dead_letters(q) == []
    assert binding.dead_letter_sources(q) == [f"{q}/$DeadLetterQueue", f"{q}.dlq"]
    assert make().dead_letter_sources(q) == [f"{q}/$DeadLetterQueue", f"{q}.dlq"]  # the default reads it too


def test_description_codec_is_exact_and_bounded() -> None:
    text = dead_letter_description(error="boom", exception="ValueError", failed_at=5, attempts=2)
    assert text == '{"error":"boom","exception":"ValueError","failed_at":5,"attempts":2}'
    assert parse_dead_letter_description(text) == {"error": "boom", "exception": "ValueError", "failed_at": 5,
                                                   "attempts": 2}
    long = dead_letter_description(error="é" * 5000, exception=None, failed_at=5, attempts=0)
    assert len(long) == 4096 and parse_dead_letter_description(long)["error"].endswith("é…")
    wrong_type = '{"error":1,"exception":null,"failed_at":1,"attempts":0}'
    for foreign in (None, "", "schema mismatch", '{"error": "x"}', wrong_type):
        assert parse_dead_letter_description(foreign) is None
    kept = bq.encode(bq.annotate_dead_letter(bq.decode(envelope_for("q")), "failed", original_queue="q", attempts=1))
    # a block already there: byte for byte
    assert native_dead_letter_body(kept, queue_name="q", reason="x", description="y", delivery_count=3,
                                   enqueued_ms=1) == kept
    # no envelope: the poison wrapper of the exact bytes, with DeadLetterReason and the description beside them
    wrapped = poison_wrapper(native_dead_letter_body(POISON, queue_name="q", reason="x", description="y",
                                                     delivery_count=3, enqueued_ms=1))
    assert wrapped is not None and wrapped.raw == POISON
    assert wrapped.dead_letter == {"reason": "x", "error": "y", "exception": None, "failed_at": 1,
                                   "original_queue": "q", "attempts": 2, "lang": "python"}
    assert service_delivery_count(0) == 1 and service_delivery_count(None) is None


# ------------------------------------------------------------------------------------ batches, errors


def test_batches_are_sized_by_the_link_and_checked_before_sending(make: Factory, q: str, double: AsbDouble) -> None:
    binding = make()
    bodies = [envelope_for(q, i, pad="x" * 100_000) for i in range(5)]  # 256 KiB per message: two per batch
    binding.publish_batch(bodies, q)
    assert double.entities[q].transfers == 3 and binding.depth(q) == 5
    received = [must(binding.reserve(q, timeout=2)) for _ in range(5)]
    assert [m.body for m in received] == bodies
    binding.ack_many(received)
    with pytest.raises(PublishBatchError, match="body 1 .* does not fit") as caught:
        binding.publish_batch([bodies[0], envelope_for(q, pad="x" * 300_000), bodies[1]], q)
    assert caught.value.failed == [0, 1, 2]
    assert double.entities[q].transfers == 3 and binding.depth(q) == 0  # nothing was sent
    with pytest.raises(BindingError, match="larger than the queue accepts"):
        binding.publish(envelope_for(q, pad="x" * 300_000), q)


def test_headers_travel_as_application_properties_and_the_projection_wins(make: Factory, q: str) -> None:
    binding = make()
    binding.publish(envelope_for(q), q, headers={"tenant": "acme", "n": 5, "bq-source-lang": "go", "none": None})
    message = must(binding.reserve(q, timeout=2))
    assert message.headers == {"tenant": "acme", "n": 5, "bq-source-lang": "python", "bq-schema-version": 1,
                               "bq-created-at": message.envelope["meta"]["created_at"]}
    binding.ack(message)


def test_queues_are_not_created_unless_asked_and_errors_name_the_queue_without_secrets(
    make: Factory, q: str, double: AsbDouble
) -> None:
    binding = make(create_queues=False)
    for action in (lambda: binding.publish(envelope_for(q), q), lambda: binding.depth(q)):
        with pytest.raises(BindingError, match="the queue does not exist; create it, or enable create_queues") as e:
            action()
        assert repr(q) in str(e.value) and "SAS_KEY_VALUE" not in str(e.value)
    assert q not in double.entities
    with pytest.raises(ValueError, match="exactly one"):
        AzureServiceBusConfig()
    with pytest.raises(ValueError, match="needs dead_letter_queue_suffix"):
        AzureServiceBusConfig(fully_qualified_namespace="x.servicebus.windows.net", native_dead_letter=False)
    assert "SAS_KEY_VALUE" not in repr(binding.config)


def test_seen_store_is_refused(make: Factory) -> None:
    with pytest.raises(NotSupportedError, match=r"use a babelqueue\+sql or babelqueue\+redis connection"):
        make().seen_store("ledger")


# ------------------------------------------------------------------------------------------- hook


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, spec: dict[str, Any]) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(spec))
    return conn_id


def test_hook_round_trip_and_a_test_connection_that_changes_nothing(monkeypatch: pytest.MonkeyPatch, q: str,
                                                                    double: AsbDouble) -> None:
    extra = {"connection_verify": double.ca_file, "create_queues": "true", "lock_duration": "30",
             "max_delivery_count": 4, "dead_letter_queue_suffix": ".dlq", "min_receive_wait": 0.1,
             "region": "ignored: not allowlisted"}
    conn_id = define(monkeypatch, "bq_asb", {"conn_type": "babelqueue+servicebus",
                                             "password": double.connection_string, "extra": extra})
    hook = get_hook(conn_id)
    assert isinstance(hook, BabelQueueAzureServiceBusHook)
    before = set(double.entities)
    assert hook.test_connection() == (True, f"Connected to BabelQueue Azure Service Bus at 127.0.0.1:{double.port}")
    assert set(double.entities) == before
    binding = hook.get_binding()
    assert binding.config == AzureServiceBusConfig(
        connection_string=double.connection_string, connection_verify=double.ca_file, create_queues=True,
        lock_duration=30.0, max_delivery_count=4, dead_letter_queue_suffix=".dlq", min_receive_wait=0.1,
    )
    body = envelope_for(q)
    binding.publish(body, q)
    message = must(binding.reserve(q, timeout=2))
    assert message.body == body and double.entities[q].lock_duration == 30.0
    binding.ack(message)
    hook.close()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "exactly one of them"),
        ({"host": "x.servicebus.windows.net", "password": "Endpoint=sb://x/;SharedAccessKeyName=a;SharedAccessKey=b"},
         "exactly one of them"),
        ({"host": "x.servicebus.windows.net", "extra": {"create_queues": "maybe"}}, "'create_queues' must be true"),
        ({"host": "x.servicebus.windows.net", "extra": {"max_delivery_count": 2.5}}, "must be a whole number"),
        ({"host": "x.servicebus.windows.net", "extra": {"lock_duration": 900}}, "lock_duration must be more than 0"),
    ],
)
def test_bad_connections_name_the_field(monkeypatch: pytest.MonkeyPatch, spec: dict[str, Any], message: str) -> None:
    hook = get_hook(define(monkeypatch, "bq_asb_bad", {"conn_type": "babelqueue+servicebus"} | spec))
    with pytest.raises(ConnectionConfigError, match=message):
        hook.get_binding()
    ok, text = hook.test_connection()
    assert not ok and "SharedAccessKey=b" not in text


def test_a_namespace_connection_uses_default_azure_credential_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = get_hook(define(monkeypatch, "bq_asb_ns", {"conn_type": "babelqueue+servicebus",
                                                      "host": "contoso.servicebus.windows.net"}))
    binding = hook.get_binding()  # no network, no credential lookup yet
    assert binding.config.fully_qualified_namespace == "contoso.servicebus.windows.net"
    assert binding._credential is None and binding._client is None
    assert hook.describe(hook.connection) == "contoso.servicebus.windows.net (DefaultAzureCredential)"
    hook.close()


def test_a_body_over_the_link_limit_is_refused_before_sending(make: Factory, q: str) -> None:
    """The namespace announces its max message size on the AMQP link (256 KiB on Standard; the double does the
    same): a batch with one body over it sends nothing and says so; a single send is refused with the hint."""
    binding = make()
    small = bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": 1}, queue_name=q))
    huge = bq.encode(bq.make_envelope("urn:babel:orders:created", {"pad": "x" * 300_000}, queue_name=q))
    with pytest.raises(PublishBatchError, match="none of the 3 bodies was sent") as caught:
        binding.publish_batch([small, huge, small], q)
    assert caught.value.failed == [0, 1, 2]
    with pytest.raises(BindingError, match="larger than the queue accepts"):
        binding.publish(huge, q)
    assert binding.depth(q) == 0


# ---------------------------------------------------------------------------------------- batched consumption


def test_a_consumer_batch_is_one_receive_and_each_message_is_completed(make: Factory, q: str, double: AsbDouble,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of 12 is one PeekLock receive asking for 12; its settlement completes each message on the same
    receiver (the SDK settles one lock token per call), and the queue ends empty."""
    from airflow_provider_babelqueue.engine.consume import Consumer

    binding = make()
    binding.publish_batch([envelope_for(q, n) for n in range(12)], q)
    _, receiver, _ = binding._receiver(q, "queue")
    asked: list[int] = []
    completed: list[Any] = []
    receive, complete = receiver.receive_messages, receiver.complete_message

    def counting_receive(**options: Any) -> Any:
        got = receive(**options)
        asked.append(options["max_message_count"])
        return got

    monkeypatch.setattr(receiver, "receive_messages", counting_receive)
    monkeypatch.setattr(receiver, "complete_message", lambda message: completed.append(complete(message)))
    seen: list[int] = []
    summary = Consumer(binding, q, {"urn:babel:orders:created": lambda env: seen.append(env["data"]["n"])},
                       batch_size=12).run(reserve_timeout=1)
    assert summary.handled == 12 and sorted(seen) == list(range(12))
    assert asked[0] == 12
    assert len(completed) == 12
    assert (double.counts(q) or {}).get("ActiveMessageCount") == 0
