"""Batched consuming on every binding (see conftest.BINDINGS): ``reserve_many`` and the consumer's batches.

``reserve_many`` takes up to ``limit`` ready messages in publish order, each its own reservation, waiting for the
first only. The consumer reserves a batch and processes each message on its own (a failure releases that message
with its own backoff, or dead-letters it), then settles the batch together: a crash before that costs a
redelivery, never a message, and one message's failure or backoff never holds up the others of its batch.

A crash is the worker dying with reservations unsettled: on brokers where a reservation lives on the consumer's
connection (RabbitMQ's unacked deliveries, Pulsar's unacknowledged messages) its connection closes and the broker
hands them out again at once; elsewhere another worker gets them once the visibility timeout (Service Bus: the lock
duration) has passed. The in-memory binding has no second process to crash: its store is the binding itself, so
the "other worker" is the same object and the reservation's expiry is the crash recovery.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.engine.consume import Backoff, Consumer
from tests.bindings.conftest import Factory, reserve_all

URN = "urn:babel:orders:created"

#: Where a worker's death returns its reservations at once (they live on its connection): no visibility timeout
#: is set there, so the test proves the close is what gives them back.
HELD_BY_CONNECTION = {"rabbitmq", "pulsar"}
#: Seconds a reservation stays hidden on the other brokers before it is handed out again. One second is the
#: smallest SQS takes (VisibilityTimeout is whole seconds; moto honours it). Service Bus allows 5-300 s lock
#: durations; its test double does not enforce the 5 s minimum (see asb_double.py), so 1 s keeps the test fast
#: while exercising the same lock expiry.
VISIBILITY_TIMEOUT = 1.0
#: Bindings whose ``reserve_many`` hands out the deliveries the broker has pushed so far (RabbitMQ's
#: ``basic.consume`` window), which may be fewer than are ready (a first call often gets 3 of 6): exact batch sizes
#: are not asserted there, only that each batch continues the last in order. The base protocol says a call "takes
#: whatever else is ready"; the RabbitMQ binding documents "what the broker has pushed so far".
PUSHED = {"rabbitmq"}


class GatewayTimeout(Exception):
    pass


class WorkerKilled(BaseException):
    """The worker process dies mid-batch (SIGKILL, OOM): no ``except Exception`` runs, nothing is settled after."""


# --------------------------------------------------------------------------------------------------- helpers


def bodies_for(queue_name: str, count: int) -> list[bytes]:
    """Distinct envelopes numbered 0..count-1 in ``data.n``, with non-ASCII text so byte-exactness shows."""
    return [bq.encode(bq.make_envelope(URN, {"n": n, "note": f"Zoë ☕ #{n}"}, queue_name=queue_name))
            for n in range(count)]


def n_of(message: ReceivedMessage) -> int:
    assert message.envelope is not None, message.decode_error
    return int(message.envelope["data"]["n"])


def take_over(binding: Binding, queue_name: str, count: int, timeout: float) -> list[bytes]:
    """What a worker taking over gets: reserve batches (acking each at once, as a worker that handles them) until
    ``count`` messages came or ``timeout`` passed, then one more look, so a message delivered twice shows up."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        batch = binding.reserve_many(queue_name, count - len(got), timeout=0.5)
        binding.ack_many(batch)
        got += [m.body for m in batch]
    extra = binding.reserve_many(queue_name, 10, timeout=0.3)
    binding.ack_many(extra)
    return got + [m.body for m in extra]


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> str:
    """The parametrised broker (``make_binding``'s parameter), known before a binding is made."""
    return str(request.node.callspec.params["make_binding"])


def crash_options(broker: str) -> dict[str, Any]:
    return {} if broker in HELD_BY_CONNECTION else {"visibility_timeout": VISIBILITY_TIMEOUT}


