"""The SQL broker's persistent ``meta.id`` seen-set (see :mod:`...core.idempotency`).

It backs the consume operator's idempotency guard and the replay operator's ledger, so a re-run never handles
or republishes the same message twice. Each store is a named set; one database holds many. ``seen_many`` /
``remember_many`` answer in one statement per chunk, which the replay ledger uses for a whole batch.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ...core.idempotency import distinct_chunks
from .schema import create_tables_racing

if TYPE_CHECKING:
    from .binding import SqlBinding

__all__ = ["SqlSeenStore"]

#: Keys per IN list / INSERT (SQLite binds at most 32766 parameters; keep statements small).
_SQL_CHUNK = 500


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
                create_tables_racing(self.table.metadata, self.binding._get_engine())
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

    def seen_many(self, keys: Iterable[str]) -> set[str]:
        """The remembered subset of ``keys``: one SELECT ... IN per 500 keys, in one read."""
        self._ensure()
        found: set[str] = set()
        with self.binding._guard("read the idempotency table", None), self.binding._read() as conn:
            for chunk in distinct_chunks(keys, _SQL_CHUNK):
                query = sa.select(self.table.c.key).where(self.table.c.store == self.name, self.table.c.key.in_(chunk))
                found.update(conn.execute(query).scalars())
        return found

    def remember_many(self, keys: Iterable[str]) -> None:
        """Remember every key in one transaction (see :meth:`insert_keys`)."""
        keys = list(keys)
        if not keys:
            return
        self._ensure()
        with self.binding._guard("write the idempotency table", None), self.binding._write() as conn:
            self.insert_keys(conn, keys)

    def insert_keys(self, conn: Any, keys: Iterable[str]) -> None:
        """Add ``keys`` inside the caller's transaction ``conn`` (the table must exist: :meth:`ensure`): a
        multi-row INSERT ... ON CONFLICT DO NOTHING per 500 keys on PostgreSQL and SQLite; elsewhere the keys
        already there are selected first and the rest inserted."""
        now = time.time()
        dialect = conn.dialect.name
        for chunk in distinct_chunks(keys, _SQL_CHUNK):
            rows = [{"store": self.name, "key": key, "seen_at": now} for key in chunk]
            statement: Any
            if dialect in ("postgresql", "sqlite"):  # imported here: the dialect modules are heavy
                insert = importlib.import_module(f"sqlalchemy.dialects.{dialect}").insert
                statement = insert(self.table).on_conflict_do_nothing(index_elements=["store", "key"])
            else:
                query = sa.select(self.table.c.key).where(self.table.c.store == self.name,
                                                          self.table.c.key.in_(chunk))
                there = set(conn.execute(query).scalars())
                rows = [row for row in rows if row["key"] not in there]
                statement = self.table.insert()
            if rows:
                conn.execute(statement, rows)

    def ensure(self) -> None:
        """Create the table if needed (before a transaction that writes it)."""
        self._ensure()

    def forget(self, key: str) -> None:
        self._ensure()
        with self.binding._guard("write the idempotency table", None), self.binding._write() as conn:
            conn.execute(self.table.delete().where(self._match(key)))

    def __len__(self) -> int:
        self._ensure()
        with self.binding._guard("read the idempotency table", None), self.binding._read() as conn:
            query = sa.select(sa.func.count()).select_from(self.table).where(self.table.c.store == self.name)
            return int(conn.execute(query).scalar_one())
