"""Hook for the Azure Service Bus binding (connection type ``babelqueue+servicebus``)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Connection

from ..bindings.base import Binding
from .base import BabelQueueHook, ConnectionConfigError, make_config
from .connection_specs import AZURE_SERVICE_BUS

__all__ = ["BabelQueueAzureServiceBusHook"]


class BabelQueueAzureServiceBusHook(BabelQueueHook):
    """Azure Service Bus queues: the envelope is the message body, with native fields and ``bq-*`` properties.

    Fields: password = a namespace connection string (SAS key or token), or host = the fully qualified
    namespace (``contoso.servicebus.windows.net``) to authenticate with ``DefaultAzureCredential`` (workload or
    managed identity, environment, Azure CLI), which production should prefer. One of the two, not both.
    The extras (native or plain dead-lettering, queue creation and the settings of created queues, receive
    wait, duplicate detection, WebSockets, CA bundle) are declared in
    :data:`~airflow_provider_babelqueue.hooks.connection_specs.AZURE_SERVICE_BUS` and go to the config as they
    are.
    """

    connection_spec = AZURE_SERVICE_BUS

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
            **self.config_options(extras),
        }
        return AzureServiceBusBinding(make_config(AzureServiceBusConfig, connection, options))

    def describe(self, connection: Connection) -> str:
        """The namespace host, never the connection string's key."""
        from ..bindings.azure_service_bus import AzureServiceBusConfig

        if connection.host:
            return f"{connection.host} (DefaultAzureCredential)"
        try:
            return AzureServiceBusConfig(connection_string=connection.password or "-").namespace
        except ValueError:
            return "(no namespace configured)"
