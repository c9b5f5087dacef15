"""Hook for the Redis binding (connection type ``babelqueue_redis``)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Connection

from ..bindings.base import Binding
from .base import BabelQueueHook, make_config
from .connection_specs import REDIS

__all__ = ["BabelQueueRedisHook"]


class BabelQueueRedisHook(BabelQueueHook):
    """Redis lists in the cross-SDK layout (ready list = the queue name, ``<queue>:processing``, DLQ list).

    Fields: host, port (6379), login (ACL user), password. The extras (database number, TLS, key prefix, DLQ
    suffix, visibility timeout, size limit) are declared in
    :data:`~airflow_provider_babelqueue.hooks.connection_specs.REDIS` and go to the config as they are.
    """

    connection_spec = REDIS

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.redis import RedisBinding, RedisConfig

        options: dict[str, Any] = {"host": connection.host or "127.0.0.1", "port": int(connection.port or 6379)}
        if connection.login:
            options["username"] = connection.login
        if connection.password:
            options["password"] = connection.password
        options.update(self.config_options(extras))
        return RedisBinding(make_config(RedisConfig, connection, options))

    def describe(self, connection: Connection) -> str:
        return f"{connection.host or '127.0.0.1'}:{connection.port or 6379}"
