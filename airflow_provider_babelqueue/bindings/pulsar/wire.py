"""Pulsar rules that need no broker connection: topic naming, the contract projection, attempts
reconciliation, the config, and the admin REST call behind the counts.

The broker's conformance rules as pure functions, so the conformance tests run them without a broker;
:mod:`.binding` applies them to a live client.
"""

from __future__ import annotations

import json
import math
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

from ...core import envelope as bq
from ..base import Binding, BindingError
from ..message import ReceivedMessage, parse_body
from ..redaction import config_repr, redact, scrub, url_secrets

__all__ = [
    "CLIENT_HINTS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Hold",
    "MIRROR",
    "PROJECTED",
    "PulsarConfig",
    "Receipt",
    "dead_letter_topic",
    "delay_millis",
    "message_key",
    "message_properties",
    "outgoing_properties",
    "partition_key",
    "property_attempts",
    "ready_count",
    "received",
    "reconcile_attempts",
    "stats_path",
    "topic_name",
]

#: The broker's default ``maxMessageSize`` (5 MiB): a larger body is refused before anything is sent.
DEFAULT_MAX_MESSAGE_BYTES = 5 * 1024 * 1024
#: The contract properties (conformance ``pulsar.property_projection``), all string → string.
PROJECTED = ("bq-job", "bq-trace-id", "bq-message-id", "bq-schema-version", "bq-source-lang", "bq-attempts")
#: The spec's mirror of a native delay (milliseconds, as a decimal string).
DELAY_PROPERTY = "bq-delay"
#: Prefix of the native message facts mirrored into ``ReceivedMessage.headers`` (dropped again on publish).
MIRROR = "pulsar."
_NAME = re.compile(r"[-=:.\w]+")  # Pulsar's rule for tenant and namespace names
_DIGITS = re.compile(r"[0-9]{1,10}")
_INT32 = 2**31 - 1


def topic_name(queue_name: str, tenant: str = "public", namespace: str = "default") -> str:
    """The persistent topic of a queue: ``persistent://<tenant>/<namespace>/<queue>``.

    A ``queue_name`` that already is a full ``persistent://tenant/namespace/topic`` name is used as it is, so one
    connection can reach topics of other namespaces. Non-persistent topics are refused: they lose messages
    whenever no consumer is connected, which at-least-once delivery and dead letters cannot live with.
    """
    if "://" in queue_name:
        domain, _, rest = queue_name.partition("://")
        parts = rest.split("/")
        if domain != "persistent":
            raise BindingError(f"topic {queue_name!r}: only persistent:// topics keep messages for a later consumer")
        if len(parts) != 3 or not all(parts) or not all(_NAME.fullmatch(p) for p in parts[:2]):
            raise BindingError(f"topic {queue_name!r} is not of the form persistent://<tenant>/<namespace>/<topic>")
        local = parts[2]
    else:
        local = queue_name
    if not local or "/" in local or any(c.isspace() or not c.isprintable() for c in local):
        raise BindingError(f"{queue_name!r} is not a valid Pulsar topic name (no '/', spaces or control characters)")
    return queue_name if "://" in queue_name else f"persistent://{tenant}/{namespace}/{local}"


def dead_letter_topic(queue_name: str, suffix: str = ".dlq", tenant: str = "public", namespace: str = "default") -> str:
    """The cross-SDK dead-letter topic of a queue: its topic name plus ``suffix`` (``orders`` → ``…/orders.dlq``)."""
    return topic_name(queue_name, tenant, namespace) + suffix


def stats_path(topic: str) -> str:
    """The admin REST path of a persistent topic's stats (the local name percent-encoded)."""
    tenant, namespace, local = topic.removeprefix("persistent://").split("/")
    return f"/admin/v2/persistent/{tenant}/{namespace}/{quote(local, safe='')}/stats"


