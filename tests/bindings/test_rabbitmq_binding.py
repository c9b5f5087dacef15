"""RabbitMQ-specific behaviour of the RabbitMQ binding against the real broker (the contract suite covers the rest).

Every test uses its own queue names; the ``queue`` fixture deletes the queue, its DLQs, its delay queues and
every queue a binding made here created. The management plugin is not needed: queues are inspected with
passive declares and ``basic.get`` on a raw pika channel.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import BindingError, NotSupportedError, PublishBatchError
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQBinding, RabbitMQConfig, amqp_properties
from tests.bindings.conftest import kept
from tests.conftest import ROOT, compact, conformance_manifest, fixture_dict, free_port

HOST, PORT = "127.0.0.1", 5672
POISON = b'\xff\xfe{"job": not json\x00'

Make = Callable[..., RabbitMQBinding]


@pytest.fixture(scope="module")
def admin() -> Iterator[Any]:
    """A raw pika channel on the test broker (fails, never skips, when the broker is down)."""
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters(HOST, PORT))
    except pika.exceptions.AMQPError as exc:
        pytest.fail(f"no RabbitMQ broker at {HOST}:{PORT} (make test starts one): {exc!r}")
    holder = {"channel": connection.channel()}
    yield holder
    connection.close()


def channel_of(admin: dict) -> Any:
    """The admin channel, reopened if a failed passive declare closed it."""
    if admin["channel"].is_closed:
        admin["channel"] = admin["channel"].connection.channel()
    return admin["channel"]


def ready_count(admin: dict, name: str) -> int | None:
    """Ready messages in ``name``, or ``None`` when the queue does not exist."""
    try:
        return channel_of(admin).queue_declare(name, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return None


def raw_get(admin: dict, name: str) -> tuple[Any, Any, bytes]:
    method, props, body = channel_of(admin).basic_get(name, auto_ack=True)
    assert method is not None, f"expected a message on {name}"
    return method, props, body


@pytest.fixture
def queue(admin: dict) -> Iterator[str]:
    name = f"bqtest-{uuid.uuid4().hex[:12]}"
    yield name
    for suffix in ("", ".failed", ".dlq", ".native", ".delay.1000", ".delay.30000"):
        channel_of(admin).queue_delete(f"{name}{suffix}")


@pytest.fixture
def make(admin: dict) -> Iterator[Make]:
    made: list[RabbitMQBinding] = []

    def factory(**options: Any) -> RabbitMQBinding:
        made.append(RabbitMQBinding(RabbitMQConfig(host=HOST, port=PORT, **options)))
        return made[-1]

    yield factory
    for binding in made:
        binding.close()
        for name in binding.declared_queues:
            channel_of(admin).queue_delete(name)


def body_for(queue: str, n: int = 0) -> bytes:
    return bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n, "note": "Café ☕"}, queue_name=queue))


def must(message: ReceivedMessage | None) -> ReceivedMessage:
    assert message is not None, "expected a message"
    return message


def props_dict(props: Any) -> dict[str, Any]:
    names = ("content_type", "content_encoding", "delivery_mode", "type", "correlation_id", "message_id", "app_id",
             "headers", "priority", "reply_to", "expiration", "timestamp", "user_id", "cluster_id")
    return {name: getattr(props, name) for name in names}


# ------------------------------------------------------------------------------------------ conformance


def test_conformance_property_projection_pure_function() -> None:
    block = conformance_manifest()["rabbitmq"]["property_projection"]
    envelope = fixture_dict(block["envelope_file"])
    for source in (envelope, compact(envelope)):
        props = amqp_properties(source)
        assert {k: props[k] for k in block["properties"]} == block["properties"]
        assert props["headers"] == block["headers"]
        assert [type(v) for v in props["headers"].values()] == [type(v) for v in block["headers"].values()]
        assert props == {**block["properties"], "headers": block["headers"], "delivery_mode": 2,
                         "content_encoding": "utf-8"}


def test_conformance_property_projection_on_a_published_message(make: Make, admin: dict, queue: str) -> None:
    block = conformance_manifest()["rabbitmq"]["property_projection"]
    body = compact(fixture_dict(block["envelope_file"]))
    make().publish(body, queue)
    method, props, stored = raw_get(admin, queue)
    assert stored == body and method.exchange == "" and method.routing_key == queue
    got = props_dict(props)
    assert {k: got[k] for k in block["properties"]} == block["properties"]
    assert got["headers"] == block["headers"] and got["delivery_mode"] == 2  # persistent
    assert type(got["headers"]["x-schema-version"]) is int and type(got["headers"]["x-attempts"]) is int
    assert type(got["headers"]["x-source-lang"]) is str
    assert channel_of(admin).queue_declare(queue, durable=True).method.message_count == 0  # durable, no arguments


def test_extra_headers_never_override_contract_headers(make: Make, admin: dict, queue: str) -> None:
    binding = make()
    body = body_for(queue)
    extra = {"x-attempts": 99, "x-source-lang": "go", "x-schema-version": "2", "traceparent": "00-abc-01",
             "tenant": 7, "amqp.type": "spoofed", "x-death": [{"count": 1}]}
    binding.publish(body, queue, headers=extra)
    _, props, _ = raw_get(admin, queue)
    assert props.headers == {"traceparent": "00-abc-01", "tenant": 7, "x-schema-version": 1, "x-source-lang": "python",
                             "x-attempts": 0}
    assert props.type == "urn:babel:orders:created"
    binding.publish(body, queue, headers={"traceparent": "00-abc-01"})
    message = must(binding.reserve(queue))
    assert message.headers["traceparent"] == "00-abc-01" and message.attempts == 0
    assert message.headers["amqp.type"] == "urn:babel:orders:created" and message.headers["amqp.redelivered"] is False
    assert message.headers["amqp.message_id"] == message.meta_id and message.delivery_count is None
    binding.ack(message)


def test_undecodable_bodies_get_no_derived_properties(make: Make, admin: dict, queue: str) -> None:
    make().publish(POISON, queue)
    _, props, stored = raw_get(admin, queue)
    assert stored == POISON
    assert props_dict(props) == {**dict.fromkeys(props_dict(props)), "content_type": "application/json",
                                 "delivery_mode": 2}
    assert amqp_properties(b"[1, 2]") == {"content_type": "application/json", "delivery_mode": 2}


def test_attempts_reconcile_body_and_x_attempts_header(make: Make, admin: dict, queue: str) -> None:
    binding = make()
    channel_of(admin).queue_declare(queue, durable=True)
    for body_attempts, header, expected in ((1, 3, 3), (2, 0, 2), (0, "7", 0)):
        envelope = bq.decode(body_for(queue))
        envelope["attempts"] = body_attempts
        props = pika.BasicProperties(headers={"x-attempts": header})
        channel_of(admin).basic_publish("", queue, bq.encode(envelope), props)
        message = must(binding.reserve(queue, timeout=2))
        assert message.attempts == expected
        binding.ack(message)


# ----------------------------------------------------------------------------------------------- batches


def test_batch_of_2000_is_confirmed_and_counted_exactly(make: Make, admin: dict, queue: str) -> None:
    binding = make()
    bodies = [body_for(queue, n) for n in range(2000)]
    started = time.perf_counter()
    binding.publish_batch(bodies, queue)
    elapsed = time.perf_counter() - started
    assert binding.depth(queue) == 2000 == ready_count(admin, queue)
    assert [raw_get(admin, queue)[2] for _ in range(2000)] == bodies
    assert elapsed < 10, f"2000 confirmed publishes took {elapsed:.1f} s"


def test_publish_batch_reports_exactly_the_nacked_bodies(make: Make, admin: dict, queue: str) -> None:
    # A real broker fault: a queue full with x-overflow=reject-publish nacks what does not fit.
    channel_of(admin).queue_declare(queue, durable=True, arguments={"x-max-length": 5, "x-overflow": "reject-publish"})
    binding = make()
    bodies = [body_for(queue, n) for n in range(12)]
    with pytest.raises(PublishBatchError) as caught:
        binding.publish_batch(bodies, queue)
    assert caught.value.failed == [5, 6, 7, 8, 9, 10, 11] and "nacked" in str(caught.value)
    assert [raw_get(admin, queue)[2] for _ in range(5)] == bodies[:5]


def test_publish_batch_reports_returned_bodies(make: Make, admin: dict, queue: str, monkeypatch: Any) -> None:
    # Simulated fault: the binding is made to believe the queue exists (as if it were deleted after the check),
    # so the broker returns every mandatory publish as unroutable; nothing else can cause a return here.
    binding = make()
    monkeypatch.setattr(binding, "_exists", lambda *args, **kwargs: True)
    with pytest.raises(PublishBatchError) as caught:
        binding.publish_batch([body_for(queue, 1), POISON, body_for(queue, 1)], queue)
    assert caught.value.failed == [0, 1, 2] and "returned" in str(caught.value)
    assert ready_count(admin, queue) is None


def test_a_retried_batch_declares_a_queue_deleted_since_the_last_one(make: Make, admin: dict, queue: str) -> None:
    # A real broker fault: the queue is deleted between two batches (as a broker restart that lost it would).
    binding = make()
    first, second = [body_for(queue, 1)], [body_for(queue, 2), POISON]
    binding.publish_batch(first, queue)
    channel_of(admin).queue_delete(queue)
    with pytest.raises(PublishBatchError) as caught:
        binding.publish_batch(second, queue)
    assert caught.value.failed == [0, 1] and "returned" in str(caught.value)
    binding.publish_batch(second, queue)  # the retry declares the queue again and is confirmed
    assert [raw_get(admin, queue)[2] for _ in range(2)] == second
    assert ready_count(admin, queue) == 0


def test_publish_batch_refuses_before_sending(make: Make, admin: dict, queue: str) -> None:
    binding = make(declare_queues=False)
    with pytest.raises(PublishBatchError) as caught:
        binding.publish_batch([body_for(queue)] * 3, queue)
    assert caught.value.failed == [0, 1, 2] and "does not exist" in str(caught.value)
    assert ready_count(admin, queue) is None
    binding.publish_batch([], queue)  # nothing to do, nothing declared


def test_unconfirmed_publishing_still_delivers(make: Make, admin: dict, queue: str) -> None:
    binding = make(publisher_confirms=False)
    bodies = [body_for(queue, n) for n in range(50)]
    binding.publish_batch(bodies, queue)
    binding.publish(bodies[0], queue)
    deadline = time.monotonic() + 5  # unconfirmed: the depth probe (another channel) may overtake the publishes
    while binding.depth(queue) < 51 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert binding.depth(queue) == 51


# ------------------------------------------------------------------------------- delays, DLQ, foreign queues


def test_release_with_delay_goes_through_a_delay_queue(make: Make, admin: dict, queue: str) -> None:
    binding = make()
    binding.publish(body_for(queue), queue, headers={"traceparent": "t-1"})
    binding.release(must(binding.reserve(queue)), delay=1.0)
    assert binding.depth(queue) == 0 and ready_count(admin, f"{queue}.delay.1000") == 1
    arguments = {"x-message-ttl": 1000, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue,
                 "x-expires": 61000}
    channel_of(admin).queue_declare(f"{queue}.delay.1000", durable=True, arguments=arguments)  # same arguments
    time.sleep(1.2)
    message = must(binding.reserve(queue, timeout=3))
    assert message.attempts == 1 and message.envelope["attempts"] == 1 and message.headers["x-attempts"] == 1
    assert message.headers["traceparent"] == "t-1" and message.headers["x-death"][0]["reason"] == "expired"
    binding.release(message, delay=1.0)  # x-death is not forwarded: the broker writes a fresh one
    assert ready_count(admin, f"{queue}.delay.1000") == 1
    _, props, _ = raw_get(admin, f"{queue}.delay.1000")
    assert "x-death" not in props.headers and props.headers["x-attempts"] == 2


def test_dead_letter_queue_is_queue_failed_or_the_configured_suffix(make: Make, admin: dict, queue: str) -> None:
    for suffix, binding in ((".failed", make()), (".dlq", make(dead_letter_suffix=".dlq"))):
        assert binding.dead_letter_name(queue) == f"{queue}{suffix}"
        body = body_for(queue)
        binding.publish(body, queue)
        binding.dead_letter(must(binding.reserve(queue)), "failed", error="boom")
        assert binding.dead_letter_depth(queue) == 1 and binding.depth(queue) == 0
        _, props, stored = raw_get(admin, f"{queue}{suffix}")
        annotated = bq.decode(stored)
        assert annotated["dead_letter"]["reason"] == "failed" and annotated["meta"] == bq.decode(body)["meta"]
        assert props.type == "urn:babel:orders:created" and props.delivery_mode == 2


def test_dlq_drain_release_requeues_unchanged(make: Make, queue: str) -> None:
    binding = make()
    binding.publish(POISON, queue)
    binding.dead_letter(must(binding.reserve(queue)), "poison")
    drained = must(binding.reserve_dead_letter(queue))
    assert drained.from_dead_letter and kept(drained) == POISON and binding.dead_letter_depth(queue) == 0
    binding.release(drained)
    again = must(binding.reserve_dead_letter(queue))
    assert again.body == drained.body and again.headers["amqp.redelivered"] is True
    binding.ack(again)
    assert binding.dead_letter_depth(queue) == 0
    with pytest.raises(NotSupportedError, match="without removing"):
        binding.browse_dead_letters(queue)


def test_release_counts_attempts_of_poison_bodies_in_the_header(make: Make, queue: str) -> None:
    binding = make()
    binding.publish(POISON, queue)
    binding.release(must(binding.reserve(queue)))
    again = must(binding.reserve(queue))
    assert again.body == POISON and again.attempts == 1 and again.headers["x-attempts"] == 1
    binding.ack(again)


def test_foreign_queue_with_arguments_is_used_as_it_is(make: Make, admin: dict, queue: str) -> None:
    arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{queue}.native", "x-message-ttl": 600000}
    channel_of(admin).queue_declare(queue, durable=True, arguments=arguments)
    binding = make()
    binding.publish(body_for(queue, 1), queue)
    binding.publish_batch([body_for(queue, 2), body_for(queue, 3)], queue)
    assert binding.depth(queue) == 3
    binding.release(must(binding.reserve(queue)))
    binding.dead_letter(must(binding.reserve(queue)), "failed")
    binding.publish(body_for(queue, 4), queue, delay=1.0)
    assert binding.dead_letter_depth(queue) == 1 and binding.depth(queue) == 2
    assert queue not in binding.declared_queues  # only passive declares touched it
    channel_of(admin).queue_declare(queue, durable=True, arguments=arguments)  # its arguments are unchanged
    time.sleep(1.2)
    assert [bq.decode(must(binding.reserve(queue)).body)["data"]["n"] for _ in range(3)] == [3, 1, 4]


def test_declare_queues_off_uses_passive_declares_only(make: Make, admin: dict, queue: str) -> None:
    binding = make(declare_queues=False)
    with pytest.raises(BindingError, match="does not exist and declare_queues is off"):
        binding.publish(body_for(queue), queue)
    assert binding.reserve(queue, timeout=0.2) is None and binding.depth(queue) == 0
    assert ready_count(admin, queue) is None and binding.declared_queues == frozenset()
    channel_of(admin).queue_declare(queue, durable=True)
    binding.publish(body_for(queue), queue)
    message = must(binding.reserve(queue))
    with pytest.raises(BindingError, match="does not exist"):
        binding.dead_letter(message, "failed")  # the DLQ is missing: the original stays reserved
    channel_of(admin).queue_declare(f"{queue}.failed", durable=True)
    binding.dead_letter(message, "failed")
    assert binding.dead_letter_depth(queue) == 1


# ------------------------------------------------------------------------------------ transactional redrive


def dead_letters(binding: RabbitMQBinding, queue: str, count: int) -> list[bytes]:
    """``count`` messages published to ``queue`` and dead-lettered; returns their DLQ bodies in order."""
    binding.publish_batch([body_for(queue, n) for n in range(count)], queue)
    for _ in range(count):
        binding.dead_letter(must(binding.reserve(queue)), "failed", error="boom")
    taken = binding.reserve_dead_letters(queue, count)
    bodies = [message.body for message in taken]
    binding.release_many(taken)
    return bodies


def test_publish_acking_moves_a_batch_in_one_transaction(make: Make, admin: dict, queue: str) -> None:
    binding = make()
    originals = dead_letters(binding, queue, 5)
    taken = binding.reserve_dead_letters(queue, 5)
    assert [m.body for m in taken] == originals  # released in order, unchanged
    replays = [bq.encode(bq.reset_for_replay(bq.decode(m.body))) for m in taken]
    assert binding.publish_acking(replays, f"{queue}-target", taken, headers={"bq-replay-bypass": 1}) is True
    assert ready_count(admin, f"{queue}.failed") == 0 and ready_count(admin, f"{queue}-target") == 5
    for replay in replays:
        _, props, stored = raw_get(admin, f"{queue}-target")
        assert stored == replay and props.headers["bq-replay-bypass"] == 1 and props.delivery_mode == 2
    channel_of(admin).queue_delete(f"{queue}-target")
    binding.ack_many(taken)  # already acked in the transaction: nothing left to settle, nothing raised
    assert binding.dead_letter_depth(queue) == 0


def test_publish_acking_to_a_missing_queue_commits_nothing(make: Make, admin: dict, queue: str) -> None:
    binding = make(declare_queues=False)
    channel_of(admin).queue_declare(queue, durable=True)
    channel_of(admin).queue_declare(f"{queue}.failed", durable=True)
    originals = dead_letters(binding, queue, 3)
    taken = binding.reserve_dead_letters(queue, 3)
    with pytest.raises(PublishBatchError, match="does not exist and declare_queues is off.*stays in the DLQ") as info:
        binding.publish_acking([b"{}"] * 3, f"{queue}-absent", taken)
    assert list(info.value.failed) == [0, 1, 2]
    assert ready_count(admin, f"{queue}-absent") is None
    binding.release_many(taken)  # still held after the failed attempt: they go back, unchanged and in order
    assert [m.body for m in binding.reserve_dead_letters(queue, 3)] == originals


def test_publish_acking_declines_what_it_does_not_hold(make: Make, admin: dict, queue: str) -> None:
    binding, other = make(), make()
    dead_letters(binding, queue, 2)
    main = make()
    main.publish(body_for(queue, 9), queue)
    from_main_queue = must(main.reserve(queue))
    assert binding.publish_acking([b"{}"], f"{queue}-target", [from_main_queue]) is False  # not a dead letter
    foreign = other.reserve_dead_letters(queue, 1)
    assert binding.publish_acking([b"{}"], f"{queue}-target", foreign) is False  # another binding's delivery
    other.close()  # the broker requeues it
    stale = binding.reserve_dead_letters(queue, 2)
    binding.close()
    assert binding.publish_acking([b"{}"], f"{queue}-target", stale) is False  # the broker took them back
    assert ready_count(admin, f"{queue}-target") is None and binding.dead_letter_depth(queue) == 2
    main.ack(from_main_queue)


def test_dead_letter_acks_and_releases_are_committed_when_the_call_returns(make: Make, admin: dict, queue: str) -> None:
    binding = make()
    dead_letters(binding, queue, 4)
    taken = binding.reserve_dead_letters(queue, 4)
    binding.ack_many(taken[:2])
    binding.release_many(taken[2:])
    assert ready_count(admin, f"{queue}.failed") == 2  # seen from another connection: the transaction committed
    one = must(binding.reserve_dead_letter(queue))
    binding.ack(one)
    assert ready_count(admin, f"{queue}.failed") == 1


def test_visibility_timeout_requeues_dead_letters_too(make: Make, admin: dict, queue: str) -> None:
    binding = make(visibility_timeout=0.5)
    dead_letters(binding, queue, 1)
    first = must(binding.reserve_dead_letter(queue))
    time.sleep(0.8)
    assert binding.dead_letter_depth(queue) == 1  # the expiry's requeue was committed
    second = must(binding.reserve_dead_letter(queue))
    binding.ack(first)  # expired: ignored
    assert binding.publish_acking([b"{}"], f"{queue}-target", [first]) is False
    binding.ack(second)
    assert binding.dead_letter_depth(queue) == 0


# ------------------------------------------------------------------------------------------ crash recovery


def test_kill_9_between_reserve_and_ack_loses_nothing(make: Make, queue: str) -> None:
    binding = make()
    body = body_for(queue)
    binding.publish(body, queue)
    child = textwrap.dedent(f"""
        import os, signal, sys
        from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQBinding, RabbitMQConfig
        binding = RabbitMQBinding(RabbitMQConfig(host={HOST!r}, port={PORT}))
        message = binding.reserve({queue!r}, timeout=5)
        sys.stdout.write(message.body.hex())
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert bytes.fromhex(done.stdout.decode()) == body
    recovered = must(binding.reserve(queue, timeout=5))  # the broker requeued the dead consumer's delivery
    assert recovered.body == body and recovered.attempts == 0 and recovered.headers["amqp.redelivered"] is True
    binding.ack(recovered)
    assert binding.depth(queue) == 0 and binding.reserve(queue) is None


