"""Interop with the official SDK's Pulsar transport (babelqueue 1.24 ``PulsarTransport``), both on the fake client.

The SDK takes an injected client (``PulsarTransport(client=...)``), so both sides talk to the same fake broker.
Compatibility facts verified here:

* Both sides send the envelope bytes unchanged and the same six ``bq-*`` string properties.
* The SDK subscribes with the client's default position (Latest): it still gets what we published before it ran,
  because our first publish created the ``babelqueue`` subscription from the earliest message.
* A negative ack by the SDK (its ``rewind``) raises the redelivery count, which our reserve reconciles into
  ``attempts`` exactly as the conformance block says. The SDK rewrites ``attempts`` in the body it hands its
  app; we report the same number in ``ReceivedMessage.attempts`` and never rewrite the stored bytes.
* An undecodable body we retry carries its count on ``bq-attempts``, which is where the SDK reads a poison
  body's count (its ``native_attempts``).
* Our dead letters land on ``<queue>.dlq``, the topic SDK apps drain.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest
from babelqueue.pulsar_transport import PulsarTransport

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.pulsar import PulsarBinding, PulsarConfig, message_properties, topic_name
from tests.bindings.pulsar_fake import FakeAdminServer, FakePulsarBroker
from tests.conftest import compact, fixture_dict

pytestmark = pytest.mark.interop

TOKEN = "interop-token"
SERVICE_URL = "pulsar://127.0.0.1:6650"
POISON = b'\xff\xfe{"job": not json'


@pytest.fixture
def broker() -> Iterator[FakePulsarBroker]:
    broker = FakePulsarBroker(token=TOKEN)
    yield broker
    for client in broker.clients:
        client.close()


@pytest.fixture
def ours(broker: FakePulsarBroker) -> Iterator[PulsarBinding]:
    with FakeAdminServer(broker) as admin:
        config = PulsarConfig(service_url=SERVICE_URL, admin_url=admin.url, token=TOKEN, redelivery_delay=0.1)
        binding = PulsarBinding(config, client_factory=broker.client)
        yield binding
        binding.close()


@pytest.fixture
def sdk(broker: FakePulsarBroker) -> PulsarTransport:
    client = broker.client(SERVICE_URL, authentication=pulsar.AuthenticationToken(TOKEN))
    return PulsarTransport(client=client, negative_ack_redelivery_delay_ms=0)


@pytest.fixture
def q() -> str:
    return f"interop-{uuid.uuid4().hex[:10]}"


def envelope_bytes(queue: str, n: int = 0) -> bytes:
    data = {"n": n, "title": "Café ☕ / naïve", "big": 2**53 + 1, "ratio": 0.1, "nested": {"list": [1, None]}}
    return bq.encode(bq.make_envelope("urn:babel:orders:created", data, queue_name=queue))


def wire_properties(broker: FakePulsarBroker, queue: str) -> list[dict[str, str]]:
    topic = broker.topics[topic_name(queue)]
    return [entry.properties for entry in topic.entries]


def test_what_we_publish_the_sdk_pops_with_the_same_properties(ours: PulsarBinding, sdk: PulsarTransport,
                                                               broker: FakePulsarBroker, q: str) -> None:
    bodies = [compact(fixture_dict("fixtures/order-created.json")), envelope_bytes(q, 1), envelope_bytes(q, 2)]
    ours.publish(bodies[0], q)
    ours.publish_batch(bodies[1:], q)
    for body in bodies:
        message = sdk.pop(q, timeout=1)
        assert message is not None and message.body.encode("utf-8") == body and message.native_attempts == 0
        sdk.ack(message)
    assert wire_properties(broker, q) == [PulsarTransport._projection(body.decode()) for body in bodies]
    assert ours.depth(q) == 0


def test_what_the_sdk_publishes_we_reserve_byte_for_byte(ours: PulsarBinding, sdk: PulsarTransport,
                                                         broker: FakePulsarBroker, q: str) -> None:
    assert ours.reserve(q, timeout=0) is None  # our consumer exists: the SDK's messages are kept for it
    body = envelope_bytes(q)
    sdk.publish(q, body.decode("utf-8"))
    message = ours.reserve(q, timeout=1)
    assert message.body == body and message.attempts == 0 and message.delivery_count == 0
    assert {k: v for k, v in message.headers.items() if k.startswith("bq-")} == message_properties(bq.decode(body))
    assert wire_properties(broker, q) == [message_properties(bq.decode(body))]
    ours.ack(message)


def test_an_sdk_negative_ack_raises_our_attempts(ours: PulsarBinding, sdk: PulsarTransport, q: str) -> None:
    body = envelope_bytes(q)
    ours.publish(body, q)
    for count in range(2):  # the SDK's handler fails twice; it rewinds (negative ack) each time
        popped = sdk.pop(q, timeout=1)  # the SDK rewrites attempts in the body it hands its app; we never do
        assert popped.native_attempts == count and bq.decode(popped.body) == bq.decode(body) | {"attempts": count}
        sdk.rewind(popped)
    message = ours.reserve(q, timeout=2)
    assert message.body == body and message.delivery_count == 2 and message.attempts == 2  # max(0, 2), no −1
    ours.ack(message)


def test_a_poison_retry_count_is_read_by_the_sdk(ours: PulsarBinding, sdk: PulsarTransport, q: str) -> None:
    ours.publish(POISON, q)
    ours.release(ours.reserve(q, timeout=1))
    ours.release(ours.reserve(q, timeout=1))
    popped = sdk.pop(q, timeout=1)
    assert popped.body.encode("utf-8", "surrogateescape") == POISON and popped.native_attempts == 2
    sdk.ack(popped)


def test_our_dead_letters_are_where_sdk_apps_drain_them(ours: PulsarBinding, sdk: PulsarTransport, q: str) -> None:
    body = envelope_bytes(q)
    ours.publish(body, q)
    ours.dead_letter(ours.reserve(q, timeout=1), bq.Reason.FAILED, error="boom", exception="GatewayTimeout")
    popped = sdk.pop(f"{q}.dlq", timeout=1)
    dead: dict[str, Any] = bq.decode(popped.body)
    assert dead["dead_letter"]["reason"] == "failed" and dead["meta"] == bq.decode(body)["meta"]
    sdk.ack(popped)
    assert ours.dead_letter_depth(q) == 0