def _text(value: Any) -> str | None:
    """A property value Pulsar can carry: a non-empty string that is valid UTF-8 (no lone surrogates)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def message_properties(envelope: Mapping[str, Any]) -> dict[str, str]:
    """The six ``bq-*`` properties of an envelope (conformance ``pulsar.property_projection``).

    Pulsar properties are string → string, so the schema version and attempts are stringified integers. A
    field that is missing, or not of its kind (a string field that is empty, a number that is not an
    integer), is left out rather than sent broken: the body stays authoritative.
    """
    raw_meta = envelope.get("meta")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    out: dict[str, str] = {}
    for name, value in (
        ("bq-job", bq.urn_of(envelope)),
        ("bq-trace-id", envelope.get("trace_id")),
        ("bq-message-id", meta.get("id")),
        ("bq-schema-version", meta.get("schema_version")),
        ("bq-source-lang", meta.get("lang")),
        ("bq-attempts", envelope.get("attempts")),
    ):
        if name in ("bq-schema-version", "bq-attempts"):
            if value.__class__ is int and value >= 0:
                out[name] = str(value)
        elif (text := _text(value)) is not None:
            out[name] = text
    return out


def outgoing_properties(
    envelope: Mapping[str, Any] | None,
    headers: Mapping[str, Any] | None = None,
    *,
    delay_ms: int = 0,
    attempts: int | None = None,
) -> dict[str, str]:
    """All properties of one message: caller headers (stringified), then the projection, which wins a clash.

    :param envelope: the decoded body, or ``None`` for an undecodable one (nothing to project).
    :param headers: extra properties; ``pulsar.*`` mirrors of a received message and the projected names are
        dropped (they are recomputed from the body), so a received message's headers forward safely.
    :param delay_ms: a native delay, mirrored on ``bq-delay`` as the spec asks.
    :param attempts: ``bq-attempts`` for an undecodable body, whose bytes cannot carry the count.
    """
    out = {
        str(k): str(v)
        for k, v in (headers or {}).items()
        if v is not None and not str(k).startswith(MIRROR) and str(k) not in (*PROJECTED, DELAY_PROPERTY)
    }
    out = {k: v for k, v in out.items() if _text(k) and _text(v)}
    if envelope is not None:
        out.update(message_properties(envelope))
    elif attempts is not None:
        out["bq-attempts"] = str(attempts)
    if delay_ms > 0:
        out[DELAY_PROPERTY] = str(delay_ms)
    return out


def reconcile_attempts(body_attempts: int, redelivery_count: Any) -> int:
    """``max(body_attempts, redelivery_count)`` (conformance ``pulsar.attempts_reconciliation``).

    Pulsar's redelivery count is 0-based (0 on a first delivery), so it maps directly, with no −1; a count the
    body already carries is never lowered; an absent or garbage count is ignored.
    """
    if redelivery_count.__class__ is not int or redelivery_count < 0:
        return body_attempts
    return max(body_attempts, redelivery_count)


def property_attempts(properties: Mapping[str, Any]) -> int:
    """``bq-attempts`` as an int (plain ASCII digits within int32, as every SDK parses it), else 0.

    Used only for an undecodable body: there the property is the one place a retry count can live.
    """
    raw = properties.get("bq-attempts")
    if isinstance(raw, str) and _DIGITS.fullmatch(raw) and int(raw) <= _INT32:
        return int(raw)
    return 0


def ready_count(stats: Mapping[str, Any] | None, subscription: str) -> int:
    """Messages of the subscription ready for delivery, from a topic-stats document.

    ``msgBacklog`` counts everything not yet acknowledged; ``msgBacklogNoDelayed`` leaves out the delayed
    messages the broker's dispatcher tracks, and ``unackedMessages`` are the ones handed to consumers. A topic
    or subscription that does not exist has none.
    """
    sub = ((stats or {}).get("subscriptions") or {}).get(subscription)
    if not isinstance(sub, Mapping):
        return 0
    backlog = int(sub.get("msgBacklog") or 0)
    waiting = int(sub.get("msgBacklogNoDelayed", backlog - int(sub.get("msgDelayed") or 0)))
    return max(waiting - int(sub.get("unackedMessages") or 0), 0)


def received(message: Any, queue_name: str, receipt: Any, dead: bool, source: str | None = None,
             decode_limit: int | None = None) -> ReceivedMessage:
    """A received Pulsar message as a :class:`ReceivedMessage`: the payload as it is, attempts reconciled with
    the redelivery count (an undecodable body counts by its ``bq-attempts``), properties plus ``pulsar.*``
    mirrors of the message id and publish time as headers, and the native redelivery count.

    :param source: the dead-letter topic it was read from."""
    body, properties = bytes(message.data() or b""), dict(message.properties() or {})
    envelope, error, body_attempts = parse_body(body, decode_limit)
    if envelope is None:  # no body to count in: the property is where a retry left the count
        body_attempts = property_attempts(properties)
    count = message.redelivery_count()
    mirrors = {f"{MIRROR}message_id": str(message.message_id()), f"{MIRROR}publish_time": message.publish_timestamp()}
    return ReceivedMessage(
        body=body,
        queue_name=queue_name,
        envelope=envelope,
        decode_error=error,
        attempts=reconcile_attempts(body_attempts, count),
        delivery_count=count if count.__class__ is int else None,
        headers={**properties, **mirrors},
        receipt=receipt,
        from_dead_letter=dead,
        dead_letter_source=source if dead else None,
    )


CLIENT_HINTS = {  # client exception class → what to check
    "Timeout": "no answer within operation_timeout_seconds; check that a broker listens at the service URL, that "
    "this worker reaches it, and that TLS is on there too when the URL says pulsar+ssl",
    "ConnectError": "cannot reach the broker; check the service URL, this worker's network and the TLS settings",
    "AuthenticationError": "the broker refused the credentials; check the token",
    "AuthorizationError": "the token's role lacks produce or consume permission on the namespace",
    "TopicNotFound": "the topic does not exist and the namespace does not create topics; create it first",
    "InvalidTopicName": "the broker refused the topic name",
    "MessageTooBig": "the message is over the broker's maxMessageSize; lower max_message_bytes to match it",
    "ProducerBlockedQuotaExceededError": "the topic's backlog quota is full; drain it or raise the quota",
    "ProducerBlockedQuotaExceededException": "the topic's backlog quota is full; drain it or raise the quota",
    "TopicTerminated": "the topic was terminated and takes no more messages",
    "ConsumerBusy": "an Exclusive or Failover consumer holds the subscription; it must be Shared for every consumer",
    "AlreadyClosed": "the client or consumer was closed",
}


@dataclass(frozen=True, slots=True)
class Receipt:
    """Which reservation a message is: its topic, its message id and the token of this delivery."""

    topic: str
    key: tuple[int, int, int, int]
    token: int


class Hold(NamedTuple):
    """A reservation this binding holds: its token, lease deadline, consumer and message."""

    token: int
    deadline: float
    consumer: Any
    message: Any


def message_key(message_id: Any) -> tuple[int, int, int, int]:
    """A hashable form of a (not hashable) ``_pulsar.MessageId``."""
    return (message_id.ledger_id(), message_id.entry_id(), message_id.partition(), message_id.batch_index())


def delay_millis(delay: float) -> int:
    """A delay in whole milliseconds, rounded up (never early); refused when it is not a finite number."""
    if not delay or delay <= 0:
        return 0
    if not math.isfinite(delay):
        raise BindingError(f"a delay must be a finite number of seconds, got {delay!r}")
    return math.ceil(round(delay * 1000, 3))


def partition_key(envelope: Any) -> str | None:
    """The trace id: a trace's messages share a partition of a partitioned topic (and a Key_Shared consumer)."""
    trace = envelope.get("trace_id") if isinstance(envelope, Mapping) else None
    return trace if isinstance(trace, str) and trace else None


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
            (not _NAME.fullmatch(self.tenant), "tenant may hold letters, digits and - = : . _ only"),
            (not _NAME.fullmatch(self.namespace), "namespace may hold letters, digits and - = : . _ only"),
            (not _NAME.fullmatch(self.subscription), "subscription may hold letters, digits and - = : . _ only"),
            (not _NAME.fullmatch(self.dead_letter_suffix), "dead_letter_suffix may hold letters, digits, - = : . _"),
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


