"""Hook for the Azure Service Bus binding (connection type ``babelqueue_azure_service_bus``)."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.sdk import Connection

from ..bindings.base import Binding
from .base import BabelQueueHook, ConnectionConfigError, as_bool, as_float, as_int, make_config

__all__ = ["BabelQueueAzureServiceBusHook"]


class BabelQueueAzureServiceBusHook(BabelQueueHook):
    """Azure Service Bus queues: the envelope is the message body, with native fields and ``bq-*`` properties.

    Fields: password = a namespace connection string (SAS key or token), or host = the fully qualified
    namespace (``contoso.servicebus.windows.net``) to authenticate with ``DefaultAzureCredential`` (workload or
    managed identity, environment, Azure CLI), which production should prefer. One of the two, not both.
    Extras: ``native_dead_letter`` (true), ``dead_letter_queue_suffix`` (a plain DLQ read too, ``.dlq`` for the
    SDKs' apps), ``create_queues`` (false), ``lock_duration`` and ``max_delivery_count`` (for created queues),
    ``min_receive_wait`` (0.2), ``duplicate_detection`` (the queues drop repeated MessageIds: retries get their
    own), ``use_websockets`` and ``connection_verify`` (a CA bundle path).
    """

    conn_type: ClassVar[str] = "babelqueue_azure_service_bus"
    hook_name: ClassVar[str] = "BabelQueue Azure Service Bus"
    extra_fields: ClassVar[tuple[str, ...]] = (
        "native_dead_letter",
        "dead_letter_queue_suffix",
        "create_queues",
        "lock_duration",
        "max_delivery_count",
        "min_receive_wait",
        "duplicate_detection",
        "use_websockets",
        "connection_verify",
    )

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.azure_service_bus import AzureServiceBusBinding, AzureServiceBusConfig

        if bool(connection.password) == bool(connection.host):
            raise ConnectionConfigError(
                "set the password to a connection string, or the host to the fully qualified namespace "
                "(authenticated with DefaultAzureCredential); exactly one of them"
            )
        options: dict[str, Any] = {
            "connection_string": connection.password or None,
            "fully_qualified_namespace": connection.host or None,
        }
        for name in ("dead_letter_queue_suffix", "connection_verify"):
            if name in extras:
                options[name] = str(extras[name])
        for name in ("native_dead_letter", "create_queues", "duplicate_detection", "use_websockets"):
            if name in extras:
                options[name] = as_bool(extras[name], name)
        for name in ("lock_duration", "min_receive_wait"):
            if name in extras:
                options[name] = as_float(extras[name], name)
        if "max_delivery_count" in extras:
            options["max_delivery_count"] = as_int(extras["max_delivery_count"], "max_delivery_count")
        config = make_config(AzureServiceBusConfig, connection, options)
        return AzureServiceBusBinding(config)

    def describe(self, connection: Connection) -> str:
        """The namespace host, never the connection string's key."""
        from ..bindings.azure_service_bus import AzureServiceBusConfig

        if connection.host:
            return f"{connection.host} (DefaultAzureCredential)"
        try:
            return AzureServiceBusConfig(connection_string=connection.password or "-").namespace
        except ValueError:
            return "(no namespace configured)"
