"""Hook for the RabbitMQ binding (connection type ``babelqueue_rabbitmq``)."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.sdk import Connection

from ..bindings.base import Binding
from .base import BabelQueueHook, ConnectionConfigError, as_bool, as_float, as_int, make_config

__all__ = ["BabelQueueRabbitMQHook"]


class BabelQueueRabbitMQHook(BabelQueueHook):
    """Durable RabbitMQ queues on the default exchange, in the official SDKs' layout (DLQ ``<queue>.failed``).

    Fields: host, port (5672), schema (the virtual host, ``/`` when empty), login, password. Extras:
    ``ssl`` (AMQPS), ``ssl_ca_certs`` (CA bundle path), ``dead_letter_suffix`` (``.failed``; ``.dlq`` for the
    official SDKs' apps), ``declare_queues`` (false: use queues an operator declared, passive declares only),
    ``publisher_confirms`` (true), ``heartbeat`` (seconds; 0 turns heartbeats off).
    """

    conn_type: ClassVar[str] = "babelqueue_rabbitmq"
    hook_name: ClassVar[str] = "BabelQueue RabbitMQ"
    extra_fields: ClassVar[tuple[str, ...]] = (
        "ssl",
        "ssl_ca_certs",
        "dead_letter_suffix",
        "declare_queues",
        "publisher_confirms",
        "heartbeat",
        "max_message_bytes",
    )

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.rabbitmq import RabbitMQBinding, RabbitMQConfig

        options: dict[str, Any] = {
            "host": connection.host or "127.0.0.1",
            "port": int(connection.port or 5672),
            "virtual_host": connection.schema or "/",
        }
        if connection.login:
            options["username"] = connection.login
        if connection.password:
            options["password"] = connection.password
        for name in ("ssl", "declare_queues", "publisher_confirms"):
            if name in extras:
                options[name] = as_bool(extras[name], name)
        for name in ("ssl_ca_certs", "dead_letter_suffix"):
            if name in extras:
                options[name] = str(extras[name])
        if "heartbeat" in extras:
            heartbeat = as_float(extras["heartbeat"], "heartbeat")
            if heartbeat != int(heartbeat):
                raise ConnectionConfigError(f"extra 'heartbeat' must be whole seconds, got {extras['heartbeat']!r}")
            options["heartbeat"] = int(heartbeat)
        if "max_message_bytes" in extras:
            options["max_message_bytes"] = as_int(extras["max_message_bytes"], "max_message_bytes")
        config = make_config(RabbitMQConfig, connection, options)
        return RabbitMQBinding(config)

    def describe(self, connection: Connection) -> str:
        return f"{connection.host or '127.0.0.1'}:{connection.port or 5672}"
