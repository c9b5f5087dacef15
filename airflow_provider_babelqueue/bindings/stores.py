"""Persistent ``meta.id`` seen-sets on the SQL and Redis brokers (see :mod:`..idempotency`).

They back the consume operator's idempotency guard and the replay operator's ledger, so a re-run never
handles or republishes the same message twice. Each store is a named set; one broker holds many.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from .redis import RedisBinding
    from .sql import SqlBinding

__all__ = ["RedisSeenStore", "SqlSeenStore"]


class SqlSeenStore:
    """Rows ``(store, key)`` in ``<table>_seen`` next to the queue tables.

    :param binding: the SQL binding whose database (and transaction discipline) the store shares.
    :param name: the set's name; different names never see each other's keys.
    """

    def __init__(self, binding: SqlBinding, name: str) -> None:
        self.binding, self.name = binding, name
        self.table = sa.Table(
            f"{binding.config.table}_seen",
            sa.MetaData(),
            sa.Column("store", sa.String(200), primary_key=True),
            sa.Column("key", sa.String(200), primary_key=True),
            sa.Column("seen_at", sa.Double(), nullable=False),
        )
        self._created = False

    def _ensure(self) -> None:
        if not self._created:
            with self.binding._guard("create the idempotency table", None):
                self.table.metadata.create_all(self.binding._get_engine(), checkfirst=True)
            self._created = True

    def _match(self, key: str) -> sa.ColumnElement[bool]:
        return sa.and_(self.table.c.store == self.name, self.table.c.key == key)

    def seen(self, key: str) -> bool:
        self._ensure()
        with self.binding._guard("read the idempotency table", None), self.binding._read() as conn:
            return conn.execute(sa.select(self.table.c.key).where(self._match(key))).first() is not None

    def remember(self, key: str) -> None:
        self._ensure()
        with self.binding._guard("write the idempotency table", None), self.binding._write() as conn:
            if conn.execute(sa.select(self.table.c.key).where(self._match(key))).first() is None:
                conn.execute(self.table.insert().values(store=self.name, key=key, seen_at=time.time()))

    def forget(self, key: str) -> None:
        self._ensure()
        with self.binding._guard("write the idempotency table", None), self.binding._write() as conn:
            conn.execute(self.table.delete().where(self._match(key)))

    def __len__(self) -> int:
        self._ensure()
        with self.binding._guard("read the idempotency table", None), self.binding._read() as conn:
            query = sa.select(sa.func.count()).select_from(self.table).where(self.table.c.store == self.name)
            return int(conn.execute(query).scalar_one())


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

    def forget(self, key: str) -> None:
        with self.binding._guard("SREM", self.key):
            self.binding.client.srem(self.key, key)

    def __len__(self) -> int:
        with self.binding._guard("SCARD", self.key):
            return int(self.binding.client.scard(self.key))
