"""SQL table binding: the spec's "PDO transport" layout (so other SDKs on the same database see the same rows).

* ``<table>``: ``id, queue, payload, attempts, reserved_at, available_at, created_at``, one row per message;
* ``<table>_failed``: ``id, queue, urn, attempts, reason, error, exception, failed_at, payload, reserved_at``,
  one row per dead letter; ``payload`` is the full annotated envelope (query it directly for triage).

Dead letters are written to ``<table>_failed`` and read from it and from any further dead-letter tables of
the same layout configured in :attr:`SqlConfig.dead_letter_sources` (another jobs table's ``_failed``, an old
name). Those extra tables are never created: a missing one reads as empty. A reservation remembers its table,
so its ack or release goes back there.

``payload`` is binary (``LargeBinary``: BLOB on SQLite, BYTEA on PostgreSQL): bodies must round-trip byte
for byte, invalid UTF-8 and NUL included, and a TEXT column would reject or transcode exactly the poison
messages triage needs. Ready-table times are float epoch seconds; ``failed_at`` is integer epoch ms.

Reserving stamps ``reserved_at``; a stamp older than the visibility timeout makes the row deliverable again
(a consumer killed before acking loses nothing). The stamp is also the reservation token: a late ack after
the row was reclaimed matches nothing.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from operator import itemgetter
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ...core import envelope as bq
from ...core.integers import INT64_MAX
from ..base import Binding, BindingError, PublishBatchError, check_sizes
from ..bodies import annotated_body, bumped_body
from ..message import ReceivedMessage, parse_body, received_message
from . import dead_letters
from .config import SqlConfig
from .engine import create_engine, mark_returned, ping_if_idle, sqlite_wal
from .postgres import ORDERED_SCAN, run_at_once, sends_ahead, settle_statements
from .schema import build_tables, column_text, create_tables_racing, dead_letter_table

__all__ = ["SqlBinding"]

if TYPE_CHECKING:
    from ...core.idempotency import SeenStore
    from .stores import SqlSeenStore

_BATCH_CHUNK = 500


#: Sort keys of a reserve's rows, whose last columns are ``available_at`` (ready rows only) and ``id``.
_BY_AVAILABLE_AT, _BY_ID = itemgetter(-2, -1), itemgetter(-1)
#: Where a ready-table reserve's row holds the stored size (with a decode limit): before available_at and id.
_STORED_SIZE = -3
#: ``_Receipt`` without the NamedTuple's Python-level ``__new__``: one per reserved message.
_new_receipt = tuple.__new__
#: The headers of every message of the table: the layout has no column for them (shared, read-only).
_NO_HEADERS: Mapping[str, Any] = MappingProxyType({})


def _driver(conn: Connection) -> sqlite3.Connection:
    """The SQLite driver's connection under ``conn``: the consumer's per-batch statements run on it."""
    driver = conn.connection.driver_connection
    if driver is None:  # invalidated by an earlier error
        raise sqlite3.InterfaceError("the database connection was invalidated")
    return driver


class _Receipt(NamedTuple):
    row_id: int
    #: The ``reserved_at`` this reservation wrote; settling only matches a row still carrying it.
    token: float
    #: The dead-letter table the row is in ("" for the ready table and the written DLQ table).
    table: str = ""


class SqlBinding(Binding):
    """A queue in two SQL tables; safe for many consumers across threads, processes and hosts.

    :param config: the tables and timings.
    :param engine: an engine to use instead of creating one from ``config.url`` (the test seam, or to share
        a pool); it is left open by :meth:`close`. Nothing connects until the first operation.
    """

    name = "sql"
    can_browse = True
    carries_headers = False

    def __init__(self, config: SqlConfig, engine: Engine | None = None) -> None:
        self.config = config
        self._engine = engine
        self._owns_engine = engine is None
        self._ready, self._failed = build_tables(config.table)
        #: Every dead-letter table read, the written one first; the extra ones live in their own metadata, so
        #: ``create_tables`` never creates them.
        extra = sa.MetaData()
        names = self.named_dead_letter_sources("", Binding.source_entries(config.dead_letter_sources),
                                               stem=config.table, placeholder="{table}")
        self._dead_tables: dict[str, sa.Table] = {self._failed.name: self._failed}
        for name in names[1:]:
            self._dead_tables[name] = dead_letter_table(name, extra)
        self._present: set[str] = {self._failed.name}  # extra tables seen to exist (they are not dropped)
        self._attempts_max: int | None = None  # the written dead-letter table's attempts range, once looked up
        self._statements: dict[tuple[Any, ...], tuple[str, tuple[str, ...] | None, dict[str, Any]]] = {}
        self._texts: dict[tuple[str, str], sa.TextClause] = {}
        self._init_lock = threading.Lock()
        self._tables_ready = not config.create_tables
        self._serial: threading.Lock | None = None  # set for in-memory SQLite (one shared connection)

    def _get_engine(self, create_tables: bool = True) -> Engine:
        with self._init_lock:
            if self._engine is None:
                url = sa.make_url(self.config.url)
                options: dict[str, Any] = {}
                if url.get_backend_name() == "sqlite":
                    # Long busy timeout: BEGIN IMMEDIATE waits for a competing consumer instead of failing.
                    options = {"connect_args": {"timeout": 30.0}}
                    if url.database in (None, "", ":memory:"):
                        options = {"poolclass": sa.pool.StaticPool, "connect_args": {"check_same_thread": False}}
                self._engine = create_engine(url, options)
                if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
                    sa.event.listen(self._engine, "connect", sqlite_wal)
                elif url.get_backend_name() != "sqlite":
                    sa.event.listen(self._engine, "checkin", mark_returned)
                    sa.event.listen(self._engine, "checkout", ping_if_idle)
            engine = self._engine
            if engine.dialect.name == "sqlite" and engine.url.database in (None, "", ":memory:"):
                self._serial = self._serial or threading.Lock()
            if create_tables and not self._tables_ready:
                create_tables_racing(self._ready.metadata, engine)
                self._tables_ready = True
            return engine

    @contextmanager
    def _guard(self, action: str, queue_name: str | None) -> Iterator[None]:
        """Turn driver errors into a :class:`BindingError` that says what to check."""
        try:
            yield
        except (sa.exc.SQLAlchemyError, sqlite3.Error) as exc:  # SQLite's hot statements run on its driver
            from ..redaction import redact_url, scrub, url_secrets

            engine = self._engine
            urls = [self.config.url] + ([] if engine is None else [engine.url.render_as_string(hide_password=False)])
            detail = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
            detail = scrub(detail, [secret for url in urls for secret in url_secrets(url)])
            lowered = detail.lower()
            db = self.config.safe_url if engine is None else redact_url(engine.url.render_as_string(hide_password=True))
            where = f"table {self.config.table!r}" + (f", queue {queue_name!r}" if queue_name else "")
            if "no such table" in lowered or ("relation" in lowered and "does not exist" in lowered):
                hint = "the queue tables are missing; create them or set create_tables=True"
            elif "locked" in lowered:
                hint = "another connection held the database lock too long; retry, or use a server database"
            elif isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError | sqlite3.OperationalError
                            | sqlite3.InterfaceError):
                hint = f"cannot reach the database at {db}; check it is running and the URL"
            else:
                hint = f"check the schema of {self.config.table!r}/{self._failed.name!r} at {db}"
            raise BindingError(f"sql binding could not {action} ({where}): {detail}; {hint}") from exc

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """A transaction that may write; on SQLite it takes the write lock up front.

        SQLite's default deferred transaction lets two consumers read the same free row and then fight
        over the upgrade; ``BEGIN IMMEDIATE`` serialises them before the read. Other databases use
        ``SELECT ... FOR UPDATE SKIP LOCKED`` instead (see :meth:`_take`).
        """
        engine = self._get_engine()
        with self._serial or nullcontext():
            if engine.dialect.name != "sqlite":
                with engine.begin() as conn:
                    yield conn
                return
            with engine.connect() as conn:
                # The transaction is the driver's own: its statements go to the driver, and the driver is put in
                # autocommit (no implicit BEGIN) for the block, then back. SQLAlchemy's execution path, and its
                # isolation-level switch and reset at check-in, cost several times statements this small, once
                # per batch a consumer reserves.
                driver = _driver(conn)
                implicit = driver.isolation_level
                driver.isolation_level = None
                try:
                    driver.execute("BEGIN IMMEDIATE")
                    try:
                        yield conn
                    except BaseException:
                        current = conn.connection.driver_connection  # None once invalidated: nothing to roll back
                        if current is not None and current.in_transaction:  # some errors end it already
                            current.execute("ROLLBACK")
                        raise
                    driver.execute("COMMIT")
                finally:
                    driver.isolation_level = implicit

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        engine = self._get_engine()
        with self._serial or nullcontext(), engine.connect() as conn:
            yield conn

    def _free(self, table: sa.Table, now: float) -> sa.ColumnElement[bool]:
        """Rows nobody holds: never reserved, or reserved longer ago than the visibility timeout."""
        col = table.c.reserved_at
        return sa.or_(col.is_(None), col <= now - self.config.visibility_timeout)

    def _message(self, row: Any, queue_name: str, dead: bool, receipt: _Receipt | None,
                 source: str | None = None) -> ReceivedMessage:
        if row.payload is None:  # over the decode limit: left in the database, its length read (_ready_columns)
            return self._unread(int(row.stored_size), queue_name, receipt)
        body = bytes(row.payload)
        envelope, error, body_attempts = parse_body(body, self.decode_limit)
        if dead and (envelope is None or "dead_letter" not in envelope):
            # stored bare, its reason in the columns: read in the form the other brokers' DLQs hold
            body = dead_letters.reader_body(body, row, envelope, decoded=True)
            envelope, error, body_attempts = parse_body(body)
        attempts = max(body_attempts, row.attempts or 0) if dead else body_attempts
        return ReceivedMessage(
            body=body, queue_name=queue_name, envelope=envelope, decode_error=error, attempts=attempts,
            delivery_count=None, headers={}, receipt=receipt, from_dead_letter=dead,
            dead_letter_source=(source or self._failed.name) if dead else None,
        )

    def _unread(self, size: int, queue_name: str, receipt: _Receipt | None) -> ReceivedMessage:
        """A ready row over the decode limit: its body left in the database, only its length read."""
        return ReceivedMessage(
            body=b"", queue_name=queue_name, envelope=None, attempts=0, receipt=receipt, stored_size=size,
            decode_error=f"body is {size:,} bytes; not read (over the decode limit of {self.decode_limit:,})",
        )

    def _attempts_column_max(self) -> int:
        """The largest ``attempts`` the written dead-letter table holds: 2**63 - 1, or 2**31 - 1 for a table
        created with a 32-bit column (looked up once; a warning says how to widen it)."""
        if self._attempts_max is None:
            maximum = INT64_MAX
            with self._guard("look up the dead-letter table", None), self._read() as conn:
                columns = {c["name"]: c["type"] for c in sa.inspect(conn).get_columns(self._failed.name)}
            kind = columns.get("attempts")
            if isinstance(kind, sa.Integer) and not isinstance(kind, sa.BigInteger) and conn.dialect.name != "sqlite":
                maximum = 2**31 - 1
                logging.getLogger(__name__).warning(
                    "%s.attempts is a 32-bit INTEGER: dead letters claiming more than %d attempts keep their count "
                    "in the payload only; widen it with: ALTER TABLE %s ALTER COLUMN attempts TYPE BIGINT",
                    self._failed.name, maximum, self._failed.name)
            self._attempts_max = maximum
        return self._attempts_max

    @staticmethod
    def _columns(table: sa.Table, dead: bool) -> list[sa.ColumnElement[Any]]:
        """What :meth:`_message` reads of a row: a dead letter's columns too, for one stored bare."""
        names = ("payload", "attempts", "queue", "reason", "error", "exception", "failed_at") if dead else (
            "payload", "attempts")
        return [table.c[name] for name in names]

    def _ready_columns(self, table: sa.Table) -> list[sa.ColumnElement[Any]]:
        """:meth:`_columns` of a ready-table reserve. With a :attr:`decode_limit`, a payload over it is not selected
        (NULL) but its length is (``stored_size``): an oversized body never crosses the wire, :meth:`_message`
        makes it an unread message and :meth:`dead_letter` copies it inside the database. The length is read
        without the value (PostgreSQL's ``length(bytea)`` from the stored header, SQLite's ``length(blob)``
        without loading the blob); an SQLite TEXT payload (a producer that bound a string) counts its bytes."""
        columns = self._columns(table, False)
        if self.decode_limit is None:
            return columns
        payload = table.c.payload
        size: sa.ColumnElement[Any] = sa.func.length(payload)
        if self._get_engine().dialect.name == "sqlite":
            size = sa.case((sa.func.typeof(payload) == "blob", size),
                           else_=sa.func.length(sa.cast(payload, sa.LargeBinary())))
        return [sa.case((size <= self.decode_limit, payload)).label("payload"), *columns[1:],
                size.label("stored_size")]

    def _readable(self) -> list[sa.Table]:
        """The dead-letter tables that exist now, in reading order: an extra table is looked up in the catalog
        until it is found (one query each; a read never creates one)."""
        tables = []
        for name, table in self._dead_tables.items():
            if name not in self._present:
                with self._guard("look up a dead-letter table", None), self._read() as conn:
                    if not sa.inspect(conn).has_table(name):
                        continue
                self._present.add(name)
            tables.append(table)
        return tables

    def _dead_table(self, receipt: _Receipt) -> sa.Table:
        table = self._dead_tables.get(receipt.table)  # "": the written table (a Table has no truth value)
        return self._failed if table is None else table

    def _take(self, queue_name: str, timeout: float, dead: bool, limit: int = 1) -> list[ReceivedMessage]:
        """Reserve up to ``limit`` free rows, oldest first, with one statement per table: ``UPDATE ... SET
        reserved_at = token WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n) RETURNING ...`` (SQLite: under
        BEGIN IMMEDIATE, which serialises reservers). Dead letters are taken from each dead-letter table in order.
        Polls up to ``timeout`` seconds for the first row (a table has no blocking read)."""
        action = "reserve from the dead-letter table" if dead else "reserve"
        deadline = time.monotonic() + max(timeout, 0)
        while True:
            out: list[ReceivedMessage] = []
            for table in self._readable() if dead else [self._ready]:
                with self._guard(action, queue_name), self._write() as conn:
                    out += self._stamp(conn, table, queue_name, dead, limit - len(out))
                if len(out) >= limit:
                    break
            if out:
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            time.sleep(min(self.config.poll_interval, remaining))

    def _stamp(self, conn: Connection, table: sa.Table, queue_name: str, dead: bool,
               limit: int) -> list[ReceivedMessage]:
        """Mark up to ``limit`` free rows reserved and read them, in one statement, with one token (see
        :meth:`_reserve_call`)."""
        sql, params, token = self._reserve_call(conn.dialect, table, queue_name, dead, limit)
        if self._select_first(conn.dialect, dead):
            # SQLite's ready rows: selected in order, then stamped by id, on the driver itself (plain tuples)
            driver = _driver(conn)
            rows = driver.execute(sql, params).fetchall()
            ids = [row[-1] for row in rows]
            for start in range(0, len(ids), _BATCH_CHUNK):
                chunk = ids[start:start + _BATCH_CHUNK]
                driver.execute(f"UPDATE {self._quoted(table)} SET reserved_at = ? WHERE id IN "
                               f"({','.join('?' * len(chunk))})", (token, *chunk))
        else:
            if conn.dialect.name == "postgresql" and not sends_ahead(conn.dialect):
                conn.exec_driver_sql(ORDERED_SCAN)  # its own statement: see postgres.sends_ahead
            result = conn.exec_driver_sql(sql, params)
            if dead:
                rows = list(result.all())  # read by name (see _message)
            else:
                # the ready rows as the driver's own tuples, read by position: SQLAlchemy's Row per row cost about
                # a tenth of the consumer's client CPU per batch; the statement still ran (and its errors were
                # wrapped) through SQLAlchemy
                rows = list(result.cursor.fetchall())
                result.close()
            rows.sort(key=_BY_ID if dead else _BY_AVAILABLE_AT)  # RETURNING has no order; the statement ends so
        return self._reserved(rows, table, queue_name, dead, token)

    def _reserve_call(self, dialect: sa.Dialect, table: sa.Table, queue_name: str, dead: bool, limit: int,
                      prefix: tuple[str, dict[str, Any]] | None = None) -> tuple[str, Any, float]:
        """The reserve of up to ``limit`` free rows, ready to run: ``(sql, parameters, token)``. Its token is the
        current time, strictly newer than every previous mark of those rows (a row is free only when its mark is
        at least the visibility timeout old), so each reservation's ``(id, reserved_at)`` receipt is unique.

        :param prefix: PostgreSQL only: statements and their named parameters sent before the reserve in the same
            round trip (the driver runs them in order and returns the last one's rows)."""
        now = time.time()
        cutoff = now - self.config.visibility_timeout
        token = now if cutoff < now else math.nextafter(now, math.inf)  # a timeout below the clock's resolution
        sql, names, defaults = self._reserve_statement(dialect, table, dead)
        values = {**defaults, "bq_queue": queue_name, "bq_cutoff": cutoff, "bq_now": now, "bq_token": token,
                  "bq_limit": limit}
        if prefix is not None:
            sql, values = prefix[0] + sql, {**values, **prefix[1]}
        return sql, tuple(values[name] for name in names) if names else values, token

    def _reserved(self, rows: list[Any], table: sa.Table, queue_name: str, dead: bool,
                  token: float) -> list[ReceivedMessage]:
        """The messages of a reserve's rows, in order, each with its ``(id, token)`` receipt."""
        if not dead:
            ready = self._ready_message
            return [ready(row, queue_name, _new_receipt(_Receipt, (row[-1], token, ""))) for row in rows]
        extra = table.name if table is not self._failed else ""
        return [self._message(row, queue_name, dead, _Receipt(row[-1], token, extra), table.name) for row in rows]

    def _at_once(self, sql: str, params: dict[str, Any]) -> list[Any]:
        """PostgreSQL on psycopg2: ``sql`` (a settlement and the next reserve) as one query, in one round trip
        (:func:`.postgres.run_at_once`), its rows in the reserve's order."""
        rows = run_at_once(self._get_engine(), sql, params)
        rows.sort(key=_BY_AVAILABLE_AT)  # RETURNING has no order
        return rows

    def _ready_message(self, row: Any, queue_name: str, receipt: _Receipt) -> ReceivedMessage:
        """:meth:`_message` of a reserved ready row (the reserve's columns: payload, ..., stored_size, then
        available_at and id, see :meth:`_reserve_statement`; a plain tuple on SQLite): the consumer's path, one
        per message, so it reads the row by position."""
        payload = row[0]
        if payload is None:  # over the decode limit: left in the database (see _message)
            return self._unread(int(row[_STORED_SIZE]), queue_name, receipt)
        body = payload if payload.__class__ is bytes else bytes(payload)
        envelope, error, attempts = parse_body(body, self.decode_limit)
        return received_message(body, queue_name, envelope, error, attempts, _NO_HEADERS, receipt)

    def _reserve_statement(self, dialect: sa.Dialect, table: sa.Table, dead: bool
                           ) -> tuple[str, tuple[str, ...] | None, dict[str, Any]]:
        """The reserve of :meth:`_stamp` for ``table``, compiled once per table and dialect: ``(sql, parameter
        names in order for a positional driver or None, fixed values)``. Run as the driver's own statement, a
        batch costs its round trip and not a statement build and compile (several times the query on SQLite)."""
        key = (table.name, dead, dialect.name, self.decode_limit)
        cached = self._statements.get(key)
        if cached is None:
            col = table.c.reserved_at
            where = [table.c.queue == sa.bindparam("bq_queue"),
                     sa.or_(col.is_(None), col <= sa.bindparam("bq_cutoff"))]
            order = [table.c.id] if dead else [table.c.available_at, table.c.id]
            if not dead:
                where.append(table.c.available_at <= sa.bindparam("bq_now"))
            picked = (sa.select(table.c.id).where(*where).order_by(*order).limit(sa.bindparam("bq_limit"))
                      .with_for_update(skip_locked=True))
            columns = self._columns(table, dead) if dead else self._ready_columns(table)
            statement: sa.Select[Any] | sa.Update = (
                sa.update(table).where(table.c.id.in_(picked.scalar_subquery()))
                .values(reserved_at=sa.bindparam("bq_token")).returning(*columns, *order[:-1], table.c.id))
            if self._select_first(dialect, dead):
                statement = (sa.select(*columns, *order[:-1], table.c.id).where(*where).order_by(*order)
                             .limit(sa.bindparam("bq_limit")))
            compiled = statement.compile(dialect=dialect)
            sql = compiled.string
            if sends_ahead(dialect):
                sql = f"{ORDERED_SCAN}; {sql}"  # one round trip: the driver returns the last statement's rows
            names = tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
            fixed = {name: value for name, value in compiled.params.items() if not name.startswith("bq_")}
            cached = self._statements[key] = (sql, names, fixed)
        return cached

    @staticmethod
    def _select_first(dialect: sa.Dialect, dead: bool) -> bool:
        """SQLite, ready rows: the reserve selects the rows, then stamps them with an ``UPDATE`` by id (one writer
        at a time under ``BEGIN IMMEDIATE``, so the selected rows stay free in between). SQLite evaluates an
        ``UPDATE … RETURNING`` on the rewritten row it holds in memory, where each mention of the payload (its
        type, its length) is a copy of it: a 40 MB body refused unread cost 6x its size there, against 2x for a
        SELECT that measures the stored value without loading it."""
        return dialect.name == "sqlite" and not dead

    @staticmethod
    def _receipt(message: ReceivedMessage) -> _Receipt:
        if not isinstance(message.receipt, _Receipt):
            raise BindingError(f"message from queue {message.queue_name!r} was not reserved by an sql binding")
        return message.receipt

    def _held(self, table: sa.Table, receipt: _Receipt) -> sa.ColumnElement[bool]:
        return sa.and_(table.c.id == receipt.row_id, table.c.reserved_at == receipt.token)

    @staticmethod
    def _row(body: bytes, queue_name: str, now: float, delay: float = 0) -> dict[str, Any]:
        return {"queue": queue_name, "payload": bytes(body), "attempts": 0, "reserved_at": None,
                "available_at": now + max(delay, 0), "created_at": now}

    def publish(
        self, body: bytes, queue_name: str, *, headers: Mapping[str, Any] | None = None, delay: float = 0
    ) -> None:
        """Insert one row; ``headers`` are ignored because the layout has no column other SDKs read."""
        check_sizes([body], self.config.max_message_bytes, f"{self.config.table} ({queue_name!r})")
        with self._guard("publish", queue_name), self._write() as conn:
            conn.execute(sa.insert(self._ready), [self._row(body, queue_name, time.time(), delay)])

    def publish_batch(self, bodies: Sequence[bytes], queue_name: str) -> None:
        """Insert all bodies in one transaction, a multi-row INSERT per chunk: all of them or none."""
        if not bodies:
            return
        check_sizes(bodies, self.config.max_message_bytes, f"{self.config.table} ({queue_name!r})")
        now = time.time()  # one timestamp: the batch keeps its order (ties are broken by id)
        rows = [self._row(body, queue_name, now) for body in bodies]
        try:
            with self._guard("publish a batch", queue_name), self._write() as conn:
                for start in range(0, len(rows), _BATCH_CHUNK):
                    conn.execute(sa.insert(self._ready), rows[start : start + _BATCH_CHUNK])
        except BindingError as exc:
            raise PublishBatchError(f"{exc} (the transaction rolled back: none was stored)", range(len(rows))) from exc

    def publish_remembering(self, bodies: Sequence[bytes], queue_name: str,
                            marks: Sequence[tuple[SeenStore, Sequence[str]]]) -> bool:
        """The batch's rows and the marks' seen rows in one transaction, when every store is a seen table of this
        binding's database (see :meth:`Binding.publish_remembering`)."""
        from .stores import SqlSeenStore

        own = [(store, keys) for store, keys in marks if isinstance(store, SqlSeenStore) and store.binding is self]
        if not bodies or len(own) < len(marks):
            return False
        check_sizes(bodies, self.config.max_message_bytes, f"{self.config.table} ({queue_name!r})")
        for store, _ in own:
            store.ensure()
        now = time.time()
        rows = [self._row(body, queue_name, now) for body in bodies]
        try:
            with self._guard("publish a batch and remember it", queue_name), self._write() as conn:
                for start in range(0, len(rows), _BATCH_CHUNK):
                    conn.execute(sa.insert(self._ready), rows[start : start + _BATCH_CHUNK])
                for store, keys in own:
                    store.insert_keys(conn, keys)
        except BindingError as exc:
            raise PublishBatchError(f"{exc} (the transaction rolled back: none was stored)", range(len(rows))) from exc
        return True

    def reserve(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        taken = self._take(queue_name, timeout, dead=False)
        return taken[0] if taken else None

    def reserve_many(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """Up to ``limit`` ready rows in one transaction (see :meth:`_take`: ``FOR UPDATE SKIP LOCKED`` on
        PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), in delivery order, sharing one reservation token."""
        return self._take(queue_name, timeout, dead=False, limit=limit) if limit > 0 else []

    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        taken = self._take(queue_name, timeout, dead=True)
        return taken[0] if taken else None

    def reserve_dead_letters(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """Up to ``limit`` dead-letter rows in one transaction (see :meth:`_take`), oldest first."""
        return self._take(queue_name, timeout, dead=True, limit=limit) if limit > 0 else []

    def ack(self, message: ReceivedMessage) -> None:
        """Delete the row, if this reservation still holds it (a reclaimed row belongs to its new holder)."""
        receipt = self._receipt(message)
        table = self._dead_table(receipt) if message.from_dead_letter else self._ready
        with self._guard("ack", message.queue_name), self._write() as conn:
            conn.execute(sa.delete(table).where(self._held(table, receipt)))

    def _by_token(self, messages: Sequence[ReceivedMessage]) -> dict[tuple[sa.Table, float], list[int]]:
        """Row ids grouped by (table, reservation token): a batch reservation shares one token."""
        groups: dict[tuple[sa.Table, float], list[int]] = {}
        ready, last, ids = self._ready, None, []
        for message in messages:  # once per settled message: a batch's run of one token costs no dict lookup
            receipt = message.receipt
            if receipt.__class__ is not _Receipt:
                self._receipt(message)  # raises, naming the queue
            key = (self._dead_table(receipt) if message.from_dead_letter else ready, receipt[1])
            if key != last:
                last, ids = key, groups.setdefault(key, [])
            ids.append(receipt[0])
        return groups

    def ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        """One transaction: a DELETE ... WHERE reserved_at = token AND id IN (...) per token and table (per 500
        ids), so a row reclaimed since (it carries a newer mark) is left to its new holder, as :meth:`ack` does."""
        self.settle(messages)

    def release_many(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """:meth:`release` for many in one transaction: dead letters un-reserved per token group, ready-table
        rows in one executemany UPDATE (each with its own bumped body; an unread body stays as stored), all gated
        on their receipts."""
        self.settle((), [(message, delay) for message in messages])

    def reservation_seconds(self, queue_name: str) -> float | None:
        """A reserved row is free again once its mark is ``visibility_timeout`` old."""
        return self.config.visibility_timeout

    def hand_back(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """Un-reserve the rows as they are (payload and ``attempts`` untouched), ready again after ``delay``; one
        transaction, one UPDATE per (table, token) and 500 ids, gated on the token like every settle."""
        if not messages:
            return
        due = time.time() + max(delay, 0)
        with self._guard("hand back reservations", messages[0].queue_name), self._write() as conn:
            for (table, token), ids in self._by_token(messages).items():
                if table is self._ready:
                    statement = self._cached_text(table, "UPDATE {t} SET reserved_at = NULL, available_at = :due "
                                                         "WHERE reserved_at = :token AND id IN :ids")
                else:  # a dead letter has no schedule: it is just free again
                    statement = self._cached_text(table, "UPDATE {t} SET reserved_at = NULL "
                                                         "WHERE reserved_at = :token AND id IN :ids")
                for start in range(0, len(ids), _BATCH_CHUNK):
                    conn.execute(statement, {"token": token, "due": due, "ids": ids[start:start + _BATCH_CHUNK]})

    def hold(self, messages: Sequence[ReceivedMessage], seconds: float) -> list[str]:
        """Mark the rows as reserved until ``seconds`` from now (a ``reserved_at`` in the future, so the visibility
        timeout counts from there); a receipt is ``"<row id>:<mark>"``. Ready-table reservations only."""
        if not messages:
            return []
        mark = time.time() + max(seconds, 0) - self.config.visibility_timeout
        with self._guard("hold reservations", messages[0].queue_name), self._write() as conn:
            for (table, token), ids in self._by_token(messages).items():
                if table is not self._ready:
                    raise BindingError("only reservations of ready messages can be held, not dead letters")
                statement = self._cached_text(table, "UPDATE {t} SET reserved_at = :mark "
                                                     "WHERE reserved_at = :token AND id IN :ids")
                for start in range(0, len(ids), _BATCH_CHUNK):
                    conn.execute(statement, {"mark": mark, "token": token, "ids": ids[start:start + _BATCH_CHUNK]})
        return [f"{self._receipt(message).row_id}:{mark!r}" for message in messages]

    def settle_held(self, receipts: Sequence[str], *, succeeded: bool) -> None:
        """One transaction: the held rows deleted (``succeeded``) or un-reserved as they are, gated on their mark."""
        groups: dict[float, list[int]] = {}
        for receipt in receipts:
            row_id, _, mark = receipt.partition(":")
            try:
                groups.setdefault(float(mark), []).append(int(row_id))
            except ValueError:
                raise BindingError(f"{receipt!r} is not a receipt of a held SQL reservation") from None
        if not groups:
            return
        template = ("DELETE FROM {t} WHERE reserved_at = :token AND id IN :ids" if succeeded else
                    "UPDATE {t} SET reserved_at = NULL, available_at = :now WHERE reserved_at = :token AND id IN :ids")
        statement = self._cached_text(self._ready, template)
        with self._guard("settle held reservations", self.config.table), self._write() as conn:
            for token, ids in groups.items():
                for start in range(0, len(ids), _BATCH_CHUNK):
                    conn.execute(statement, {"token": token, "now": time.time(),
                                             "ids": ids[start:start + _BATCH_CHUNK]})

    def settle(self, acks: Sequence[ReceivedMessage],
               releases: Sequence[tuple[ReceivedMessage, float]] = ()) -> None:
        """The releases (each with its own delay) and the acks in one transaction (see :meth:`_settle_in`)."""
        if not acks and not releases:
            return
        first = acks[0] if acks else releases[0][0]
        with self._guard("settle reservations", first.queue_name), self._write() as conn:
            self._settle_in(conn, acks, releases)

    def settle_and_reserve(self, queue_name: str, limit: int, timeout: float = 0, *,
                           acks: Sequence[ReceivedMessage] = (),
                           releases: Sequence[tuple[ReceivedMessage, float]] = ()) -> list[ReceivedMessage]:
        """The previous batch's settlement and the next batch's reservation in one transaction: one commit per
        batch. When nothing is ready, the settlement is committed and the reserve polls up to ``timeout``."""
        if limit <= 0 or (not acks and not releases):
            return self.reserve_many(queue_name, limit, timeout)
        with self._guard("settle and reserve", queue_name):
            dialect = self._get_engine().dialect
            prefix = self._settle_prefix(dialect, acks, releases)
            if prefix is not None:
                sql, params, token = self._reserve_call(dialect, self._ready, queue_name, False, limit, prefix)
                taken = self._reserved(self._at_once(sql, params), self._ready, queue_name, False, token)
            else:
                with self._write() as conn:
                    self._settle_in(conn, acks, releases)
                    taken = self._stamp(conn, self._ready, queue_name, False, limit)
        return taken or self.reserve_many(queue_name, limit, timeout)

    def _settle_prefix(self, dialect: sa.Dialect, acks: Sequence[ReceivedMessage],
                       releases: Sequence[tuple[ReceivedMessage, float]]) -> tuple[str, dict[str, Any]] | None:
        """PostgreSQL on psycopg2: the usual end of a batch (ready-table reservations of one token, each body read)
        as statements to send with the next reserve (:func:`.postgres.settle_statements`). ``None``: settle the
        general way (:meth:`_settle_in`), as on another driver (:func:`.postgres.sends_ahead`)."""
        messages = [*acks, *(message for message, _ in releases)]
        if (not sends_ahead(dialect) or len(messages) > _BATCH_CHUNK
                or any(m.from_dead_letter or m.stored_size is not None for m in messages)):
            return None
        tokens = {self._receipt(message).token for message in messages}
        if len(tokens) != 1:
            return None
        now = time.time()
        return settle_statements(
            self._quoted(self._ready), tokens.pop(), [self._receipt(message).row_id for message in acks],
            [(self._receipt(m).row_id, bumped_body(m), now + max(delay, 0)) for m, delay in releases])

    def _quoted(self, table: sa.Table) -> str:
        return str(self._get_engine().dialect.identifier_preparer.quote(table.name))

    def _settle_in(self, conn: Connection, acks: Sequence[ReceivedMessage],
                   releases: Sequence[tuple[ReceivedMessage, float]]) -> None:
        """Inside a transaction: acked rows deleted per (table, token) group, 500 ids a statement; released dead
        letters un-reserved the same way; released ready rows updated with one executemany (attempts + 1 in the
        column and the body, an unread body kept as stored, each its own ``available_at``). Every statement is
        gated on the reservation's token, so a row reclaimed since is left to its new holder."""
        for (table, token), ids in self._by_token(acks).items():
            delete = self._cached_text(table, "DELETE FROM {t} WHERE reserved_at = :token AND id IN :ids")
            for start in range(0, len(ids), _BATCH_CHUNK):
                chunk = ids[start:start + _BATCH_CHUNK]
                if conn.dialect.name == "sqlite":  # on the driver itself: no statement build per batch
                    marks = ",".join("?" * len(chunk))
                    _driver(conn).execute(
                        f"DELETE FROM {self._quoted(table)} WHERE reserved_at = ? AND id IN ({marks})", (token, *chunk))
                else:
                    conn.execute(delete, {"token": token, "ids": chunk})
        if not releases:
            return
        dead = self._by_token([message for message, _ in releases if message.from_dead_letter])
        for (table, token), ids in dead.items():
            free = self._cached_text(table,
                                     "UPDATE {t} SET reserved_at = NULL WHERE reserved_at = :token AND id IN :ids")
            for start in range(0, len(ids), _BATCH_CHUNK):
                conn.execute(free, {"token": token, "ids": ids[start:start + _BATCH_CHUNK]})
        now, t = time.time(), self._ready
        rows, kept = [], []
        for message, delay in releases:
            if message.from_dead_letter:
                continue
            receipt = self._receipt(message)
            row = {"b_id": receipt.row_id, "b_token": receipt.token, "b_available": now + max(delay, 0)}
            if message.stored_size is None:
                rows.append({**row, "b_payload": bumped_body(message)})
            else:
                kept.append(row)
        if conn.dialect.name == "sqlite":  # on the driver itself, as the acks: no statement build per batch
            driver, quoted = _driver(conn), self._quoted(t)
            for with_payload, group in ((True, rows), (False, kept)):
                if group:
                    driver.executemany(
                        f"UPDATE {quoted} SET {'payload = :b_payload, ' if with_payload else ''}"
                        "attempts = attempts + 1, reserved_at = NULL, available_at = :b_available "
                        "WHERE id = :b_id AND reserved_at = :b_token", group)
            return
        held = (t.c.id == sa.bindparam("b_id"), t.c.reserved_at == sa.bindparam("b_token"))
        values = {"attempts": t.c.attempts + 1, "reserved_at": None, "available_at": sa.bindparam("b_available")}
        if rows:
            conn.execute(sa.update(t).where(*held).values(payload=sa.bindparam("b_payload"), **values), rows)
        if kept:
            conn.execute(sa.update(t).where(*held).values(**values), kept)

    def _cached_text(self, table: sa.Table, template: str) -> sa.TextClause:
        """A settle statement on ``table`` (``:ids`` expanding), built once: a batch then costs no statement build."""
        key = (template, table.name)
        cached = self._texts.get(key)
        if cached is None:
            cached = self._texts[key] = sa.text(template.format(t=self._quoted(table))).bindparams(
                sa.bindparam("ids", expanding=True))
        return cached

    def release(self, message: ReceivedMessage, delay: float = 0) -> None:
        """Un-reserve the row with ``attempts`` one higher in the column and the body (an unread body, over the
        decode limit, stays as stored); a DLQ row is just un-reserved, since a drain that gives up must leave the
        dead letter as it was."""
        receipt = self._receipt(message)
        if message.from_dead_letter:
            table = self._dead_table(receipt)
            with self._guard("release a dead letter", message.queue_name), self._write() as conn:
                conn.execute(sa.update(table).where(self._held(table, receipt)).values(reserved_at=None))
            return
        values: dict[str, Any] = {"attempts": self._ready.c.attempts + 1, "reserved_at": None,
                                  "available_at": time.time() + max(delay, 0)}
        if message.stored_size is None:
            values["payload"] = bumped_body(message)
        with self._guard("release", message.queue_name), self._write() as conn:
            conn.execute(sa.update(self._ready).where(self._held(self._ready, receipt)).values(**values))

    def dead_letter(
        self, message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
    ) -> None:
        """Delete the reserved row and insert the annotated copy into ``<table>_failed``, atomically.

        A body that cannot be annotated is stored byte for byte, with the reason, error and exception in their
        columns (and read back as a poison wrapper, see :meth:`_message`). The text columns are derived and
        sanitised (:func:`column_text`: no NUL, which PostgreSQL's text refuses, no lone surrogate); the payload
        is never altered. ``attempts`` is clamped to an older table's 32-bit column (the body keeps the count).

        An unread message (over the decode limit, see :meth:`_ready_columns`) is moved inside the database: the
        dead-letter row is an ``INSERT ... SELECT`` of the reserved row's payload, so the refused body never
        crosses the wire (:meth:`_move_unread`)."""
        receipt = self._receipt(message)
        source = self._dead_table(receipt) if message.from_dead_letter else self._ready
        annotated = annotated_body(message, reason, error=error, exception=exception)
        row = {"queue": message.queue_name, "urn": column_text(message.urn),
               "attempts": min(message.attempts, self._attempts_column_max()), "reason": column_text(str(reason)),
               "error": column_text(error), "exception": column_text(exception), "failed_at": bq.now_ms(),
               "payload": message.body if annotated is None else annotated, "reserved_at": None}
        with self._guard("dead-letter", message.queue_name), self._write() as conn:
            if message.stored_size is not None:
                self._move_unread(conn, source, receipt, row)
            elif conn.execute(sa.delete(source).where(self._held(source, receipt))).rowcount == 1:
                conn.execute(sa.insert(self._failed), [row])

    def _move_unread(self, conn: Connection, source: sa.Table, receipt: _Receipt, row: dict[str, Any]) -> None:
        """Dead-letter the reserved row of ``receipt`` with its payload copied by the database: lock the row while
        this reservation still holds it (``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` holds the whole database),
        insert the dead-letter row (``row``'s columns, the payload selected from the reserved row), delete the
        reserved row; one transaction, so a crash leaves the message reserved, never lost or doubled.

        :param row: the dead-letter row's columns but ``payload``; each value is cast to its column's type, which
            the database could not infer from a parameter in a SELECT list.
        """
        held = sa.select(source.c.id).where(self._held(source, receipt)).with_for_update()
        if conn.execute(held).first() is None:
            return  # settled already, or expired and reserved again: it is the new holder's
        names = [name for name in row if name not in ("payload", "reserved_at")]
        copied = sa.select(*(sa.cast(sa.literal(row[name]), self._failed.c[name].type) for name in names),
                           source.c.payload).where(source.c.id == receipt.row_id)
        conn.execute(sa.insert(self._failed).from_select([*names, "payload"], copied))
        conn.execute(sa.delete(source).where(source.c.id == receipt.row_id))

    def depth(self, queue_name: str) -> int:
        now, t = time.time(), self._ready
        where = (t.c.queue == queue_name, t.c.available_at <= now, self._free(t, now))
        query = sa.select(sa.func.count()).select_from(t).where(*where)
        with self._guard("count", queue_name), self._read() as conn:
            return int(conn.execute(query).scalar_one())

    def dead_letter_depth(self, queue_name: str) -> int:
        """Unreserved dead letters of the queue, summed over the dead-letter tables (a COUNT each)."""
        total = 0
        for t in self._readable():
            query = sa.select(sa.func.count()).select_from(t).where(t.c.queue == queue_name,
                                                                    self._free(t, time.time()))
            with self._guard("count dead letters", queue_name), self._read() as conn:
                total += int(conn.execute(query).scalar_one())
        return total

    def queue_names(self, limit: int = 200) -> list[str]:
        """:func:`.dead_letters.queue_names`."""
        return dead_letters.queue_names(self, limit)

    def dead_letter_bytes_after(self, queue_name: str, cursor: Any, count: int) -> tuple[list[bytes], Any]:
        """:func:`.dead_letters.dead_letter_bytes_after`."""
        return dead_letters.dead_letter_bytes_after(self, queue_name, cursor, count)

    def dead_letters_failed_since(self, queue_name: str, since_ms: int, *,
                                  max_scan: int = 20_000) -> tuple[int, bool]:
        """:func:`.dead_letters.dead_letters_failed_since`."""
        return dead_letters.dead_letters_failed_since(self, queue_name, since_ms, max_scan=max_scan)

    def browse_dead_letters(self, queue_name: str, limit: int = 100) -> list[ReceivedMessage]:
        """The oldest ``limit`` dead letters of the queue, reserved or not, table after table; nothing is
        changed."""
        out: list[ReceivedMessage] = []
        for t in self._readable():
            if len(out) >= limit:
                break
            query = sa.select(*self._columns(t, True)).where(t.c.queue == queue_name).order_by(t.c.id)
            query = query.limit(max(limit - len(out), 0))
            with self._guard("browse dead letters", queue_name), self._read() as conn:
                rows = conn.execute(query).all()
            out += [self._message(row, queue_name, True, None, t.name) for row in rows]
        return out

    def browse_dead_letter_bytes(self, queue_name: str, start: int, stop: int) -> list[bytes]:
        """:func:`.dead_letters.browse_dead_letter_bytes`."""
        return dead_letters.browse_dead_letter_bytes(self, queue_name, start, stop)

    def discard_dead_letters(self, queue_name: str, bodies: Sequence[bytes]) -> int:
        """:func:`.dead_letters.discard_dead_letters`."""
        return dead_letters.discard_dead_letters(self, queue_name, bodies)

    def seen_store(self, name: str) -> SqlSeenStore:
        from .stores import SqlSeenStore

        return SqlSeenStore(self, name)

    def sqlite_file(self) -> Path | None:
        """The SQLite database file the URL names; ``None`` for another database, an in-memory SQLite database
        or a ``file:`` URI (whose open mode only SQLite reads)."""
        url = sa.make_url(self.config.url)
        if (url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:")
                or url.query.get("uri") == "true"):
            return None
        return Path(str(url.database))

    def ping(self) -> None:
        """Run ``SELECT 1``; unlike every other operation it creates neither the queue tables nor a database file.

        Connecting to SQLite creates the file, so for a file that does not exist yet ping only checks that its
        folder exists and is writable (the first publish creates the file there) and connects to nothing.

        :raises BindingError: the database cannot be reached, or the SQLite file is missing and could not be
            created where it is meant to be.
        """
        path = self.sqlite_file()
        if path is not None and not path.exists():
            folder = path.parent
            if not folder.is_dir():
                raise BindingError(f"SQLite file {path} does not exist, nor does its folder {folder}: the first "
                                   "publish could not create it; create the folder or point the connection elsewhere")
            if not os.access(folder, os.W_OK | os.X_OK):
                raise BindingError(f"SQLite file {path} does not exist, and its folder {folder} is not writable by "
                                   "this process: the first publish could not create it")
            return
        with self._guard("reach the database", None), self._get_engine(create_tables=False).connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    def dead_letter_name(self, queue_name: str) -> str:
        return self._failed.name

    def dead_letter_sources(self, queue_name: str) -> list[str]:
        """``<table>_failed``, then the tables of :attr:`SqlConfig.dead_letter_sources` (a queue's dead letters
        are its rows in each: the tables are per connection, not per queue)."""
        return list(self._dead_tables)

    def close(self) -> None:
        """Dispose the engine's pool if this binding created it; an injected engine is left alone."""
        with self._init_lock:
            if self._owns_engine and self._engine is not None:
                self._engine.dispose()
                self._engine = None
                self._tables_ready = not self.config.create_tables
