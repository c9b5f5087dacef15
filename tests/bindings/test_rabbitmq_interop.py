"""Live interop with the official SDK's RabbitMQ transport (``babelqueue.pika_transport``) on the real broker.

Compatibility facts verified here (babelqueue 1.24 ``PikaTransport``):

* Same layout: default exchange, routing key = queue, durable queue declared without arguments, persistent
  delivery, ``basic.get`` + manual ack.
* Same properties, field for field: content type and ``content_encoding`` ``utf-8``, ``type`` = URN,
  ``correlation_id``, ``message_id``, ``app_id`` and the native-typed ``x-*`` headers. The SDK stringifies
  out-of-band headers and hands every header back as a string on ``pop``; we keep AMQP's native types.
* The SDK declares its queues (durable, no arguments) on first use; our passive-first declare accepts them,
  and the SDK accepts ours.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from babelqueue import EnvelopeCodec
from babelqueue.pika_transport import PikaTransport

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQBinding, RabbitMQConfig
from tests.conftest import compact, fixture_dict

pytestmark = pytest.mark.interop

URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
PROPERTY_NAMES = ("content_type", "content_encoding", "delivery_mode", "type", "correlation_id", "message_id",
                  "app_id", "headers", "priority", "expiration", "timestamp", "reply_to", "user_id")


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"bqtest-sdk-{uuid.uuid4().hex[:10]}"
    yield name
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    channel = connection.channel()
    for suffix in ("", "-sdk", ".failed", ".dlq"):
        channel.queue_delete(f"{name}{suffix}")
    connection.close()


@pytest.fixture
def ours() -> Iterator[RabbitMQBinding]:
    binding = RabbitMQBinding(RabbitMQConfig.from_url(URL))
    yield binding
    binding.close()


@pytest.fixture
def sdk() -> Iterator[PikaTransport]:
    transport = PikaTransport(URL)
    yield transport
    transport.close()


def raw_get(name: str) -> tuple[Any, bytes]:
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    try:
        method, props, body = connection.channel().basic_get(name, auto_ack=True)
        assert method is not None, f"expected a message on {name}"
        return props, body
    finally:
        connection.close()


def envelope_bytes(queue: str, n: int = 0) -> bytes:
    data = {"n": n, "title": "Café ☕ / naïve", "big": 2**53 + 1, "ratio": 0.1, "nested": {"list": [1, None]}}
    return bq.encode(bq.make_envelope("urn:babel:orders:created", data, queue_name=queue))


def test_what_we_publish_the_sdk_pops_byte_for_byte(ours: RabbitMQBinding, sdk: PikaTransport, queue: str) -> None:
    bodies = [compact(fixture_dict("fixtures/order-created.json")), envelope_bytes(queue, 1), envelope_bytes(queue, 2)]
    ours.publish(bodies[0], queue, headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
    ours.publish_batch(bodies[1:], queue)
    for index, body in enumerate(bodies):
        message = sdk.pop(queue, timeout=0)
        assert message is not None and message.body.encode("utf-8") == body
        envelope = EnvelopeCodec.decode(message.body)
        assert EnvelopeCodec.accepts(envelope)
        expected = {"x-schema-version": str(envelope["meta"]["schema_version"]),
                    "x-source-lang": envelope["meta"]["lang"], "x-attempts": "0"}
        if index == 0:
            expected["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        assert message.headers == expected
        sdk.ack(message)
    assert ours.depth(queue) == 0


def test_our_properties_equal_the_sdks_field_for_field(ours: RabbitMQBinding, sdk: PikaTransport, queue: str) -> None:
    for body in (compact(fixture_dict("fixtures/order-created.json")), compact(fixture_dict("fixtures/urn-alias.json")),
                 envelope_bytes(queue)):
        ours.publish(body, queue, headers={"traceparent": "00-abc-01"})
        sdk.publish_with_headers(f"{queue}-sdk", body.decode("utf-8"), {"traceparent": "00-abc-01"})
        (our_props, our_body), (sdk_props, sdk_body) = raw_get(queue), raw_get(f"{queue}-sdk")
        assert our_body == sdk_body == body
        mine = {name: getattr(our_props, name) for name in PROPERTY_NAMES}
        theirs = {name: getattr(sdk_props, name) for name in PROPERTY_NAMES}
        if "job" not in bq.decode(body):
            # The SDK projects only ``job``; for an envelope that carries the URN in the ``urn`` alias we still
            # set ``type`` (consumers must accept the alias, and routing on ``type`` should keep working).
            assert theirs.pop("type") is None and mine.pop("type") == bq.decode(body)["urn"]
        assert mine == theirs


def test_what_the_sdk_publishes_we_reserve_byte_for_byte(ours: RabbitMQBinding, sdk: PikaTransport,
                                                         queue: str) -> None:
    envelope = EnvelopeCodec.make("urn:babel:orders:created", {"order_id": 1042, "note": "ünïcödé"}, queue=queue)
    raw = EnvelopeCodec.encode(envelope)
    sdk.publish(queue, raw)
    sdk.publish_with_headers(queue, raw, {"traceparent": "t-1"})
    for headers in ({}, {"traceparent": "t-1"}):
        message = ours.reserve(queue, timeout=2)
        assert message is not None and message.body == raw.encode("utf-8")
        assert bq.check(message.envelope) is None and message.attempts == 0
        assert message.headers["x-source-lang"] == "python" and message.headers["x-schema-version"] == 1
        assert {k: message.headers[k] for k in headers} == headers
        assert message.headers["amqp.type"] == "urn:babel:orders:created"
        assert message.headers["amqp.message_id"] == envelope["meta"]["id"]
        ours.ack(message)
    assert ours.reserve(queue) is None


def test_a_release_and_a_dead_letter_are_read_by_the_sdk(ours: RabbitMQBinding, sdk: PikaTransport,
                                                         queue: str) -> None:
    envelope = EnvelopeCodec.make("urn:babel:orders:created", {"order_id": 7}, queue=queue)
    sdk.publish(queue, EnvelopeCodec.encode(envelope))
    message = ours.reserve(queue, timeout=2)
    assert message is not None
    ours.release(message)
    retried = sdk.pop(queue, timeout=0)
    assert retried is not None and retried.headers["x-attempts"] == "1"
    assert EnvelopeCodec.decode(retried.body)["attempts"] == 1
    assert EnvelopeCodec.decode(retried.body)["meta"] == envelope["meta"]
    sdk.ack(retried)
    ours.publish(EnvelopeCodec.encode(envelope).encode("utf-8"), queue)
    dead = ours.reserve(queue, timeout=2)
    assert dead is not None
    dlq_ours = RabbitMQBinding(RabbitMQConfig.from_url(URL, dead_letter_suffix=".dlq"))
    try:
        ours.dead_letter(dead, "failed", error="boom")
        annotated = sdk.pop(f"{queue}.failed", timeout=0)  # the SDK reads our DLQ like any queue
        assert annotated is not None
        assert EnvelopeCodec.decode(annotated.body)["dead_letter"]["reason"] == "failed"
        sdk.ack(annotated)
        assert dlq_ours.dead_letter_name(queue) == f"{queue}.dlq"
    finally:
        dlq_ours.close()
