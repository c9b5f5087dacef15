"""A conformant BabelQueue consumer over any binding, for bounded runs (pure: no Airflow import).

For each delivery, in this order:

1. an undecodable body is dead-lettered with reason ``poison`` (its bytes kept exactly);
2. an envelope that fails validation is dead-lettered with the validation reason (an unsupported schema
   version included): quarantined, never dropped;
3. a URN with no handler follows the unknown-URN strategy;
4. a duplicate ``meta.id`` (when an idempotency store is given) is acked without running the handler;
5. the handler runs; success acks, failure releases with backoff until ``max_attempts`` handler runs,
   then dead-letters with reason ``failed``, the error text and the exception type.
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

from . import envelope as bq
from .bindings.base import Binding, ReceivedMessage
from .idempotency import SeenStore

__all__ = ["Backoff", "ConsumeSummary", "Consumer", "Handler", "UnknownUrnStrategy", "exception_name"]

Handler = Callable[[dict[str, Any]], Any]


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
        return delay * (0.5 + 0.5 * (rng or random).random()) if self.jitter else delay


@dataclass(slots=True)
class ConsumeSummary:
    """What one bounded run did; ``as_dict()`` is what the operator returns to XCom."""

    received: int = 0
    handled: int = 0
    retried: int = 0
    skipped_duplicates: int = 0
    deleted_unknown: int = 0
    released_unknown: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "handled": self.handled,
            "retried": self.retried,
            "skipped_duplicates": self.skipped_duplicates,
            "deleted_unknown": self.deleted_unknown,
            "released_unknown": self.released_unknown,
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
        log: logging.Logger | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.binding = binding
        self.queue_name = queue_name
        self.handlers = dict(handlers)
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff()
        self.unknown_urn = UnknownUrnStrategy(unknown_urn)
        self.idempotency = idempotency
        self.log = log or logging.getLogger(__name__)
        self.rng = rng
        self.summary = ConsumeSummary()

    # ----------------------------------------------------------------------------------- outcomes

    def _dead_letter(
        self,
        message: ReceivedMessage,
        reason: str,
        error: str | None,
        exception: str | None = None,
        failed_runs: int = 0,
    ) -> str:
        # attempts in the dead_letter block = deliveries that were given up on (as the other SDKs record it)
        counted = dataclasses.replace(message, attempts=message.attempts + failed_runs)
        self.binding.dead_letter(counted, reason, error=error, exception=exception)
        self.summary.dead_lettered[reason] += 1
        self.log.warning("dead-lettered %s (%s): %s", message.meta_id or "<no meta.id>", reason, error)
        return f"dead_letter:{reason}"

    def _failed(self, message: ReceivedMessage, exc: BaseException, reason: str) -> str:
        if message.attempts + 1 >= self.max_attempts:
            return self._dead_letter(message, reason, str(exc) or type(exc).__name__, exception_name(exc), 1)
        delay = self.backoff.delay(message.attempts, self.rng)
        self.binding.release(message, delay=delay)
        self.summary.retried += 1
        self.log.info("retry %s in %.1fs after %s: %s", message.meta_id, delay, exception_name(exc), exc)
        return "retried"

    # ------------------------------------------------------------------------------------ process

    def process(self, message: ReceivedMessage) -> str:
        """Handle one delivery; returns what happened (``handled``, ``retried``, ``dead_letter:<reason>``...)."""
        self.summary.received += 1
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
        key = message.meta_id
        if self.idempotency is not None and key and self.idempotency.seen(key):
            self.binding.ack(message)
            self.summary.skipped_duplicates += 1
            return "skipped_duplicate"
        try:
            handler(envelope)
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried or dead-lettered
            return self._failed(message, exc, bq.Reason.FAILED)
        if self.idempotency is not None and key:
            self.idempotency.remember(key)
        self.binding.ack(message)
        self.summary.handled += 1
        return "handled"

    def _unknown(self, message: ReceivedMessage, urn: str) -> str:
        strategy = self.unknown_urn
        if strategy is UnknownUrnStrategy.DEAD_LETTER:
            return self._dead_letter(message, bq.Reason.UNKNOWN_URN, f"no handler is mapped for {urn}")
        if strategy is UnknownUrnStrategy.DELETE:
            self.binding.ack(message)
            self.summary.deleted_unknown += 1
            self.log.info("deleted %s: no handler for %s (strategy delete)", message.meta_id, urn)
            return "deleted"
        if strategy is UnknownUrnStrategy.RELEASE:
            self.binding.release(message, delay=self.backoff.delay(message.attempts, self.rng))
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
        reserve, whichever comes first. A bounded run is what an Airflow task needs."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while max_messages is None or self.summary.received < max_messages:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            timeout = reserve_timeout if remaining is None else max(0.0, min(reserve_timeout, remaining))
            message = self.binding.reserve(self.queue_name, timeout=timeout)
            if message is None:
                if stop_when_empty:
                    break
                continue
            self.process(message)
            if progress_every and self.summary.received % progress_every == 0:
                self.log.info("progress on %s: %s", self.queue_name, self.summary.as_dict())
        return self.summary
