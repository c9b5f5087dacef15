"""Live interop with the official SDK's SQS transport (babelqueue 1.24 ``SqsTransport``) on moto's server.

Compatibility facts verified here:

* Both sides send the envelope text as the MessageBody unchanged and project the same six ``bq-*``
  MessageAttributes (same names, String/Number types and values), so either side routes on the other's.
* The SDK's ``pop`` rewrites the body only to raise ``attempts`` to ``ApproximateReceiveCount - 1``; we never
  rewrite on read and report the same reconciled number in ``ReceivedMessage.attempts``.
* FIFO: both use group = the queue name and deduplication id = meta.id.
* DLQ names differ by default (the SDK: ``<queue>-dlq``; ours: ``<queue>-failed``); ``dead_letter_suffix="-dlq"``
  makes our dead letters land where SDK apps drain theirs. With default settings every read of ours takes
  both: the SDK worker's dead letters (standard, and FIFO: all in one message group) are counted, drained in
  one run and redriven, and the SDK's worker handles the redriven envelopes; no ``-failed`` queue is created.
* For the same delivery (one ReceiveMessage reply) our ``attempts`` is what the SDK's handler sees.
* A body SQS cannot carry as text reaches the SDK as base64 text with ``bq-body-encoding: base64`` (our
  extension): the SDK sees poison, which is what those bytes are, and the header tells a human how to read it.
"""

from __future__ import annotations

