"""A conformant BabelQueue consumer over any binding, for bounded runs (pure: no Airflow import).

For each delivery, in this order:

0. with a :class:`~.filters.MessageFilter`, a message the filter does not take is *handed back* unhandled
   (:meth:`Binding.hand_back`: bytes and ``attempts`` unchanged, hidden for ``unmatched_delay`` seconds), never
   acked, released or dead-lettered, and counted as ``unmatched``: it is meant for another consumer. Poison and
   invalid envelopes match no filter, so a filtered consumer hands them back too (an unfiltered one
   quarantines them, below);
1. a body over ``max_body_bytes`` or nested deeper than ``max_nesting_depth`` is dead-lettered with reason
   ``poison`` (its bytes kept exactly) and an error naming the limit and the actual size or depth: a hostile
   or runaway producer cannot make a consumer validate, re-encode or hand it to a handler;
2. an undecodable body is dead-lettered with reason ``poison`` (its bytes kept exactly): not JSON, not an
   object, a malformed header frame, or an integer outside signed 64-bit (never handed on rounded);
3. an envelope that fails validation is dead-lettered with the validation reason (an unsupported schema
   version included): quarantined, never dropped;
4. a URN with no handler follows the unknown-URN strategy;
5. a duplicate ``meta.id`` (when an idempotency store is given) is acked without running the handler;
6. the handler runs, given the envelope with the reconciled ``attempts`` (the binding's
   ``ReceivedMessage.attempts``: e.g. SQS's ApproximateReceiveCount - 1 when it is higher than the body's);
   success acks, failure releases with backoff until ``max_attempts`` handler runs, then dead-letters with
   reason ``failed``, the error text, the exception type, and ``attempts`` = the handler runs, at the top level
   and in the block (3 and 3 after three failures with ``max_attempts=3``, as the spec and the Python SDK).

A framed message (Node's Redis adapter, the Python SDK 1.24) is its inner envelope throughout: the bindings
unwrap it when they read it (``bindings.message.parse_body``), a release keeps it framed, a dead letter is stored
as the bare annotated envelope.

A run reserves in batches (:meth:`Binding.reserve_many`, up to ``batch_size`` at once) and settles the handled
messages of a batch with one :meth:`Binding.ack_many`, so a queue moves at the broker's pace rather than one round
trip per message. Each message is still processed on its own: a handler's failure releases or dead-letters only
that message, at once. What a crash can cost is bounded: the handled but unsettled messages (at most one batch,
and no more than ``settle_interval`` seconds of handling) come back and run again, as any at-least-once delivery does;
an idempotency store makes those redeliveries no-ops. Nothing is lost: a message is settled only after its
handler returned. A batch whose handlers are slow shrinks the next one (down to one message), and no handler
starts once half of the binding's :meth:`~.Binding.reservation_seconds` has passed since the batch was reserved:
the rest is handed back unhandled (``returned_unhandled``), so a reservation never outlives the broker's visibility
timeout while it waits its turn, and parallel consumers do not both run it.

Handlers' return values. A handler that returns something other than ``None`` has it kept, in handling order, as
``{"meta_id": ..., "urn": ..., "result": ...}`` in :attr:`ConsumeSummary.results` (what the operator returns to
XCom), as its JSON form (orjson: a dataclass or a datetime is kept as the object or the text it encodes to).
The list is bounded by ``max_results`` entries and ``max_result_bytes`` of JSON; once a result would pass either,
it and every later one are counted in ``results_dropped`` instead, so the list is always the first results. A
result orjson cannot encode is counted in ``results_unserialisable`` and warned about once per URN and type. A
message delivered again (a crash before its ack, a redelivery by the broker) runs its handler again and has its
result kept again; a duplicate skipped by the idempotency store has none.

The limits are checked on the raw bytes the binding returned; bindings decode a body when they reserve it
(with orjson, which refuses nesting deeper than 1,024 levels without recursing), so the limits protect
everything after that: validation, the dead-letter re-encoding, handlers and their own parsers.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from ..bindings.base import Binding, BindingError
from ..bindings.bodies import bumped_body
from ..bindings.message import ReceivedMessage
from ..core import envelope as bq
from ..core.idempotency import Effect, IdempotencyGuard, SeenStore
from .filters import MessageFilter
from .limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_NESTING_DEPTH, body_limit_error, check_limit, nesting_depth
from .logs import DEFAULT_MESSAGE_LOG_LINES, LineBudget, Log
from .telemetry import ConsumeTracer, MessageSpan

#: The contract's integers are signed 64-bit (and so are the brokers' attempts columns and headers).
_MAX_COUNT = 2**63 - 1
#: Messages reserved at once by default: large enough that a round trip per batch costs little beside a no-op
#: handler's work, small enough that a crash repeats little and every binding's batch primitive takes it whole.
DEFAULT_BATCH_SIZE = 100
#: Seconds of handled-but-unsettled work the consumer keeps at most before it settles them.
DEFAULT_SETTLE_INTERVAL = 1.0
#: A batch whose processing took longer than this halves the next batch (down to one message).
_SLOW_BATCH_SECONDS = 5.0
#: Share of a reservation's life after which a batch starts no more handlers (see Consumer._process_batch): the
#: other half is for the handler already running and the settlement.
_RESERVATION_SHARE = 0.5
#: Seconds a message the filter did not take stays hidden after it is handed back. Long enough that a run walking
#: a shared queue moves past the messages it handed back instead of meeting them again in its next reserves (a
#: batch of 100 takes well under a second), short enough that the consumer a message is meant for gets it within
#: seconds; a whole number, because SQS hides messages for whole seconds.
DEFAULT_UNMATCHED_DELAY = 5.0
#: Handler results kept for XCom: enough to pass the ids or references a run produced to the next task.
DEFAULT_MAX_RESULTS = 100
#: Bytes of JSON the kept results may take (64 KiB). Without a custom XCom backend a return value is one row of
#: the metadata database, which the UI and every downstream pull load whole: it should stay small. A handler whose
#: output is larger writes it to storage and returns a reference to it.
DEFAULT_MAX_RESULT_BYTES = 64 * 1024

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_NESTING_DEPTH",
    "DEFAULT_MAX_RESULTS",
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_SETTLE_INTERVAL",
    "DEFAULT_UNMATCHED_DELAY",
    "Backoff",
    "ConsumeSummary",
    "Consumer",
    "Handler",
    "MessageFilter",
    "UnknownUrnStrategy",
    "body_limit_error",
    "check_handler",
    "check_handler_key",
    "check_limit",
    "exception_name",
    "nesting_depth",
]

Handler = Callable[[dict[str, Any]], Any]


#: Callables whose call returns an object instead of running their body.
_NEVER_RUN: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("a coroutine function", inspect.iscoroutinefunction),
    ("a generator function", inspect.isgeneratorfunction),
    ("an async generator function", inspect.isasyncgenfunction),
)


def check_handler_key(urn: Any) -> None:
    """Refuse a handler key no message can have: blank, or a pattern (``urn:babel:orders:*``). Handlers are found
    by the exact URN, so such a key would match nothing and every message would be handled as an unknown URN
    (dead-lettered by default).

    :raises ValueError: naming the key and what to give instead.
    """
    if not isinstance(urn, str) or not urn.strip():
        raise ValueError(f"a handler's key must be the URN it handles, got {urn!r}")
    if any(char in urn for char in "*?["):
        raise ValueError(
            f"handler key {urn!r} looks like a pattern, but handlers are found by the exact URN: it would match no "
            "message. Give one handler per URN, and take only matching messages with a filter (urns=[...] on the "
            "consume operator)"
        )


def check_handler(urn: str, handler: Any) -> None:
    """Refuse a handler that could never handle a message, before any message is taken.

    Called with the envelope alone, a handler whose signature needs more (``def handle(envelope, context)``)
    would raise on every message, and every message would end as a ``failed`` dead letter after its attempts;
    an ``async def`` handler (or a generator function) would return an un-run coroutine (or generator), and its
    messages would be acked with nothing done.

    Its key is checked by :func:`check_handler_key`.

    :raises ValueError: naming the URN, the handler and what to change.
    """
    check_handler_key(urn)
    if not callable(handler):
        raise ValueError(f"handler for {urn!r} must be callable, got {handler!r}")
    name = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    for kind, test in _NEVER_RUN:
        if test(handler) or test(type(handler).__call__):
            raise ValueError(
                f"handler for {urn!r} ({name}) is {kind}; a handler is called and its return value kept, so its "
                "body would never run: make it a plain function (wrap async work with asyncio.run)"
            )
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # some builtins and extension callables have none to read
        return
    try:
        signature.bind({})
    except TypeError:
        raise ValueError(
            f"handler for {urn!r} ({name}{signature}) cannot be called with one argument, the envelope dict: "
            "give it one positional parameter (more only with defaults)"
        ) from None


_NOT_COUNTABLE = (
    "not retried: the body cannot be re-encoded with a higher attempts count (nesting deeper than the "
    "encoder's 254 levels), so each retry would arrive as the first attempt again"
)


def _attempt_countable(message: ReceivedMessage) -> bool:
    """Whether a release can record the attempt in the body.

    :func:`~airflow_provider_babelqueue.bindings.bodies.bumped_body` gives a body it cannot re-encode back
    unchanged (bytes are never lost), so releasing it would deliver it with the same ``attempts`` forever on
    brokers that keep the count only in the body (the SQL table, Redis lists): a failing handler would loop
    without end. Such a message is dead-lettered at its first failure instead, on every broker (one rule, rather
    than one per broker's native counter); the check costs one re-encoding per failure.
    """
    try:
        return bumped_body(message) != message.body
    except Exception:  # noqa: BLE001 - e.g. RecursionError while walking very deep data: not countable either
        return False


class UnknownUrnStrategy(StrEnum):
    """What to do with a valid envelope whose URN has no handler."""

    #: count it as a handler failure: retried, then dead-lettered with reason ``unknown_urn``
    FAIL = "fail"
    #: ack it: the message is dropped on purpose
    DELETE = "delete"
    #: put it back for another consumer that knows the URN
    RELEASE = "release"
    #: quarantine it at once with reason ``unknown_urn``
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before a failed message is delivered again.

    :param kind: ``fixed`` waits ``base`` seconds every time; ``exponential`` waits ``base * 2**attempts``
        capped at ``cap``, which spreads retries of a struggling downstream service out.
    :param jitter: with exponential backoff, wait a random 50–100 % of the delay so a burst of failures
        does not come back as one burst.
    """

    kind: str = "exponential"
    base: float = 1.0
    cap: float = 60.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "exponential"):
            raise ValueError(f"backoff kind must be 'fixed' or 'exponential', got {self.kind!r}")
        if self.base < 0 or self.cap < 0:
            raise ValueError("backoff base and cap must not be negative")

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """The delay after the handler failed on a delivery with this many previous attempts."""
        if self.kind == "fixed":
            return self.base
        delay = min(self.cap, self.base * (2 ** min(attempts, 62)))
        return delay * (0.5 + 0.5 * float((rng or random).random())) if self.jitter else delay