@pytest.fixture
def reopen(make_binding: Factory) -> Iterator[Callable[[Binding], Binding]]:
    """``reopen(binding)`` → another worker's binding on the same queues (same config: the same table, key prefix,
    namespace or broker). The memory binding is its own store: the "other worker" is the binding itself."""
    opened: list[Binding] = []

    def open_again(binding: Binding) -> Binding:
        if binding.name == "memory":
            return binding
        if binding.name == "pulsar":  # the fake broker is reached through the first binding's client factory
            other = type(binding)(binding.config, client_factory=binding._factory)
        else:
            other = type(binding)(binding.config)
        opened.append(other)
        return other

    yield open_again
    for other in reversed(opened):  # before make_binding's cleanups delete the queues
        other.close()


def crash(binding: Binding, reopen: Callable[[Binding], Binding]) -> Binding:
    """The worker holding ``binding``'s reservations dies without settling any (its connections close); returns
    the binding of the worker that takes over."""
    if binding.name != "memory":
        binding.close()
    return reopen(binding)


class RecordingConsumer(Consumer):
    """A consumer that records what happened to each delivery, by ``data.n``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[int, list[str]] = defaultdict(list)
        self.last_delivery = 0.0

    def process(self, message: ReceivedMessage) -> str:
        self.last_delivery = time.monotonic()  # it was reserved before this
        outcome = super().process(message)
        self.outcomes[n_of(message)].append(outcome)
        return outcome


class Calls:
    """The consumer's reservations and settlements through the binding protocol, whichever of its methods the
    consumer uses for them (``reserve_many`` or ``settle_and_reserve``; ``ack``, ``ack_many``, ``release``,
    ``release_many``, ``settle``). Only the outermost call counts: a default implementation that calls another
    protocol method is still one call.

    :ivar events: in call order, ``("settle", acked, released, t)`` when a call starts (acked: numbers; released:
        ``(number, delay)``) and ``("reserve", limit, numbers, t)`` when it returns, ``t`` when the call started.
    """

    SETTLING = ("settle_and_reserve", "settle", "ack", "ack_many", "release", "release_many")

    def __init__(self, monkeypatch: pytest.MonkeyPatch, binding: Binding) -> None:
        self.events: list[tuple[Any, ...]] = []
        self._depth = 0
        for name in ("reserve_many", *self.SETTLING):
            monkeypatch.setattr(binding, name, self._wrap(name, getattr(binding, name)))

    @property
    def reserves(self) -> list[tuple[int, list[int]]]:
        return [(limit, got) for kind, limit, got, _ in self.events if kind == "reserve"]

    @property
    def settles(self) -> list[tuple[list[int], list[tuple[int, float]]]]:
        return [(acked, released) for kind, acked, released, _ in self.events if kind == "settle"]

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            outer, started = self._depth == 0, time.monotonic()
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            given = bound.arguments
            if outer and name in self.SETTLING:
                acks = {"ack": [given.get("message")], "ack_many": given.get("messages")}.get(name, given.get("acks"))
                releases = {"release": [(given.get("message"), given.get("delay"))],
                            "release_many": [(m, given.get("delay")) for m in given.get("messages") or ()],
                            }.get(name, given.get("releases"))
                if acks or releases:
                    self.events.append(("settle", [n_of(m) for m in acks or ()],
                                        [(n_of(m), delay) for m, delay in releases or ()], started))
            self._depth += 1
            try:
                result = method(*args, **kwargs)
            finally:
                self._depth -= 1
            if outer and name in ("reserve_many", "settle_and_reserve"):
                self.events.append(("reserve", given["limit"], [n_of(m) for m in result], started))
            return result

        return call


# ------------------------------------------------------------------------------------------- reserve_many


def test_reserve_many_takes_up_to_limit_in_publish_order(binding: Binding, queue_name: str) -> None:
    """Each call takes ``min(limit, ready)`` in publish order, while the earlier batches are still held."""

    def reserve(limit: int) -> list[ReceivedMessage]:
        got = binding.reserve_many(queue_name, limit, timeout=2)
        if binding.name in PUSHED:  # a partial batch: what else is ready comes with the next calls (see PUSHED)
            while got and len(got) < limit and (more := binding.reserve_many(queue_name, limit - len(got))):
                got += more
        return got

    bodies = bodies_for(queue_name, 7)
    binding.publish_batch(bodies, queue_name)
    first = reserve(3)
    assert [m.body for m in first] == bodies[:3]
    assert [m.envelope for m in first] == [bq.decode(body) for body in bodies[:3]]
    assert all(m.queue_name == queue_name and m.attempts == 0 and m.decode_error is None
               and not m.from_dead_letter for m in first)
    second = reserve(3)  # continues where the first left off
    assert [m.body for m in second] == bodies[3:6]
    started = time.monotonic()
    rest = reserve(100)  # more than is left: all of it, no wait for more
    assert [m.body for m in rest] == bodies[6:]
    assert time.monotonic() - started < 1, "waited for more than the first message though one was ready"
    assert binding.reserve_many(queue_name, 100, timeout=0) == []
    binding.ack_many(first + second + rest)
    assert binding.reserve_many(queue_name, 100, timeout=0) == []
    assert binding.depth(queue_name) == 0 and binding.dead_letter_depth(queue_name) == 0


def test_successive_batches_keep_publish_order_and_bytes(binding: Binding, queue_name: str) -> None:
    """What a consumer does: reserve a batch, settle it, reserve the next; together the batches are the queue, in
    order, byte for byte. (Batch sizes are exact except where the binding hands out what was pushed so far.)"""
    bodies = bodies_for(queue_name, 25)
    binding.publish_batch(bodies, queue_name)
    batches: list[list[bytes]] = []
    while sum(map(len, batches)) < len(bodies) and len(batches) < 30:
        batch = binding.reserve_many(queue_name, 10, timeout=2)
        assert 0 < len(batch) <= 10
        binding.ack_many(batch)
        batches.append([m.body for m in batch])
    assert [body for batch in batches for body in batch] == bodies
    if binding.name not in PUSHED:
        assert list(map(len, batches)) == [10, 10, 5]
    assert binding.reserve_many(queue_name, 10, timeout=0) == []
    assert binding.depth(queue_name) == 0


def test_reserve_many_of_zero_takes_nothing_and_does_not_wait(binding: Binding, queue_name: str) -> None:
    body = bodies_for(queue_name, 1)[0]
    binding.publish(body, queue_name)
    started = time.monotonic()
    assert binding.reserve_many(queue_name, 0, timeout=5) == []
    assert time.monotonic() - started < 1
    assert binding.depth(queue_name) == 1  # nothing was reserved
    [message] = binding.reserve_many(queue_name, 5, timeout=2)
    assert message.body == body
    binding.ack_many([message])


def test_reserve_many_on_an_empty_queue_waits_about_the_timeout(binding: Binding, queue_name: str) -> None:
    # SQS long-polls in whole seconds: a wait of 0.5 s is one ReceiveMessage with WaitTimeSeconds=1. moto's server
    # then waits on its queue in whole seconds until its wall clock passes the poll's end, so a wait that ends a hair
    # early is followed by a second one: up to 2 s (2.45 s was seen on a busy CI machine). A binding that ignored the
    # timeout would wait the configured long poll (20 s by default), well past either bound.
    upper = 2.0 + 1.0 if binding.name == "sqs" else 0.5 + 0.75
    started = time.monotonic()
    assert binding.reserve_many(queue_name, 10, timeout=0.5) == []
    assert 0.45 <= time.monotonic() - started < upper
    started = time.monotonic()
    assert binding.reserve_many(queue_name, 10, timeout=0) == []
    assert time.monotonic() - started < 0.75


def test_reserve_many_waits_for_the_first_message_only(binding: Binding, queue_name: str) -> None:
    """It returns with the first message, not waiting for ``limit`` of them, and while it waits another thread can
    use the binding (here: publish that message), as with ``reserve``."""
    warm_up, body = bodies_for(queue_name, 2)
    binding.publish(warm_up, queue_name)  # connections, links and the queue itself exist before the timing starts
    binding.ack_many(binding.reserve_many(queue_name, 5, timeout=2))
    published: list[float] = []

    def publish() -> None:
        published.append(time.monotonic())
        binding.publish(body, queue_name)
        published.append(time.monotonic())

    timer = threading.Timer(0.3, publish)
    timer.start()
    got = binding.reserve_many(queue_name, 5, timeout=5)
    returned = time.monotonic()
    timer.join()
    assert [m.body for m in got] == [body]
    fired, done = published
    assert returned - done < 1, f"returned {returned - done:.2f} s after the message came: it waited for more"
    binding.ack_many(got)
    assert done - fired < 0.15, f"the other thread's publish took {done - fired:.2f} s: held up by the reserve"


# ----------------------------------------------------------------------------------------------- crashes


def test_a_batch_reserved_and_never_settled_comes_back_after_a_crash(make_binding: Factory, broker: str,
                                                                     reopen: Callable[[Binding], Binding],
                                                                     queue_name: str) -> None:
    binding = make_binding(**crash_options(broker))
    bodies = bodies_for(queue_name, 6)
    binding.publish_batch(bodies, queue_name)
    batch = binding.reserve_many(queue_name, 4, timeout=2)
    assert [m.body for m in batch] == bodies[:len(batch)] and batch
    if binding.name not in PUSHED:
        assert len(batch) == 4
    survivor = crash(binding, reopen)
    back = take_over(survivor, queue_name, 6, timeout=VISIBILITY_TIMEOUT + 4)
    assert sorted(back) == sorted(bodies)  # every one, exact bytes, none twice


@pytest.mark.parametrize("settle_interval", [60.0, 0.0], ids=["settled-per-batch", "settled-per-message"])
def test_a_consumer_that_dies_mid_batch_loses_nothing(make_binding: Factory, broker: str,
                                                      reopen: Callable[[Binding], Binding], queue_name: str,
                                                      settle_interval: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Handled but not yet acked messages come back (at-least-once), as does the one in hand and the rest of the
    batch; with ``settle_interval=0`` each handled message was acked at once, so only the others come back."""
    binding = make_binding(**crash_options(broker))
    bodies = bodies_for(queue_name, 5)
    binding.publish_batch(bodies, queue_name)
    handled: list[int] = []

    def handler(env: dict[str, Any]) -> None:
        if env["data"]["n"] == 3:
            raise WorkerKilled
        handled.append(env["data"]["n"])

    calls = Calls(monkeypatch, binding)
    consumer = Consumer(binding, queue_name, {URN: handler}, batch_size=5, settle_interval=settle_interval)
    with pytest.raises(WorkerKilled):
        consumer.run(reserve_timeout=1)
    assert handled == [0, 1, 2]
    acked = [n for acks, _ in calls.settles for n in acks]
    if settle_interval == 0:
        assert acked == [0, 1, 2]
    elif binding.name in PUSHED:  # a partial first batch is settled when the next is reserved
        assert acked == list(range(len(acked))) and len(acked) <= 3
    else:
        assert acked == []  # one batch of five, never settled
    survivor = crash(binding, reopen)
    expected = [body for n, body in enumerate(bodies) if n not in acked]
    # the handled-and-acked ones were reserved as long as the rest: had they not been acked, they would be back too
    back = take_over(survivor, queue_name, len(expected), timeout=VISIBILITY_TIMEOUT + 4)
    assert sorted(back) == sorted(expected)