def test_a_late_settle_of_a_lost_reservation_changes_nothing(make: Make, queue: str, caplog: Any) -> None:
    binding = make()
    body = body_for(queue)
    binding.publish(body, queue)
    lost = must(binding.reserve(queue))
    binding.close()  # the connection goes: the broker requeues the delivery
    with caplog.at_level(logging.WARNING):
        binding.ack(lost)
        binding.dead_letter(lost, "failed")
    assert "no longer held" in caplog.text and binding.dead_letter_depth(queue) == 0
    again = must(binding.reserve(queue))  # reconnects
    assert again.body == body and again.headers["amqp.redelivered"] is True
    binding.ack(again)
    assert binding.depth(queue) == 0


def test_visibility_timeout_requeues_and_ignores_the_late_ack(make: Make, queue: str) -> None:
    binding = make(visibility_timeout=0.5)
    binding.publish(body_for(queue), queue)
    first = must(binding.reserve(queue))
    time.sleep(0.8)
    second = must(binding.reserve(queue))
    assert second.body == first.body and second.receipt != first.receipt
    binding.ack(first)  # expired: ignored, and the redelivery is untouched
    binding.ack(second)
    assert binding.depth(queue) == 0 and binding.reserve(queue, timeout=0.7) is None


def test_a_missing_queue_never_closes_the_channel_holding_reservations(make: Make, queue: str) -> None:
    binding = make()
    binding.publish(body_for(queue), queue)
    held = must(binding.reserve(queue))
    assert binding.depth(f"{queue}-missing") == 0 and binding.dead_letter_depth(f"{queue}-missing") == 0
    assert binding.reserve_dead_letter(f"{queue}-missing") is None
    binding.ack(held)  # still valid: the 404s happened on the probe channel
    assert binding.depth(queue) == 0 and binding.reserve(queue) is None


