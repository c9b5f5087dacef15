"""Service Bus rules that need no connection: projection, reconciliation, dead-letter text, message shapes.

The broker's conformance rules as pure functions, so the conformance tests run them without a broker;
:mod:`.binding` applies them to a live client.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from ...core import envelope as bq
from ..base import BindingError
from ..bodies import dead_letter_view
from ..message import ReceivedMessage, parse_body

__all__ = [
    "DEAD_LETTER_SUBQUEUE",
    "MAX_DEAD_LETTER_TEXT",
    "application_properties",
    "dead_letter_description",
    "message_fields",
    "native_dead_letter_body",
    "outgoing_message",
    "parse_dead_letter_description",
    "received_message",
    "reconcile_attempts",
    "service_delivery_count",
]

#: The native dead-letter sub-queue of every queue: ``<queue>/$DeadLetterQueue``.
DEAD_LETTER_SUBQUEUE = "$DeadLetterQueue"
#: Longest DeadLetterReason / DeadLetterErrorDescription the Service Bus clients send (.NET truncates to it).
MAX_DEAD_LETTER_TEXT = 4096
#: Service Bus's identifiers (MessageId, CorrelationId, SessionId) are at most 128 characters.
_MAX_ID = 128
_DESCRIPTION_KEYS = ("error", "exception", "failed_at", "attempts")


def message_fields(envelope: Mapping[str, Any]) -> dict[str, str]:
    """The native message fields of an envelope (conformance ``asb.property_projection.message``): subject =
    URN, correlation_id = trace_id, message_id = meta.id, content_type ``application/json``. An id Service
    Bus would refuse (empty, not a string, over 128 characters) is left out rather than sent broken; the
    body stays authoritative."""
    raw_meta = envelope.get("meta")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    out = {"content_type": "application/json"}
    for name, value, limit in (
        ("subject", bq.urn_of(envelope), None),
        ("correlation_id", envelope.get("trace_id"), _MAX_ID),
        ("message_id", meta.get("id"), _MAX_ID),
    ):
        if isinstance(value, str) and value and (limit is None or len(value) <= limit):
            out[name] = value
    return out


def application_properties(envelope: Mapping[str, Any]) -> dict[str, int | str]:
    """The ``bq-*`` application properties as native AMQP values (conformance
    ``asb.property_projection.application_properties``): ``bq-schema-version`` and ``bq-created-at`` stay
    integers (a number sent as a string would not filter as one), ``bq-source-lang`` a string."""
    raw_meta = envelope.get("meta")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    out: dict[str, int | str] = {}
    for name, value, kind in (
        ("bq-schema-version", meta.get("schema_version"), int),
        ("bq-source-lang", meta.get("lang"), str),
        ("bq-created-at", meta.get("created_at"), int),
    ):
        # value's class is exactly kind here, so isinstance tells int from str as `kind is` would
        if value.__class__ is kind and (isinstance(value, int) and -(2**63) <= value < 2**63
                                        or isinstance(value, str) and value):
            out[name] = value
    return out


def service_delivery_count(sdk_delivery_count: Any) -> int | None:
    """Service Bus's 1-based DeliveryCount from the Python SDK's ``delivery_count``.

    The Python SDK surfaces the raw AMQP header (the number of earlier failed deliveries: 0 on a first
    delivery), while Service Bus, its .NET/Java/Node clients and the conformance suite count deliveries from 1.
    """
    return sdk_delivery_count + 1 if sdk_delivery_count.__class__ is int and sdk_delivery_count >= 0 else None


def reconcile_attempts(body_attempts: int, delivery_count: Any) -> int:
    """``max(body_attempts, DeliveryCount - 1)`` (conformance ``asb.attempts_reconciliation``): a first
    delivery (DeliveryCount 1) reads 0, a count raised by a consumer is never lowered, and a DeliveryCount of
    1 or less (or none) leaves the body's count as it is. ``delivery_count`` is the 1-based native count."""
    if delivery_count.__class__ is not int:
        return body_attempts
    return max(body_attempts, delivery_count - 1)


