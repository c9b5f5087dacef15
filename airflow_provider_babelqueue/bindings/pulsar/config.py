"""The Pulsar binding's configuration: where the cluster is, who we are, and how topics are used.

Checked when built (URL schemes, Pulsar's naming rule, positive timings), so a wrong connection extra fails where
it is configured; it also gives the client's options and the admin API's TLS context, one setting for both.
"""

from __future__ import annotations

import math
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..base import Binding
from ..redaction import config_repr, redact
from .wire import DEFAULT_MAX_MESSAGE_BYTES, NAME

__all__ = ["PulsarConfig"]


@dataclass(frozen=True, slots=True)
class PulsarConfig:
    """Where the Pulsar cluster is, who we are, and how topics are used.

    :param service_url: the binary protocol endpoint, ``pulsar://host:6650`` or ``pulsar+ssl://host:6651``
        (several hosts may be listed, comma-separated, as the Pulsar client allows).
    :param admin_url: the admin REST endpoint (``http://host:8080`` / ``https://host:8443``); ``depth`` and
        ``dead_letter_depth`` read topic stats there, because the binary protocol has no count.
    :param token: a JWT for token authentication, used on both endpoints (kept out of ``repr`` and errors).
    :param tenant: with ``namespace``, where bare queue names live: ``persistent://<tenant>/<namespace>/<queue>``.
    :param subscription: the durable Shared subscription every consumer joins (``babelqueue`` in every SDK).
    :param dead_letter_suffix: dead letters go to the topic ``<queue><suffix>`` (``.dlq``, the SDKs' name).
    :param dead_letter_sources: dead-letter topics read besides the written one (always read, first): suffixes,
        ``{queue}`` templates or full topic names, as a list or comma text. None by default: every SDK writes
        ``<queue>.dlq`` on Pulsar. An extra topic is read only when its stats show messages, so a read never
        creates one.
    :param tls_trust_certs_file_path: CA bundle for ``pulsar+ssl`` and ``https`` (``None``: certifi for the
        client, the system store for the admin API).
    :param tls_validate_hostname: check that certificates name the host (on by default, unlike the client's).
    :param tls_allow_insecure_connection: accept any certificate; for a lab, never for production.
    :param visibility_timeout: seconds after which a reservation nobody settled is negatively acknowledged (and
        so redelivered); ``None`` holds it until ack, release, or the consumer disconnecting. Checked on every
        binding call and while ``reserve`` waits (Pulsar's own ack timeout cannot go under 10 s).
    :param redelivery_delay: seconds before the broker redelivers a negatively acknowledged message (an
        expired reservation, or a dead letter put back by a drain); Pulsar's client default is 60.
    :param receiver_queue_size: messages a consumer prefetches. Small keeps a Shared subscription fair across
        workers and ``depth`` close (prefetched messages count as handed out); must be at least 1, because a
        zero-queue consumer cannot receive with a timeout.
    :param max_message_bytes: checked before sending (the broker's ``maxMessageSize``, 5 MiB by default).
    :param create_subscription: create the subscription (from the earliest message) before the first publish
        to a topic, so messages published before any consumer ran are kept for it and counted by ``depth``.
    :param min_receive_wait: the shortest wait of one receive: a consumer gets messages pushed after a flow
        round trip, so ``reserve(timeout=0)`` still waits this long rather than miss a waiting message.
    :param operation_timeout_seconds: client operations (subscribe, send, lookups) give up after this.
    :param admin_timeout: seconds for one admin REST call.
    """

    service_url: str = "pulsar://127.0.0.1:6650"
    admin_url: str = "http://127.0.0.1:8080"
    token: str | None = field(default=None, repr=False)
    tenant: str = "public"
    namespace: str = "default"
    subscription: str = "babelqueue"
    dead_letter_suffix: str = ".dlq"
    dead_letter_sources: tuple[str, ...] | str | None = ()
    tls_trust_certs_file_path: str | None = None
    tls_validate_hostname: bool = True
    tls_allow_insecure_connection: bool = False
    visibility_timeout: float | None = None
    redelivery_delay: float = 1.0
    receiver_queue_size: int = 1
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    create_subscription: bool = True
    min_receive_wait: float = 0.1
    operation_timeout_seconds: int = 30
    admin_timeout: float = 10.0

    #: Either URL may carry a password or a token (userinfo, query): the repr redacts them.
    __repr__ = config_repr

    def __post_init__(self) -> None:
        object.__setattr__(self, "dead_letter_sources", Binding.source_entries(self.dead_letter_sources))
        service, admin = urlsplit(self.service_url), urlsplit(self.admin_url)
        for bad, problem in (
            (service.scheme not in ("pulsar", "pulsar+ssl") or not service.netloc,
             f"service_url must be pulsar://host:port or pulsar+ssl://host:port, got {redact(self.service_url)!r}"),
            (admin.scheme not in ("http", "https") or not admin.netloc,
             f"admin_url must be http://host:port or https://host:port, got {redact(self.admin_url)!r}"),
            (not NAME.fullmatch(self.tenant), "tenant may hold letters, digits and - = : . _ only"),
            (not NAME.fullmatch(self.namespace), "namespace may hold letters, digits and - = : . _ only"),
            (not NAME.fullmatch(self.subscription), "subscription may hold letters, digits and - = : . _ only"),
            (not NAME.fullmatch(self.dead_letter_suffix), "dead_letter_suffix may hold letters, digits, - = : . _"),
            (self.visibility_timeout is not None and not 0 < self.visibility_timeout < math.inf,
             "visibility_timeout must be a positive number of seconds (or None)"),
            (not 0 <= self.redelivery_delay <= 86400, "redelivery_delay must be 0-86400 seconds"),
            (self.receiver_queue_size.__class__ is not int or self.receiver_queue_size < 1,
             "receiver_queue_size must be a whole number of at least 1"),
            (not 1024 <= self.max_message_bytes <= 2**31 - 1, "max_message_bytes must be 1024-2147483647"),
            (not 0 <= self.min_receive_wait <= 10, "min_receive_wait must be 0-10 seconds"),
            (self.operation_timeout_seconds.__class__ is not int or self.operation_timeout_seconds < 1,
             "operation_timeout_seconds must be a whole number of at least 1"),
            (not 0 < self.admin_timeout < math.inf, "admin_timeout must be a positive number of seconds"),
        ):
            if bad:
                raise ValueError(problem)

    def client_options(self, pulsar: Any, client_logger: Any = None) -> dict[str, Any]:
        """Keyword arguments of ``pulsar.Client`` besides the service URL: timeouts, token, TLS, logging."""
        options: dict[str, Any] = {
            "operation_timeout_seconds": self.operation_timeout_seconds,
            "tls_validate_hostname": self.tls_validate_hostname,
            "tls_allow_insecure_connection": self.tls_allow_insecure_connection,
        }
        if client_logger is not None:  # the C++ client logs to stdout otherwise
            options["logger"] = client_logger
        if self.token:
            options["authentication"] = pulsar.AuthenticationToken(self.token)
        if self.tls_trust_certs_file_path:
            options["tls_trust_certs_file_path"] = self.tls_trust_certs_file_path
        return options

    def ssl_context(self) -> ssl.SSLContext:
        """The admin API's TLS settings, the same as the client's: CA bundle, hostname check, insecure mode."""
        context = ssl.create_default_context(cafile=self.tls_trust_certs_file_path)
        if self.tls_allow_insecure_connection or not self.tls_validate_hostname:
            context.check_hostname = False
        if self.tls_allow_insecure_connection:
            context.verify_mode = ssl.CERT_NONE
        return context