# ----------------------------------------------------------------------------------------- the consumer


ALWAYS_FAILS = {2, 7}
FAILS_ONCE = 4


def test_each_message_of_a_batch_gets_its_own_outcome(make_binding: Factory, broker: str,
                                                      reopen: Callable[[Binding], Binding], queue_name: str) -> None:
    # a short visibility timeout, so a handled message left unacked would show by the end. Service Bus counts
    # locked messages in its depth (ActiveMessageCount), so there depth 0 says it and its lock stays the default;
    # its DLQ is read from the native sub-queue only (a missing plain <queue>.dlq costs seconds per read)
    lock_counted = broker == "azure-service-bus"
    binding = make_binding(**({"dead_letter_sources": ()} if lock_counted else crash_options(broker)))
    bodies = bodies_for(queue_name, 10)
    binding.publish_batch(bodies, queue_name)
    runs: dict[int, list[int]] = defaultdict(list)

    def handler(env: dict[str, Any]) -> None:
        n = env["data"]["n"]
        runs[n].append(env["attempts"])
        if n in ALWAYS_FAILS:
            raise GatewayTimeout(f"gateway down for order {n}")
        if n == FAILS_ONCE and env["attempts"] == 0:
            raise ConnectionError("flaky link")

    consumer = RecordingConsumer(binding, queue_name, {URN: handler}, batch_size=10, max_attempts=2,
                                 backoff=Backoff("fixed", 0))
    summary = consumer.run(reserve_timeout=1)

    assert dict(consumer.outcomes) == {
        n: ["retried", "dead_letter:failed"] if n in ALWAYS_FAILS
        else ["retried", "handled"] if n == FAILS_ONCE
        else ["handled"]
        for n in range(10)
    }
    assert dict(runs) == {n: [0, 1] if n in ALWAYS_FAILS or n == FAILS_ONCE else [0] for n in range(10)}
    assert summary.as_dict() == {
        "received": 13,
        "handled": 8,
        "retried": 3,
        "skipped_duplicates": 0,
        "deleted_unknown": 0,
        "released_unknown": 0,
        "unmatched": 0,
        "returned_unhandled": 0,
        "broker_errors": 0,
        "results_dropped": 0,
        "results_unserialisable": 0,
        "dead_lettered": {"failed": 2},
    }
    assert binding.depth(queue_name) == 0
    assert binding.reserve_many(queue_name, 100, timeout=0) == []
    assert binding.dead_letter_depth(queue_name) == 2
    dead = collect_dead_letters(binding, queue_name, 2)
    assert sorted(d.envelope["data"]["n"] for d in dead) == sorted(ALWAYS_FAILS)
    for letter in dead:
        env = letter.envelope
        n = env["data"]["n"]
        original = bq.decode(bodies[n])
        assert env["dead_letter"] | {"failed_at": 0} == {
            "reason": "failed",
            "error": f"gateway down for order {n}",
            "exception": "tests.bindings.test_batched_consume.GatewayTimeout",
            "failed_at": 0,
            "original_queue": queue_name,
            "attempts": 2,
            "lang": "python",
        }
        assert {k: env[k] for k in ("job", "trace_id", "data", "meta")} == {
            k: original[k] for k in ("job", "trace_id", "data", "meta")}
    binding.ack_many(dead)
    assert binding.dead_letter_depth(queue_name) == 0
    # nothing stays reserved: past the visibility timeout (or once the worker's connection closed), a handled
    # message that was not acked would be handed out again
    if not lock_counted:
        survivor = crash(binding, reopen)
        if broker not in HELD_BY_CONNECTION:  # past the last reservation's visibility timeout
            time.sleep(max(0.0, consumer.last_delivery + VISIBILITY_TIMEOUT + 0.3 - time.monotonic()))
        assert survivor.reserve_many(queue_name, 100, timeout=0.3) == []