# --------------------------------------------------------------------------------------------------- errors




def test_unreachable_broker_gives_a_clear_binding_error() -> None:
    port = free_port()
    binding = RabbitMQBinding(RabbitMQConfig(port=port, socket_timeout=2))  # constructing does not connect
    for call in (binding.ping, lambda: binding.publish(b"{}", "orders"), lambda: binding.depth("orders")):
        with pytest.raises(BindingError) as caught:
            call()
        assert f"127.0.0.1:{port}" in str(caught.value) and "cannot reach" in str(caught.value)
    with pytest.raises(PublishBatchError) as batch:
        binding.publish_batch([b"{}"], "orders")
    assert batch.value.failed == [0] and f"127.0.0.1:{port}" in str(batch.value)


def test_wrong_password_gives_a_clear_error_without_the_password() -> None:
    secret = f"pw-{uuid.uuid4().hex}"
    config = RabbitMQConfig(host=HOST, port=PORT, password=secret)
    binding = RabbitMQBinding(config)
    for call in (binding.ping, lambda: binding.reserve("orders")):
        with pytest.raises(BindingError) as caught:
            call()
        text = f"{caught.value} {caught.value.__cause__!r} {config!r}"
        assert "authentication failed" in str(caught.value) and f"{HOST}:{PORT}" in str(caught.value)
        assert secret not in text
    binding.close()


