"""Pulsar binding specifics, against the fake client and the fake admin HTTP server (tests/bindings/pulsar_fake.py).

The shared behaviour is in test_contract.py and test_batch_ops.py (the ``pulsar`` factory in conftest). Here: the
conformance block ``pulsar`` (both sub-blocks, from the manifest: pure functions and as carried by the client),
topic naming, properties and headers, delays, release and dead-letter copies, reservations (gating, visibility
timeout, a crashed consumer), pipelined batches with exact failure indexes, size limits, the admin stats call and
its errors, TLS on the admin API, client options (checked against the real ``pulsar.Client`` too), and the hook.
"""

from __future__ import annotations

import json
import logging
import shutil
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import BindingError, NotSupportedError, PublishBatchError
from airflow_provider_babelqueue.bindings.pulsar import (
    PulsarBinding,
    PulsarConfig,
    dead_letter_topic,
    message_properties,
    reconcile_attempts,
    topic_name,
)
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.hooks.base import ConnectionConfigError
from airflow_provider_babelqueue.hooks.pulsar import BabelQueuePulsarHook
from tests.bindings.conftest import kept
from tests.bindings.pulsar_fake import FakeAdminServer, FakePulsarBroker
from tests.conftest import compact, conformance_manifest, fixture_dict, free_port

PULSAR_BLOCK = conformance_manifest()["pulsar"]
TOKEN = "eyJhbGciOiJIUzI1NiJ9.pulsar-Secret.signature"
SERVICE_URL = "pulsar://127.0.0.1:6650"
POISON = b'\xff\xfe{"job": not json'

Factory = Callable[..., PulsarBinding]


@pytest.fixture
def broker() -> FakePulsarBroker:
    return FakePulsarBroker(token=TOKEN)


@pytest.fixture
def admin(broker: FakePulsarBroker) -> Iterator[FakeAdminServer]:
    with FakeAdminServer(broker) as server:
        yield server


@pytest.fixture
def make(broker: FakePulsarBroker, admin: FakeAdminServer) -> Iterator[Factory]:
    made: list[PulsarBinding] = []

    def factory(**options: Any) -> PulsarBinding:
        config = PulsarConfig(**({"service_url": SERVICE_URL, "admin_url": admin.url, "token": TOKEN} | options))
        made.append(PulsarBinding(config, client_factory=broker.client))
        return made[-1]

    yield factory
    for binding in made:
        binding.close()


@pytest.fixture
def q() -> str:
    return f"bq-{uuid.uuid4().hex[:10]}"


def body_for(queue: str, n: int = 0, **data: Any) -> bytes:
    return bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n, **data}, queue_name=queue))


def raw_messages(broker: FakePulsarBroker, topic: str, count: int) -> list[Any]:
    """What the topic holds, read by a plain client on a subscription of its own (from the earliest message)."""
    client = broker.client(SERVICE_URL, authentication=pulsar.AuthenticationToken(TOKEN))
    consumer = client.subscribe(topic, f"inspect-{uuid.uuid4().hex[:6]}",
                                initial_position=pulsar.InitialPosition.Earliest)
    try:
        return [consumer.receive(timeout_millis=1000) for _ in range(count)]
    finally:
        client.close()


# ---------------------------------------------------------------------------- conformance block "pulsar"


def test_property_projection_matches_the_conformance_block() -> None:
    block = PULSAR_BLOCK["property_projection"]
    assert message_properties(fixture_dict(block["envelope_file"])) == block["properties"]


@pytest.mark.parametrize("case", PULSAR_BLOCK["attempts_reconciliation"]["cases"], ids=lambda c: c["name"])
def test_attempts_reconciliation_matches_the_conformance_block(case: dict[str, Any]) -> None:
    assert reconcile_attempts(case["body_attempts"], case["redelivery_count"]) == case["expected_attempts"]


