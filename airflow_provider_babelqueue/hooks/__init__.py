"""Hooks, one per binding, and the resolver that maps any ``babelqueue_conn_id`` to the right one.

Operators, sensors and triggers call :func:`get_hook` and then use the binding protocol; they never
branch on the broker.

Importing this package is cheap (no Airflow, no binding): the provider info reads the connection declarations
below it while Airflow loads its configuration.
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import TYPE_CHECKING

from .connection_specs import CONNECTION_SPECS

if TYPE_CHECKING:
    from pathlib import Path

    from .base import BabelQueueHook

__all__ = ["DEFAULT_CONN_ID", "HOOK_CLASSES", "default_sqlite_path", "get_hook"]

DEFAULT_CONN_ID = "babelqueue_default"

#: connection type → hook class path, from the declarations in :mod:`.connection_specs`.
HOOK_CLASSES = {spec.conn_type: spec.hook_class for spec in CONNECTION_SPECS}


def default_sqlite_path() -> Path:
    """The embedded default queue database: ``$AIRFLOW_HOME/babelqueue.sqlite``."""
    from pathlib import Path

    return Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "babelqueue.sqlite"


def _hook_class(conn_type: str) -> type[BabelQueueHook]:
    module, _, name = HOOK_CLASSES[conn_type].rpartition(".")
    return getattr(import_module(module), name)


def get_hook(babelqueue_conn_id: str = DEFAULT_CONN_ID) -> BabelQueueHook:
    """The hook for a connection id, chosen by the connection's type.

    The id ``babelqueue_default`` works with no connection defined: it is the embedded SQLite queue at
    :func:`default_sqlite_path`. Any other id must exist and have one of the BabelQueue types.

    :raises BindingError: for a connection of another type, naming the types that would work.
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from ..core.errors import BindingError

    try:
        connection = BaseHook.get_connection(babelqueue_conn_id)
    except AirflowNotFoundException:
        if babelqueue_conn_id != DEFAULT_CONN_ID:
            raise
        from airflow.sdk import Connection

        connection = Connection(conn_id=DEFAULT_CONN_ID, conn_type="babelqueue_sql")
    if connection.conn_type not in HOOK_CLASSES:
        raise BindingError(
            f"connection {babelqueue_conn_id!r} has type {connection.conn_type!r}; a BabelQueue connection must "
            f"have one of the types {', '.join(sorted(HOOK_CLASSES))}"
        )
    return _hook_class(connection.conn_type)(babelqueue_conn_id, connection=connection)
