"""Hooks, one per binding, and the resolver that maps any ``babelqueue_conn_id`` to the right one.

Operators, sensors and triggers call :func:`get_hook` and then use the binding protocol; they never
branch on the broker.
"""

from __future__ import annotations

import os
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from ..bindings.base import BindingError

if TYPE_CHECKING:
    from .base import BabelQueueHook

__all__ = ["DEFAULT_CONN_ID", "HOOK_CLASSES", "default_sqlite_path", "get_hook"]

DEFAULT_CONN_ID = "babelqueue_default"

#: connection type → hook class path. Bindings add themselves here as they land.
HOOK_CLASSES = {
    "babelqueue_sql": "airflow_provider_babelqueue.hooks.sql.BabelQueueSqlHook",
    "babelqueue_redis": "airflow_provider_babelqueue.hooks.redis.BabelQueueRedisHook",
    "babelqueue_rabbitmq": "airflow_provider_babelqueue.hooks.rabbitmq.BabelQueueRabbitMQHook",
    "babelqueue_sqs": "airflow_provider_babelqueue.hooks.sqs.BabelQueueSqsHook",
    "babelqueue_azure_service_bus": "airflow_provider_babelqueue.hooks.azure_service_bus.BabelQueueAzureServiceBusHook",
    "babelqueue_pulsar": "airflow_provider_babelqueue.hooks.pulsar.BabelQueuePulsarHook",
}


def default_sqlite_path() -> Path:
    """The embedded default queue database: ``$AIRFLOW_HOME/babelqueue.sqlite``."""
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
