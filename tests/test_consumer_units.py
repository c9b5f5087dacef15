"""Pure parts of the consumer: backoff arithmetic, exception names, argument checks; the attempts rules over the
memory binding."""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import time
from typing import Any

import orjson
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.engine.consume import Backoff, Consumer, exception_name

URN = "urn:babel:orders:created"
NO_WAIT = Backoff("fixed", 0.0)
QUIET = logging.getLogger("tests.consumer_units")


def test_fixed_backoff() -> None:
    assert [Backoff("fixed", 2.5).delay(n) for n in (0, 1, 10)] == [2.5, 2.5, 2.5]


def test_exponential_backoff_doubles_up_to_the_cap() -> None:
    plain = Backoff("exponential", 1.0, cap=10.0, jitter=False)
    assert [plain.delay(n) for n in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert plain.delay(10_000) == 10.0


def test_jitter_stays_between_half_and_full_delay() -> None:
    jittered = Backoff("exponential", 1.0, cap=100.0)
    rng = random.Random(3)
    delays = [jittered.delay(3, rng) for _ in range(500)]
    assert min(delays) >= 4.0 and max(delays) <= 8.0 and len(set(delays)) > 400


def test_backoff_and_consumer_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="'fixed' or 'exponential'"):
        Backoff("linear")
    with pytest.raises(ValueError, match="must not be negative"):
        Backoff("fixed", -1)
    with pytest.raises(ValueError, match="max_attempts must be at least 1"):
        Consumer(MemoryBinding(), "q", {}, max_attempts=0)
    with pytest.raises(ValueError, match="'sometimes' is not a valid UnknownUrnStrategy"):
        Consumer(MemoryBinding(), "q", {}, unknown_urn="sometimes")


def test_exception_names() -> None:
    class Local(Exception):
        pass

    assert exception_name(ValueError("x")) == "ValueError"
    assert exception_name(Local()) == f"{__name__}.test_exception_names.<locals>.Local"


# ------------------------------------------------------------------------------- attempts, as the spec says