@dataclass(slots=True)
class ConsumeSummary:
    """What one bounded run did. ``as_dict()`` holds the counts (what progress lines log); the operator returns it
    to XCom with :attr:`results` added.

    ``received`` counts the deliveries the filter took (all of them without a filter); ``unmatched`` the ones it
    handed back, once per hand-back; ``returned_unhandled`` the ones of a slow batch handed back before their
    handler started, because the batch's reservations were half over (they are received again later).
    ``results`` holds the handlers' return values (see the module docstring).
    """

    received: int = 0
    handled: int = 0
    retried: int = 0
    skipped_duplicates: int = 0
    deleted_unknown: int = 0
    released_unknown: int = 0
    unmatched: int = 0
    returned_unhandled: int = 0
    broker_errors: int = 0
    results_dropped: int = 0
    results_unserialisable: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)
    results: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "handled": self.handled,
            "retried": self.retried,
            "skipped_duplicates": self.skipped_duplicates,
            "deleted_unknown": self.deleted_unknown,
            "released_unknown": self.released_unknown,
            "unmatched": self.unmatched,
            "returned_unhandled": self.returned_unhandled,
            "broker_errors": self.broker_errors,
            "results_dropped": self.results_dropped,
            "results_unserialisable": self.results_unserialisable,
            # plain strings: a Reason key would print as <Reason.FAILED: 'failed'> in the progress lines
            "dead_lettered": {str(reason): count for reason, count in sorted(self.dead_lettered.items())},
        }


