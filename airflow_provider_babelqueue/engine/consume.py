"""A conformant BabelQueue consumer over any binding, for bounded runs (pure: no Airflow import).

For each delivery, in this order:

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
unwrap it when they read it (``bindings.base.parse_body``), a release keeps it framed, a dead letter is stored
as the bare annotated envelope.

A run reserves in batches (:meth:`Binding.reserve_many`, up to ``batch_size`` at once) and settles the handled
messages of a batch with one :meth:`Binding.ack_many`, so a queue moves at the broker's pace rather than one round
trip per message. Each message is still processed on its own: a handler's failure releases or dead-letters only
that message, at once. What a crash can cost is bounded: the handled but unsettled messages (at most one batch,
and no more than ``settle_interval`` seconds of handling) come back and run again, as any at-least-once delivery does;
an idempotency store makes those redeliveries no-ops. Nothing is lost: a message is settled only after its
handler returned. A batch whose handlers are slow shrinks the next one (down to one message), so reservations do
not outlive the broker's visibility timeout while they wait their turn.

The limits are checked on the raw bytes the binding returned; bindings decode a body when they reserve it
(with orjson, which refuses nesting deeper than 1,024 levels without recursing), so the limits protect
everything after that: validation, the dead-letter re-encoding, handlers and their own parsers.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..bindings.base import Binding, BindingError, ReceivedMessage, bumped_body
from ..core import envelope as bq
from ..core.idempotency import Effect, IdempotencyGuard, SeenStore
from .limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_NESTING_DEPTH, body_limit_error, check_limit, nesting_depth
from .logs import Log

#: The contract's integers are signed 64-bit (and so are the brokers' attempts columns and headers).
_MAX_COUNT = 2**63 - 1
#: Messages reserved at once by default: large enough that a round trip per batch costs little beside a no-op
#: handler's work, small enough that a crash repeats little and every binding's batch primitive takes it whole.
DEFAULT_BATCH_SIZE = 100
#: Seconds of handled-but-unsettled work the consumer keeps at most before it settles them.
DEFAULT_SETTLE_INTERVAL = 1.0
#: A batch whose processing took longer than this halves the next batch (down to one message).
_SLOW_BATCH_SECONDS = 5.0

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_NESTING_DEPTH",
    "DEFAULT_SETTLE_INTERVAL",
    "Backoff",
    "ConsumeSummary",
    "Consumer",
    "Handler",
    "UnknownUrnStrategy",
    "body_limit_error",
    "check_limit",
    "exception_name",
    "nesting_depth",
]

Handler = Callable[[dict[str, Any]], Any]

_NOT_COUNTABLE = (
    "not retried: the body cannot be re-encoded with a higher attempts count (nesting deeper than the "
    "encoder's 254 levels), so each retry would arrive as the first attempt again"
)


def _attempt_countable(message: ReceivedMessage) -> bool:
    """Whether a release can record the attempt in the body.

    :func:`~airflow_provider_babelqueue.bindings.base.bumped_body` gives a body it cannot re-encode back
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
    """What one bounded run did; ``as_dict()`` is what the operator returns to XCom."""

    received: int = 0
    handled: int = 0
    retried: int = 0
    skipped_duplicates: int = 0
    deleted_unknown: int = 0
    released_unknown: int = 0
    broker_errors: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "handled": self.handled,
            "retried": self.retried,
            "skipped_duplicates": self.skipped_duplicates,
            "deleted_unknown": self.deleted_unknown,
            "released_unknown": self.released_unknown,
            "broker_errors": self.broker_errors,
            "dead_lettered": dict(sorted(self.dead_lettered.items())),
        }


