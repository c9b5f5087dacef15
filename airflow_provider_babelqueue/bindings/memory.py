"""In-memory binding: the reference semantics of the protocol, for tests and dry runs.

Everything lives in one process; nothing survives it. Thread-safe: several consumers may reserve
concurrently, and ``reserve(timeout=...)`` blocks until a message is ready or the timeout passes.
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
from .base import Binding, ReceivedMessage, bumped_body, check_sizes, dead_letter_body, parse_body

__all__ = ["MemoryBinding", "MemoryConfig"]


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """:param visibility_timeout: seconds a reserved message may stay unacked before it is delivered
    again (what a crashed consumer leaves behind).
    :param max_message_bytes: refuse larger bodies before storing them (``None``: no limit), as the real
        brokers do, so tests can exercise the refusal."""

    visibility_timeout: float = 300.0
    max_message_bytes: int | None = None


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

    def _promote(self, queue_name: str, now: float) -> None:
        delayed = self._delayed.get(queue_name)
        if delayed:
            due = [item for item in delayed if item[0] <= now]
            if due:
                self._delayed[queue_name] = [item for item in delayed if item[0] > now]
                self._ready.setdefault(queue_name, deque()).extend(
                    stored for _, stored in sorted(due, key=lambda i: i[0])
                )
        expired = [t for t, (q, _, deadline, _) in self._reserved.items() if q == queue_name and deadline <= now]
        for token in expired:
            _, dead, _, stored = self._reserved.pop(token)
            (self._dead if dead else self._ready).setdefault(queue_name, deque()).append(stored)

    def _take(self, queue_name: str, timeout: float, dead: bool, limit: int = 1) -> list[ReceivedMessage]:
        """Up to ``limit`` ready messages, each its own reservation; waits up to ``timeout`` for the first."""
        deadline = time.monotonic() + max(timeout, 0)
        with self._cond:
            while True:
                now = time.monotonic()
                self._promote(queue_name, now)
                source = (self._dead if dead else self._ready).get(queue_name)
                if source:
                    taken: list[ReceivedMessage] = []
                    while source and len(taken) < limit:
                        stored = source.popleft()
                        stored.deliveries += 1
                        token = next(self._tokens)
                        self._reserved[token] = (queue_name, dead, now + self.config.visibility_timeout, stored)
                        taken.append(self._message(stored, queue_name, dead, token))
                    return taken
                remaining = deadline - now
                if remaining <= 0 or limit <= 0:
                    return []
                self._cond.wait(min(remaining, 0.05))

    @staticmethod
    def _message(stored: _Stored, queue_name: str, dead: bool, token: int | None) -> ReceivedMessage:
        envelope, error, body_attempts = parse_body(stored.body)
        return ReceivedMessage(
            body=stored.body,
            queue_name=queue_name,
            envelope=envelope,
            decode_error=error,
            attempts=body_attempts,
            delivery_count=stored.deliveries,
            headers=dict(stored.headers),
            receipt=token,
            from_dead_letter=dead,
        )

    def _settle(self, message: ReceivedMessage) -> _Stored | None:
        entry = self._reserved.pop(message.receipt, None)
        return entry[3] if entry else None

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
        with self._cond:
            if self._settle(message) is None:
                return
        if message.from_dead_letter:
            with self._cond:
                self._dead.setdefault(message.queue_name, deque()).append(_Stored(message.body, message.headers))
            return
        self.publish(bumped_body(message), message.queue_name, headers=message.headers, delay=delay)

    def dead_letter(
        self, message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
    ) -> None:
        body = dead_letter_body(message, reason, error=error, exception=exception)
        with self._cond:
            if self._settle(message) is None:
                return
            self._dead.setdefault(message.queue_name, deque()).append(_Stored(body, message.headers))

    def depth(self, queue_name: str) -> int:
        with self._cond:
            self._promote(queue_name, time.monotonic())
            return len(self._ready.get(queue_name, ()))

    def dead_letter_depth(self, queue_name: str) -> int:
        with self._cond:
            return len(self._dead.get(queue_name, ()))

    def browse_dead_letters(self, queue_name: str, limit: int = 100) -> list[ReceivedMessage]:
        with self._cond:
            items = list(self._dead.get(queue_name, ()))[: max(limit, 0)]
        return [self._message(stored, queue_name, True, None) for stored in items]

    def dead_letter_name(self, queue_name: str) -> str:
        return f"{queue_name}:failed"

    def seen_store(self, name: str) -> InMemorySeenStore:
        with self._cond:
            return self._seen.setdefault(name, InMemorySeenStore())
