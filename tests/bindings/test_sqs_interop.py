"""Live interop with the official SDK's SQS transport (babelqueue 1.24 ``SqsTransport``) on moto's server.

Compatibility facts verified here:

* Both sides send the envelope text as the MessageBody unchanged and project the same six ``bq-*``
  MessageAttributes (same names, String/Number types and values), so either side routes on the other's.
* The SDK's ``pop`` rewrites the body only to raise ``attempts`` to ``ApproximateReceiveCount - 1``; we never
  rewrite on read and report the same reconciled number in ``ReceivedMessage.attempts``.
* FIFO: both use group = the queue name and deduplication id = meta.id.
* DLQ names differ by default (the SDK: ``<queue>-dlq``; ours: ``<queue>-failed``); ``dead_letter_suffix="-dlq"``
  makes our dead letters land where SDK apps drain theirs.
* A body SQS cannot carry as text reaches the SDK as base64 text with ``bq-body-encoding: base64`` (our
  extension): the SDK sees poison, which is what those bytes are, and the header tells a human how to read it.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from babelqueue import EnvelopeCodec
from babelqueue.sqs_transport import SqsTransport

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.sqs import SqsBinding, SqsConfig, message_attributes
from tests.bindings.sqs_server import (
    REGION,
    sqs_client,
)
from tests.conftest import compact, fixture_dict

pytestmark = pytest.mark.interop

POISON = b'\xff\xfe{"job": not json'


@pytest.fixture
def ours(endpoint: str, admin: Any) -> Iterator[SqsBinding]:
    binding = SqsBinding(
        SqsConfig(
            region_name=REGION,
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            dead_letter_suffix="-dlq",
        )
    )
    yield binding
    binding.close()


@pytest.fixture
def q() -> str:
    return f"interop-{uuid.uuid4().hex[:10]}"


def sdk(endpoint: str, **options: Any) -> SqsTransport:
    return SqsTransport(client=sqs_client(endpoint), **options)


def envelope_bytes(queue: str, n: int = 0) -> bytes:
    data = {"n": n, "title": "Café ☕ / naïve", "big": 2**53 + 1, "ratio": 0.1, "nested": {"list": [1, None]}}
    return bq.encode(bq.make_envelope("urn:babel:orders:created", data, queue_name=queue))


def strings(attributes: dict[str, dict[str, str]]) -> dict[str, str]:
    return {name: value["StringValue"] for name, value in attributes.items()}


def test_what_we_publish_the_sdk_pops_with_the_same_attributes(ours: SqsBinding, endpoint: str, q: str) -> None:
    bodies = [compact(fixture_dict("fixtures/order-created.json")), envelope_bytes(q, 1), envelope_bytes(q, 2)]
    ours.publish(bodies[0], q)
    ours.publish_batch(bodies[1:], q)
    transport = sdk(endpoint)
    for body in bodies:
        message = transport.pop(q, timeout=1)
        assert message is not None and message.body.encode("utf-8") == body and message.route_urn == ""
        assert message.headers == strings(message_attributes(bq.decode(body)))  # the six, as the SDK reads them
        assert EnvelopeCodec.accepts(EnvelopeCodec.decode(message.body))
        transport.ack(message)
    assert ours.depth(q) == 0 and ours.reserve(q) is None


def test_what_the_sdk_publishes_we_reserve_byte_for_byte(ours: SqsBinding, endpoint: str, q: str) -> None:
    envelope = EnvelopeCodec.make("urn:babel:orders:created", {"order_id": 1042, "note": "ünïcödé"}, queue=q)
    raw = EnvelopeCodec.encode(envelope)
    ours.depth(q)  # creates the queue (the SDK expects it to exist)
    sdk(endpoint).publish(q, raw)
    message = ours.reserve(q, timeout=1)
    assert message is not None and message.body == raw.encode("utf-8") and message.decode_error is None
    assert bq.check(message.envelope) is None and message.envelope == bq.decode(raw.encode())
    assert message.attempts == 0 and message.delivery_count == 1
    assert {k: v for k, v in message.headers.items() if k.startswith("bq-")} == strings(
        message_attributes(message.envelope)
    )  # the SDK projects exactly what we would
    ours.ack(message)
    assert ours.depth(q) == 0


def test_sdk_native_redeliveries_reconcile_our_attempts(ours: SqsBinding, endpoint: str, q: str) -> None:
    raw = EnvelopeCodec.encode(EnvelopeCodec.make("urn:babel:orders:created", {"order_id": 7}, queue=q))
    ours.depth(q)
    transport = sdk(endpoint)
    transport.publish(q, raw)
    for _ in range(2):  # the SDK's release: ChangeMessageVisibility(0), the receive count goes up
        popped = transport.pop(q, timeout=1)
        transport.redeliver(popped, popped.body, 0)
    message = ours.reserve(q, timeout=1)
    assert message.delivery_count == 3 and message.attempts == 2
    assert message.body == raw.encode() and message.envelope["attempts"] == 0  # read, never rewritten
    ours.release(message)  # our release: a copy whose body says attempts = 3
    popped = transport.pop(q, timeout=1)
    assert EnvelopeCodec.decode(popped.body)["attempts"] == 3
    transport.ack(popped)


def test_fifo_group_and_dedup_ids_agree(ours: SqsBinding, endpoint: str, admin: Any, q: str) -> None:
    fifo = f"{q}.fifo"
    ours.depth(fifo)
    ours_body = envelope_bytes(fifo)
    sdk_raw = EnvelopeCodec.encode(EnvelopeCodec.make("urn:babel:orders:created", {"order_id": 1}, queue=fifo))
    ours.publish(ours_body, fifo)
    sdk(endpoint, fifo=True).publish(fifo, sdk_raw)
    url = admin.get_queue_url(QueueName=fifo)["QueueUrl"]
    seen = {}
    for _ in range(2):
        [message] = admin.receive_message(QueueUrl=url, AttributeNames=["All"], WaitTimeSeconds=1)["Messages"]
        attributes = message["Attributes"]
        seen[message["Body"]] = (attributes["MessageGroupId"], attributes["MessageDeduplicationId"])
        admin.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert seen == {
        ours_body.decode(): (fifo, bq.decode(ours_body)["meta"]["id"]),
        sdk_raw: (fifo, EnvelopeCodec.decode(sdk_raw)["meta"]["id"]),
    }


def test_dead_letters_land_where_sdk_apps_drain_them(ours: SqsBinding, endpoint: str, q: str) -> None:
    transport = sdk(endpoint)
    assert ours.dead_letter_name(q) == transport.dead_letter_queue_name(q) == f"{q}-dlq"
    ours.publish(envelope_bytes(q), q)
    ours.dead_letter(ours.reserve(q), "failed", error="boom")
    popped = transport.pop(f"{q}-dlq", timeout=1)
    block = EnvelopeCodec.decode(popped.body)["dead_letter"]
    assert (block["reason"], block["error"], block["original_queue"]) == ("failed", "boom", q)
    transport.ack(popped)


def test_bodies_that_are_not_text_reach_the_sdk_as_marked_base64(ours: SqsBinding, endpoint: str, q: str) -> None:
    ours.publish(POISON, q)
    message = sdk(endpoint).pop(q, timeout=1)
    assert message.headers == {"bq-body-encoding": "base64"} and base64.b64decode(message.body) == POISON
    assert EnvelopeCodec.poison_cause(message.body).startswith("invalid JSON")  # the SDK quarantines it
    assert not EnvelopeCodec.accepts(EnvelopeCodec.decode(message.body))
