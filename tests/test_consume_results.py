"""The consumer keeps what handlers return (for the operator's XCom), within bounds; and a filtered run's loop (what it
hands back, when it ends), on the memory binding. The same filter behaviour on every broker:
tests/bindings/test_consume_filters.py."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.core.idempotency import InMemorySeenStore
from airflow_provider_babelqueue.engine.consume import Backoff, Consumer
from airflow_provider_babelqueue.engine.filters import message_filter

CREATED = "urn:babel:orders:created"
REFUNDED = "urn:babel:orders:refunded"
NO_WAIT = Backoff("fixed", 0.0)


def publish(binding: MemoryBinding, urn: str, *data: dict[str, Any]) -> list[str]:
    """Publish one envelope per ``data`` on ``orders``; returns their meta ids in order."""
    ids = []
    for payload in data:
        env = bq.make_envelope(urn, payload, queue_name="orders")
        binding.publish(bq.encode(env), "orders")
        ids.append(env["meta"]["id"])
    return ids


def entry_size(meta_id: str, urn: str, result: Any) -> int:
    return len(orjson.dumps({"meta_id": meta_id, "urn": urn, "result": result}))


# ------------------------------------------------------------------------------------------------- results


@dataclasses.dataclass
class Receipt:
    order: int
    at: datetime.datetime


def test_results_are_kept_in_handling_order_as_json() -> None:
    binding = MemoryBinding()
    ids = publish(binding, CREATED, *({"n": n} for n in range(5)))
    refund_id, = publish(binding, REFUNDED, {"n": 5})
    at = datetime.datetime(2026, 3, 1, 12, 30, tzinfo=datetime.UTC)

    def created(env: dict[str, Any]) -> Any:
        n = env["data"]["n"]
        if n == 1 and env["attempts"] == 0:
            raise ConnectionError("flaky")  # retried: its result comes from the run that succeeded
        return [{"n": n, "doubled": n * 2}, None, n, "ok", (n, "tuple")][n]

    summary = Consumer(binding, "orders", {CREATED: created, REFUNDED: lambda env: Receipt(5, at)},
                       backoff=NO_WAIT).run(reserve_timeout=0)
    assert summary.handled == 6 and summary.retried == 1
    # the retried message (n=1) was released to the end of the queue, and returned None anyway
    assert summary.results == [
        {"meta_id": ids[0], "urn": CREATED, "result": {"n": 0, "doubled": 0}},
        {"meta_id": ids[2], "urn": CREATED, "result": 2},
        {"meta_id": ids[3], "urn": CREATED, "result": "ok"},
        {"meta_id": ids[4], "urn": CREATED, "result": [4, "tuple"]},
        {"meta_id": refund_id, "urn": REFUNDED, "result": {"order": 5, "at": "2026-03-01T12:30:00+00:00"}},
    ]
    assert (summary.results_dropped, summary.results_unserialisable) == (0, 0)
    assert "results" not in summary.as_dict()  # the counts only: progress lines stay short


def test_results_are_bounded_by_count_and_the_rest_counted() -> None:
    binding = MemoryBinding()
    ids = publish(binding, CREATED, *({"n": n} for n in range(7)))
    summary = Consumer(binding, "orders", {CREATED: lambda env: env["data"]["n"]}, max_results=3).run(
        reserve_timeout=0)
    assert summary.handled == 7
    assert summary.results == [{"meta_id": ids[n], "urn": CREATED, "result": n} for n in range(3)]
    assert summary.as_dict()["results_dropped"] == 4

    binding = MemoryBinding()
    publish(binding, CREATED, {"n": 0}, {"n": 1})
    none_kept = Consumer(binding, "orders", {CREATED: lambda env: "x"}, max_results=0).run(reserve_timeout=0)
    assert none_kept.results == [] and none_kept.results_dropped == 2


def test_results_are_bounded_by_json_bytes_and_stay_the_first_ones() -> None:
    binding = MemoryBinding()
    sizes = [100, 100, 500, 10, 10]
    ids = publish(binding, CREATED, *({"size": size} for size in sizes))
    outputs = {n: "x" * size for n, size in enumerate(sizes)}
    needed = [entry_size(ids[n], CREATED, outputs[n]) for n in range(len(sizes))]
    # room for the first two and a little more: the third (500 bytes) does not fit, and the ones after it, small
    # enough to fit, are dropped too: the list is always the first results
    limit = needed[0] + needed[1] + needed[3] + needed[4]
    summary = Consumer(binding, "orders", {CREATED: lambda env: "x" * env["data"]["size"]},
                       max_result_bytes=limit).run(reserve_timeout=0)
    assert summary.handled == 5
    assert summary.results == [{"meta_id": ids[n], "urn": CREATED, "result": outputs[n]} for n in (0, 1)]
    assert summary.results_dropped == 3
    assert sum(len(orjson.dumps(entry)) for entry in summary.results) == needed[0] + needed[1] <= limit

    binding = MemoryBinding()
    [only] = publish(binding, CREATED, {"size": 10})
    exact = Consumer(binding, "orders", {CREATED: lambda env: "x" * 10},
                     max_result_bytes=entry_size(only, CREATED, "x" * 10)).run(reserve_timeout=0)
    assert exact.results == [{"meta_id": only, "urn": CREATED, "result": "x" * 10}]  # exactly at the limit: kept


def test_unserialisable_results_are_counted_and_warned_once_per_urn_and_type(caplog: pytest.LogCaptureFixture) -> None:
    binding = MemoryBinding()
    outputs: list[Any] = [{1, 2}, {3}, object(), {"ok": True}, 2**70, {1: "int key"}, {4}]
    ids = publish(binding, CREATED, *({"n": n} for n in range(len(outputs))))
    publish(binding, REFUNDED, {"n": 0})
    log = logging.getLogger("tests.consume_results")
    with caplog.at_level(logging.WARNING, logger=log.name):
        summary = Consumer(binding, "orders", {CREATED: lambda env: outputs[env["data"]["n"]],
                                               REFUNDED: lambda env: {5}}, log=log).run(reserve_timeout=0)
    assert summary.handled == 8 and not summary.dead_lettered  # the messages themselves were handled and acked
    assert summary.results == [{"meta_id": ids[3], "urn": CREATED, "result": {"ok": True}}]
    assert (summary.results_unserialisable, summary.results_dropped) == (7, 0)
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == [
        f"the handler for {CREATED} returned a set, which is not JSON-serialisable: not kept for XCom "
        "(counted in results_unserialisable)",
        f"the handler for {CREATED} returned a object, which is not JSON-serialisable: not kept for XCom "
        "(counted in results_unserialisable)",
        f"the handler for {CREATED} returned a int, which is not JSON-serialisable: not kept for XCom "
        "(counted in results_unserialisable)",
        f"the handler for {CREATED} returned a dict, which is not JSON-serialisable: not kept for XCom "
        "(counted in results_unserialisable)",
        f"the handler for {REFUNDED} returned a set, which is not JSON-serialisable: not kept for XCom "
        "(counted in results_unserialisable)",
    ]


def test_results_reach_the_summary_through_the_idempotency_guard() -> None:
    binding = MemoryBinding()
    store = InMemorySeenStore()
    [first, second] = publish(binding, CREATED, {"n": 1}, {"n": 2})
    store.remember(second)  # handled before: skipped, no handler run, no result
    summary = Consumer(binding, "orders", {CREATED: lambda env: {"n": env["data"]["n"]}}, idempotency=store).run(
        reserve_timeout=0)
    assert (summary.handled, summary.skipped_duplicates) == (1, 1)
    assert summary.results == [{"meta_id": first, "urn": CREATED, "result": {"n": 1}}]
    # a message delivered twice (an ack lost, a producer's retry) is handled twice without a store: kept twice
    binding = MemoryBinding()
    env = bq.make_envelope(CREATED, {"n": 3}, queue_name="orders")
    binding.publish_batch([bq.encode(env)] * 2, "orders")
    again = env["meta"]["id"]
    twice = Consumer(binding, "orders", {CREATED: lambda env: env["data"]["n"]}).run(reserve_timeout=0)
    assert twice.results == [{"meta_id": again, "urn": CREATED, "result": 3}] * 2


@pytest.mark.parametrize(("option", "value", "message"), [
    ("max_results", -1, "max_results must be a whole number >= 0"),
    ("max_results", True, "max_results must be a whole number >= 0"),
    ("max_result_bytes", 1.5, "max_result_bytes must be a whole number >= 0"),
    ("unmatched_delay", -1, "unmatched_delay must be a finite number >= 0"),
    ("unmatched_delay", float("nan"), "unmatched_delay must be a finite number >= 0"),
    ("unmatched_delay", float("inf"), "unmatched_delay must be a finite number >= 0"),
])
def test_arguments_are_checked(option: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Consumer(MemoryBinding(), "orders", {}, **{option: value})


# ----------------------------------------------------------------------------------------- the filter's loop


class Spy(MemoryBinding):
    """Counts reserves and records each ``hand_back`` call (the ``data.n`` of its messages and its delay)."""

    def __init__(self) -> None:
        super().__init__()
        self.reserves = 0
        self.hand_backs: list[tuple[list[int], float]] = []

    def reserve_many(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        self.reserves += 1
        return super().reserve_many(queue_name, limit, timeout)

    def hand_back(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        self.hand_backs.append(([m.envelope["data"]["n"] if m.envelope else -1 for m in messages], delay))
        super().hand_back(messages, delay)


def test_unmatched_messages_are_handed_back_once_per_batch_and_never_handled() -> None:
    binding = Spy()
    for n in range(10):
        publish(binding, CREATED if n % 3 == 0 else REFUNDED, {"n": n})
    binding.publish(b"\xff poison", "orders")
    handled: list[int] = []
    summary = Consumer(binding, "orders", {CREATED: lambda env: handled.append(env["data"]["n"]),
                                           REFUNDED: lambda env: handled.append(env["data"]["n"])},
                       batch_size=4, message_filter=message_filter(CREATED), unmatched_delay=0.3).run(
        reserve_timeout=0)
    assert handled == [0, 3, 6, 9]
    assert binding.hand_backs == [([1, 2], 0.3), ([4, 5, 7], 0.3), ([8, -1], 0.3)]
    counts = summary.as_dict()
    assert (counts["received"], counts["handled"], counts["unmatched"], counts["dead_lettered"]) == (4, 4, 7, {})
    assert binding.depth("orders") == 0 and binding.dead_letter_depth("orders") == 0  # hidden for the delay
    time.sleep(0.35)
    back = binding.reserve_many("orders", 10)
    assert [m.envelope["data"]["n"] if m.envelope else m.body for m in back] == [1, 2, 4, 5, 7, 8, b"\xff poison"]


def test_a_run_meeting_only_what_it_handed_back_ends() -> None:
    """No delay: the hand-back makes them ready at once and the next reserve brings them again. That reserve
    brought nothing new, so a run that stops when the queue is empty stops there."""
    binding = Spy()
    for n in range(3):
        publish(binding, REFUNDED, {"n": n})
    started = time.monotonic()
    summary = Consumer(binding, "orders", {}, message_filter=message_filter(CREATED), unmatched_delay=0).run(
        reserve_timeout=0.1)
    assert time.monotonic() - started < 2
    assert binding.reserves == 2 and binding.hand_backs == [([0, 1, 2], 0.0)] * 2
    assert (summary.received, summary.unmatched) == (0, 6)
    assert binding.depth("orders") == 3


def test_a_run_walks_past_more_unmatched_messages_than_a_batch_holds() -> None:
    binding = Spy()
    for n in range(25):
        publish(binding, REFUNDED, {"n": n})
    for n in range(25, 28):
        publish(binding, CREATED, {"n": n})
    handled: list[int] = []
    summary = Consumer(binding, "orders", {CREATED: lambda env: handled.append(env["data"]["n"])}, batch_size=10,
                       message_filter=message_filter(jsonpath="$[?$.n > 24]"), unmatched_delay=0.5).run(
        reserve_timeout=0)
    assert handled == [25, 26, 27] and summary.unmatched == 25
    assert binding.hand_backs == [(list(range(10)), 0.5), (list(range(10, 20)), 0.5), (list(range(20, 25)), 0.5)]
    time.sleep(0.55)
    assert [m.envelope and m.envelope["data"]["n"] for m in binding.reserve_many("orders", 100)] == list(range(25))


def test_without_stop_when_empty_a_run_does_not_spin_on_what_it_handed_back() -> None:
    binding = Spy()
    publish(binding, REFUNDED, {"n": 0})
    summary = Consumer(binding, "orders", {}, message_filter=message_filter(CREATED), unmatched_delay=0).run(
        max_seconds=0.5, stop_when_empty=False, reserve_timeout=0.1)
    # each reserve that brings the handed-back message again is followed by a reserve_timeout's wait
    assert 3 <= binding.reserves <= 6 and summary.unmatched == binding.reserves
    assert binding.depth("orders") == 1


def test_process_alone_hands_back_at_once() -> None:
    binding = Spy()
    publish(binding, REFUNDED, {"n": 4})
    consumer = Consumer(binding, "orders", {}, message_filter=message_filter(CREATED), unmatched_delay=0)
    message = binding.reserve("orders")
    assert message is not None and consumer.process(message) == "unmatched"
    assert binding.hand_backs == [([4], 0.0)]
    again = binding.reserve("orders")
    assert again is not None and again.body == message.body
