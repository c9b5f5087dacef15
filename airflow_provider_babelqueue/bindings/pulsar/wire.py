"""Pulsar rules that need no broker connection: topic naming, the contract projection onto message
properties, attempts reconciliation, receipts.

The broker's conformance rules as pure functions, so the conformance tests run them without a broker;
:mod:`.binding` applies them to a live client.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import quote

from ...core import envelope as bq
from ..base import BindingError
from ..message import ReceivedMessage, parse_body

__all__ = [
    "CLIENT_HINTS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Hold",
    "MIRROR",
    "NAME",
    "PROJECTED",
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
#: Pulsar's rule for tenant, namespace and subscription names.
NAME = re.compile(r"[-=:.\w]+")
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
        if len(parts) != 3 or not all(parts) or not all(NAME.fullmatch(p) for p in parts[:2]):
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