import base64
import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from babelqueue import BabelQueue, EnvelopeCodec
from babelqueue.sqs_transport import SqsTransport

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.bindings.sqs import SqsBinding, SqsConfig, message_attributes
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, drain_dead_letters
from airflow_provider_babelqueue.engine.replay import Replayer, feed_from_dead_letters
from tests.bindings.sqs_server import (
    REGION,
    queue_urls,
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
            create_queues=True,
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


# ------------------------------------------------------------------ the SDK's worker as the dead-lettering peer


@pytest.fixture
def default(endpoint: str, admin: Any) -> Iterator[SqsBinding]:
    """Our binding with default settings but queue creation: writes ``-failed``, reads the RedrivePolicy target,
    ``-failed``, ``-dlq``."""
    binding = SqsBinding(SqsConfig(region_name=REGION, endpoint_url=endpoint, aws_access_key_id="testing",
                                   aws_secret_access_key="testing", create_queues=True))
    yield binding
    binding.close()


def failing_sdk_worker(endpoint: str, admin: Any, queue: str, count: int) -> list[str]:
    """The SDK's worker (``BabelQueue`` on ``SqsTransport``, ``max_attempts=1``, dead letters on) handling
    ``count`` messages it published with a handler that raises: each is dead-lettered where the SDK writes,
    ``<queue>-dlq`` (FIFO: ``<queue>-dlq.fifo``, every dead letter in that one message group). Returns the
    meta.ids, in publishing order."""
    fifo = queue.endswith(".fifo")
    attributes = {"FifoQueue": "true", "ContentBasedDeduplication": "false"} if fifo else {}
    transport = sdk(endpoint, fifo=fifo)
    for name in (queue, transport.dead_letter_queue_name(queue)):  # the SDK expects its queues to exist
        admin.create_queue(QueueName=name, Attributes=attributes)
    app = BabelQueue(transport=transport, queue=queue, max_attempts=1, dead_letter=True)

    def fail(data: dict[str, Any], meta: dict[str, Any]) -> None:
        raise RuntimeError(f"payment gateway timeout for order {data['order_id']}")

    app.register("urn:babel:orders:created", fail)
    ids = [app.publish("urn:babel:orders:created", {"order_id": n}) for n in range(count)]
    assert app.consume(queue, max_messages=count, timeout=1, handle_signals=False) == count
    return ids


def sdk_worker_handles(endpoint: str, queue: str, count: int) -> list[dict[str, Any]]:
    """The SDK's worker handling ``count`` messages of ``queue`` successfully; the envelopes its handler saw."""
    seen: list[dict[str, Any]] = []
    app = BabelQueue(transport=sdk(endpoint, fifo=queue.endswith(".fifo")), queue=queue)
    app.register("urn:babel:orders:created", lambda data, meta, envelope: seen.append(envelope))
    app.consume(queue, max_messages=count, timeout=1, handle_signals=False)
    return seen


@pytest.mark.parametrize(("kind", "count"), [("standard", 3), ("fifo", 5)])
def test_the_sdk_workers_dead_letters_are_counted_and_drained_by_default(
    default: SqsBinding, endpoint: str, admin: Any, q: str, tmp_path: Path, kind: str, count: int
) -> None:
    queue = f"{q}.fifo" if kind == "fifo" else q
    ids = failing_sdk_worker(endpoint, admin, queue, count)
    sdk_dlq = sdk(endpoint).dead_letter_queue_name(queue)
    assert sdk_dlq in default.dead_letter_sources(queue) and default.dead_letter_name(queue) != sdk_dlq
    assert default.dead_letter_depth(queue) == count
    result = drain_dead_letters([DrainSource(default, queue, "sqs")], LocalFileSink(tmp_path / "dead.jsonl"))
    records = [orjson.loads(line) for line in (tmp_path / "dead.jsonl").read_bytes().splitlines()]
    assert result.records == count and [r["meta_id"] for r in records] == ids  # one run, FIFO order kept
    assert {bq.decode(r["body"].encode())["dead_letter"]["reason"] for r in records} == {"failed"}
    assert default.dead_letter_depth(queue) == 0
    our_dlq = default.dead_letter_name(queue)
    assert not any(url.endswith(f"/{our_dlq}") for url in queue_urls(admin))  # reads created no empty -failed


@pytest.mark.parametrize(("kind", "count"), [("standard", 3), ("fifo", 5)])
def test_a_redrive_of_the_sdk_workers_dead_letters_is_handled_by_the_sdk(
    default: SqsBinding, endpoint: str, admin: Any, q: str, kind: str, count: int
) -> None:
    queue = f"{q}.fifo" if kind == "fifo" else q
    ids = failing_sdk_worker(endpoint, admin, queue, count)
    replayer = Replayer(target=default, ledger_binding=MemoryBinding(), source=default)
    feed_from_dead_letters(replayer, default, queue, 0.0)
    replayer.finish()
    assert replayer.result.as_dict()["replayed"] == count and default.dead_letter_depth(queue) == 0
    seen = sdk_worker_handles(endpoint, queue, count)  # FIFO: within 5 minutes of the originals, none deduplicated
    assert [envelope["meta"]["id"] for envelope in seen] == ids
    for envelope in seen:
        assert envelope["attempts"] == 0 and "dead_letter" not in envelope and envelope["meta"]["queue"] == queue
        assert EnvelopeCodec.accepts(envelope)


class OneReply:
    """A client answering ReceiveMessage with one recorded reply (every other call goes to the real client): our
    binding then reads exactly the delivery the SDK's worker read."""

    def __init__(self, client: Any, reply: dict[str, Any]) -> None:
        self.client, self.reply = client, reply

    def receive_message(self, **_: Any) -> dict[str, Any]:
        return copy.deepcopy(self.reply)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_for_the_same_delivery_our_attempts_are_what_the_sdk_handler_sees(
    endpoint: str, admin: Any, q: str
) -> None:
    url = admin.create_queue(QueueName=q)["QueueUrl"]
    raw = EnvelopeCodec.encode(EnvelopeCodec.make("urn:babel:orders:created", {"order_id": 9}, queue=q))
    admin.send_message(QueueUrl=url, MessageBody=raw)
    [first] = admin.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]  # delivery 1, not settled
    admin.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    client, replies, seen = sqs_client(endpoint), [], []
    client.meta.events.register("after-call.sqs.ReceiveMessage",
                                lambda parsed, **_: replies.append(copy.deepcopy(parsed)))
    app = BabelQueue(transport=SqsTransport(client=client), queue=q)
    app.register("urn:babel:orders:created", lambda data, meta, envelope: seen.append(envelope["attempts"]))
    assert app.consume(q, max_messages=1, timeout=1, handle_signals=False) == 1
    [reply] = [r for r in replies if r.get("Messages")]
    assert reply["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == "2"
    binding = SqsBinding(SqsConfig(region_name=REGION, endpoint_url=endpoint, aws_access_key_id="testing",
                                   aws_secret_access_key="testing"), client=OneReply(client, reply))
    message = binding.reserve(q)
    assert message is not None and message.delivery_count == 2
    assert [message.attempts] == seen == [1]
    assert message.body == raw.encode()  # the SDK rewrote its copy to say attempts 1; ours reads it unchanged
