"""Hooks, one per binding, and the resolver that maps any ``babelqueue_conn_id`` to the right one.

Operators, sensors and triggers call :func:`get_hook` and then use the binding protocol; they never
branch on the broker.

Importing this package is cheap (no Airflow, no binding): the provider info reads the connection declarations
below it while Airflow loads its configuration.

Connection types are named ``babelqueue+<broker>``. Connections saved with the earlier names
(``babelqueue_<broker>``, which Airflow warns about whenever it renders them as a URI) resolve to the same hooks;
Airflow's UI lists only the current names.
"""

from __future__ import annotations

import logging
import os
from importlib import import_module
from typing import TYPE_CHECKING

from .connection_specs import CONNECTION_SPECS

if TYPE_CHECKING:
    from pathlib import Path

    from .base import BabelQueueHook

__all__ = ["DEFAULT_CONN_ID", "FORMER_CONN_TYPES", "HOOK_CLASSES", "current_conn_type", "default_sqlite_path",
           "get_hook", "remote_executors"]

DEFAULT_CONN_ID = "babelqueue_default"

#: connection type → hook class path, from the declarations in :mod:`.connection_specs` (current names only: the
#: ones registered with Airflow).
HOOK_CLASSES = {spec.conn_type: spec.hook_class for spec in CONNECTION_SPECS}

#: former connection type → its current name (``babelqueue_redis`` → ``babelqueue+redis``).
FORMER_CONN_TYPES = {former: spec.conn_type for spec in CONNECTION_SPECS for former in spec.former_conn_types}

logger = logging.getLogger(__name__)
_noted: set[tuple[str, str]] = set()


def current_conn_type(conn_type: str | None) -> str | None:
    """The current name of a BabelQueue connection type, given the current or a former one; ``None`` for a type
    that is not BabelQueue's."""
    if conn_type in HOOK_CLASSES:
        return conn_type
    return FORMER_CONN_TYPES.get(conn_type or "")


def default_sqlite_path() -> Path:
    """The embedded default queue database: ``$AIRFLOW_HOME/babelqueue.sqlite``."""
    from pathlib import Path

    return Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "babelqueue.sqlite"


_LOCAL_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})
_spread_warned = False


def remote_executors(setting: str) -> list[str]:
    """The executors of an ``[core] executor`` setting that run tasks on other machines than the scheduler's:
    every one but the local ones (``LocalExecutor``, also given by module path or behind an alias)."""
    names = [item.strip() for item in setting.split(",") if item.strip()]
    return [name for name in names if name.rpartition(":")[2].rpartition(".")[2] not in _LOCAL_EXECUTORS]


def _warn_if_workers_spread() -> None:
    """Warn once per process when the embedded default is used under an executor whose workers may be on
    several machines: each has its own SQLite file, so a message published on one is never seen on another."""
    global _spread_warned
    if _spread_warned:
        return
    _spread_warned = True
    from airflow.sdk import conf

    try:
        remote = remote_executors(str(conf.get("core", "executor", fallback="") or ""))
    except Exception:  # an unreadable setting must not stop a task; the warning is advice
        return
    if remote:
        logger.warning(
            "babelqueue_default is not defined, so it is the embedded SQLite queue at %s on this machine. The "
            "executor %s runs tasks on several machines, each with its own file: a message published on one is "
            "never seen on another. Define babelqueue_default (or the connection your DAGs name) as a PostgreSQL "
            "or Redis connection every worker reaches.", default_sqlite_path(), ", ".join(remote),
        )


def _hook_class(conn_type: str) -> type[BabelQueueHook]:
    module, _, name = HOOK_CLASSES[conn_type].rpartition(".")
    return getattr(import_module(module), name)


def get_hook(babelqueue_conn_id: str = DEFAULT_CONN_ID) -> BabelQueueHook:
    """The hook for a connection id, chosen by the connection's type.

    The id ``babelqueue_default`` works with no connection defined: it is the embedded SQLite queue at
    :func:`default_sqlite_path`. Any other id must exist and have one of the BabelQueue types.

    The connection's type may be a current name or a former one (:data:`FORMER_CONN_TYPES`): connections saved
    before the rename keep working, and are noted once per process in the log at INFO.

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

        from .connection_specs import SQL

        connection = Connection(conn_id=DEFAULT_CONN_ID, conn_type=SQL.conn_type)
        _warn_if_workers_spread()
    conn_type = current_conn_type(connection.conn_type)
    if conn_type is None:
        raise BindingError(
            f"connection {babelqueue_conn_id!r} has type {connection.conn_type!r}; a BabelQueue connection must "
            f"have one of the types {', '.join(sorted(HOOK_CLASSES))}"
        )
    if conn_type != connection.conn_type and (babelqueue_conn_id, conn_type) not in _noted:
        _noted.add((babelqueue_conn_id, conn_type))
        logger.info("Connection %r has the former type name %r, still accepted; its current name is %r",
                    babelqueue_conn_id, connection.conn_type, conn_type)
    return _hook_class(conn_type)(babelqueue_conn_id, connection=connection)