def test_a_dead_letter_counts_the_handler_runs_at_the_top_level_and_in_the_block(
        make_binding: Factory, broker: str, queue_name: str) -> None:
    """After three failed runs (two of them on released copies) the dead letter says 3 and 3, as the spec, the
    Python SDK and docs/conformance.md say, whatever the broker keeps in its DLQ."""
    binding = make_binding(**({"dead_letter_sources": ()} if broker == "azure-service-bus" else {}))
    body = bodies_for(queue_name, 1)[0]
    binding.publish(body, queue_name)

    def handler(env: dict[str, Any]) -> None:
        raise GatewayTimeout("gateway down")

    summary = Consumer(binding, queue_name, {URN: handler}, max_attempts=3, backoff=Backoff("fixed", 0)).run(
        reserve_timeout=1)
    assert summary.retried == 2 and summary.dead_lettered == {"failed": 1}
    [dead] = collect_dead_letters(binding, queue_name, 1)
    assert dead.envelope is not None and dead.envelope["dead_letter"]["attempts"] == 3
    assert dead.envelope["attempts"] == 3
    binding.ack_many([dead])


def collect_dead_letters(binding: Binding, queue_name: str, count: int) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + 5
    while len(got) < count and time.monotonic() < deadline:
        got += binding.reserve_dead_letters(queue_name, count - len(got), timeout=0.5)
    return got + binding.reserve_dead_letters(queue_name, 10, timeout=0)