class _CountingBroker(MemoryBinding):
    """A memory binding whose broker counts deliveries itself, as SQS does: ``attempts`` is reconciled as
    max(body, ApproximateReceiveCount - 1), and the broker's count runs ``ahead`` of the body's."""

    def __init__(self, ahead: int) -> None:
        super().__init__()
        self.ahead = ahead

    def reserve(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        message = super().reserve(queue_name, timeout)
        if message is None:
            return None
        return dataclasses.replace(message, attempts=message.attempts + self.ahead)

    def reserve_many(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        return [dataclasses.replace(message, attempts=message.attempts + self.ahead)
                for message in super().reserve_many(queue_name, limit, timeout)]


def _publish_one(binding: MemoryBinding, urn: str = URN) -> bytes:
    body = bq.encode(bq.make_envelope(urn, {"order_id": 1042}, queue_name="orders"))
    binding.publish(body, "orders")
    return body


def test_handlers_see_the_reconciled_attempts_not_the_bodys() -> None:
    binding = _CountingBroker(ahead=4)
    body = _publish_one(binding)
    seen: list[dict[str, Any]] = []
    summary = Consumer(binding, "orders", {URN: seen.append}, log=QUIET).run(reserve_timeout=0)
    assert summary.handled == 1
    [envelope] = seen
    assert envelope["attempts"] == 4 and list(envelope) == ["job", "trace_id", "data", "meta", "attempts"]
    assert {**envelope, "attempts": 0} == bq.decode(body)  # nothing else changed


def test_a_dead_letter_counts_the_reconciled_attempts_at_the_top_level_and_in_the_block() -> None:
    binding = _CountingBroker(ahead=4)
    _publish_one(binding)
    seen: list[int] = []

    def fail(envelope: dict[str, Any]) -> None:
        seen.append(envelope["attempts"])
        raise RuntimeError("card declined")

    summary = Consumer(binding, "orders", {URN: fail}, max_attempts=3, backoff=NO_WAIT, log=QUIET).run(
        reserve_timeout=0)
    # the broker says four deliveries happened before this one: past max_attempts, dead-lettered at once
    assert seen == [4] and summary.retried == 0 and dict(summary.dead_lettered) == {"failed": 1}
    [dead] = binding.browse_dead_letters("orders")
    stored = orjson.loads(dead.body)
    assert stored["attempts"] == stored["dead_letter"]["attempts"] == 5


def test_three_failed_runs_give_a_dead_letter_with_attempts_3_and_3() -> None:
    """spec/dead-letters.md's example (and the Python SDK): ``"attempts": 3`` at the top level and in the block."""
    binding = MemoryBinding()
    body = _publish_one(binding)
    seen: list[int] = []

    def fail(envelope: dict[str, Any]) -> None:
        seen.append(envelope["attempts"])
        raise RuntimeError("card declined")

    Consumer(binding, "orders", {URN: fail}, max_attempts=3, backoff=NO_WAIT, log=QUIET).run(reserve_timeout=0)
    [dead] = binding.browse_dead_letters("orders")
    block = orjson.loads(dead.body)["dead_letter"]
    assert seen == [0, 1, 2]
    assert dead.body == body.replace(b'"attempts":0}', b'"attempts":3,') + (
        b'"dead_letter":{"reason":"failed","error":"card declined","exception":"RuntimeError","failed_at":'
        + str(block["failed_at"]).encode() + b',"original_queue":"orders","attempts":3,"lang":"python"}}')


def test_validation_and_unknown_urn_dead_letters_keep_the_delivery_attempts() -> None:
    binding = MemoryBinding()
    env = bq.make_envelope("urn:babel:nobody:handles", {}, queue_name="orders")
    env["attempts"] = 2
    binding.publish(bq.encode(env), "orders")
    invalid = bq.make_envelope(URN, {}, queue_name="orders")
    invalid["attempts"] = -1
    binding.publish(bq.encode(invalid), "orders")
    Consumer(binding, "orders", {URN: print}, log=QUIET).run(reserve_timeout=0)
    unknown, bad = (orjson.loads(m.body) for m in binding.browse_dead_letters("orders"))
    assert (unknown["attempts"], unknown["dead_letter"]["attempts"], unknown["dead_letter"]["reason"]) == (
        2, 2, "unknown_urn")
    # an invalid attempts value is the evidence of the quarantine: kept as it was
    assert (bad["attempts"], bad["dead_letter"]["attempts"], bad["dead_letter"]["reason"]) == (
        -1, 0, "invalid_attempts")


def test_a_lone_surrogate_in_a_handler_error_reaches_no_log_or_dead_letter(caplog: pytest.LogCaptureFixture) -> None:
    """``RuntimeError("\\ud800")`` would make every UTF-8 log handler (Airflow's task log, pytest-xdist's report)
    fail to write the retry and dead-letter lines: the consumer logs and stores the text with U+FFFD instead."""
    binding = MemoryBinding()
    binding.publish(bq.encode(bq.make_envelope("urn:x", {}, queue_name="q")), "q")

    def handler(envelope: dict[str, Any]) -> None:
        raise RuntimeError("bad \ud800 text")

    with caplog.at_level(logging.INFO, logger="tests.surrogate"):
        summary = Consumer(binding, "q", {"urn:x": handler}, max_attempts=2, backoff=Backoff("fixed", 0.0),
                           log=logging.getLogger("tests.surrogate")).run(reserve_timeout=0)
    assert summary.retried == 1 and dict(summary.dead_lettered) == {"failed": 1}
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2 and all("bad \ufffd text" in text for text in messages)
    for text in messages:
        text.encode("utf-8")  # raises on a lone surrogate
    [dead] = binding.browse_dead_letters("q")
    assert dead.envelope is not None and dead.envelope["dead_letter"]["error"] == "bad \ufffd text"


def test_the_progress_line_names_dead_letter_reasons_as_plain_text(caplog: pytest.LogCaptureFixture) -> None:
    """The summary's ``dead_lettered`` keys are plain strings, so a task log's progress line reads
    ``'unknown_urn': 2``, not the enum's repr."""
    binding = MemoryBinding()
    for _ in range(2):
        _publish_one(binding)
    with caplog.at_level(logging.INFO, logger=QUIET.name):
        summary = Consumer(binding, "orders", {}, log=QUIET).run(reserve_timeout=0, progress_seconds=0)
    assert [type(key) for key in summary.as_dict()["dead_lettered"]] == [str]
    progress = [m for m in caplog.messages if m.startswith("progress on orders (")]
    assert progress and progress[-1].endswith("'dead_lettered': {'unknown_urn': 2}}"), progress


def test_progress_lines_come_by_time_not_by_count(caplog: pytest.LogCaptureFixture) -> None:
    """Thousands of messages in a second make no progress line (the summary follows the run); a run that takes
    longer than ``progress_seconds`` gets one per interval that brought deliveries, with the rate."""
    binding = MemoryBinding()
    for _ in range(3000):
        _publish_one(binding, urn="urn:fast")
    with caplog.at_level(logging.INFO, logger=QUIET.name):
        summary = Consumer(binding, "orders", {"urn:fast": lambda env: None}, log=QUIET).run(reserve_timeout=0)
    assert summary.handled == 3000
    assert [m for m in caplog.messages if m.startswith("progress on")] == []
    for _ in range(4):
        _publish_one(binding, urn="urn:slow")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=QUIET.name):
        Consumer(binding, "orders", {"urn:slow": lambda env: time.sleep(0.4)}, log=QUIET, batch_size=1).run(
            reserve_timeout=0, progress_seconds=0.7)
    progress = [m for m in caplog.messages if m.startswith("progress on orders")]
    assert len(progress) == 2, progress  # after the 2nd (0.8 s) and the 4th message (0.8 s later)
    assert re.match(r"progress on orders \(\d msg/s since the last line\): \{'received': 2, 'handled': 2,", progress[0])
    assert re.match(r"progress on orders \(\d msg/s since the last line\): \{'received': 4, 'handled': 4,", progress[1])


class _Callable:
    def __call__(self, envelope: dict[str, Any]) -> None:
        return None


class _AsyncCallable:
    async def __call__(self, envelope: dict[str, Any]) -> None:
        return None


def _two(envelope: dict[str, Any], context: dict[str, Any]) -> None:
    return None


async def _coroutine(envelope: dict[str, Any]) -> None:
    return None


def _generator(envelope: dict[str, Any]) -> Any:
    yield envelope


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (_two, r"handler for 'urn:x' \(_two\(envelope: 'dict\[str, Any\]', context: 'dict\[str, Any\]'\) -> 'None'\) "
               r"cannot be called with one argument, the envelope dict"),
        (lambda: None, r"handler for 'urn:x' \(.*<lambda>\(\)\) cannot be called with one argument"),
        (_coroutine, r"handler for 'urn:x' \(_coroutine\) is a coroutine function; .* asyncio.run"),
        (_AsyncCallable(), r"handler for 'urn:x' \(_AsyncCallable\) is a coroutine function"),
        ("not callable", r"handler for 'urn:x' must be callable, got 'not callable'"),
        (_generator, r"handler for 'urn:x' \(_generator\) is a generator function; .* would never run"),
        ({"urn:babel:orders:*": _Callable()}, r"handler key 'urn:babel:orders:\*' looks like a pattern, .*\(urns="),
        ({"": _Callable()}, r"a handler's key must be the URN it handles, got ''"),
    ],
)
def test_a_handler_that_could_never_handle_a_message_is_refused_before_any_is_taken(handler: Any,
                                                                                    message: str) -> None:
    binding = MemoryBinding()
    body = bq.encode(bq.make_envelope("urn:x", {}))
    binding.publish(body, "orders")
    with pytest.raises(ValueError, match=message):
        Consumer(binding, "orders", handler if isinstance(handler, dict) else {"urn:x": handler})
    assert binding.depth("orders") == 1
    taken = binding.reserve("orders", timeout=0)
    assert taken is not None and taken.body == body  # never reserved: the attempts are still 0


@pytest.mark.parametrize(
    "handler",
    [lambda env: None, lambda env, extra=1: None, lambda *args, **kwargs: None, _Callable(), print, {}.get],
    ids=["one", "defaults", "varargs", "instance", "builtin", "bound-builtin"],
)
def test_handlers_callable_with_the_envelope_are_accepted(handler: Any) -> None:
    Consumer(MemoryBinding(), "orders", {"urn:x": handler})
