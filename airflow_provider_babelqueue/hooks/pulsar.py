"""Hook for the Apache Pulsar binding (connection type ``babelqueue_pulsar``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar
from urllib.parse import urlsplit

from airflow.sdk import Connection

from ..bindings.base import Binding
from .base import BabelQueueHook, as_bool, as_float, as_int, make_config

__all__ = ["BabelQueuePulsarHook"]


class BabelQueuePulsarHook(BabelQueueHook):
    """Persistent Pulsar topics with the Shared subscription ``babelqueue``; dead letters on ``<queue>.dlq``.

    Fields: host (the broker host, or a whole service URL ``pulsar://…`` / ``pulsar+ssl://…``), port (6650, or
    6651 with ``ssl``), password (a JWT for token authentication, sent to the broker and the admin API).
    Extras: ``ssl`` (``pulsar+ssl``), ``admin_url`` (default ``http://<host>:8080``, ``https://<host>:8443`` with
    ``ssl``), ``tenant`` / ``namespace`` (``public`` / ``default``), ``subscription`` (``babelqueue``),
    ``dead_letter_suffix`` (``.dlq``), ``tls_trust_certs_file_path``, ``tls_validate_hostname`` (true),
    ``tls_allow_insecure_connection``, ``visibility_timeout``, ``redelivery_delay`` (1 s),
    ``receiver_queue_size`` (1), ``max_message_bytes`` (5 MiB), ``create_subscription`` (true) and
    ``operation_timeout_seconds`` (30).

    :param client_factory: passed to the binding in place of ``pulsar.Client`` (a test seam; see
        :class:`~airflow_provider_babelqueue.bindings.pulsar.PulsarBinding`).
    """

    conn_type: ClassVar[str] = "babelqueue_pulsar"
    hook_name: ClassVar[str] = "BabelQueue Apache Pulsar"
    extra_fields: ClassVar[tuple[str, ...]] = (
        "ssl",
        "admin_url",
        "tenant",
        "namespace",
        "subscription",
        "dead_letter_suffix",
        "tls_trust_certs_file_path",
        "tls_validate_hostname",
        "tls_allow_insecure_connection",
        "visibility_timeout",
        "redelivery_delay",
        "receiver_queue_size",
        "max_message_bytes",
        "create_subscription",
        "operation_timeout_seconds",
    )

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
        tls = as_bool(extras.get("ssl", False), "ssl")
        host = connection.host or "127.0.0.1"
        if "://" in host:  # a whole service URL: its scheme says whether TLS is on
            service_url, tls = host, host.startswith("pulsar+ssl://")
            host = urlsplit(host).hostname or "127.0.0.1"
        else:
            service_url = f"{'pulsar+ssl' if tls else 'pulsar'}://{host}:{connection.port or (6651 if tls else 6650)}"
        admin_url = str(extras.get("admin_url") or f"{'https' if tls else 'http'}://{host}:{8443 if tls else 8080}")
        return service_url, admin_url

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.pulsar import PulsarBinding, PulsarConfig

        service_url, admin_url = self.urls(connection, extras)
        options: dict[str, Any] = {"service_url": service_url, "admin_url": admin_url}
        options["token"] = connection.password or None
        for name in ("tenant", "namespace", "subscription", "dead_letter_suffix", "tls_trust_certs_file_path"):
            if name in extras:
                options[name] = str(extras[name])
        for name in ("tls_validate_hostname", "tls_allow_insecure_connection", "create_subscription"):
            if name in extras:
                options[name] = as_bool(extras[name], name)
        for name in ("visibility_timeout", "redelivery_delay"):
            if name in extras:
                options[name] = as_float(extras[name], name)
        for name in ("receiver_queue_size", "max_message_bytes", "operation_timeout_seconds"):
            if name in extras:
                options[name] = as_int(extras[name], name)
        config = make_config(PulsarConfig, connection, options)
        return PulsarBinding(config, client_factory=self.client_factory)

    def describe(self, connection: Connection) -> str:
        service_url, admin_url = self.urls(connection, self.extras(connection))
        return f"{service_url} (admin {admin_url})"
