"""Batch operations of the binding protocol, on every binding (see conftest.BINDINGS).

``reserve_dead_letters`` / ``ack_many`` / ``release_many`` must mean exactly what a loop over their single-message
forms means: FIFO order, byte-exact bodies, one reservation per member (returned after the visibility timeout
when not settled, gated against a late settle), whatever the binding's native implementation. Seen stores:
``seen_many`` / ``remember_many`` through the helpers in ``idempotency`` (native or looped).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding, NotSupportedError
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.core.idempotency import InMemorySeenStore, remember_many, seen_many
from tests.bindings.conftest import Factory, kept

#: Bindings whose settle is gated on the reservation itself (a stale receipt matches nothing). SQS and RabbitMQ
#: settle through the broker's own receipt / delivery-tag rules instead.
GATED = {"memory", "sql", "redis"}


def poison(index: int) -> bytes:
    """An undecodable body: dead-lettered in a poison wrapper holding it byte for byte (:func:`kept` gives it back),
    so the DLQ's exact bytes are known up front."""
    return b"\xff\xfe" + f"poison {index} \x00 ".encode() + bytes([0x80 + index % 64])


def dead_letter(binding: Binding, queue_name: str, bodies: list[bytes]) -> None:
    """What a consumer does when it gives up: publish, reserve, dead-letter, in order."""
    for body in bodies:
        binding.publish(body, queue_name)
        message = binding.reserve(queue_name, timeout=5)
        assert message is not None and message.body == body
        binding.dead_letter(message, bq.Reason.POISON, error="undecodable")


