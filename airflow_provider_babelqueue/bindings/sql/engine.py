"""How the SQL binding connects: the engine, a pooled connection's ping when it sat idle, SQLite's journal mode.

Kept apart from the binding, which is about the queue's tables and statements.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ..base import MissingExtraError

__all__ = ["create_engine", "mark_returned", "ping_if_idle", "sqlite_wal"]


#: A pooled connection returned this recently is handed out again without a ping (see :func:`ping_if_idle`).
_FRESH_SECONDS = 1.0


def mark_returned(_dbapi_connection: Any, record: Any) -> None:
    """Pool ``checkin``: when the connection came back (it had just worked, or the pool would have dropped it)."""
    if record is not None:
        record.info["babelqueue_returned"] = time.monotonic()


def ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """Pool ``checkout``: ping a connection that sat in the pool over :data:`_FRESH_SECONDS`, and have the pool
    replace it (``DisconnectionError``: a new connection is made and checked out instead) when the ping fails. A
    database restart or an idle timeout on the way then costs no failed operation, while a consumer that takes the
    connection back at once for its next batch pays no round trip for it (SQLAlchemy's ``pool_pre_ping`` pings at
    every checkout: a quarter of a batch's round trips)."""
    returned = record.info.get("babelqueue_returned")
    if returned is not None and time.monotonic() - returned < _FRESH_SECONDS:
        return
    try:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT 1")
        finally:
            cursor.close()
        # the driver opened a transaction for the ping: end it, so the connection is handed out idle, as the pool
        # had it (a connection about to be switched to autocommit must not be inside a transaction)
        dbapi_connection.rollback()
    except Exception as exc:  # noqa: BLE001 - any failure means: not usable, get another
        raise sa.exc.DisconnectionError(f"the pooled connection failed its ping: {exc}") from exc


def create_engine(url: sa.URL, options: dict[str, Any]) -> Engine:
    """``sa.create_engine``, where a missing driver module names what installs it.

    SQLAlchemy imports the URL's driver (DBAPI) module here; without it the error would be a bare
    ``ModuleNotFoundError: No module named 'psycopg2'``. PostgreSQL's default driver comes with the ``postgres``
    extra; another driver named in a ``sqlalchemy_url`` is the user's to install, so its module is named.

    :raises MissingExtraError: the driver module is not installed (also an ``ImportError``).
    """
    try:
        return sa.create_engine(url, **options)
    except ImportError as exc:
        dialect = f"{url.get_backend_name()}+{url.get_driver_name()}"
        module = exc.name or url.get_driver_name()
        if dialect == "postgresql+psycopg2":
            hint = "install it with: pip install 'airflow-provider-babelqueue[postgres]'"
        elif url.get_backend_name() == "postgresql":
            hint = ("install the package that provides it, or write the URL as postgresql+psycopg2://... and "
                    "install that driver with: pip install 'airflow-provider-babelqueue[postgres]'")
        else:
            hint = f"install the package that provides it, or use another driver in the URL ({dialect!r} now)"
        raise MissingExtraError(f"{module} is not installed, and the SQL binding needs it for {dialect} URLs; "
                                f"{hint}") from exc


def sqlite_wal(dbapi_connection: Any, _record: Any) -> None:
    """Write-ahead logging for a SQLite file: one sync per commit instead of the rollback journal's
    several, and readers (depth, browse) no longer wait for a consumer's write lock. ``synchronous``
    stays FULL, so a committed publish or ack survives a power cut. The mode is stored in the file."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()
