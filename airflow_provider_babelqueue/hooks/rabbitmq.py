"""Hook for the RabbitMQ binding (connection type ``babelqueue+rabbitmq``)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Connection

from ..bindings.base import Binding
from ..bindings.redaction import redact
from .base import BabelQueueHook, login_options, make_config
from .connection_specs import RABBITMQ

__all__ = ["BabelQueueRabbitMQHook"]


class BabelQueueRabbitMQHook(BabelQueueHook):
    """Durable RabbitMQ queues on the default exchange, in the official SDKs' layout (DLQ ``<queue>.failed``).

    Fields: host, port (5672), schema (the virtual host, ``/`` when empty), login, password. The extras (TLS,
    DLQ suffix and the DLQs reads take, passive declares, publisher confirms, heartbeat, size limit) are declared in
    :data:`~airflow_provider_babelqueue.hooks.connection_specs.RABBITMQ` and go to the config as they are.
    """

    connection_spec = RABBITMQ

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.rabbitmq import RabbitMQBinding, RabbitMQConfig

        options: dict[str, Any] = {
            "host": connection.host or "127.0.0.1",
            "port": int(connection.port or 5672),
            "virtual_host": connection.schema or "/",
        }
        options |= login_options(connection) | self.config_options(extras)
        return RabbitMQBinding(make_config(RabbitMQConfig, connection, options))

    def describe(self, connection: Connection) -> str:
        return f"{redact(connection.host or '127.0.0.1')}:{connection.port or 5672}"
