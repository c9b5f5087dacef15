"""Hook for the SQL table binding (connection type ``babelqueue_sql``): SQLite by default, PostgreSQL too."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote, urlencode

from airflow.sdk import Connection

from ..bindings.base import Binding
from .base import BabelQueueHook, ConnectionConfigError, as_float, as_int, make_config

__all__ = ["BabelQueueSqlHook", "sql_url"]

#: PostgreSQL TLS settings passed to libpq as URL query parameters (ignored for SQLite and ``sqlalchemy_url``).
_TLS_EXTRAS = ("sslmode", "sslrootcert", "sslcert", "sslkey")
_DRIVERS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg2", "postgres": "postgresql+psycopg2"}


def sql_url(connection: Connection, extras: dict[str, Any]) -> str:
    """The SQLAlchemy URL a ``babelqueue_sql`` connection stands for.

    ``sqlalchemy_url`` (any driver) wins. Otherwise ``dialect`` (``sqlite`` by default, or ``postgresql``)
    with the standard fields: for SQLite ``host`` is the database file path (default
    ``$AIRFLOW_HOME/babelqueue.sqlite``); for PostgreSQL host, port, login, password and schema (the
    database name).
    """
    from ..bindings.sql import sqlite_url
    from . import default_sqlite_path

    if "sqlalchemy_url" in extras:
        return str(extras["sqlalchemy_url"])
    dialect = str(extras.get("dialect", "sqlite")).lower()
    if dialect not in _DRIVERS:
        raise ConnectionConfigError(f"extra 'dialect' must be 'sqlite' or 'postgresql', got {dialect!r}")
    if dialect == "sqlite":
        return sqlite_url(connection.host or default_sqlite_path())
    if not connection.host:
        raise ConnectionConfigError("a PostgreSQL babelqueue_sql connection needs a host")
    auth = ""
    if connection.login:
        auth = quote(connection.login, safe="")
        if connection.password:
            auth += ":" + quote(connection.password, safe="")
        auth += "@"
    port = f":{connection.port}" if connection.port else ""
    tls = {key: str(extras[key]) for key in _TLS_EXTRAS if extras.get(key) not in (None, "")}
    query = f"?{urlencode(tls)}" if tls else ""
    return f"{_DRIVERS[dialect]}://{auth}{connection.host}{port}/{connection.schema or 'postgres'}{query}"


class BabelQueueSqlHook(BabelQueueHook):
    """Queues in SQL tables: ``<table>`` for ready messages, ``<table>_failed`` for dead letters.

    The embedded default: with no server at all, the ``babelqueue_default`` connection is a SQLite file in
    ``$AIRFLOW_HOME``. Extras: ``dialect``, ``sqlalchemy_url``, ``table`` (default ``jobs``),
    ``visibility_timeout`` (seconds before an unacked reservation returns to the queue), and for PostgreSQL over
    TLS ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey`` (libpq's names and meanings).
    """

    conn_type: ClassVar[str] = "babelqueue_sql"
    hook_name: ClassVar[str] = "BabelQueue SQL"
    extra_fields: ClassVar[tuple[str, ...]] = ("dialect", "sqlalchemy_url", "table", "visibility_timeout",
                                               "max_message_bytes", *_TLS_EXTRAS)

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.sql import SqlBinding, SqlConfig

        options: dict[str, Any] = {"url": sql_url(connection, extras)}
        if "table" in extras:
            options["table"] = str(extras["table"])
        if "visibility_timeout" in extras:
            options["visibility_timeout"] = as_float(extras["visibility_timeout"], "visibility_timeout")
        if "max_message_bytes" in extras:
            options["max_message_bytes"] = as_int(extras["max_message_bytes"], "max_message_bytes")
        return SqlBinding(make_config(SqlConfig, connection, options))

    def describe(self, connection: Connection) -> str:
        extras = self.extras(connection)
        if "sqlalchemy_url" in extras:
            return str(extras["sqlalchemy_url"]).split("@")[-1]
        if str(extras.get("dialect", "sqlite")).lower() == "sqlite":
            from . import default_sqlite_path

            return f"sqlite file {connection.host or default_sqlite_path()}"
        return f"{connection.host}:{connection.port or 5432}/{connection.schema or 'postgres'}"
