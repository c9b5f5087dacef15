"""The binding contract: one set of test bodies, run against every binding (see conftest.BINDINGS)."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding, BindingError, NotSupportedError, PublishBatchError
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.core.peer import poison_wrapper
from tests.bindings.conftest import Factory

POISON = b'\xff\xfe{"job": not json'


def body_for(queue_name: str, n: int = 0, **data: object) -> bytes:
    return bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n, **data}, queue_name=queue_name))


def must_reserve(binding: Binding, queue_name: str, timeout: float = 2.0) -> ReceivedMessage:
    message = binding.reserve(queue_name, timeout=timeout)
    assert message is not None, f"expected a message on {queue_name}"
    return message


def test_publish_reserve_ack(binding: Binding, queue_name: str) -> None:
    body = body_for(queue_name, 1, title="Café ☕ / naïve")
    binding.publish(body, queue_name)
    assert binding.depth(queue_name) == 1
    message = must_reserve(binding, queue_name)
    assert message.body == body
    assert message.envelope == bq.decode(body) and message.decode_error is None
    assert message.attempts == 0 and message.queue_name == queue_name and not message.from_dead_letter
    assert message.meta_id == bq.decode(body)["meta"]["id"] and message.urn == "urn:babel:orders:created"
    assert binding.depth(queue_name) == 0
    binding.ack(message)
    assert binding.reserve(queue_name, timeout=0) is None
    assert binding.depth(queue_name) == 0 and binding.dead_letter_depth(queue_name) == 0


def test_queues_are_isolated(binding: Binding, queue_name: str) -> None:
    other = f"{queue_name}-other"
    binding.publish(body_for(queue_name), queue_name)
    assert binding.reserve(other, timeout=0) is None
    assert binding.depth(other) == 0 and binding.depth(queue_name) == 1


def test_release_redelivers_with_one_more_attempt(binding: Binding, queue_name: str) -> None:
    body = body_for(queue_name)
    binding.publish(body, queue_name)
    first = must_reserve(binding, queue_name)
    binding.release(first)
    second = must_reserve(binding, queue_name)
    assert second.attempts == 1 and second.envelope is not None and second.envelope["attempts"] == 1
    assert second.meta_id == first.meta_id and second.envelope["trace_id"] == first.envelope["trace_id"]
    expected = bq.decode(body)
    expected["attempts"] = 1
    assert second.body == bq.encode(expected)
    binding.release(second)
    third = must_reserve(binding, queue_name)
    assert third.attempts == 2
    binding.ack(third)
    assert binding.reserve(queue_name, timeout=0) is None


def test_release_with_delay(binding: Binding, queue_name: str) -> None:
    binding.publish(body_for(queue_name), queue_name)
    binding.release(must_reserve(binding, queue_name), delay=1.0)
    assert binding.reserve(queue_name, timeout=0) is None
    assert binding.depth(queue_name) == 0
    time.sleep(1.2)
    assert must_reserve(binding, queue_name, timeout=3).attempts == 1


def test_publish_with_delay(binding: Binding, queue_name: str) -> None:
    body = body_for(queue_name)
    binding.publish(body, queue_name, delay=1.0)
    assert binding.depth(queue_name) == 0
    assert binding.reserve(queue_name, timeout=0) is None
    time.sleep(1.2)
    assert binding.depth(queue_name) == 1
    assert must_reserve(binding, queue_name).body == body


def test_dead_letter_moves_an_annotated_copy(binding: Binding, queue_name: str) -> None:
    body = body_for(queue_name, 7)
    binding.publish(body, queue_name)
    binding.release(must_reserve(binding, queue_name))
    message = must_reserve(binding, queue_name)
    binding.dead_letter(message, bq.Reason.FAILED, error="Payment gateway timeout", exception="GatewayTimeout")
    assert binding.depth(queue_name) == 0 and binding.reserve(queue_name, timeout=0) is None
    assert binding.dead_letter_depth(queue_name) == 1
    dead = binding.reserve_dead_letter(queue_name, timeout=2)
    assert dead is not None and dead.from_dead_letter
    env = dead.envelope
    assert env is not None and list(env)[-1] == "dead_letter"
    block = env["dead_letter"]
    assert {k: block[k] for k in ("reason", "error", "exception", "original_queue", "attempts", "lang")} == {
        "reason": "failed",
        "error": "Payment gateway timeout",
        "exception": "GatewayTimeout",
        "original_queue": queue_name,
        "attempts": 1,
        "lang": "python",
    }
    assert type(block["failed_at"]) is int
    original = bq.decode(body)
    assert {k: env[k] for k in ("job", "trace_id", "data", "meta")} == {
        k: original[k] for k in ("job", "trace_id", "data", "meta")
    }
    binding.ack(dead)
    assert binding.dead_letter_depth(queue_name) == 0
    assert binding.reserve_dead_letter(queue_name, timeout=0) is None


def test_undecodable_bodies_survive_byte_exact(binding: Binding, queue_name: str) -> None:
    binding.publish(POISON, queue_name)
    message = must_reserve(binding, queue_name)
    assert message.body == POISON and message.envelope is None and "not valid JSON" in message.decode_error
    assert message.attempts == 0
    binding.release(message)
    again = must_reserve(binding, queue_name)
    assert again.body == POISON
    binding.dead_letter(again, bq.Reason.POISON, error=again.decode_error)
    dead = binding.reserve_dead_letter(queue_name, timeout=2)
    # stored with the reason, the error and the quarantining queue beside the exact bytes (a poison wrapper)
    wrapper = poison_wrapper(dead.body) if dead is not None else None
    assert wrapper is not None and wrapper.raw == POISON and wrapper.reason == "poison"
    assert wrapper.dead_letter["original_queue"] == queue_name and "not valid JSON" in wrapper.dead_letter["error"]
    binding.ack(dead)


def test_invalid_envelopes_are_annotated_with_their_reason(binding: Binding, queue_name: str) -> None:
    env = bq.make_envelope("urn:x", {}, queue_name=queue_name)
    env["meta"]["schema_version"] = 2
    binding.publish(bq.encode(env), queue_name)
    message = must_reserve(binding, queue_name)
    reason = bq.check(message.envelope)
    assert reason == "unsupported_schema_version"
    binding.dead_letter(message, reason)
    dead = binding.reserve_dead_letter(queue_name, timeout=2)
    assert dead.envelope["dead_letter"]["reason"] == "unsupported_schema_version"
    assert dead.envelope["meta"]["schema_version"] == 2
    binding.ack(dead)


def test_batch_publish_keeps_order_and_bytes(binding: Binding, queue_name: str) -> None:
    bodies = [body_for(queue_name, i) for i in range(250)] + [POISON]
    binding.publish_batch(bodies, queue_name)
    assert binding.depth(queue_name) == 251
    received = []
    while (message := binding.reserve(queue_name, timeout=0)) is not None:
        received.append(message.body)
        binding.ack(message)
    assert received == bodies


def test_reserve_waits_up_to_its_timeout(binding: Binding, queue_name: str) -> None:
    started = time.monotonic()
    assert binding.reserve(queue_name, timeout=0.3) is None
    assert time.monotonic() - started >= 0.25
    body = body_for(queue_name)
    threading.Timer(0.3, binding.publish, args=(body, queue_name)).start()
    assert must_reserve(binding, queue_name, timeout=5).body == body


def test_unacked_reservation_returns_after_the_visibility_timeout(make_binding: Factory, queue_name: str) -> None:
    binding = make_binding(visibility_timeout=1.0)
    body = body_for(queue_name)
    binding.publish(body, queue_name)
    must_reserve(binding, queue_name)  # a consumer that never acks
    assert binding.reserve(queue_name, timeout=0) is None
    time.sleep(1.3)
    again = must_reserve(binding, queue_name, timeout=2)
    assert again.body == body
    binding.ack(again)
    assert binding.reserve(queue_name, timeout=0) is None


def test_browse_reads_without_removing(binding: Binding, queue_name: str) -> None:
    for i in range(3):
        binding.publish(body_for(queue_name, i), queue_name)
        binding.dead_letter(must_reserve(binding, queue_name), "unknown_urn")
    if not binding.can_browse:
        with pytest.raises(NotSupportedError):
            binding.browse_dead_letters(queue_name)
        return
    seen = binding.browse_dead_letters(queue_name, limit=2)
    assert [m.envelope["data"]["n"] for m in seen] == [0, 1]
    assert all(m.from_dead_letter and m.envelope["dead_letter"]["reason"] == "unknown_urn" for m in seen)
    assert binding.dead_letter_depth(queue_name) == 3


def test_concurrent_consumers_get_each_message_once(binding: Binding, queue_name: str) -> None:
    bodies = [body_for(queue_name, i) for i in range(200)]
    binding.publish_batch(bodies, queue_name)
    got: list[bytes] = []
    lock = threading.Lock()

    def consume() -> None:
        while (message := binding.reserve(queue_name, timeout=0.2)) is not None:
            binding.ack(message)
            with lock:
                got.append(message.body)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if binding.name == "sqs":
        # A standard SQS queue delivers at least once: a receive may now and then return a copy of a message another
        # receive holds (AWS documents it; moto's server does it when two receives race). Every message must come,
        # and nothing but them; a copy is a redelivery, not a loss.
        assert set(got) == set(bodies) and len(got) >= 200
    else:
        assert sorted(got) == sorted(bodies) and len(got) == 200


def test_oversize_bodies_are_refused_before_sending(make_binding: Factory, queue_name: str) -> None:
    """A body over ``max_message_bytes`` fails before anything is sent, naming the limit; smaller ones go.
    (Exact boundaries are per broker: SQS counts attributes too; see each binding's tests.)"""
    binding = make_binding(max_message_bytes=2048)
    small = body_for(queue_name, pad="x" * 100)
    over = body_for(queue_name, pad="x" * (2049 - len(body_for(queue_name, pad=""))))
    assert len(over) == 2049
    with pytest.raises(PublishBatchError, match="max_message_bytes=2,?048") as caught:
        binding.publish_batch([small, over, small], queue_name)
    assert caught.value.failed == [0, 1, 2]
    with pytest.raises(BindingError, match="max_message_bytes=2,?048"):
        binding.publish(over, queue_name)
    assert binding.depth(queue_name) == 0  # nothing was sent
    binding.publish(small, queue_name)
    assert must_reserve(binding, queue_name).body == small


def test_a_body_exactly_at_the_limit_is_sent(make_binding: Factory, queue_name: str) -> None:
    binding = make_binding(max_message_bytes=2048)
    at_limit = body_for(queue_name, pad="x" * (2048 - len(body_for(queue_name, pad=""))))
    if binding.name == "sqs":
        pytest.skip("SQS counts message attributes into the limit (tested in test_sqs_binding.py)")
    binding.publish_batch([at_limit], queue_name)
    assert must_reserve(binding, queue_name).body == at_limit
