"""Hook for the SQL table binding (connection type ``babelqueue+sql``): SQLite by default, PostgreSQL too."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from airflow.sdk import Connection

from ..bindings.base import Binding
from ..bindings.redaction import redact
from .base import BabelQueueHook, ConnectionConfigError, make_config, read_extras
from .connection_specs import SQL

__all__ = ["BabelQueueSqlHook", "sql_url"]

#: PostgreSQL TLS settings passed to libpq as URL query parameters (ignored for SQLite and ``sqlalchemy_url``).
_TLS_EXTRAS = ("sslmode", "sslrootcert", "sslcert", "sslkey")


def sql_url(connection: Connection, extras: dict[str, Any]) -> str:
    """The SQLAlchemy URL a ``babelqueue+sql`` connection stands for.

    ``sqlalchemy_url`` (any driver) wins. Otherwise ``dialect`` (``sqlite`` by default, or ``postgresql``)
    with the standard fields: for SQLite ``host`` is the database file path (default
    ``$AIRFLOW_HOME/babelqueue.sqlite``); for PostgreSQL host, port, login, password and schema (the
    database name).

    :param extras: the allowlisted extras, raw or converted (they are converted here either way).
    """
    from ..bindings.sql import sqlite_url
    from . import default_sqlite_path

    values = read_extras(SQL.extras, extras)
    if "sqlalchemy_url" in values:
        return values["sqlalchemy_url"]
    if values.get("dialect", "sqlite") == "sqlite":
        return sqlite_url(connection.host or default_sqlite_path())
    if not connection.host:
        raise ConnectionConfigError("a PostgreSQL babelqueue+sql connection needs a host")
    auth = ""
    if connection.login:
        auth = quote(connection.login, safe="")
        if connection.password:
            auth += ":" + quote(connection.password, safe="")
        auth += "@"
    port = f":{connection.port}" if connection.port else ""
    tls = {key: values[key] for key in _TLS_EXTRAS if key in values}
    query = f"?{urlencode(tls)}" if tls else ""
    return f"postgresql+psycopg2://{auth}{connection.host}{port}/{connection.schema or 'postgres'}{query}"


class BabelQueueSqlHook(BabelQueueHook):
    """Queues in SQL tables: ``<table>`` for ready messages, ``<table>_failed`` for dead letters.

    The embedded default: with no server at all, the ``babelqueue_default`` connection is a SQLite file in
    ``$AIRFLOW_HOME``. The extras are declared in :data:`~airflow_provider_babelqueue.hooks.connection_specs.SQL`:
    ``dialect``, ``sqlalchemy_url`` and the PostgreSQL TLS settings (libpq's names and meanings) make the URL
    (:func:`sql_url`), the others go to the config as they are (``dead_letter_sources`` unconverted: the config
    takes a JSON list or comma text of further dead-letter tables).
    """

    reads_fleet_dead_letter_sources = False

    connection_spec = SQL

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.sql import SqlBinding, SqlConfig

        options: dict[str, Any] = {"url": sql_url(connection, extras), **self.config_options(extras)}
        return SqlBinding(make_config(SqlConfig, connection, options))

    def reached(self, connection: Connection, binding: Binding) -> str:
        """As the base says, except for a SQLite file that does not exist yet: ``ping`` checked that its folder
        can hold it and created nothing (opening SQLite creates the file), so the message says the file is
        still to come."""
        from ..bindings.sql import SqlBinding

        path = binding.sqlite_file() if isinstance(binding, SqlBinding) else None
        if path is not None and not path.exists():
            return (f"SQLite file {path} does not exist yet: the first use (a publish, a read) creates it, and its "
                    "folder exists and is writable. This test created nothing")
        return super().reached(connection, binding)

    def describe(self, connection: Connection) -> str:
        """Where the database is: the URL without its userinfo (user and password) and with secret query
        parameters (libpq's ``?password=``) redacted; host, port, database and the other parameters stay."""
        extras = read_extras(SQL.extras, self.extras(connection))
        if "sqlalchemy_url" in extras:
            from ..bindings.sql import SqlConfig

            try:  # SQLAlchemy's parse first: it places a password holding '/' or '?' where urlsplit would not
                parts = urlsplit(SqlConfig(url=str(extras["sqlalchemy_url"])).safe_url)
            except ValueError:
                return "(an unparsable sqlalchemy_url)"
            return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        if extras.get("dialect", "sqlite") == "sqlite":
            from . import default_sqlite_path

            return f"sqlite file {connection.host or default_sqlite_path()}"
        return f"{redact(connection.host or '')}:{connection.port or 5432}/{connection.schema or 'postgres'}"
