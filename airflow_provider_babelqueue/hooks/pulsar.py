"""Hook for the Apache Pulsar binding (connection type ``babelqueue+pulsar``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import Connection

from ..bindings.base import Binding
from ..bindings.redaction import redact_url
from .base import BabelQueueHook, make_config, read_extras
from .connection_specs import PULSAR

__all__ = ["BabelQueuePulsarHook"]


class BabelQueuePulsarHook(BabelQueueHook):
    """Persistent Pulsar topics with the Shared subscription ``babelqueue``; dead letters on ``<queue>.dlq``.

    Fields: host (the broker host, or a whole service URL ``pulsar://…`` / ``pulsar+ssl://…``), port (6650, or
    6651 with ``ssl``), password (a JWT for token authentication, sent to the broker and the admin API).
    The extras are declared in :data:`~airflow_provider_babelqueue.hooks.connection_specs.PULSAR`; ``ssl`` and
    ``admin_url`` make the URLs (:meth:`urls`), the others go to the config as they are.

    :param client_factory: passed to the binding in place of ``pulsar.Client`` (a test seam; see
        :class:`~airflow_provider_babelqueue.bindings.pulsar.PulsarBinding`).
    """

    connection_spec = PULSAR

    def __init__(
        self,
        babelqueue_conn_id: str = BabelQueueHook.default_conn_name,
        *,
        connection: Connection | None = None,
        client_factory: Callable[..., Any] | None = None,
    ) -> None:
        super().__init__(babelqueue_conn_id, connection=connection)
        self.client_factory = client_factory

    def urls(self, connection: Connection, extras: dict[str, Any]) -> tuple[str, str]:
        """``(service_url, admin_url)`` from the host, port and the ``ssl`` / ``admin_url`` extras."""
        values = read_extras(PULSAR.extras, extras)
        tls: bool = values.get("ssl", False)
        host = connection.host or "127.0.0.1"
        if "://" in host:  # a whole service URL: its scheme says whether TLS is on
            service_url, tls = host, host.startswith("pulsar+ssl://")
            host = urlsplit(host).hostname or "127.0.0.1"
        else:
            service_url = f"{'pulsar+ssl' if tls else 'pulsar'}://{host}:{connection.port or (6651 if tls else 6650)}"
        admin_url = values.get("admin_url") or f"{'https' if tls else 'http'}://{host}:{8443 if tls else 8080}"
        return service_url, admin_url

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.pulsar import PulsarBinding, PulsarConfig

        service_url, admin_url = self.urls(connection, extras)
        options: dict[str, Any] = {"service_url": service_url, "admin_url": admin_url,
                                   "token": connection.password or None, **self.config_options(extras)}
        return PulsarBinding(make_config(PulsarConfig, connection, options), client_factory=self.client_factory)

    def describe(self, connection: Connection) -> str:
        service_url, admin_url = self.urls(connection, self.extras(connection))
        return f"{redact_url(service_url)} (admin {redact_url(admin_url)})"
