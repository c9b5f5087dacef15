"""A filtered consumer on every binding (see conftest.BINDINGS): it handles exactly the messages its filter takes and
hands the others back unhandled, so they are still on the queue afterwards with their exact bytes and (except
where the broker counts receives itself: SQS) their ``attempts``; nothing is dead-lettered, poison included."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.engine.consume import Consumer
from airflow_provider_babelqueue.engine.filters import message_filter
from tests.bindings.conftest import Factory, reserve_all

CREATED, REFUNDED, PAID = "urn:babel:orders:created", "urn:babel:orders:refunded", "urn:babel:invoices:paid"
#: Brokers that count every receive themselves: a hand-back is a redelivery there (see test_hand_back.py).
COUNTS_RECEIVES = {"sqs"}

#: A valid envelope as a non-canonical writer sends it (spaces, escaped slashes, a unicode escape): any re-encoding
#: would change these bytes.
ODD = ('{"job": "%s", "trace_id": "t-%d", "data": {"n": %d, "amount": %d, "url": "https:\\/\\/shop.example\\/o\\/%d", '
       '"city": "M\\u00fcnchen"}, "meta": {"id": "m-%d", "queue": "%s", "lang": "php", "schema_version": %d, '
       '"created_at": 1700000000000}, "attempts": %d}')
#: n → (URN, amount, attempts, schema_version); None: a poison body. Taken: orders:*, amount > 100, valid.
MIX: dict[int, tuple[str, int, int, int] | None] = {
    0: (CREATED, 150, 0, 1),
    1: (CREATED, 50, 0, 1),  # amount too small
    2: (PAID, 500, 0, 1),  # another URN
    3: (REFUNDED, 101, 2, 1),  # taken, on its third attempt
    4: None,  # not JSON: matches no filter (an unfiltered consumer would dead-letter it)
    5: (CREATED, 100, 1, 1),  # not over 100; attempts 1 must stay 1
    6: (CREATED, 999, 0, 1),
    7: (CREATED, 500, 0, 2),  # would match, but fails validation: matches no filter
}
TAKEN = [0, 3, 6]
LEFT = [1, 2, 4, 5, 7]
POISON = b"\xff not json at all"


def bodies_for(queue_name: str) -> dict[int, bytes]:
    return {n: POISON if spec is None else
            (ODD % (spec[0], n, n, spec[1], n, n, queue_name, spec[3], spec[2])).encode() for n, spec in MIX.items()}


def attempts_of(n: int) -> int:
    spec = MIX[n]
    return 0 if spec is None else spec[2]


def n_of(message: ReceivedMessage) -> int:
    return -1 if message.envelope is None else int(message.envelope["data"]["n"])


def record_hand_backs(binding: Binding, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Each ``hand_back`` call's messages (``data.n``, -1 for poison), in call order."""
    calls: list[list[int]] = []
    original: Callable[..., None] = binding.hand_back

    def hand_back(messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        calls.append([n_of(m) for m in messages])
        original(messages, delay)

    monkeypatch.setattr(binding, "hand_back", hand_back)
    return calls


@pytest.fixture
def filtered_binding(make_binding: Factory, request: pytest.FixtureRequest) -> Binding:
    # Service Bus: read the DLQ from its native sub-queue only (a missing plain <queue>.dlq costs seconds per read)
    asb = request.node.callspec.params["make_binding"] == "azure-service-bus"
    return make_binding(**({"dead_letter_sources": ()} if asb else {}))


def test_a_filtered_consumer_handles_the_matches_and_leaves_the_rest_exactly_as_it_was(
        filtered_binding: Binding, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    binding = filtered_binding
    bodies = bodies_for(queue_name)
    for n in sorted(bodies):
        binding.publish(bodies[n], queue_name)
    runs: list[tuple[int, int]] = []

    def handler(env: dict[str, Any]) -> int:
        runs.append((env["data"]["n"], env["attempts"]))
        return int(env["data"]["n"])

    hand_backs = record_hand_backs(binding, monkeypatch)
    consumer = Consumer(binding, queue_name, {CREATED: handler, REFUNDED: handler, PAID: handler}, batch_size=10,
                        message_filter=message_filter("urn:babel:orders:*", "$[?$.amount > 100]"),
                        unmatched_delay=0.2)
    summary = consumer.run(reserve_timeout=0.5)

    assert runs == [(0, 0), (3, 2), (6, 0)]  # each match once, in queue order, with its attempts
    assert [entry["result"] for entry in summary.results] == TAKEN
    handed = [n for call in hand_backs for n in call]
    # each one at least once; a message whose delay ran out while the run still reserved is handed back again
    assert set(handed) == {-1 if MIX[n] is None else n for n in LEFT} and summary.unmatched == len(handed)
    counts = summary.as_dict()
    assert (counts["received"], counts["handled"], counts["retried"], counts["dead_lettered"]) == (3, 3, 0, {})

    back = reserve_all(binding, queue_name, len(LEFT))
    assert sorted(m.body for m in back) == sorted(bodies[n] for n in LEFT)  # byte for byte
    if binding.name not in COUNTS_RECEIVES:
        by_body = {bodies[n]: attempts_of(n) for n in LEFT}
        assert {m.body: m.attempts for m in back} == by_body
    binding.ack_many(back)
    assert binding.reserve_many(queue_name, 10, timeout=0.3) == []
    assert binding.dead_letter_depth(queue_name) == 0


def test_a_run_meeting_only_what_it_handed_back_ends(filtered_binding: Binding, queue_name: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a delay the handed-back messages are ready again at once and the next reserve brings them back:
    nothing new, so the run stops as it would on an empty queue (instead of spinning until ``max_seconds``)."""
    binding = filtered_binding
    bodies = bodies_for(queue_name)
    for n in LEFT:
        binding.publish(bodies[n], queue_name)
    hand_backs = record_hand_backs(binding, monkeypatch)
    started = time.monotonic()
    summary = Consumer(binding, queue_name, {CREATED: lambda env: pytest.fail("handled")}, batch_size=10,
                       message_filter=message_filter(CREATED, "$[?$.amount > 100]"), unmatched_delay=0).run(
        reserve_timeout=0.5)
    assert time.monotonic() - started < 8
    assert summary.received == 0 and summary.unmatched == sum(map(len, hand_backs)) >= len(LEFT)
    back = reserve_all(binding, queue_name, len(LEFT))
    assert sorted(m.body for m in back) == sorted(bodies[n] for n in LEFT)
    binding.ack_many(back)