def reserve_until(binding: Binding, queue_name: str, count: int, timeout: float = 5.0) -> list[ReceivedMessage]:
    """Reserve dead letters in batches until ``count`` are held (brokers may hand a batch out in parts)."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += binding.reserve_dead_letters(queue_name, count - len(got), timeout=0.5)
    return got


def test_reserve_dead_letters_takes_min_of_limit_and_available_in_fifo_order(binding: Binding,
                                                                             queue_name: str) -> None:
    bodies = [poison(i) for i in range(5)]
    dead_letter(binding, queue_name, bodies)
    first = reserve_until(binding, queue_name, 3)
    assert [kept(m) for m in first] == bodies[:3]
    assert all(m.from_dead_letter and m.queue_name == queue_name and kept(m) != m.body for m in first)
    rest = binding.reserve_dead_letters(queue_name, 10, timeout=1)
    rest += reserve_until(binding, queue_name, 2 - len(rest), timeout=2) if len(rest) < 2 else []
    assert [kept(m) for m in rest] == bodies[3:]  # only what is there: min(limit, available)
    assert binding.reserve_dead_letters(queue_name, 10, timeout=0) == []
    started = time.monotonic()
    assert binding.reserve_dead_letters(queue_name, 0, timeout=5) == []  # nothing asked for: no wait either
    assert time.monotonic() - started < 1
    binding.ack_many(first + rest)
    assert binding.reserve_dead_letters(queue_name, 10, timeout=0.2) == []
    assert binding.dead_letter_depth(queue_name) == 0


def test_equal_bodies_are_separate_reservations(binding: Binding, queue_name: str) -> None:
    same = poison(7)
    dead_letter(binding, queue_name, [same, same, poison(8)])
    batch = reserve_until(binding, queue_name, 3)
    assert [kept(m) for m in batch] == [same, same, poison(8)]
    binding.ack_many(batch[:1])  # one of the twins: the other stays reserved, then comes back on a release
    binding.release_many(batch[1:])
    back = reserve_until(binding, queue_name, 2)
    assert sorted(kept(m) for m in back) == sorted([same, poison(8)])
    binding.ack_many(back)
    assert binding.reserve_dead_letters(queue_name, 10, timeout=0.2) == []


def test_envelopes_keep_their_bytes_and_decode(binding: Binding, queue_name: str) -> None:
    bodies = [bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": i, "note": "Zoë ☕"},
                                         queue_name=queue_name)) for i in range(4)]
    for body in bodies:
        binding.publish(body, queue_name)
        message = binding.reserve(queue_name, timeout=5)
        binding.dead_letter(message, bq.Reason.FAILED, error="boom", exception="GatewayTimeout")
    batch = reserve_until(binding, queue_name, 4)
    assert [m.envelope["data"]["n"] for m in batch] == [0, 1, 2, 3]
    assert [m.meta_id for m in batch] == [bq.meta_id_of(bq.decode(b)) for b in bodies]
    assert all(m.body == bq.encode(m.envelope) for m in batch)  # the stored annotated bytes, not a re-encoding
    if binding.can_browse:
        binding.release_many(batch)
        assert sorted(kept(m) for m in binding.browse_dead_letters(queue_name)) == sorted(kept(m) for m in batch)
        batch = reserve_until(binding, queue_name, 4)
    binding.ack_many(batch)
    assert binding.reserve_dead_letters(queue_name, 10, timeout=0.2) == []


def test_ack_many_removes_exactly_those(binding: Binding, queue_name: str) -> None:
    bodies = [poison(i) for i in range(6)]
    dead_letter(binding, queue_name, bodies)
    batch = reserve_until(binding, queue_name, 6)
    binding.ack_many([batch[0], batch[2], batch[5]])  # not a prefix: the general path on Redis
    binding.release_many([batch[1], batch[3], batch[4]])
    back = reserve_until(binding, queue_name, 3)
    assert sorted(kept(m) for m in back) == sorted([bodies[1], bodies[3], bodies[4]])
    assert binding.reserve_dead_letters(queue_name, 10, timeout=0.2) == []
    binding.ack_many(back)
    binding.ack_many([])
    assert binding.reserve_dead_letters(queue_name, 10, timeout=0.2) == []


def test_reserve_dead_letters_waits_for_the_first_one_only(binding: Binding, queue_name: str) -> None:
    started = time.monotonic()
    assert binding.reserve_dead_letters(queue_name, 5, timeout=0.3) == []
    assert time.monotonic() - started >= 0.25
    threading.Timer(0.3, dead_letter, args=(binding, queue_name, [poison(1)])).start()
    got = binding.reserve_dead_letters(queue_name, 5, timeout=10)
    assert [kept(m) for m in got] == [poison(1)]
    binding.ack_many(got)


def test_an_unacked_batch_returns_after_the_visibility_timeout(make_binding: Factory, queue_name: str) -> None:
    binding = make_binding(visibility_timeout=1.0)
    bodies = [poison(i) for i in range(3)]
    dead_letter(binding, queue_name, bodies)
    assert [kept(m) for m in reserve_until(binding, queue_name, 3)] == bodies  # a drain that dies here
    assert binding.reserve_dead_letters(queue_name, 10, timeout=0) == []
    time.sleep(1.3)
    again = reserve_until(binding, queue_name, 3)
    assert sorted(kept(m) for m in again) == sorted(bodies)
    binding.ack_many(again)
    assert binding.reserve_dead_letters(queue_name, 10, timeout=0.2) == []


def test_a_late_ack_many_after_reclamation_changes_nothing(make_binding: Factory, queue_name: str) -> None:
    binding = make_binding(visibility_timeout=1.0)
    if binding.name not in GATED:
        pytest.skip(f"the {binding.name} binding settles by the broker's own receipt rules, not a gated token")
    bodies = [poison(i) for i in range(3)]
    dead_letter(binding, queue_name, bodies)
    stale = reserve_until(binding, queue_name, 3)
    time.sleep(1.3)
    current = reserve_until(binding, queue_name, 3)  # reclaimed: a new holder has them now
    assert sorted(kept(m) for m in current) == sorted(bodies)
    binding.ack_many(stale)  # the first holder wakes up and acks: nothing may change
    binding.release_many(stale)
    binding.release_many(current)  # the real holder gives them back: all three are still there
    back = reserve_until(binding, queue_name, 3)
    assert sorted(kept(m) for m in back) == sorted(bodies)
    binding.ack_many(back)
    assert binding.reserve_dead_letters(queue_name, 10, timeout=0.2) == []


def test_seen_many_and_remember_many(binding: Binding) -> None:
    try:
        store = binding.seen_store(f"batch-{uuid.uuid4().hex[:8]}")
    except NotSupportedError:
        pytest.skip(f"the {binding.name} binding holds no seen store")
    assert seen_many(store, []) == set() and remember_many(store, []) is None
    keys = [f"id-{i}" for i in range(1203)]  # past every chunk size of the native implementations
    store.remember("id-5")
    assert seen_many(store, keys) == {"id-5"}
    remember_many(store, keys[:700] + ["id-5", "id-0"])  # already there and repeated: no error, no duplicate
    assert seen_many(store, keys + ["other", "id-3"]) == set(keys[:700])
    assert len(store) == 700 and store.seen("id-699") and not store.seen("id-700")
    store.forget("id-3")
    assert "id-3" not in seen_many(store, keys)
    if binding.name in ("sql", "redis"):
        assert callable(getattr(store, "seen_many", None)) and callable(getattr(store, "remember_many", None))


class _LoopOnlyStore:
    """A third-party store with only the single-key methods: the helpers loop over them."""

    def __init__(self) -> None:
        self.inner, self.calls = InMemorySeenStore(), []

    def seen(self, key: str) -> bool:
        self.calls.append(("seen", key))
        return self.inner.seen(key)

    def remember(self, key: str) -> None:
        self.calls.append(("remember", key))
        self.inner.remember(key)

    def forget(self, key: str) -> None:
        self.inner.forget(key)


def test_helpers_fall_back_to_single_key_methods() -> None:
    store = _LoopOnlyStore()
    remember_many(store, ["a", "b", "a"])
    assert seen_many(store, ["a", "c", "b", "c"]) == {"a", "b"}
    assert store.calls == [("remember", "a"), ("remember", "b"), ("seen", "a"), ("seen", "c"), ("seen", "b")]


class _SingleOnly(Binding):
    """A binding written against the protocol before the batch methods: the defaults loop over its methods."""

    name = "single"

    def __init__(self) -> None:
        from airflow_provider_babelqueue.bindings.memory import MemoryBinding

        self.inner, self.calls = MemoryBinding(), []

    def publish(self, body, queue_name, *, headers=None, delay=0):  # type: ignore[no-untyped-def]
        self.inner.publish(body, queue_name, headers=headers, delay=delay)

    def publish_batch(self, bodies, queue_name):  # type: ignore[no-untyped-def]
        self.inner.publish_batch(bodies, queue_name)

    def reserve(self, queue_name, timeout=0):  # type: ignore[no-untyped-def]
        return self.inner.reserve(queue_name, timeout)

    def ack(self, message):  # type: ignore[no-untyped-def]
        self.calls.append("ack")
        self.inner.ack(message)

    def release(self, message, delay=0):  # type: ignore[no-untyped-def]
        self.calls.append("release")
        self.inner.release(message, delay)

    def dead_letter(self, message, reason, *, error=None, exception=None):  # type: ignore[no-untyped-def]
        self.inner.dead_letter(message, reason, error=error, exception=exception)

    def depth(self, queue_name):  # type: ignore[no-untyped-def]
        return self.inner.depth(queue_name)

    def dead_letter_depth(self, queue_name):  # type: ignore[no-untyped-def]
        return self.inner.dead_letter_depth(queue_name)

    def reserve_dead_letter(self, queue_name, timeout=0):  # type: ignore[no-untyped-def]
        self.calls.append("reserve_dead_letter")
        return self.inner.reserve_dead_letter(queue_name, timeout)


def test_default_batch_methods_loop_over_the_single_message_ones() -> None:
    binding = _SingleOnly()
    dead_letter(binding, "q", [poison(i) for i in range(3)])
    binding.calls.clear()
    batch = binding.reserve_dead_letters("q", 5)
    assert [kept(m) for m in batch] == [poison(i) for i in range(3)]
    assert binding.calls == ["reserve_dead_letter"] * 4  # three messages, then None
    binding.calls.clear()
    binding.release_many(batch[2:])
    binding.ack_many(batch[:2])
    assert binding.calls == ["release", "ack", "ack"]
    assert [kept(m) for m in binding.reserve_dead_letters("q", 1)] == [poison(2)]
