"""``hand_back`` on every binding (see conftest.BINDINGS): a reserved message a filter did not take goes back unhandled.

It is not a failed attempt: the stored bytes come back exactly (a body written with spaces and escaped slashes, as
PHP writes them, is not re-encoded) and ``attempts`` does not move, so the consumer it is meant for keeps its whole
retry budget. After the delay it is ready again; a reservation already settled is left alone.
"""

from __future__ import annotations

from airflow_provider_babelqueue.bindings.base import Binding
from tests.bindings.conftest import reserve_all

#: Brokers that count every receive themselves: a hand-back is a redelivery there, and the reconciled ``attempts``
#: (the larger of the body's count and the broker's) shows it once the broker's count passes the body's.
COUNTS_RECEIVES = {"sqs"}

#: A valid envelope as a non-canonical writer sends it: spaces, an escaped slash, a unicode escape. Any re-encoding
#: (what a release does to bump ``attempts``) would change these bytes.
ODD = (b'{"job": "urn:babel:orders:created", "trace_id": "t-1", "data": {"url": "https:\\/\\/shop.example\\/o\\/1", '
       b'"city": "M\\u00fcnchen", "n": %d}, "meta": {"id": "m-%d", "queue": "orders", "lang": "php", '
       b'"schema_version": 1, "created_at": 1700000000000}, "attempts": %d}')


def test_hand_back_keeps_bytes_and_attempts(binding: Binding, queue_name: str) -> None:
    bodies = [ODD % (n, n, attempts) for n, attempts in enumerate((0, 2, 0))]
    for body in bodies:
        binding.publish(body, queue_name)
    first = reserve_all(binding, queue_name, 3)
    assert sorted(m.body for m in first) == sorted(bodies)
    attempts = {m.body: m.attempts for m in first}
    assert sorted(attempts.values()) == [0, 0, 2]
    taken = [m for m in first if m.envelope is not None and m.envelope["data"]["n"] == 2]
    binding.hand_back([m for m in first if m not in taken], delay=0.5)
    binding.ack_many(taken)

    # hidden for the delay (brokers with whole-second delays round it up), then back exactly as stored
    assert binding.reserve_many(queue_name, 10, timeout=0) == []
    again = reserve_all(binding, queue_name, 2, within=15.0)
    assert sorted(m.body for m in again) == sorted(bodies[:2])
    # SQS: the first body claims 0 attempts and has been received twice now (receive count 2 = 1 earlier attempt)
    bump = {bodies[0]: 1} if binding.name in COUNTS_RECEIVES else {}
    assert {m.body: m.attempts for m in again} == {body: attempts[body] + bump.get(body, 0) for body in bodies[:2]}
    binding.ack_many(again)
    assert binding.reserve_many(queue_name, 10, timeout=0.3) == []
    assert binding.dead_letter_depth(queue_name) == 0


def test_hand_back_without_delay_is_ready_at_once(binding: Binding, queue_name: str) -> None:
    body = ODD % (7, 7, 1)
    binding.publish(body, queue_name)
    (message,) = reserve_all(binding, queue_name, 1)
    binding.hand_back([message])
    (again,) = reserve_all(binding, queue_name, 1)
    assert (again.body, again.attempts) == (body, 1)
    binding.ack(again)


def test_hand_back_of_a_settled_reservation_changes_nothing(binding: Binding, queue_name: str) -> None:
    body = ODD % (8, 8, 0)
    binding.publish(body, queue_name)
    (message,) = reserve_all(binding, queue_name, 1)
    binding.ack(message)
    binding.hand_back([message], delay=0)
    assert binding.reserve_many(queue_name, 10, timeout=0.5) == []
