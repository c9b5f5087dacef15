"""Hook for the Redis binding (connection type ``babelqueue_redis``)."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.sdk import Connection

from ..bindings.base import Binding
from .base import BabelQueueHook, ConnectionConfigError, as_bool, as_float, as_int, make_config

__all__ = ["BabelQueueRedisHook"]


class BabelQueueRedisHook(BabelQueueHook):
    """Redis lists in the cross-SDK layout (ready list = the queue name, ``<queue>:processing``, DLQ list).

    Fields: host, port (6379), login (ACL user), password. Extras: ``db`` (number), ``ssl`` (TLS, the
    ``rediss`` scheme), ``ssl_ca_certs`` (CA bundle path), ``key_prefix``, ``dead_letter_suffix``
    (``:failed`` by default; ``.dlq`` for the official SDKs' apps), ``visibility_timeout`` (seconds).
    """

    conn_type: ClassVar[str] = "babelqueue_redis"
    hook_name: ClassVar[str] = "BabelQueue Redis"
    extra_fields: ClassVar[tuple[str, ...]] = (
        "db",
        "ssl",
        "ssl_ca_certs",
        "key_prefix",
        "dead_letter_suffix",
        "visibility_timeout",
        "max_message_bytes",
    )

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.redis import RedisBinding, RedisConfig

        options: dict[str, Any] = {"host": connection.host or "127.0.0.1", "port": int(connection.port or 6379)}
        if connection.login:
            options["username"] = connection.login
        if connection.password:
            options["password"] = connection.password
        if "db" in extras:
            try:
                options["db"] = int(extras["db"])
            except (TypeError, ValueError):
                raise ConnectionConfigError(f"extra 'db' must be a database number, got {extras['db']!r}") from None
        if "ssl" in extras:
            options["ssl"] = as_bool(extras["ssl"], "ssl")
        for name in ("ssl_ca_certs", "key_prefix", "dead_letter_suffix"):
            if name in extras:
                options[name] = str(extras[name])
        if "visibility_timeout" in extras:
            options["visibility_timeout"] = as_float(extras["visibility_timeout"], "visibility_timeout")
        if "max_message_bytes" in extras:
            options["max_message_bytes"] = as_int(extras["max_message_bytes"], "max_message_bytes")
        return RedisBinding(make_config(RedisConfig, connection, options))

    def describe(self, connection: Connection) -> str:
        return f"{connection.host or '127.0.0.1'}:{connection.port or 6379}"