def dead_letter_description(*, error: str | None, exception: str | None, failed_at: int, attempts: int) -> str:
    """The DeadLetterErrorDescription this binding writes: compact JSON of the ``dead_letter`` fields Service
    Bus has no property for, so a reader rebuilds the exact block (:func:`native_dead_letter_body`).

    Service Bus keeps the body of a dead letter as it was; the reason goes into DeadLetterReason, this into the
    description. Within :data:`MAX_DEAD_LETTER_TEXT` characters: a long error (then exception) is cut with "…".
    """
    doc: dict[str, Any] = {"error": error, "exception": exception, "failed_at": failed_at, "attempts": attempts}
    for key in ("error", "exception"):
        while len(text := json.dumps(doc, ensure_ascii=False, separators=(",", ":"))) > MAX_DEAD_LETTER_TEXT:
            if not doc[key]:
                break
            keep = max(len(doc[key]) - (len(text) - MAX_DEAD_LETTER_TEXT) - 1, 0)
            doc[key] = doc[key][:keep] + "…" if keep else None
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def parse_dead_letter_description(text: Any) -> dict[str, Any] | None:
    """The fields of a description written by :func:`dead_letter_description`; ``None`` for any other text
    (a foreign SDK's, or Service Bus's own such as MaxDeliveryCountExceeded)."""
    if not isinstance(text, str) or not text.startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if doc.__class__ is not dict or tuple(doc) != _DESCRIPTION_KEYS:
        return None
    if not all(doc[k] is None or isinstance(doc[k], str) for k in ("error", "exception")):
        return None
    if not all(doc[k].__class__ is int and doc[k] >= 0 for k in ("failed_at", "attempts")):
        return None
    return doc


def native_dead_letter_body(
    body: bytes,
    *,
    queue_name: str,
    reason: str | None,
    description: str | None,
    delivery_count: int | None,
    enqueued_ms: int | None,
) -> bytes:
    """The body of a native dead letter as this binding hands it out: with a ``dead_letter`` block.

    Service Bus dead-letters a message with its body unchanged, so downstream would see two shapes. An
    envelope without a block gets one from DeadLetterReason (``unknown`` when absent) and the description:
    ours (:func:`dead_letter_description`) restores the exact block; any other text becomes ``error``, with
    ``attempts`` reconciled from the DeliveryCount and ``failed_at`` = the enqueued time (the broker records no
    dead-lettering time). A body that already has a block is returned byte for byte; one that is not an envelope
    (or cannot be annotated) as the poison wrapper of its exact bytes with that reason and block
    (:func:`~...core.peer.wrap_raw`), the form every reader takes the reason and the route from.
    """
    envelope, _, body_attempts = parse_body(body)
    if envelope is not None and "dead_letter" in envelope:
        return body
    ours = parse_dead_letter_description(description)
    if ours is None:
        ours = {
            "error": description or None,
            "exception": None,
            "failed_at": enqueued_ms if enqueued_ms.__class__ is int else bq.now_ms(),
            "attempts": reconcile_attempts(body_attempts, delivery_count),
        }
    return dead_letter_view(body, envelope, reason or "unknown", original_queue=queue_name, **ours)


#: Written by Service Bus on dead letters; never forwarded onto a copy.
_NATIVE = ("DeadLetterReason", "DeadLetterErrorDescription")
_HINTS = {  # SDK / azure-core error class → what to check
    **dict.fromkeys(
        ("MessagingEntityNotFoundError", "ResourceNotFoundError"),
        "the queue does not exist; create it, or enable create_queues",
    ),
    **dict.fromkeys(
        ("ServiceBusAuthenticationError", "ClientAuthenticationError", "CredentialUnavailableError"),
        "authentication failed; check the connection string's key, or the identity DefaultAzureCredential found",
    ),
    "ServiceBusAuthorizationError": "not authorized; the key or role needs Send and Listen (Manage for counts)",
    **dict.fromkeys(
        ("ServiceBusConnectionError", "ServiceBusCommunicationError", "ServiceRequestError"),
        "cannot reach the namespace; check the host and this worker's network (5671, or 443 with use_websockets)",
    ),
    "MessageSizeExceededError": "the message is larger than the queue accepts (256 KiB on the Standard tier)",
    "MessageLockLostError": "the message's lock expired (it was or will be delivered again)",
    "MessageAlreadySettled": "the message was settled already (acked, released or dead-lettered)",
    "ServiceBusQuotaExceededError": "the queue or namespace is full (quota exceeded)",
    "ServiceBusServerBusyError": "the namespace is throttling requests; retry later",
    "OperationTimeoutError": "the operation timed out",
    "HttpResponseError": "the management API refused the request (counts and creating queues need Manage rights)",
}


