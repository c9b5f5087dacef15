"""The SQL binding's tables: the spec's layout of ``<table>`` and ``<table>_failed``, and how they are created.

The columns are the ones other SDKs on the same database read and write (see :mod:`.binding`); what goes into a
derived text column is made storable here (:func:`column_text`), so a handler's error text can never stop a dead
letter's INSERT.
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ...core import envelope as bq

__all__ = ["build_tables", "column_text", "create_tables_racing", "dead_letter_table"]


def column_text(text: str | None) -> str | None:
    """A derived text column's value: NUL removed (PostgreSQL's ``text`` refuses it) and lone surrogates made
    U+FFFD (no driver encodes them), so what a handler's error says can never stop a dead letter's INSERT."""
    if text is None:
        return None
    text = bq.storable_text(text) or ""
    return text.replace("\x00", "") if "\x00" in text else text


def dead_letter_table(name: str, metadata: sa.MetaData) -> sa.Table:
    """A dead-letter table's description (``<table>_failed``'s layout) under ``name``."""
    row_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    return sa.Table(
        name, metadata,
        sa.Column("id", row_id, primary_key=True, autoincrement=True),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("urn", sa.Text(), nullable=True),
        # 64-bit: the contract's attempts go up to 2**63 - 1 (an older table's INTEGER column is clamped on
        # write, see SqlBinding._attempts_column_max)
        sa.Column("attempts", sa.BigInteger(), nullable=False, default=0),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("exception", sa.Text(), nullable=True),
        sa.Column("failed_at", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("reserved_at", sa.Double(), nullable=True),
        sa.Index(f"{name}_queue_idx", "queue", "id"),
        sqlite_autoincrement=True,
    )


def build_tables(name: str) -> tuple[sa.Table, sa.Table]:
    metadata = sa.MetaData()
    row_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER only
    ready = sa.Table(
        name, metadata,
        sa.Column("id", row_id, primary_key=True, autoincrement=True),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, default=0),
        sa.Column("reserved_at", sa.Double(), nullable=True),
        sa.Column("available_at", sa.Double(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        # (queue, available_at, id) serves the reserve query's ORDER BY available_at, id straight from the
        # index; without id, a batch (one shared available_at) is re-sorted on every reserve.
        sa.Index(f"{name}_queue_idx", "queue", "available_at", "id"),
        sqlite_autoincrement=True,  # never reuse ids: a stale receipt must not match a newer row
    )
    failed = dead_letter_table(f"{name}_failed", metadata)
    return ready, failed


def create_tables_racing(metadata: sa.MetaData, engine: Engine, attempts: int = 5) -> None:
    """``CREATE TABLE IF NOT EXISTS`` for every table of ``metadata``, tolerating other processes creating the
    same tables at the same time: a lost race (PostgreSQL: IntegrityError or ProgrammingError; SQLite:
    OperationalError "already exists") is checked again, table by table, a few times."""
    for attempt in range(attempts):
        try:
            metadata.create_all(engine, checkfirst=True)
            return
        except sa.exc.DatabaseError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.01 * (attempt + 1))