def exception_name(exc: BaseException) -> str:
    """``module.QualName`` of an exception type (builtins without a module), for triage grouping."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


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
        self.handlers = dict(handlers)
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff()
        self.unknown_urn = UnknownUrnStrategy(unknown_urn)
        self.idempotency = idempotency
        #: The one at-most-once-per-``meta.id`` rule (core.idempotency), applied to every handler run.
        self.guard = IdempotencyGuard(idempotency) if idempotency is not None else None
        self.log: Log = log or logging.getLogger(__name__)
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
        #: Handled messages waiting for the batch's ack, and failed ones for their release with their delay
        #: (``None``: settle each at once, as :meth:`process` called alone does).
        self._acks: list[ReceivedMessage] | None = None
        self._releases: list[tuple[ReceivedMessage, float]] = []
        self._outage_since: float | None = None
        self._outage_errors = 0
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
        self.log.warning("dead-lettered %s (%s): %s", meta_id or message.meta_id or "<no meta.id>", reason, error)
        return f"dead_letter:{reason}"

    def _failed(self, message: ReceivedMessage, exc: BaseException, reason: str) -> str:
        # a lone surrogate in a handler's message would fail every UTF-8 log handler and encoder downstream
        error = bq.storable_text(str(exc)) or type(exc).__name__
        if message.attempts + 1 >= self.max_attempts:
            return self._dead_letter(message, reason, error, exception_name(exc), 1)
        if not _attempt_countable(message):
            return self._dead_letter(message, reason, f"{error} ({_NOT_COUNTABLE})", exception_name(exc), 1)
        delay = self.backoff.delay(message.attempts, self.rng)
        self._release(message, delay)
        self.summary.retried += 1
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
        acks, releases = self._pending()
        if acks or releases:
            self.binding.settle(acks, releases)

    def process(self, message: ReceivedMessage) -> str:
        """Handle one delivery; returns what happened (``handled``, ``retried``, ``dead_letter:<reason>``...)."""
        self.summary.received += 1
        limit_error = body_limit_error(message.body, self.max_body_bytes, self.max_nesting_depth,
                                       size=message.size)
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
        urn = bq.urn_of(envelope)
        handler = self.handlers.get(urn)
        if handler is None:
            return self._unknown(message, urn)
        if envelope["attempts"] != message.attempts:
            # the broker counted more deliveries than the body (check() made attempts an int): the handler sees
            # the reconciled count, on a copy, so the decoded envelope stays what the body holds
            envelope = {**envelope, "attempts": message.attempts}
        try:
            if self.guard is None:
                handler(envelope)
                effect = Effect.RUN
            else:
                effect = self.guard.process(envelope, handler)
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried or dead-lettered
            return self._failed(message, exc, bq.Reason.FAILED)
        if effect is Effect.SKIP:
            self._ack(message)
            self.summary.skipped_duplicates += 1
            return "skipped_duplicate"
        self._ack(message)
        self.summary.handled += 1
        return "handled"

    def _unknown(self, message: ReceivedMessage, urn: str) -> str:
        strategy = self.unknown_urn
        if strategy is UnknownUrnStrategy.DEAD_LETTER:
            return self._dead_letter(message, bq.Reason.UNKNOWN_URN, f"no handler is mapped for {urn}")
        if strategy is UnknownUrnStrategy.DELETE:
            self._ack(message)
            self.summary.deleted_unknown += 1
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
        progress_every: int = 1000,
    ) -> ConsumeSummary:
        """Consume until ``max_messages`` deliveries, ``max_seconds``, or (``stop_when_empty``) an empty
        reserve, whichever comes first. A bounded run is what an Airflow task needs.

        Reserves up to :attr:`batch_size` messages at once, waiting up to ``reserve_timeout`` for the first with
        the broker's blocking read; processes them in order; settles the handled ones together (see the module
        docstring). ``progress_every`` deliveries, a progress line goes to the log."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        size, logged = self.batch_size, 0
        self._acks, self._releases = [], []
        try:
            while max_messages is None or self.summary.received < max_messages:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                timeout = reserve_timeout if remaining is None else max(0.0, min(reserve_timeout, remaining))
                want = size if max_messages is None else min(size, max_messages - self.summary.received)
                try:
                    # the previous batch is settled in the same call (one transaction on the SQL table)
                    acks, releases = self._pending()
                    batch = self.binding.settle_and_reserve(self.queue_name, want, timeout, acks=acks,
                                                            releases=releases)
                    began = time.monotonic()
                    self._process_batch(batch)
                except BindingError as exc:
                    self._pending()  # still reserved on the broker: they come back (see _settle)
                    self._ride_out(exc, deadline)
                    continue
                self._outage_since = None
                if not batch:
                    if stop_when_empty:
                        break
                    continue
                took = time.monotonic() - began
                if took > _SLOW_BATCH_SECONDS and size > 1:
                    size = max(1, size // 2)  # slow handlers: fewer reservations wait their turn
                elif took < _SLOW_BATCH_SECONDS / 4 and size < self.batch_size:
                    size = min(self.batch_size, size * 2)
                if progress_every and self.summary.received // progress_every > logged:
                    logged = self.summary.received // progress_every
                    self.log.info("progress on %s: %s", self.queue_name, self.summary.as_dict())
            acks, releases = self._pending()  # the last batch
            while acks or releases:
                try:
                    self.binding.settle(acks, releases)
                    break
                except BindingError as exc:  # settling again is harmless: each settle is gated on its receipt
                    self._ride_out(exc, deadline)
        finally:
            self._acks, self._releases = None, []
            try:
                self.binding.end_reservations(self.queue_name)
            except BindingError as exc:  # what it held comes back when its connection closes
                self.log.warning("could not hand back prefetched messages of %s: %s", self.queue_name, exc)
        return self.summary

    def _process_batch(self, batch: list[ReceivedMessage]) -> None:
        """Process each message in order; the handled and failed ones wait for the batch's settlement, which
        happens every :attr:`settle_interval` seconds too when handlers are slow."""
        since = time.monotonic()
        for message in batch:
            self.process(message)
            if time.monotonic() - since >= self.settle_interval:
                self._settle()
                since = time.monotonic()

    def _ride_out(self, exc: BindingError, deadline: float | None) -> None:
        """Wait out a broker error, or raise it once ``max_outage_seconds`` have passed since the first one.

        Nothing is lost meanwhile: a message whose ack or release failed is still reserved on the broker and
        comes back after its visibility timeout (or at once, on brokers that requeue a dead connection's
        deliveries); the idempotency store, when set, keeps its handler from running twice.
        """
        self.summary.broker_errors += 1
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