def _body(message: Any) -> bytes:
    """The body bytes of a received SDK message: data sections joined (what every SDK sends); an AMQP value
    or sequence another client sent is carried as text, or as JSON."""
    kind, body = getattr(message.body_type, "value", message.body_type), message.body
    if kind == "data":
        return b"".join(bytes(part) for part in body)
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    value = body if kind == "value" else list(body)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8")


def _headers(properties: Mapping[Any, Any] | None) -> dict[str, Any]:
    """Application properties with text keys; byte values decoded when they are UTF-8 (the SDK hands them
    out as bytes)."""
    out: dict[str, Any] = {}
    for key, value in (properties or {}).items():
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                pass
        out[key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)] = value
    return out


def forwarded(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Headers a copy keeps: the caller's, not the ``bq-*`` projection (recomputed) nor broker-written ones."""
    return {k: v for k, v in headers.items() if not k.startswith("bq-") and k not in _NATIVE}


class Receipt(NamedTuple):
    """Which cached receiver took the message, and the SDK's message (it carries the lock token)."""

    key: str
    message: Any


def receipt_of(message: ReceivedMessage) -> Receipt:
    if not isinstance(message.receipt, Receipt):
        raise BindingError(
            f"this message was not reserved by a Service Bus binding (receipt {message.receipt!r}); peeked "
            "(browsed) messages cannot be settled"
        )
    return message.receipt


def outgoing_message(
    message_class: Any,
    long: Any,
    body: bytes,
    headers: Mapping[str, Any] | None = None,
    delay: float = 0,
    message_id: str | None = None,
) -> Any:
    """A ``ServiceBusMessage``: the body byte for byte, the projection, the caller's headers as extra
    application properties (the projection wins a clash), ``delay`` as ``scheduled_enqueue_time_utc``.

    :param long: the SDK's AMQP-long wrapper. The SDK sends a plain int as a 32-bit AMQP int and fails above
        2**31 (azure-sdk-for-python#34717), so larger ints (``bq-created-at``) are wrapped as it wraps its own.
    :param message_id: replaces the projected MessageId (a retry copy on a duplicate-detecting queue).
    """
    envelope = parse_body(body)[0]
    fields = message_fields(envelope) if envelope is not None else {"content_type": "application/json"}
    if message_id:
        fields["message_id"] = message_id
    properties = {
        str(k): v if isinstance(v, str | int | float | bool | bytes) else str(v)
        for k, v in (headers or {}).items()
        if v is not None
    }
    properties |= application_properties(envelope) if envelope is not None else {}
    for key, value in properties.items():
        if value.__class__ is int and not -(2**31) <= value < 2**31:
            properties[key] = long(value)
    message = message_class(body, application_properties=properties or None, **fields)
    if delay > 0 and math.isfinite(delay):
        message.scheduled_enqueue_time_utc = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=delay)
    return message


def received_message(message: Any, queue: str, dead: bool, receipt: Receipt | None,
                     source: str | None = None, decode_limit: int | None = None) -> ReceivedMessage:
    """A :class:`ReceivedMessage` from an SDK message: DeliveryCount 1-based, attempts reconciled, and for a
    dead-letter queue the body with its ``dead_letter`` block (:func:`native_dead_letter_body`).

    :param source: the dead-letter queue it was read from (``<queue>/$DeadLetterQueue`` or a plain queue)."""
    body, count = _body(message), service_delivery_count(message.delivery_count)
    if dead:
        enqueued = message.enqueued_time_utc
        body = native_dead_letter_body(
            body,
            queue_name=queue,
            reason=message.dead_letter_reason,
            description=message.dead_letter_error_description,
            delivery_count=count,
            enqueued_ms=round(enqueued.timestamp() * 1000) if enqueued is not None else None,
        )
    envelope, error, body_attempts = parse_body(body, decode_limit)
    return ReceivedMessage(
        body=body,
        queue_name=queue,
        envelope=envelope,
        decode_error=error,
        attempts=reconcile_attempts(body_attempts, count),
        delivery_count=count,
        headers=_headers(message.application_properties),
        receipt=receipt,
        from_dead_letter=dead,
        dead_letter_source=source if dead else None,
    )