def test_unknown_virtual_host_is_named() -> None:
    binding = RabbitMQBinding(RabbitMQConfig(host=HOST, port=PORT, virtual_host=f"nope-{uuid.uuid4().hex[:6]}"))
    with pytest.raises(BindingError, match="virtual host 'nope-"):
        binding.ping()


def test_config_from_url() -> None:
    config = RabbitMQConfig.from_url(
        "amqps://app:p%40ss%3Aword@mq.example/prod%2Feu?dead_letter_suffix=.dlq&declare_queues=false"
        "&publisher_confirms=true&heartbeat=30&socket_timeout=5&ssl_ca_certs=/etc/ca.pem", heartbeat=15)
    assert (config.host, config.port, config.virtual_host, config.username, config.password) == (
        "mq.example", 5671, "prod/eu", "app", "p@ss:word")
    assert config.ssl and config.ssl_ca_certs == "/etc/ca.pem" and config.dead_letter_suffix == ".dlq"
    assert config.declare_queues is False and config.publisher_confirms is True
    assert config.heartbeat == 15 and config.socket_timeout == 5
    assert "p@ss" not in repr(config)
    assert RabbitMQConfig.from_url("amqp://mq") == RabbitMQConfig(host="mq")
    assert RabbitMQConfig.from_url("amqp://guest:guest@mq:5673/") == RabbitMQConfig(host="mq", port=5673)
    for bad in ("redis://localhost", "amqp://localhost?prefetch=1"):
        with pytest.raises(ValueError):
            RabbitMQConfig.from_url(bad)
    for bad_options in ({"dead_letter_suffix": ""}, {"visibility_timeout": 0}):
        with pytest.raises(ValueError):
            RabbitMQConfig(**bad_options)