def test_a_failed_message_waits_its_backoff_while_the_rest_of_its_batch_is_acked(
        make_binding: Factory, broker: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The others of the batch are handled at once and acked without waiting for the failed one's retry: every
    reservation here expires after a visibility timeout shorter than the backoff (RabbitMQ's and Pulsar's by the
    binding's own lease), so an ack held until the retry would let the handled messages run twice."""
    base = 1.5
    # the delay each broker applies: SQS's DelaySeconds is whole seconds, rounded up (never early); the others
    # delay by the millisecond (Redis and SQL by their clock, RabbitMQ by a delay queue's TTL, Pulsar by
    # deliver_after, Service Bus by a scheduled enqueue time)
    effective = math.ceil(base) if broker == "sqs" else base
    binding = make_binding(visibility_timeout=VISIBILITY_TIMEOUT)
    bodies = bodies_for(queue_name, 5)
    binding.publish_batch(bodies, queue_name)
    runs: list[tuple[int, int, float]] = []

    def handler(env: dict[str, Any]) -> None:
        runs.append((env["data"]["n"], env["attempts"], time.monotonic()))
        if env["data"]["n"] == 1 and env["attempts"] == 0:
            raise GatewayTimeout("try later")

    calls = Calls(monkeypatch, binding)
    consumer = Consumer(binding, queue_name, {URN: handler}, batch_size=5, max_attempts=3,
                        backoff=Backoff("fixed", base))
    summary = consumer.run(max_messages=6, reserve_timeout=effective + 3)

    # none of the handled ones ran twice, and the failed one ran again once, with attempts 1
    assert [(n, attempts) for n, attempts, _ in runs] == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (1, 1)]
    assert summary.handled == 5 and summary.retried == 1 and summary.received == 6 and not summary.dead_lettered
    if binding.name not in PUSHED:
        assert calls.reserves[0] == (5, [0, 1, 2, 3, 4])
    # before the retry was reserved, the batch was settled: 0, 2, 3, 4 acked; 1 released with the backoff's delay,
    # passed to the broker as it is
    reserves = [i for i, event in enumerate(calls.events) if event[0] == "reserve"]
    retry = next(i for i in reserves if calls.events[i][2] == [1] and i != reserves[0])
    assert [n for i in reserves if i < retry for n in calls.events[i][2]] == [0, 1, 2, 3, 4]
    before = [event for event in calls.events[:retry] if event[0] == "settle"]
    assert sorted(n for event in before for n in event[1]) == [0, 2, 3, 4]
    assert [released for event in before for released in event[2]] == [(1, base)]
    failed_at, retried_at = runs[1][2], runs[5][2]
    assert runs[4][2] - failed_at < 0.5  # the rest of the batch at once, not after the failed one's delay
    # the failed one came back no sooner than its delay (50 ms of slack for the broker's clock), and not much later
    assert retried_at - failed_at >= effective - 0.05, f"redelivered after {retried_at - failed_at:.3f} s"
    assert retried_at - failed_at < effective + 2.5
    assert binding.depth(queue_name) == 0
    assert binding.reserve_many(queue_name, 100, timeout=0) == []
    assert binding.dead_letter_depth(queue_name) == 0


def test_max_messages_is_respected_and_the_rest_stays_ready(binding: Binding, reopen: Callable[[Binding], Binding],
                                                            queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = bodies_for(queue_name, 12)
    binding.publish_batch(bodies, queue_name)
    seen: list[int] = []
    calls = Calls(monkeypatch, binding)
    summary = Consumer(binding, queue_name, {URN: lambda env: seen.append(env["data"]["n"])},
                       batch_size=100).run(max_messages=7, reserve_timeout=1)
    assert seen == list(range(7))
    assert summary.received == 7 and summary.handled == 7
    taken = 0
    for limit, got in calls.reserves:  # never more asked for than max_messages leaves
        assert limit == 7 - taken and 0 < len(got) <= limit
        taken += len(got)
    assert [n for _, got in calls.reserves for n in got] == list(range(7))
    assert calls.settles == [(got, []) for _, got in calls.reserves]  # each batch acked together
    if binding.name not in PUSHED:
        assert calls.reserves == [(7, list(range(7)))]  # one batch: all seven were ready
    assert binding.depth(queue_name) == 5
    # another worker, while this one's binding stays open (nothing fetched ahead may stay with it), gets the rest
    other = reopen(binding)
    rest = reserve_all(other, queue_name, 5)  # a broker that pushes (RabbitMQ) may hand them out over two calls
    assert [m.body for m in rest] == bodies[7:]
    other.ack_many(rest)
    assert other.reserve_many(queue_name, 100, timeout=0) == []
    assert other.depth(queue_name) == 0


def test_batches_are_handled_in_publish_order(binding: Binding, queue_name: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = bodies_for(queue_name, 35)
    binding.publish_batch(bodies, queue_name)
    seen: list[int] = []
    calls = Calls(monkeypatch, binding)
    summary = Consumer(binding, queue_name, {URN: lambda env: seen.append(env["data"]["n"])},
                       batch_size=10).run(reserve_timeout=0.5)
    assert seen == list(range(35))
    assert summary.received == 35 and summary.handled == 35 and summary.retried == 0
    reserves = calls.reserves
    assert all(limit == 10 for limit, _ in reserves)
    assert reserves[-1][1] == [] and all(got for _, got in reserves[:-1])  # the empty one ended the run
    assert [n for _, got in reserves for n in got] == list(range(35))
    assert calls.settles == [(got, []) for _, got in reserves[:-1]]  # each batch acked together, once
    if binding.name not in PUSHED:
        assert [len(got) for _, got in reserves] == [10, 10, 10, 5, 0]
    assert binding.depth(queue_name) == 0
    assert binding.reserve_many(queue_name, 100, timeout=0) == []


def test_a_slow_batch_hands_back_what_it_cannot_start_before_its_reservations_are_half_over(
        make_binding: Factory, broker: str, queue_name: str) -> None:
    """Two consumers in parallel, handlers slow enough that a whole batch outlasts the reservations (one second;
    RabbitMQ's and Pulsar's a lease of the binding's own): each consumer stops starting handlers once half of it is
    over and hands the rest back unhandled, so no message runs twice, where before the tail of every batch ran on
    both consumers. The batches shrink to what fits.

    Service Bus and SQS get three seconds (Service Bus's real minimum is five): on the double the first send of a
    binding (a hand-back there is a copy sent, then the original completed) takes a good part of a one-second
    lock, and moto's server answers a receive in tens of milliseconds, hundreds while the suite loads both cores;
    the first message of a batch always runs, so a receive slower than half the reservation can make it run twice."""
    seconds = 3.0 if broker in ("azure-service-bus", "sqs") else VISIBILITY_TIMEOUT
    bodies = bodies_for(queue_name, 12)
    first = make_binding(visibility_timeout=seconds)
    second = make_binding(visibility_timeout=seconds)
    assert first.reservation_seconds(queue_name) == seconds
    first.publish_batch(bodies, queue_name)
    runs: list[int] = []
    lock = threading.Lock()

    def handler(env: dict[str, Any]) -> None:
        with lock:
            runs.append(env["data"]["n"])
        time.sleep(0.15 * seconds)

    summaries = []

    def consume(binding: Binding) -> None:
        consumer = Consumer(binding, queue_name, {URN: handler}, batch_size=6)
        summaries.append(consumer.run(max_seconds=30, reserve_timeout=1.0))

    workers = [threading.Thread(target=consume, args=(binding,)) for binding in (first, second)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert len(summaries) == 2
    assert sorted(runs) == list(range(12)), f"ran twice: {sorted(n for n in set(runs) if runs.count(n) > 1)}"
    assert sum(s.handled for s in summaries) == 12 and not any(s.dead_lettered or s.retried for s in summaries)
    # six handlers of 0.15 of the reservation do not fit in half of it: the first batches handed back their tails
    assert sum(s.returned_unhandled for s in summaries) >= 2
    assert first.depth(queue_name) == 0


def test_reservations_held_until_the_connection_closes_never_cut_a_batch(
        make_binding: Factory, broker: str, queue_name: str) -> None:
    """Without a lease RabbitMQ and Pulsar hand a delivery to nobody else while this reader holds it: a slow batch
    runs whole. Elsewhere the broker's own timeout always applies (SQL and Redis 300 s by default, SQS the queue's
    visibility timeout, Service Bus the lock duration)."""
    binding = make_binding()
    seconds = binding.reservation_seconds(queue_name)
    if broker not in HELD_BY_CONNECTION:
        assert seconds is not None and seconds > 0
        return
    assert seconds is None
    binding.publish_batch(bodies_for(queue_name, 4), queue_name)
    consumer = Consumer(binding, queue_name, {URN: lambda env: time.sleep(0.2)}, batch_size=4)
    summary = consumer.run(max_messages=4, reserve_timeout=3.0)
    assert summary.handled == 4 and summary.returned_unhandled == 0


def test_stop_ends_the_run_at_the_next_message_and_hands_back_the_rest_of_the_batch(
        make_binding: Factory, broker: str, queue_name: str) -> None:
    """``Consumer.stop()`` (what the consume operator's ``on_kill`` calls): the handler in hand finishes, the
    handled messages are settled, the ones not started come back at once, unhandled, rather than after the
    visibility timeout (300 s on SQL and Redis here, 60 s on the Service Bus double, SQS's 30 s)."""
    binding = make_binding()
    binding.publish_batch(bodies_for(queue_name, 10), queue_name)
    ran: list[int] = []

    def handler(env: dict[str, Any]) -> None:
        ran.append(env["data"]["n"])
        if len(ran) == 3:
            consumer.stop()

    consumer = Consumer(binding, queue_name, {URN: handler}, batch_size=10)
    summary = consumer.run(reserve_timeout=3.0)
    assert consumer.stopped and ran == [0, 1, 2] and summary.handled == 3
    if broker not in PUSHED:  # RabbitMQ's first batch may be what was pushed so far: its prefetch goes back too
        assert summary.returned_unhandled == 7
    back = reserve_all(binding, queue_name, 7, within=10.0)
    assert sorted(n_of(m) for m in back) == list(range(3, 10))
    binding.ack_many(back)
    assert binding.depth(queue_name) == 0