def test_projection_as_carried_by_the_client(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    block = PULSAR_BLOCK["property_projection"]
    body = compact(fixture_dict(block["envelope_file"]))
    make().publish(body, q)
    [message] = raw_messages(broker, topic_name(q), 1)
    assert message.data() == body
    assert message.properties() == block["properties"]  # exactly the six, all strings
    assert message.partition_key() == block["properties"]["bq-trace-id"]


@pytest.mark.parametrize("case", PULSAR_BLOCK["attempts_reconciliation"]["cases"], ids=lambda c: c["name"])
def test_reconciliation_with_real_redeliveries(make: Factory, broker: FakePulsarBroker, q: str,
                                               case: dict[str, Any]) -> None:
    """The body says ``body_attempts``; another consumer of the subscription fails it ``redelivery_count``
    times (negative acks); our reserve then reports the conformance block's number."""
    binding = make()
    env = bq.make_envelope("urn:babel:orders:created", {}, queue_name=q)
    env["attempts"] = case["body_attempts"]
    binding.publish(bq.encode(env), q)
    client = broker.client(SERVICE_URL, authentication=pulsar.AuthenticationToken(TOKEN))
    shared = {"consumer_type": pulsar.ConsumerType.Shared, "negative_ack_redelivery_delay_ms": 0}
    bystander = client.subscribe(q, "babelqueue", receiver_queue_size=0, **shared)  # keeps the tracker alive
    other = client.subscribe(q, "babelqueue", **shared)
    for expected in range(case["redelivery_count"]):
        message = other.receive(timeout_millis=1000)
        assert message.redelivery_count() == expected
        other.negative_acknowledge(message)
    other.close()
    message = binding.reserve(q, timeout=1)
    assert message is not None and message.delivery_count == case["redelivery_count"]
    assert message.attempts == case["expected_attempts"] and message.envelope["attempts"] == case["body_attempts"]
    binding.ack(message)
    bystander.close()


# ----------------------------------------------------------------------------------- naming and config


def test_topic_names() -> None:
    assert topic_name("orders") == "persistent://public/default/orders"
    assert topic_name("orders", "acme", "billing") == "persistent://acme/billing/orders"
    assert topic_name("persistent://acme/billing/orders") == "persistent://acme/billing/orders"
    assert dead_letter_topic("orders") == "persistent://public/default/orders.dlq"
    assert dead_letter_topic("orders", "-failed", "acme", "ns") == "persistent://acme/ns/orders-failed"
    for bad, message in [
        ("non-persistent://public/default/x", "only persistent:// topics"),
        ("persistent://public/x", "not of the form persistent://<tenant>/<namespace>/<topic>"),
        ("a/b", "not a valid Pulsar topic name"),
        ("", "not a valid Pulsar topic name"),
        ("with space", "not a valid Pulsar topic name"),
    ]:
        with pytest.raises(BindingError, match=message):
            topic_name(bad)


def test_the_binding_uses_its_tenant_namespace_and_suffix(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    binding = make(tenant="acme", namespace="billing", dead_letter_suffix="-failed")
    binding.publish(body_for(q), q)
    binding.dead_letter(binding.reserve(q, timeout=1), "failed")
    assert binding.dead_letter_name(q) == f"persistent://acme/billing/{q}-failed"
    assert set(broker.topics) == {f"persistent://acme/billing/{q}", f"persistent://acme/billing/{q}-failed"}
    assert binding.dead_letter_depth(q) == 1 and binding.depth(q) == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"service_url": "http://broker:6650"}, "service_url must be pulsar://host:port or pulsar\\+ssl://"),
        ({"admin_url": "pulsar://broker:8080"}, "admin_url must be http://host:port or https://host:port"),
        ({"tenant": "a/b"}, "tenant may hold"),
        ({"subscription": ""}, "subscription may hold"),
        ({"visibility_timeout": 0}, "visibility_timeout must be a positive number"),
        ({"receiver_queue_size": 0}, "receiver_queue_size must be a whole number of at least 1"),
        ({"max_message_bytes": 10}, "max_message_bytes must be 1024-2147483647"),
    ],
)
def test_config_refuses_what_cannot_work(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PulsarConfig(**options)


def test_token_stays_out_of_repr() -> None:
    assert TOKEN not in repr(PulsarConfig(token=TOKEN)) and "token" not in repr(PulsarConfig(token=TOKEN))


def test_client_options(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    binding = make(tls_trust_certs_file_path="/etc/ssl/ca.pem", operation_timeout_seconds=7)
    binding.publish(body_for(q), q)
    [client] = broker.clients
    options = client.options
    assert isinstance(options["authentication"], pulsar.AuthenticationToken)
    assert (options["tls_trust_certs_file_path"], options["tls_validate_hostname"]) == ("/etc/ssl/ca.pem", True)
    assert (options["tls_allow_insecure_connection"], options["operation_timeout_seconds"]) == (False, 7)
    assert isinstance(options["logger"], logging.Logger) and client.service_url == SERVICE_URL
    binding.close()
    assert client.closed


def test_the_real_client_accepts_the_options_and_reports_a_missing_broker(admin: FakeAdminServer) -> None:
    """The real ``pulsar.Client`` (no fake), with every option the binding passes; no broker at the port."""
    config = PulsarConfig(service_url=f"pulsar://127.0.0.1:{free_port()}", admin_url=admin.url, token=TOKEN,
                          operation_timeout_seconds=1)
    binding = PulsarBinding(config)
    with pytest.raises(BindingError) as caught:
        binding.ping()
    text = str(caught.value)
    assert "look up 'persistent://public/default/babelqueue-ping' failed: no answer within" in text
    assert "(Timeout: Pulsar error: TimeOut)" in text and TOKEN not in text
    binding.close()


def test_a_missing_token_is_reported(make: Factory, q: str) -> None:
    binding = make(token=None)
    with pytest.raises(BindingError, match="the broker refused the credentials; check the token"):
        binding.publish(body_for(q), q)
    with pytest.raises(BindingError, match=r"refused the token \(401\); .* \(Authentication required\)"):
        binding.depth(q)


# --------------------------------------------------------------------------------- what goes on the wire


def test_subscription_exists_before_the_first_publish(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    body = body_for(q)
    make().publish(body, q)
    [sub] = broker.topics[topic_name(q)].subscriptions.values()
    assert (sub.name, sub.kind, sub.mark, sub.consumers) == ("babelqueue", pulsar.ConsumerType.Shared, 0, [])
    late = broker.client(SERVICE_URL, authentication=pulsar.AuthenticationToken(TOKEN)).subscribe(
        q, "babelqueue", consumer_type=pulsar.ConsumerType.Shared  # the client's default position: Latest
    )
    assert late.receive(timeout_millis=500).data() == body  # kept for a consumer that joins later
    late.close()


def test_headers_join_the_properties_and_come_back(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    binding = make()
    body = body_for(q)
    binding.publish(body, q, headers={"bq-replay-bypass": 1, "bq-job": "urn:spoofed", "tenant": "acme", "x": None})
    [raw] = raw_messages(broker, topic_name(q), 1)
    assert raw.properties() == message_properties(bq.decode(body)) | {"bq-replay-bypass": "1", "tenant": "acme"}
    message = binding.reserve(q, timeout=1)
    assert message.headers == raw.properties() | {
        "pulsar.message_id": str(raw.message_id()),
        "pulsar.publish_time": raw.publish_timestamp(),
    }
    binding.ack(message)


def test_publish_with_delay_uses_deliver_after(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    binding = make()
    assert binding.reserve(q, timeout=0) is None  # a consumer is connected: the dispatcher tracks delays
    body = body_for(q)
    binding.publish(body, q, delay=0.5)
    stats = broker.stats(topic_name(q))["subscriptions"]["babelqueue"]
    assert (stats["msgBacklog"], stats["msgDelayed"], binding.depth(q)) == (1, 1, 0)
    assert binding.reserve(q, timeout=0) is None
    [raw] = raw_messages(broker, topic_name(q), 1)  # waits until it is due
    assert raw.properties()["bq-delay"] == "500"
    message = binding.reserve(q, timeout=2)
    assert message is not None and message.body == body
    binding.ack(message)
    with pytest.raises(BindingError, match="a delay must be a finite number of seconds"):
        binding.publish(body, q, delay=float("inf"))


def test_size_limit_is_checked_before_sending(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    binding = make(max_message_bytes=1024)
    with pytest.raises(BindingError, match=r"a 2000-byte body for .* is over max_message_bytes=1024; nothing"):
        binding.publish(b"x" * 2000, q)
    assert topic_name(q) not in broker.topics
    small = FakePulsarBroker(token=TOKEN, max_message_size=1500)
    with FakeAdminServer(small) as server:
        other = PulsarBinding(PulsarConfig(admin_url=server.url, token=TOKEN), client_factory=small.client)
        with pytest.raises(BindingError, match="over the broker's maxMessageSize.*MessageTooBig"):
            other.publish(b"y" * 2000, q)
        other.close()


# ------------------------------------------------------------------------------ retries and dead letters


def test_release_publishes_a_copy_then_acks(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    binding = make()
    body = body_for(q)
    binding.publish(body, q, headers={"tenant": "acme"})
    binding.release(binding.reserve(q, timeout=1), delay=0.2)
    stats = broker.stats(topic_name(q))["subscriptions"]["babelqueue"]
    assert (stats["msgBacklog"], stats["msgDelayed"], stats["unackedMessages"]) == (1, 1, 0)
    again = binding.reserve(q, timeout=2)
    expected = bq.decode(body) | {"attempts": 1}
    assert again.body == bq.encode(expected) and again.delivery_count == 0 and again.attempts == 1
    assert {k: again.headers[k] for k in ("bq-attempts", "bq-delay", "tenant")} == {
        "bq-attempts": "1", "bq-delay": "200", "tenant": "acme"}
    binding.ack(again)


def test_poison_keeps_its_bytes_and_counts_on_a_property(make: Factory, q: str) -> None:
    binding = make()
    binding.publish(POISON, q)
    first = binding.reserve(q, timeout=1)
    assert (first.body, first.attempts, first.headers.get("bq-attempts")) == (POISON, 0, None)
    binding.release(first)
    second = binding.reserve(q, timeout=1)
    assert (second.body, second.attempts, second.headers["bq-attempts"]) == (POISON, 1, "1")
    binding.release(second)
    third = binding.reserve(q, timeout=1)
    assert (third.body, third.attempts) == (POISON, 2)
    binding.dead_letter(third, bq.Reason.POISON, error=third.decode_error)
    dead = binding.reserve_dead_letter(q, timeout=1)
    # the count travels in the poison wrapper's block now that the bytes sit inside one
    assert (kept(dead), dead.attempts, dead.from_dead_letter) == (POISON, 2, True)
    binding.ack(dead)


def test_dead_letter_copy_and_a_drain_that_puts_it_back(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    binding = make(redelivery_delay=0.2)
    binding.publish(body_for(q, 3), q)
    binding.release(binding.reserve(q, timeout=1))
    binding.dead_letter(binding.reserve(q, timeout=1), bq.Reason.FAILED, error="boom", exception="GatewayTimeout")
    [raw] = raw_messages(broker, dead_letter_topic(q), 1)
    annotated = bq.decode(raw.data())
    assert annotated["dead_letter"]["attempts"] == 1 and annotated["dead_letter"]["original_queue"] == q
    assert raw.properties() == message_properties(annotated)
    assert broker.topics[dead_letter_topic(q)].subscriptions["babelqueue"].mark == 0
    dead = binding.reserve_dead_letter(q, timeout=1)
    binding.release(dead, delay=30)  # back to the DLQ unchanged, after redelivery_delay (the delay does not apply)
    assert binding.reserve_dead_letter(q, timeout=0) is None
    back = binding.reserve_dead_letter(q, timeout=2)
    assert back.body == dead.body == raw.data() and back.delivery_count == 1 and back.from_dead_letter
    binding.ack(back)
    assert binding.dead_letter_depth(q) == 0 and binding.depth(q) == 0


def test_browse_and_seen_store_are_refused_clearly(make: Factory, q: str) -> None:
    binding = make()
    with pytest.raises(NotSupportedError, match=f"Pulsar cannot list the dead letters of 'persistent://public/"
                                                f"default/{q}.dlq' without taking them"):
        binding.browse_dead_letters(q)
    with pytest.raises(NotSupportedError, match=r"use a babelqueue\+sql or babelqueue\+redis connection"):
        binding.seen_store("ledger")


# ---------------------------------------------------------------------------------------- reservations


def test_a_late_settle_of_an_expired_reservation_changes_nothing(make: Factory, q: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    binding = make(visibility_timeout=0.3, redelivery_delay=0.1)
    body = body_for(q)
    binding.publish(body, q)
    stale = binding.reserve(q, timeout=1)
    time.sleep(0.4)
    current = binding.reserve(q, timeout=2)  # expired, negatively acknowledged, redelivered: same message id
    assert current.body == body and current.delivery_count == 1 and current.attempts == 1
    assert current.headers["pulsar.message_id"] == stale.headers["pulsar.message_id"]
    with caplog.at_level(logging.WARNING, "airflow_provider_babelqueue.bindings.pulsar"):
        binding.ack(stale)
        binding.release(stale)
    assert sum("is no longer held by this reservation" in r.message for r in caplog.records) == 2
    assert binding.depth(q) == 0 and binding.reserve(q, timeout=0) is None  # still held by `current`
    binding.ack(current)
    binding.ack(current)  # settled twice: the second one is a warning too, nothing else
    assert binding.depth(q) == 0


def test_a_crashed_consumers_message_goes_to_another(make: Factory, q: str) -> None:
    survivor, crashing = make(), make()
    assert survivor.reserve(q, timeout=0) is None  # connected
    body = body_for(q)
    crashing.publish(body, q)
    assert crashing.reserve(q, timeout=1).body == body
    crashing.close()  # dies holding it: the broker redelivers to the other consumer, counted
    again = survivor.reserve(q, timeout=1)
    assert again.body == body and again.delivery_count == 1 and again.attempts == 1
    survivor.ack(again)


def test_zero_queue_consumers_cannot_receive_with_a_timeout(broker: FakePulsarBroker) -> None:
    """What the binding relies on when it creates the subscription with a zero-size queue, as the C++ client."""
    consumer = broker.client(SERVICE_URL, authentication=pulsar.AuthenticationToken(TOKEN)).subscribe(
        "t", "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=0
    )
    with pytest.raises(pulsar.InvalidConfiguration):
        consumer.receive(timeout_millis=10)
    with pytest.raises(pulsar.Timeout, match="Pulsar error: TimeOut"):
        broker.client(SERVICE_URL, authentication=pulsar.AuthenticationToken(TOKEN)).subscribe(
            "t", "s", consumer_type=pulsar.ConsumerType.Shared
        ).receive(timeout_millis=10)


# -------------------------------------------------------------------------------------------- batches


def test_publish_batch_pipelines_and_names_the_failed_bodies(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    binding = make()
    bodies = [body_for(q, i) for i in range(25)]
    binding.publish_batch(bodies, q)
    assert [m.data() for m in raw_messages(broker, topic_name(q), 25)] == bodies
    rejected = {bodies[3], bodies[17]}
    broker.send_hook = lambda topic, data: pulsar.Result.ProducerQueueIsFull if data in rejected else None
    with pytest.raises(PublishBatchError) as caught:
        binding.publish_batch(bodies, q)
    assert caught.value.failed == [3, 17]
    assert "2 of 25 bodies for 'persistent://public/default" in str(caught.value) and "ProducerQueueIsFull" in str(
        caught.value)
    assert binding.depth(q) == 25 + 23


def test_an_oversize_body_fails_the_batch_before_sending(make: Factory, broker: FakePulsarBroker, q: str) -> None:
    binding = make(max_message_bytes=2048)
    with pytest.raises(PublishBatchError, match=r"bodies \[1\] are over max_message_bytes=2048; nothing was sent") as e:
        binding.publish_batch([body_for(q), b"z" * 3000, body_for(q)], q)
    assert e.value.failed == [0, 1, 2] and topic_name(q) not in broker.topics
    binding.publish_batch([], q)


# --------------------------------------------------------------------------------------------- counts


def test_depth_is_one_admin_get_with_the_token(make: Factory, admin: FakeAdminServer, q: str) -> None:
    binding = make()
    assert binding.depth(q) == 0  # no such topic: 404
    binding.publish_batch([body_for(q, i) for i in range(3)], q)
    held = binding.reserve(q, timeout=1)
    admin.requests.clear()
    assert (binding.depth(q), binding.dead_letter_depth(q)) == (2, 0)
    assert admin.requests == [
        ("GET", f"/admin/v2/persistent/public/default/{q}/stats", f"Bearer {TOKEN}"),
        ("GET", f"/admin/v2/persistent/public/default/{q}.dlq/stats", f"Bearer {TOKEN}"),
    ]
    binding.ack(held)


def test_an_unreachable_admin_api_is_reported(make: Factory, q: str) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BindingError, match=f"Pulsar admin {closed}/admin/v2/persistent/public/default/{q}/stats: "
                                           "cannot read topic stats: check admin_url"):
        make(admin_url=closed).depth(q)


def test_the_fake_admin_lists_and_deletes_topics(make: Factory, broker: FakePulsarBroker, admin: FakeAdminServer,
                                                 q: str) -> None:
    """The endpoints the live suite's cleanup uses, on the test double itself."""
    import urllib.error
    import urllib.request

    def call(method: str, path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(admin.url + path, method=method, headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    binding = make()
    binding.publish(body_for(q), q)
    assert call("GET", "/admin/v2/persistent/public/default") == (200, json.dumps([topic_name(q)]).encode())
    assert call("DELETE", f"/admin/v2/persistent/public/default/{q}") == (
        412, b'{"reason": "Topic has active producers/subscriptions"}')
    assert call("DELETE", f"/admin/v2/persistent/public/default/{q}?force=true") == (204, b"")
    assert call("DELETE", f"/admin/v2/persistent/public/default/{q}?force=true")[0] == 404
    assert broker.topics == {} and binding.depth(q) == 0


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA and a server certificate for ``localhost`` only (no IP address in it)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed for the admin TLS test and is not on PATH")
    tmp = tmp_path_factory.mktemp("pulsar-tls")
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
         "-days", "2", "-subj", "/CN=babelqueue-test-ca", cwd=tmp)
    _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=localhost", cwd=tmp)
    (tmp / "san.ext").write_text("subjectAltName=DNS:localhost\n")
    _run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.crt", "-days", "2", "-extfile", "san.ext", cwd=tmp)
    return tmp


def test_admin_api_over_tls(broker: FakePulsarBroker, certificates: Path, q: str) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates / "server.crt", certificates / "server.key")
    ca = str(certificates / "ca.crt")
    with FakeAdminServer(broker, ssl_context=context) as server:

        def depth(url: str, **options: Any) -> int:
            binding = PulsarBinding(PulsarConfig(admin_url=url, token=TOKEN, **options), client_factory=broker.client)
            try:
                return binding.depth(q)
            finally:
                binding.close()

        by_name, by_ip = f"https://localhost:{server.port}", server.url
        assert depth(by_name, tls_trust_certs_file_path=ca) == 0
        with pytest.raises(BindingError, match="cannot read topic stats.*CERTIFICATE_VERIFY_FAILED"):
            depth(by_ip, tls_trust_certs_file_path=ca)  # the certificate does not name 127.0.0.1
        assert depth(by_ip, tls_trust_certs_file_path=ca, tls_validate_hostname=False) == 0
        with pytest.raises(BindingError, match="CERTIFICATE_VERIFY_FAILED"):
            depth(by_name)  # not signed by a CA the system trusts
        assert depth(by_ip, tls_allow_insecure_connection=True) == 0
        assert all(auth == f"Bearer {TOKEN}" for _, _, auth in server.requests) and len(server.requests) == 3


# ----------------------------------------------------------------------------------------------- hook


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, spec: dict[str, Any]) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(spec))
    return conn_id


def test_hook_builds_the_binding_from_allowlisted_extras(monkeypatch: pytest.MonkeyPatch, broker: FakePulsarBroker,
                                                         admin: FakeAdminServer, q: str) -> None:
    extra = {
        "admin_url": admin.url,
        "tenant": "acme",
        "namespace": "orders",
        "dead_letter_suffix": "-dead",
        "visibility_timeout": "45",
        "redelivery_delay": "0.5",
        "receiver_queue_size": "10",
        "tls_validate_hostname": "false",
        "topic_prefix": "not read",
    }
    conn_id = define(monkeypatch, "bq_pulsar", {"conn_type": "babelqueue+pulsar", "host": "127.0.0.1",
                                                "password": TOKEN, "extra": extra})
    assert isinstance(get_hook(conn_id), BabelQueuePulsarHook)
    hook = BabelQueuePulsarHook(conn_id, client_factory=broker.client)
    config = hook.get_binding().config
    assert (config.service_url, config.admin_url, config.token) == (SERVICE_URL, admin.url, TOKEN)
    assert (config.tenant, config.namespace, config.dead_letter_suffix) == ("acme", "orders", "-dead")
    assert (config.visibility_timeout, config.redelivery_delay, config.receiver_queue_size) == (45.0, 0.5, 10)
    assert config.tls_validate_hostname is False and config.subscription == "babelqueue"
    binding = hook.get_binding()
    binding.publish(body_for(q), q)
    binding.dead_letter(binding.reserve(q, timeout=1), "failed")
    assert binding.dead_letter_depth(q) == 1 and f"persistent://acme/orders/{q}-dead" in broker.topics
    hook.close()


def test_hook_test_connection_has_no_side_effects(monkeypatch: pytest.MonkeyPatch, broker: FakePulsarBroker,
                                                  admin: FakeAdminServer) -> None:
    conn_id = define(monkeypatch, "bq_pulsar_ping", {"conn_type": "babelqueue+pulsar", "host": "127.0.0.1",
                                                     "password": TOKEN, "extra": {"admin_url": admin.url}})
    hook = BabelQueuePulsarHook(conn_id, client_factory=broker.client)
    assert hook.test_connection() == (True, f"Connected to BabelQueue Apache Pulsar at {SERVICE_URL} (admin "
                                            f"{admin.url})")
    assert broker.topics == {} and [client.closed for client in broker.clients] == [True]
    assert admin.requests == [("GET", "/admin/v2/persistent/public/default/babelqueue-ping/stats", f"Bearer {TOKEN}")]


def test_hook_test_connection_says_what_is_wrong(monkeypatch: pytest.MonkeyPatch, broker: FakePulsarBroker,
                                                 admin: FakeAdminServer) -> None:
    wrong = define(monkeypatch, "bq_pulsar_wrong", {"conn_type": "babelqueue+pulsar", "password": "not-the-token",
                                                    "extra": {"admin_url": admin.url}})
    ok, message = BabelQueuePulsarHook(wrong, client_factory=broker.client).test_connection()
    assert ok is False and "refused the token (401)" in message and "not-the-token" not in message
    closed = define(monkeypatch, "bq_pulsar_closed", {"conn_type": "babelqueue+pulsar", "host": "127.0.0.1",
                                                      "port": free_port(), "password": TOKEN,
                                                      "extra": {"admin_url": admin.url,
                                                                "operation_timeout_seconds": 1}})
    ok, message = BabelQueuePulsarHook(closed).test_connection()  # the real client: nothing listens there
    assert ok is False and "no answer within operation_timeout_seconds" in message and TOKEN not in message


def test_hook_urls() -> None:
    from airflow.sdk import Connection

    hook = BabelQueuePulsarHook("unused")
    assert hook.urls(Connection(conn_id="a", conn_type="babelqueue+pulsar", host="pulsar.internal"), {}) == (
        "pulsar://pulsar.internal:6650", "http://pulsar.internal:8080")
    assert hook.urls(Connection(conn_id="b", conn_type="babelqueue+pulsar", host="pulsar.internal"),
                     {"ssl": "true"}) == ("pulsar+ssl://pulsar.internal:6651", "https://pulsar.internal:8443")
    full = Connection(conn_id="c", conn_type="babelqueue+pulsar", host="pulsar+ssl://p1:6651,p2:6651")
    assert hook.urls(full, {"admin_url": "https://admin:443"}) == ("pulsar+ssl://p1:6651,p2:6651", "https://admin:443")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"ssl": "maybe"}, "'ssl' must be true or false"),
        ({"receiver_queue_size": "1.5"}, "'receiver_queue_size' must be a whole number"),
        ({"receiver_queue_size": "0"}, "receiver_queue_size must be a whole number of at least 1"),
        ({"admin_url": "ftp://x"}, "admin_url must be http://host:port or https://host:port"),
        ({"redelivery_delay": "-1"}, "'redelivery_delay' must not be negative"),
    ],
)
def test_hook_bad_fields_name_the_field(monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], message: str) -> None:
    hook = BabelQueuePulsarHook(define(monkeypatch, "bq_pulsar_bad", {"conn_type": "babelqueue+pulsar",
                                                                      "extra": extra}))
    with pytest.raises(ConnectionConfigError, match=message):
        hook.get_binding()