def test_module_imports_without_the_pika_package() -> None:
    child = textwrap.dedent("""
        import sys
        sys.modules["pika"] = None  # as if the extra were not installed
        from airflow_provider_babelqueue.bindings.base import MissingExtraError
        from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQBinding, amqp_properties
        assert amqp_properties(b"{}")["content_type"] == "application/json"
        try:
            RabbitMQBinding()
        except MissingExtraError as exc:
            assert "airflow-provider-babelqueue[rabbitmq]" in str(exc), exc
        else:
            raise SystemExit("no MissingExtraError")
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()


# ---------------------------------------------------------------------------------------------------- hook


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, spec: dict) -> str:
    import json

    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(spec))
    return conn_id


def test_hook_reads_fields_and_allowlisted_extras(monkeypatch: pytest.MonkeyPatch, admin: dict, queue: str) -> None:
    from airflow_provider_babelqueue.hooks.rabbitmq import BabelQueueRabbitMQHook

    extra = {"dead_letter_suffix": ".dlq", "declare_queues": "true", "publisher_confirms": "yes", "heartbeat": "30",
             "ssl": False, "visibility_timeout": 1, "password": "not-read-from-extra"}
    spec = {"conn_type": "babelqueue+rabbitmq", "host": HOST, "port": PORT, "schema": "/", "login": "guest",
            "password": "guest", "extra": extra}
    hook = BabelQueueRabbitMQHook(define(monkeypatch, "bq_rabbit", spec))
    try:
        config = hook.get_binding().config
        assert (config.host, config.port, config.virtual_host, config.username, config.password) == (
            HOST, PORT, "/", "guest", "guest")
        assert config.dead_letter_suffix == ".dlq" and config.heartbeat == 30 and config.visibility_timeout is None
        binding = hook.get_binding()
        binding.publish(body_for(queue), queue)
        binding.dead_letter(must(binding.reserve(queue, timeout=2)), "failed")
        assert ready_count(admin, f"{queue}.dlq") == 1
        assert hook.test_connection() == (True, f"Connected to BabelQueue RabbitMQ at {HOST}:{PORT}")
    finally:
        hook.close()


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"host": "127.0.0.1", "port": "CLOSED"}, "127.0.0.1:"),
        ({"host": "127.0.0.1", "port": PORT, "login": "guest", "password": "Hunter2-secret"}, "authentication failed"),
        ({"host": "127.0.0.1", "port": PORT, "schema": "no-such-vhost"}, "virtual host 'no-such-vhost'"),
    ],
    ids=["closed-port", "bad-password", "bad-vhost"],
)
def test_hook_test_connection_says_what_is_wrong(monkeypatch: pytest.MonkeyPatch, spec: dict, fragment: str) -> None:
    from airflow_provider_babelqueue.hooks.rabbitmq import BabelQueueRabbitMQHook

    if spec["port"] == "CLOSED":
        spec = {**spec, "port": free_port()}
    hook = BabelQueueRabbitMQHook(define(monkeypatch, "bq_rabbit_bad", {"conn_type": "babelqueue+rabbitmq", **spec}))
    ok, message = hook.test_connection()
    assert ok is False and fragment in message and "Hunter2-secret" not in message, message


@pytest.mark.parametrize(
    ("extra", "message"),
    [({"heartbeat": "often"}, "'heartbeat' must be a number"), ({"ssl": "maybe"}, "'ssl' must be true or false"),
     ({"declare_queues": "perhaps"}, "'declare_queues' must be true or false")],
)
def test_hook_bad_extras_name_the_field(monkeypatch: pytest.MonkeyPatch, extra: dict, message: str) -> None:
    from airflow_provider_babelqueue.hooks.base import ConnectionConfigError
    from airflow_provider_babelqueue.hooks.rabbitmq import BabelQueueRabbitMQHook

    hook = BabelQueueRabbitMQHook(define(monkeypatch, "bq_rabbit_x", {"conn_type": "babelqueue+rabbitmq",
                                                                       "extra": extra}))
    with pytest.raises(ConnectionConfigError, match=message):
        hook.get_binding()


def test_hook_looks_nothing_up_when_constructed(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_babelqueue.hooks.rabbitmq import BabelQueueRabbitMQHook

    def explode(*args: object, **kwargs: object) -> None:
        raise AssertionError("connection looked up at construction")

    monkeypatch.setattr(BabelQueueRabbitMQHook, "get_connection", classmethod(explode))
    BabelQueueRabbitMQHook("anything")


def test_a_zero_wait_consume_reads_the_queue_to_its_end(make: Make, admin: dict, queue: str) -> None:
    """``reserve_timeout=0`` with ``stop_when_empty``: the run ends only when the queue is empty. After a batch's
    acks free the prefetch window, the broker can answer the binding's ``basic.get`` with get-empty before the
    pushes that refill the window reach the client. The binding then makes one more synchronous call, whose reply
    comes after those pushes. Without that call, about one run in 40 here stopped after about 200 of the 400
    messages, with the rest still queued. A race: each repetition is a chance to meet it, so the test runs the
    consume 30 times."""
    from airflow_provider_babelqueue.engine.consume import Consumer

    bodies = [body_for(queue, n) for n in range(400)]
    for attempt in range(30):
        binding = make()
        binding.publish_batch(bodies, queue)
        seen: list[dict[str, Any]] = []
        summary = Consumer(binding, queue, {"urn:babel:orders:created": seen.append}, batch_size=100,
                           log=logging.getLogger("tests.rabbitmq")).run(reserve_timeout=0)
        handled = sorted(envelope["data"]["n"] for envelope in seen)
        assert (summary.handled, handled) == (400, list(range(400))), (attempt, summary.as_dict())
        assert binding.depth(queue) == 0
        binding.close()