_ADMIN_HINTS = {
    401: "the admin API refused the token (401); check the connection's token",
    403: "the token's role may not read this topic's stats (403); grant it the namespace's consume or admin rights",
}


def admin_get(config: PulsarConfig, path: str, context: ssl.SSLContext | None = None) -> dict[str, Any] | None:
    """GET one admin REST document; ``None`` for a 404 (the topic does not exist).

    :raises BindingError: naming the URL, the status and the broker's ``reason``, with a hint; never the token.
    """
    url = config.admin_url.rstrip("/") + path
    headers = {"Accept": "application/json"} | ({"Authorization": f"Bearer {config.token}"} if config.token else {})
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=config.admin_timeout, context=context) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        try:
            reason = json.loads(exc.read() or b"{}").get("reason", "")
        except (ValueError, AttributeError):
            reason = ""
        hint = _ADMIN_HINTS.get(exc.code, f"the admin API answered {exc.code}")
        raise BindingError(f"Pulsar admin {redact(url)}: {hint}{f' ({reason})' if reason else ''}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        text = str(getattr(exc, "reason", exc))
        text = text.replace(config.token, "***") if config.token else text
        text = scrub(text, url_secrets(url))
        raise BindingError(
            f"Pulsar admin {redact(url)}: cannot read topic stats: check admin_url, that the broker's web service "
            "listens "
            f"there, and its TLS settings ({type(exc).__name__}: {text})"
        ) from exc
