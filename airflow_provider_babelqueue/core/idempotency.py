"""Consumer idempotency keyed on ``meta.id``: at-least-once delivery, exactly-once *effect*.

A guard wraps a handler. Before running it, the guard asks a seen-set store whether the message's
``meta.id`` was already handled; if so, the delivery is skipped (and acked by the caller). The id is
remembered only after the handler returned, so a handler that raises leaves it unmarked and the retry
or dead-letter path still applies. A message without a usable ``meta.id`` cannot be recognised, so the
guard fails open and runs it. ``trace_id`` is never the key: one trace spans many messages.

This is post-success dedupe, not an in-flight lock. Pure module: standard library only; persistent
stores (SQL table, Redis set) live with their bindings and satisfy :class:`SeenStore`.

Batches. A store may also offer ``seen_many(keys) -> set[str]`` and ``remember_many(keys)`` (one round
trip for many keys; the SQL, Redis and in-memory stores do). They are optional: callers use the functions
:func:`seen_many` and :func:`remember_many`, which fall back to looping over ``seen`` / ``remember`` for a
store without them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from .envelope import meta_id_of

__all__ = [
    "Effect",
    "IdempotencyGuard",
    "InMemorySeenStore",
    "SeenStore",
    "distinct_chunks",
    "remember_many",
    "seen_many",
]


def distinct_chunks(keys: Iterable[str], size: int) -> Iterable[list[str]]:
    """``keys`` without repeats, in order, as lists of at most ``size``: what the persistent stores send per
    statement or round trip."""
    distinct = list(dict.fromkeys(keys))
    for start in range(0, len(distinct), size):
        yield distinct[start:start + size]


@runtime_checkable
class SeenStore(Protocol):
    """Where handled ``meta.id`` values are remembered."""

    def seen(self, key: str) -> bool:
        """Whether ``key`` was remembered and not forgotten since."""

    def remember(self, key: str) -> None:
        """Record ``key`` as handled."""

    def forget(self, key: str) -> None:
        """Evict ``key`` so its next delivery runs again (manual replay, expiry)."""


def seen_many(store: SeenStore, keys: Iterable[str]) -> set[str]:
    """The subset of ``keys`` that ``store`` remembers: the store's own ``seen_many`` (one round trip) when it
    has one, else one ``seen`` per distinct key."""
    distinct = list(dict.fromkeys(keys))
    if not distinct:
        return set()
    batch = getattr(store, "seen_many", None)
    if callable(batch):
        return set(batch(distinct))
    return {key for key in distinct if store.seen(key)}


def remember_many(store: SeenStore, keys: Iterable[str]) -> None:
    """Remember every key: the store's own ``remember_many`` when it has one, else one ``remember`` each, in
    order (so a failure leaves a prefix remembered)."""
    distinct = list(dict.fromkeys(keys))
    if not distinct:
        return
    batch = getattr(store, "remember_many", None)
    if callable(batch):
        batch(distinct)
        return
    for key in distinct:
        store.remember(key)


class InMemorySeenStore:
    """A process-local seen-set, for tests and single-run consumers. Thread-safe."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def seen(self, key: str) -> bool:
        with self._lock:
            return key in self._keys

    def remember(self, key: str) -> None:
        with self._lock:
            self._keys.add(key)

    def seen_many(self, keys: Iterable[str]) -> set[str]:
        with self._lock:
            return {key for key in keys if key in self._keys}

    def remember_many(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._keys.update(keys)

    def forget(self, key: str) -> None:
        with self._lock:
            self._keys.discard(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)


class Effect(StrEnum):
    """What the guard did with one delivery."""

    RUN = "run"
    SKIP = "skip"


class IdempotencyGuard:
    """Runs a handler at most once per ``meta.id`` that it completed.

    :param store: the seen-set; share one store between all consumers of a queue so a redelivery to
        another worker is recognised too.
    """

    def __init__(self, store: SeenStore) -> None:
        self.store = store

    def process(self, envelope: dict[str, Any], handler: Callable[[dict[str, Any]], Any]) -> Effect:
        """Run ``handler(envelope)`` unless its ``meta.id`` was handled before.

        Exceptions from the handler propagate and the id stays unmarked.
        """
        key = meta_id_of(envelope)
        if key and self.store.seen(key):
            return Effect.SKIP
        handler(envelope)
        if key:
            self.store.remember(key)
        return Effect.RUN

    def forget(self, key: str) -> None:
        """Evict one id, so its next delivery is handled again."""
        self.store.forget(key)
