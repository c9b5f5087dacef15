"""Hook for the Redis binding (connection type ``babelqueue+redis``)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Connection

from ..bindings.base import Binding
from ..bindings.redaction import redact
from .base import BabelQueueHook, login_options, make_config
from .connection_specs import REDIS

__all__ = ["BabelQueueRedisHook"]


class BabelQueueRedisHook(BabelQueueHook):
    """Redis lists in the cross-SDK layout (ready list = the queue name, ``<queue>:processing``, DLQ list).

    Fields: host, port (6379), login (ACL user), password. The extras (database number, TLS, key prefix, DLQ
    suffix and the DLQ lists reads take, header frames, visibility timeout, size limit) are declared in
    :data:`~airflow_provider_babelqueue.hooks.connection_specs.REDIS` and go to the config as they are
    (``dead_letter_sources`` unconverted: the config takes a JSON list or comma text).
    """

    connection_spec = REDIS

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.redis import RedisBinding, RedisConfig

        options: dict[str, Any] = {"host": connection.host or "127.0.0.1", "port": int(connection.port or 6379)}
        options |= login_options(connection) | self.config_options(extras)
        return RedisBinding(make_config(RedisConfig, connection, options))

    def describe(self, connection: Connection) -> str:
        return f"{redact(connection.host or '127.0.0.1')}:{connection.port or 6379}"
