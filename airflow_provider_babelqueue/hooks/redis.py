"""Hook for the Redis binding (connection type ``babelqueue+redis``)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Connection

from ..bindings.base import Binding
from ..bindings.redaction import redact
from .base import BabelQueueHook, make_config
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
        if connection.login:
            options["username"] = connection.login
        if connection.password:
            options["password"] = connection.password
        options.update(self.config_options(extras))
        if "dead_letter_sources" in extras:  # a JSON list or comma text, as it is: the config splits and checks it
            options["dead_letter_sources"] = extras["dead_letter_sources"]
        return RedisBinding(make_config(RedisConfig, connection, options))

    def describe(self, connection: Connection) -> str:
        return f"{redact(connection.host or '127.0.0.1')}:{connection.port or 6379}"