def exception_name(exc: BaseException) -> str:
    """``module.QualName`` of an exception type (builtins without a module), for triage grouping."""
    return _type_name(exc)


def _type_name(value: object) -> str:
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _whole(value: int, name: str) -> int:
    if value.__class__ is bool or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
    return value


class Consumer:
    """Consumes one queue of a binding with the rules in the module docstring.

    :param handlers: URN → callable taking the envelope dict. Handlers must treat it as read-only.
    :param max_attempts: handler runs before a failing message is dead-lettered (1 = no retry).
    :param idempotency: a seen-set keyed on ``meta.id``; shared by all consumers of the queue it makes
        redeliveries (at-least-once) collapse into one effect.
    :param max_body_bytes: a longer body is dead-lettered as ``poison`` before it is validated or handed to a
        handler, with an error naming both sizes, so one runaway producer cannot exhaust a worker's memory.
        ``None`` turns the check off.
    :param max_nesting_depth: a body whose arrays/objects nest deeper (the envelope itself is level 1) is
        dead-lettered as ``poison`` the same way: deep nesting crashes recursive parsers and handlers with a
        ``RecursionError``. Measured on the raw bytes without recursion; ``None`` turns the check off.
    :param max_outage_seconds: how long :meth:`run` keeps retrying when the broker fails (a restart, a network
        blip) before it gives up and raises, so a short outage costs a pause instead of a failed task. Each
        broker error is logged and counted (``broker_errors``); 0 raises the first one.
    :param batch_size: messages :meth:`run` reserves at once (the prefetch window on RabbitMQ, 10 at most per
        SQS receive). Larger batches move a queue faster; a crash repeats at most one batch of handled messages.
        1 settles every message before the next is reserved.
    :param settle_interval: handled messages are settled (acked) at least this often, in seconds, even
        mid-batch, which bounds what a crash repeats when handlers are slow.
    :param message_filter: which messages this consumer takes (URN patterns, a JSONPath over ``data``), for a
        queue several consumers share; the others are handed back unhandled, with their settlement. ``None`` or an
        empty filter takes every message.
    :param unmatched_delay: seconds a handed-back message stays hidden (default 5: see
        :data:`DEFAULT_UNMATCHED_DELAY`), so this run moves past it rather than reserving it again.
    :param max_results: handler return values kept in :attr:`ConsumeSummary.results`; 0 keeps none.
    :param max_result_bytes: the JSON size the kept results may take together (default 64 KiB: a return value
        lands in the metadata database, see :data:`DEFAULT_MAX_RESULT_BYTES`).
    :param tracer: told about each reserve, message and settlement (:mod:`.telemetry`; the OpenTelemetry spans of
        :mod:`airflow_provider_babelqueue.observability.tracing`); ``None``, when tracing is off, costs nothing.
    :param message_log_lines: per-message log lines of each kind (retry, dead letter, deletion) written in a
        minute; the ones over it are counted in one line when the minute, or the run, ends. A failing dependency
        fails every message, and a task log of one line per message is slow to open and says no more than the
        first hundred and a count (the summary counts every message). ``None`` logs every one.
    """

    def __init__(
        self,
        binding: Binding,
        queue_name: str,
        handlers: Mapping[str, Handler],
        *,
        max_attempts: int = 3,
        backoff: Backoff | None = None,
        unknown_urn: UnknownUrnStrategy | str = UnknownUrnStrategy.DEAD_LETTER,
        idempotency: SeenStore | None = None,
        log: Log | None = None,
        rng: random.Random | None = None,
        max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
        max_nesting_depth: int | None = DEFAULT_MAX_NESTING_DEPTH,
        max_outage_seconds: float = 0.0,
        batch_size: int = DEFAULT_BATCH_SIZE,
        settle_interval: float = DEFAULT_SETTLE_INTERVAL,
        message_filter: MessageFilter | None = None,
        unmatched_delay: float = DEFAULT_UNMATCHED_DELAY,
        max_results: int = DEFAULT_MAX_RESULTS,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        tracer: ConsumeTracer | None = None,
        message_log_lines: int | None = DEFAULT_MESSAGE_LOG_LINES,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_body_bytes = check_limit(max_body_bytes, "max_body_bytes")
        self.max_nesting_depth = check_limit(max_nesting_depth, "max_nesting_depth")
        self.binding = binding
        # a body this consumer refuses for its size is delivered undecoded (the SQL table leaves it unread in the
        # database: ReceivedMessage.stored_size): refusing it then costs at most about its own size once more (the
        # bytes), not the several times that decoding it into objects would
        binding.decode_limit = self.max_body_bytes
        self.queue_name = queue_name
        for urn, handler in handlers.items():
            check_handler(urn, handler)
        self.handlers = dict(handlers)
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff()
        self.unknown_urn = UnknownUrnStrategy(unknown_urn)
        self.idempotency = idempotency
        #: The one at-most-once-per-``meta.id`` rule (core.idempotency), applied to every handler run.
        self.guard = IdempotencyGuard(idempotency) if idempotency is not None else None
        self.log: Log = log or logging.getLogger(__name__)
        #: Per-message lines (retries, dead letters, deletions): the first ``message_log_lines`` of each kind a
        #: minute, then a count.
        self._lines = LineBudget(self.log, message_log_lines)
        self.rng = rng
        if not max_outage_seconds >= 0:
            raise ValueError(f"max_outage_seconds must be a number >= 0, got {max_outage_seconds!r}")
        self.max_outage_seconds = float(max_outage_seconds)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        if not settle_interval >= 0:
            raise ValueError(f"settle_interval must be a number >= 0, got {settle_interval!r}")
        self.settle_interval = float(settle_interval)
        #: ``None`` when every message is taken (no filter, or one that restricts nothing).
        self.message_filter = message_filter if message_filter is not None and message_filter.active else None
        if not 0 <= unmatched_delay < float("inf"):
            raise ValueError(f"unmatched_delay must be a finite number >= 0, got {unmatched_delay!r}")
        self.unmatched_delay = float(unmatched_delay)
        self.max_results = _whole(max_results, "max_results")
        self.max_result_bytes = _whole(max_result_bytes, "max_result_bytes")
        #: Messages the filter did not take, waiting for the batch's settlement to be handed back together.
        self._unmatched: list[ReceivedMessage] = []
        #: Who this run handed back (``meta.id``, or a hash of an undecodable body): a reserve that brings back only
        #: those brought nothing new, which ends a run that stops when the queue is empty.
        self._handed_back: set[str | int] = set()
        self._fitted: int | None = None  # set when a batch handed back its tail: how many it handled in time
        self._stop = False  # set by stop(): run() ends at the next message boundary
        self._result_bytes = 0
        self._results_full = False
        self._warned_unserialisable: set[tuple[str, str]] = set()
        #: Handled messages waiting for the batch's ack, and failed ones for their release with their delay
        #: (``None``: settle each at once, as :meth:`process` called alone does).
        self._acks: list[ReceivedMessage] | None = None
        self._releases: list[tuple[ReceivedMessage, float]] = []
        self._outage_since: float | None = None
        self._outage_errors = 0
        self.tracer = tracer
        #: The process span of the message being handled (tracing on).
        self._span: MessageSpan | None = None
        self.summary = ConsumeSummary()

    # ----------------------------------------------------------------------------------- outcomes

    def _dead_letter(
        self,
        message: ReceivedMessage,
        reason: str,
        error: str | None,
        exception: str | None = None,
        failed_runs: int = 0,
        meta_id: str | None = None,
    ) -> str:
        # attempts of the dead letter (the block's, and the top-level one: dead_letter_body writes both) = the
        # attempts used up, the failing run included (the spec's 3 and 3 after three runs), saturating at the
        # contract's largest integer: a body claiming 2**63 - 1 attempts must still be stored
        counted = dataclasses.replace(message, attempts=min(message.attempts + failed_runs, _MAX_COUNT))
        try:
            self.binding.dead_letter(counted, reason, error=error, exception=exception)
        except BindingError:
            raise  # the broker itself failed: run() rides it out, the message stays reserved and comes back
        except Exception as exc:  # noqa: BLE001 - what the message holds must never stop its dead-lettering
            # the bindings store any body (bare bytes with the reason beside them when it cannot be annotated),
            # so this is a defect somewhere between; store the exact bytes with the plainest texts rather than
            # leave the message reserved at the head of the queue, where every run would meet it again
            self.log.error("dead-lettering %s failed (%s: %s); storing its exact bytes instead",
                           meta_id or message.meta_id or "<no meta.id>", type(exc).__name__, exc)
            bare = dataclasses.replace(counted, envelope=None, decode_error=message.decode_error or str(reason))
            plain = (error or "").encode("ascii", "backslashreplace").decode("ascii").replace("\x00", "\\x00")
            self.binding.dead_letter(bare, reason, error=plain or None, exception=exception and
                                     exception.encode("ascii", "backslashreplace").decode("ascii"))
        self.summary.dead_lettered[reason] += 1
        if self._lines.allow("dead-letter"):
            self.log.warning("dead-lettered %s (%s): %s", meta_id or message.meta_id or "<no meta.id>", reason,
                             error)
        return f"dead_letter:{reason}"

    def _failed(self, message: ReceivedMessage, exc: BaseException, reason: str) -> str:
        # a lone surrogate in a handler's message would fail every UTF-8 log handler and encoder downstream
        error = bq.storable_text(str(exc)) or type(exc).__name__
        if self._span is not None:
            self._span.failed(exc)
        if message.attempts + 1 >= self.max_attempts:
            return self._dead_letter(message, reason, error, exception_name(exc), 1)
        if not _attempt_countable(message):
            return self._dead_letter(message, reason, f"{error} ({_NOT_COUNTABLE})", exception_name(exc), 1)
        delay = self.backoff.delay(message.attempts, self.rng)
        self._release(message, delay)
        self.summary.retried += 1
        if self._lines.allow("retry"):
            self.log.info("retry %s in %.1fs after %s: %s", message.meta_id, delay, exception_name(exc), error)
        return "retried"

    # ------------------------------------------------------------------------------------ process

    def _ack(self, message: ReceivedMessage) -> None:
        """Ack now, or (inside :meth:`run`'s batch) with the batch's other handled messages."""
        if self._acks is None:
            self.binding.ack(message)
        else:
            self._acks.append(message)

    def _release(self, message: ReceivedMessage, delay: float) -> None:
        """Release now, or (inside :meth:`run`'s batch) with the batch's settlement."""
        if self._acks is None:
            self.binding.release(message, delay=delay)
        else:
            self._releases.append((message, delay))

    def _pending(self) -> tuple[list[ReceivedMessage], list[tuple[ReceivedMessage, float]]]:
        """The batch's unsettled acks and releases, handed over (the lists start empty again)."""
        acks, releases = self._acks or [], self._releases
        self._acks, self._releases = ([] if self._acks is not None else None), []
        return acks, releases

    def _settle(self) -> None:
        """Settle the batch's handled and failed messages so far in one call (a broker error leaves them reserved:
        they come back, and the idempotency store, when set, keeps their handlers from running twice)."""
        self._hand_back()
        acks, releases = self._pending()
        if acks or releases:
            self._settle_now(acks, releases)

    def _settle_now(self, acks: list[ReceivedMessage], releases: list[tuple[ReceivedMessage, float]]) -> None:
        started = time.time_ns()
        self.binding.settle(acks, releases)
        if self.tracer is not None:
            self.tracer.settled(self.queue_name, len(acks), len(releases), started)

    def _hand_back(self) -> None:
        """Hand back the messages the filter did not take, in one call (a broker error leaves them reserved: they
        come back after the visibility timeout, unhandled, as they would have anyway)."""
        unmatched, self._unmatched = self._unmatched, []
        if unmatched:
            self.binding.hand_back(unmatched, delay=self.unmatched_delay)

    @staticmethod
    def _identity(message: ReceivedMessage) -> str | int:
        return message.meta_id or hash(message.body)

    def _keep_result(self, meta_id: str, urn: str, value: Any) -> None:
        """Keep a handler's return value for XCom, within the bounds (see the module docstring)."""
        try:
            encoded = orjson.dumps({"meta_id": meta_id, "urn": urn, "result": value})
        except TypeError:  # orjson.JSONEncodeError: an unsupported type, a lone surrogate, a cycle, a huge int
            self.summary.results_unserialisable += 1
            kind = _type_name(value)
            if (urn, kind) not in self._warned_unserialisable:
                self._warned_unserialisable.add((urn, kind))
                self.log.warning("the handler for %s returned a %s, which is not JSON-serialisable: not kept for "
                                 "XCom (counted in results_unserialisable)", urn, kind)
            return
        if (self._results_full or len(self.summary.results) >= self.max_results
                or self._result_bytes + len(encoded) > self.max_result_bytes):
            if not self._results_full:
                self._results_full = True
                self.log.info("kept %d handler results (%d bytes of JSON); later ones are counted in "
                              "results_dropped (max_results=%d, max_result_bytes=%d)", len(self.summary.results),
                              self._result_bytes, self.max_results, self.max_result_bytes)
            self.summary.results_dropped += 1
            return
        self.summary.results.append(orjson.loads(encoded))
        self._result_bytes += len(encoded)

    def process(self, message: ReceivedMessage) -> str:
        """Handle one delivery; returns what happened (``handled``, ``retried``, ``dead_letter:<reason>``,
        ``unmatched``...)."""
        if self.tracer is None:
            return self._process(message)
        with self.tracer.process(message) as span:
            self._span = span
            try:
                outcome = self._process(message)
            finally:
                self._span = None
            span.outcome(outcome)
        return outcome

    def _process(self, message: ReceivedMessage) -> str:
        if self.message_filter is not None and not self.message_filter.matches(message.envelope):
            self.summary.unmatched += 1
            self._handed_back.add(self._identity(message))
            if self._acks is None:
                self.binding.hand_back([message], delay=self.unmatched_delay)
            else:
                self._unmatched.append(message)
            return "unmatched"
        self.summary.received += 1
        limit_error = body_limit_error(message.body, self.max_body_bytes, self.max_nesting_depth,
                                       size=message.stored_size)  # None: the body was read, its length counts
        if limit_error is not None:
            # Treated as undecodable: the binding stores the bytes as they are instead of decoding and
            # re-encoding the oversized or over-deep body to annotate it.
            refused = dataclasses.replace(message, envelope=None, decode_error=limit_error)
            return self._dead_letter(refused, bq.Reason.POISON, limit_error, meta_id=message.meta_id)
        envelope = message.envelope
        if envelope is None:
            return self._dead_letter(message, bq.Reason.POISON, message.decode_error)
        reason = bq.check(envelope)
        if reason is not None:
            return self._dead_letter(message, reason, f"the envelope failed validation: {reason}")
        urn = envelope.get("job")  # check() passed: the URN is ``job`` unless that is blank (then the alias)
        if urn.__class__ is not str or not urn or urn.isspace():
            urn = bq.urn_of(envelope)
        handler = self.handlers.get(urn)
        if handler is None:
            return self._unknown(message, urn)
        if envelope["attempts"] != message.attempts:
            # the broker counted more deliveries than the body (check() made attempts an int): the handler sees
            # the reconciled count, on a copy, so the decoded envelope stays what the body holds
            envelope = {**envelope, "attempts": message.attempts}
        effect = Effect.RUN
        try:
            if self.guard is None:
                result = handler(envelope)
            else:
                returned: list[Any] = []  # the guard returns what it did, not what the handler returned
                effect = self.guard.process(envelope, lambda env: returned.append(handler(env)))
                result = returned[0] if returned else None
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried or dead-lettered
            return self._failed(message, exc, bq.Reason.FAILED)
        if effect is Effect.SKIP:  # outside the try: a failed ack is the broker's error, not the handler's
            self._ack(message)
            self.summary.skipped_duplicates += 1
            return "skipped_duplicate"
        acks = self._acks  # the batch's acks inside run(); None: ack now (see _ack)
        if acks is None:
            self.binding.ack(message)
        else:
            acks.append(message)
        self.summary.handled += 1
        if result is not None:
            self._keep_result(bq.meta_id_of(envelope), urn, result)
        return "handled"

    def _unknown(self, message: ReceivedMessage, urn: str) -> str:
        strategy = self.unknown_urn
        if strategy is UnknownUrnStrategy.DEAD_LETTER:
            return self._dead_letter(message, bq.Reason.UNKNOWN_URN, f"no handler is mapped for {urn}")
        if strategy is UnknownUrnStrategy.DELETE:
            self._ack(message)
            self.summary.deleted_unknown += 1
            if self._lines.allow("deletion"):
                self.log.info("deleted %s: no handler for %s (strategy delete)", message.meta_id, urn)
            return "deleted"
        if strategy is UnknownUrnStrategy.RELEASE:
            self._release(message, self.backoff.delay(message.attempts, self.rng))
            self.summary.released_unknown += 1
            return "released"
        return self._failed(message, LookupError(f"no handler is mapped for {urn}"), bq.Reason.UNKNOWN_URN)

    # ---------------------------------------------------------------------------------------- run

    def run(
        self,
        *,
        max_messages: int | None = None,
        max_seconds: float | None = None,
        stop_when_empty: bool = True,
        reserve_timeout: float = 1.0,
        progress_seconds: float = 30.0,
    ) -> ConsumeSummary:
        """Consume until ``max_messages`` deliveries, ``max_seconds``, or (``stop_when_empty``) an empty
        reserve, whichever comes first. A bounded run is what an Airflow task needs.

        Reserves up to :attr:`batch_size` messages at once, waiting up to ``reserve_timeout`` for the first with
        the broker's blocking read; processes them in order; settles the handled ones together (see the module
        docstring). Every ``progress_seconds`` that brought deliveries, a progress line with the summary so far and
        the rate since the previous line goes to the log: a long run shows it is moving, and a fast one does not
        fill the log (a line per thousand messages was dozens of lines a second on a fast broker).

        With a filter, ``max_messages`` counts the deliveries it took; the ones it handed back are hidden for
        ``unmatched_delay`` seconds, so the next reserves reach past them. A reserve that brings only messages
        this run handed back already (their delay ran out) brought nothing new: with ``stop_when_empty`` the run
        ends there, as on an empty reserve; without, it waits ``reserve_timeout`` before it reserves again."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        size, idle = self.batch_size, False
        last_line, last_count = time.monotonic(), 0
        self._acks, self._releases, self._unmatched = [], [], []
        self._handed_back = set()
        if self.message_filter is not None:
            self.log.info("consuming %s: only messages where %s; the others are handed back unhandled, hidden "
                          "for %.1f s", self.queue_name, self.message_filter.describe(), self.unmatched_delay)
        try:
            while (max_messages is None or self.summary.received < max_messages) and not self._stop:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                timeout = reserve_timeout if remaining is None else max(0.0, min(reserve_timeout, remaining))
                want = size if max_messages is None else min(size, max_messages - self.summary.received)
                try:
                    # handed back first: the reserve below may take them again once their delay is over
                    self._hand_back()
                    if idle:  # the last reserve brought only what this run had handed back: wait as on an empty one
                        idle = False
                        self._pause(timeout, deadline)
                        continue
                    # the previous batch is settled in the same call (one transaction on the SQL table)
                    acks, releases = self._pending()
                    reserved = time.monotonic()  # the batch's reservations begin no earlier than this call
                    started = time.time_ns()
                    batch = self.binding.settle_and_reserve(self.queue_name, want, timeout, acks=acks,
                                                            releases=releases)
                    if self.tracer is not None:
                        self.tracer.received(self.queue_name, batch, started, acked=len(acks),
                                             released=len(releases))
                    began = time.monotonic()
                    fresh = self._process_batch(batch, reserved)
                except BindingError as exc:
                    self._pending()  # still reserved on the broker: they come back (see _settle)
                    self._unmatched = []
                    self._ride_out(exc, deadline)
                    continue
                self._outage_since = None
                if not fresh:  # empty, or only messages this run handed back already
                    if stop_when_empty:
                        break
                    idle = bool(batch)  # back at once (no delay): wait as an empty reserve would, rather than spin
                    continue
                took = time.monotonic() - began
                if self._fitted is not None:  # handed back its tail: the next batch is what fitted in this one
                    size, self._fitted = max(1, min(size // 2, self._fitted)), None
                elif took > _SLOW_BATCH_SECONDS and size > 1:
                    size = max(1, size // 2)  # slow handlers: fewer reservations wait their turn
                elif took < _SLOW_BATCH_SECONDS / 4 and size < self.batch_size:
                    size = min(self.batch_size, size * 2)
                now = time.monotonic()
                if now - last_line >= progress_seconds and self.summary.received > last_count:
                    rate = (self.summary.received - last_count) / max(now - last_line, 1e-6)
                    self.log.info("progress on %s (%.0f msg/s since the last line): %s", self.queue_name, rate,
                                  self.summary.as_dict())
                    last_line, last_count = now, self.summary.received
            unmatched, self._unmatched = self._unmatched, []
            acks, releases = self._pending()  # the last batch
            while unmatched or acks or releases:
                try:
                    if unmatched:
                        self.binding.hand_back(unmatched, delay=self.unmatched_delay)
                        unmatched = []
                    if acks or releases:
                        self._settle_now(acks, releases)
                    break
                except BindingError as exc:  # settling again is harmless: each settle is gated on its receipt
                    self._ride_out(exc, deadline)
        finally:
            self._lines.flush()
            self._acks, self._releases, self._unmatched = None, [], []
            try:
                self.binding.end_reservations(self.queue_name)
            except BindingError as exc:  # what it held comes back when its connection closes
                self.log.warning("could not hand back prefetched messages of %s: %s", self.queue_name, exc)
        return self.summary

    def _process_batch(self, batch: list[ReceivedMessage], reserved: float | None = None) -> bool:
        """Process each message in order; the handled, failed and unmatched ones wait for the batch's settlement,
        which happens every :attr:`settle_interval` seconds too when handlers are slow. Returns whether the batch
        brought anything new: a message this run did not hand back before.

        :param reserved: when the reserve that took the batch was called (``time.monotonic()``): its reservations
            began no earlier (the broker may take them before its reply arrives). Once half the binding's
            :meth:`~.Binding.reservation_seconds` has passed, no further handler starts: the rest of the batch is
            handed back unhandled (see :meth:`_return_unstarted`), since the broker would soon hand those messages
            to another reader while this one still held them.
        """
        fresh = self.message_filter is None or any(self._identity(m) not in self._handed_back for m in batch)
        # process() without its tracing layer when there is none (and no subclass put its own process() there)
        plain = self.tracer is None and type(self).process is Consumer.process
        process = self._process if plain else self.process
        cutoff = math.inf
        if reserved is not None and batch:
            horizon = self._reservation_seconds()
            if horizon is not None:
                cutoff = reserved + horizon * _RESERVATION_SHARE
        since = now = time.monotonic()
        for index, message in enumerate(batch):
            if self._stop:
                self._return_unstarted(batch[index:], index, stopping=True)
                break
            if index and now >= cutoff:  # the first always runs: every batch moves the queue on
                self._return_unstarted(batch[index:], index)
                break
            process(message)
            now = time.monotonic()
            if now - since >= self.settle_interval:
                self._settle()
                since = now = time.monotonic()
        return bool(batch) and fresh

    def stop(self) -> None:
        """Ask a running :meth:`run` to end at the next message boundary: the handler running now finishes, the
        handled messages are settled, the ones of the batch not started are handed back unhandled (counted in
        ``returned_unhandled``), and :meth:`run` returns its summary. It only sets a flag, so a signal handler or
        another thread may call it (an Airflow task's ``on_kill``); a reserve already waiting on the broker
        finishes its wait (``reserve_timeout``) first."""
        self._stop = True

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop

    def _reservation_seconds(self) -> float | None:
        """The binding's :meth:`~.Binding.reservation_seconds` for the queue; ``None`` (no cut-off) when the broker
        cannot say now: the batch then runs as a batch whose reservations last."""
        try:
            return self.binding.reservation_seconds(self.queue_name)
        except BindingError as exc:
            self.log.debug("could not read how long reservations on %s last: %s", self.queue_name, exc)
            return None

    def _return_unstarted(self, rest: list[ReceivedMessage], handled: int, *, stopping: bool = False) -> None:
        """Hand back the messages of a batch whose handlers did not start in the first half of its reservations
        (or before :meth:`stop`): unhandled, their bytes and ``attempts`` unchanged, ready again at once. The next
        batch is no larger than what fitted (``handled``). A broker error leaves them reserved: they come back when
        the reservation ends."""
        self.summary.returned_unhandled += len(rest)
        self._fitted = handled
        if stopping:
            self.log.warning("stopping: handed back %d message(s) of %s unhandled", len(rest), self.queue_name)
        elif self._lines.allow("return"):
            self.log.warning(
                "handed back %d message(s) of %s unhandled: the batch's reservations were half over after %d "
                "handled; the next batches are smaller (raise the binding's visibility timeout or lower batch_size "
                "for handlers this slow)", len(rest), self.queue_name, handled)
        try:
            self.binding.hand_back(rest)
        except BindingError as exc:
            self.log.warning("could not hand back %d message(s) of %s; they come back when their reservation "
                             "ends: %s", len(rest), self.queue_name, exc)

    @staticmethod
    def _pause(seconds: float, deadline: float | None) -> None:
        """Sleep ``seconds``, or until ``deadline``."""
        if deadline is not None:
            seconds = min(seconds, deadline - time.monotonic())
        if seconds > 0:
            time.sleep(seconds)

    def _ride_out(self, exc: BindingError, deadline: float | None) -> None:
        """Wait out a broker error, or raise it once ``max_outage_seconds`` have passed since the first one.

        Nothing is lost meanwhile: a message whose ack or release failed is still reserved on the broker and
        comes back after its visibility timeout (or at once, on brokers that requeue a dead connection's
        deliveries); the idempotency store, when set, keeps its handler from running twice.
        """
        self.summary.broker_errors += 1
        if self._stop:  # told to stop: what it holds comes back when its reservations end
            raise exc
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since, self._outage_errors = now, 0
        self._outage_errors += 1
        left = self._outage_since + self.max_outage_seconds - now
        if left <= 0 or (deadline is not None and deadline <= now):
            raise exc
        pause = min(left, 0.25 * 2 ** min(self._outage_errors, 4))  # 0.5, 1, 2, 4 s
        self.log.warning("broker error on %s, retrying in %.1f s (giving up %.0f s from now): %s", self.queue_name,
                         pause, left, exc)
        time.sleep(pause)
