"""The Redis broker's persistent ``meta.id`` seen-set (see :mod:`...core.idempotency`).

It backs the consume operator's idempotency guard and the replay operator's ledger. ``seen_many`` /
``remember_many`` answer in one round trip per chunk, which the replay ledger uses for a whole batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ...core.idempotency import distinct_chunks

if TYPE_CHECKING:
    from .binding import RedisBinding

__all__ = ["RedisSeenStore"]

#: Keys per SMISMEMBER / SADD.
_REDIS_CHUNK = 5000


class RedisSeenStore:
    """A Redis set ``<key_prefix>babelqueue:seen:<name>``.

    :param binding: the Redis binding whose client and key prefix the store shares.
    :param name: the set's name.
    """

    def __init__(self, binding: RedisBinding, name: str) -> None:
        self.binding, self.name = binding, name
        self.key = f"{binding.config.key_prefix}babelqueue:seen:{name}"

    def seen(self, key: str) -> bool:
        with self.binding._guard("SISMEMBER", self.key):
            return bool(self.binding.client.sismember(self.key, key))

    def remember(self, key: str) -> None:
        with self.binding._guard("SADD", self.key):
            self.binding.client.sadd(self.key, key)

    def seen_many(self, keys: Iterable[str]) -> set[str]:
        """The remembered subset of ``keys``: one SMISMEMBER per 5000 keys."""
        found: set[str] = set()
        with self.binding._guard("SMISMEMBER", self.key):
            for chunk in distinct_chunks(keys, _REDIS_CHUNK):
                flags = self.binding.client.smismember(self.key, chunk)
                found.update(key for key, flag in zip(chunk, flags, strict=True) if flag)
        return found

    def remember_many(self, keys: Iterable[str]) -> None:
        """One variadic SADD per 5000 keys."""
        with self.binding._guard("SADD", self.key):
            self.queue_adds(self.binding.client, keys)

    def queue_adds(self, client: Any, keys: Iterable[str]) -> None:
        """The SADDs for ``keys`` on ``client``, which may be a MULTI pipeline the caller executes."""
        for chunk in distinct_chunks(keys, _REDIS_CHUNK):
            client.sadd(self.key, *chunk)

    def forget(self, key: str) -> None:
        with self.binding._guard("SREM", self.key):
            self.binding.client.srem(self.key, key)

    def __len__(self) -> int:
        with self.binding._guard("SCARD", self.key):
            return int(self.binding.client.scard(self.key))
