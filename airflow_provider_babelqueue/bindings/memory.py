"""In-memory binding: the reference semantics of the protocol, for tests and dry runs.

Everything lives in one process; nothing survives it. Thread-safe: several consumers may reserve
concurrently, and ``reserve(timeout=...)`` blocks until a message is ready or the timeout passes.

Dead letters are kept Redis-like, by dead-letter queue name: written to ``<queue>:failed``, read from
``<queue>:failed`` and ``<queue>.dlq`` (where the official SDKs' workers put theirs), so the contract suite can
check the dead-letter-sources rule without a broker. :meth:`MemoryBinding.put_dead_letter` stores bytes on any
of them, as a peer's worker would.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.idempotency import InMemorySeenStore
from .base import Binding, check_sizes
from .bodies import bumped_body, dead_letter_body
from .message import ReceivedMessage, parse_body

#: What the twin reads besides the written DLQ, as Redis does: the spec's name and the SDKs' apps' name.
DEFAULT_SOURCES = (":failed", ".dlq")

__all__ = ["MemoryBinding", "MemoryConfig"]


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """:param visibility_timeout: seconds a reserved message may stay unacked before it is delivered
    again (what a crashed consumer leaves behind).
    :param max_message_bytes: refuse larger bodies before storing them (``None``: no limit), as the real
        brokers do, so tests can exercise the refusal.
    :param dead_letter_suffix: dead letters are written to ``<queue><suffix>`` (the spec's Redis name).
    :param dead_letter_sources: the DLQs read besides the written one (suffixes, ``{queue}`` templates or full
        names; a list or comma text), as the Redis binding reads them."""

    visibility_timeout: float = 300.0
    max_message_bytes: int | None = None
    dead_letter_suffix: str = ":failed"
    dead_letter_sources: tuple[str, ...] | str | None = DEFAULT_SOURCES

    def __post_init__(self) -> None:
        if not self.dead_letter_suffix:
            raise ValueError("dead_letter_suffix must not be empty: the DLQ would be the queue itself")
        object.__setattr__(self, "dead_letter_sources", Binding.source_entries(self.dead_letter_sources))


@dataclass(slots=True)
class _Stored:
    body: bytes
    headers: Mapping[str, Any]
    deliveries: int = 0


class MemoryBinding(Binding):
    name = "memory"
    carries_headers = True
    can_browse = True

    def __init__(self, config: MemoryConfig | None = None) -> None:
        self.config = config or MemoryConfig()
        self._ready: dict[str, deque[_Stored]] = {}
        self._delayed: dict[str, list[tuple[float, _Stored]]] = {}
        self._reserved: dict[int, tuple[str, bool, float, _Stored]] = {}
        self._dead: dict[str, deque[_Stored]] = {}
        self._tokens = itertools.count(1)
        self._seen: dict[str, InMemorySeenStore] = {}
        self._cond = threading.Condition()

    # ------------------------------------------------------------------------------------ helpers

    def _promote(self, queue_name: str, now: float, dead: bool = False) -> None:
        """Move due delayed messages to the ready list and expired reservations back where they were taken:
        ``queue_name`` is the ready queue, or (``dead``) one dead-letter queue's name."""
        delayed = None if dead else self._delayed.get(queue_name)
        if delayed:
            due = [item for item in delayed if item[0] <= now]
            if due:
                self._delayed[queue_name] = [item for item in delayed if item[0] > now]
                self._ready.setdefault(queue_name, deque()).extend(
                    stored for _, stored in sorted(due, key=lambda i: i[0])
                )
        expired = [t for t, (key, d, deadline, _) in self._reserved.items()
                   if key == queue_name and d == dead and deadline <= now]
        for token in expired:
            _, _, _, stored = self._reserved.pop(token)
            (self._dead if dead else self._ready).setdefault(queue_name, deque()).append(stored)

    def _take(self, queue_name: str, timeout: float, dead: bool, limit: int = 1) -> list[ReceivedMessage]:
        """Up to ``limit`` ready messages (``dead``: from each dead-letter source in order), each its own
        reservation, which remembers the list it came from; waits up to ``timeout`` for the first."""
        deadline = time.monotonic() + max(timeout, 0)
        keys = self.dead_letter_sources(queue_name) if dead else [queue_name]
        with self._cond:
            while True:
                now = time.monotonic()
                taken: list[ReceivedMessage] = []
                for key in keys:
                    self._promote(key, now, dead)
                    source = (self._dead if dead else self._ready).get(key)
                    while source and len(taken) < limit:
                        stored = source.popleft()
                        stored.deliveries += 1
                        token = next(self._tokens)
                        self._reserved[token] = (key, dead, now + self.config.visibility_timeout, stored)
                        taken.append(self._message(stored, queue_name, key if dead else None, token))
                if taken:
                    return taken
                remaining = deadline - now
                if remaining <= 0 or limit <= 0:
                    return []
                self._cond.wait(min(remaining, 0.05))

    def _message(self, stored: _Stored, queue_name: str, source: str | None, token: int | None) -> ReceivedMessage:
        envelope, error, body_attempts = parse_body(stored.body, self.decode_limit)
        return ReceivedMessage(
            body=stored.body,
            queue_name=queue_name,
            envelope=envelope,
            decode_error=error,
            attempts=body_attempts,
            delivery_count=stored.deliveries,
            headers=dict(stored.headers),
            receipt=token,
            from_dead_letter=source is not None,
            dead_letter_source=source,
        )

    def _settle(self, message: ReceivedMessage) -> _Stored | None:
        entry = self._reserved.pop(message.receipt, None)
        return entry[3] if entry else None

    def put_dead_letter(self, body: bytes, name: str, headers: Mapping[str, Any] | None = None) -> None:
        """Store ``body`` as it is on the dead-letter queue ``name`` (e.g. ``orders.dlq``), as a peer SDK's worker
        does; nothing is annotated. For tests and demos of the dead-letter-sources rule."""
        with self._cond:
            self._dead.setdefault(name, deque()).append(_Stored(bytes(body), dict(headers or {})))
            self._cond.notify_all()

    # --------------------------------------------------------------------------------- protocol

    def publish(
        self, body: bytes, queue_name: str, *, headers: Mapping[str, Any] | None = None, delay: float = 0
    ) -> None:
        check_sizes([body], self.config.max_message_bytes, f"memory queue {queue_name!r}")
        stored = _Stored(bytes(body), dict(headers or {}))
        with self._cond:
            if delay > 0:
                self._delayed.setdefault(queue_name, []).append((time.monotonic() + delay, stored))
            else:
                self._ready.setdefault(queue_name, deque()).append(stored)
            self._cond.notify_all()

    def publish_batch(self, bodies: Sequence[bytes], queue_name: str) -> None:
        check_sizes(bodies, self.config.max_message_bytes, f"memory queue {queue_name!r}")
        with self._cond:
            self._ready.setdefault(queue_name, deque()).extend(_Stored(bytes(b), {}) for b in bodies)
            self._cond.notify_all()

    def reserve(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        taken = self._take(queue_name, timeout, dead=False)
        return taken[0] if taken else None

    def reserve_many(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        return self._take(queue_name, timeout, dead=False, limit=limit) if limit > 0 else []

    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        taken = self._take(queue_name, timeout, dead=True)
        return taken[0] if taken else None

    def reserve_dead_letters(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """One pass under the lock. ``ack_many``/``release_many`` stay the base loops over ``ack``/``release``:
        there is no round trip to save in memory, and subclasses overriding ``ack`` keep seeing every ack."""
        return self._take(queue_name, timeout, dead=True, limit=limit)

    def ack(self, message: ReceivedMessage) -> None:
        with self._cond:
            self._settle(message)

    def release(self, message: ReceivedMessage, delay: float = 0) -> None:
        self._put_back(message, delay, counted=True)

    def reservation_seconds(self, queue_name: str) -> float | None:
        """A reservation is handed out again once ``visibility_timeout`` has passed."""
        return self.config.visibility_timeout

    def hand_back(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        for message in messages:
            self._put_back(message, delay, counted=False)

    def _put_back(self, message: ReceivedMessage, delay: float, counted: bool) -> None:
        with self._cond:
            entry = self._reserved.pop(message.receipt, None)
            if entry is None:
                return
            if message.from_dead_letter:  # back on the DLQ it came from, unchanged
                self._dead.setdefault(entry[0], deque()).append(_Stored(message.body, message.headers))
                self._cond.notify_all()
                return
        body = bumped_body(message) if counted else message.body
        self.publish(body, message.queue_name, headers=message.headers, delay=delay)

    def dead_letter(
        self, message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
    ) -> None:
        body = dead_letter_body(message, reason, error=error, exception=exception)
        with self._cond:
            if self._settle(message) is None:
                return
            self._dead.setdefault(self.dead_letter_name(message.queue_name), deque()).append(
                _Stored(body, message.headers))
            self._cond.notify_all()

    def depth(self, queue_name: str) -> int:
        with self._cond:
            self._promote(queue_name, time.monotonic())
            return len(self._ready.get(queue_name, ()))

    def dead_letter_depth(self, queue_name: str) -> int:
        """The sum over the dead-letter sources (a missing one counts 0)."""
        with self._cond:
            now = time.monotonic()
            total = 0
            for key in self.dead_letter_sources(queue_name):
                self._promote(key, now, dead=True)
                total += len(self._dead.get(key, ()))
            return total

    def browse_dead_letters(self, queue_name: str, limit: int = 100) -> list[ReceivedMessage]:
        """Each source's dead letters in reading order, up to ``limit`` in all; nothing is reserved."""
        items: list[tuple[str, _Stored]] = []
        with self._cond:
            for key in self.dead_letter_sources(queue_name):
                items += [(key, stored) for stored in list(self._dead.get(key, ()))[: max(limit - len(items), 0)]]
        return [self._message(stored, queue_name, key, None) for key, stored in items]

    def dead_letter_name(self, queue_name: str) -> str:
        return f"{queue_name}{self.config.dead_letter_suffix}"

    def dead_letter_sources(self, queue_name: str) -> list[str]:
        """The written DLQ, then the configured ones (by default ``<queue>:failed`` and ``<queue>.dlq``)."""
        entries = self.config.dead_letter_sources
        assert isinstance(entries, tuple)  # normalised by MemoryConfig
        return self.named_dead_letter_sources(queue_name, entries)

    def seen_store(self, name: str) -> InMemorySeenStore:
        with self._cond:
            return self._seen.setdefault(name, InMemorySeenStore())
