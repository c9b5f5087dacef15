"""SQS rules that need no client: the contract projection, attempts reconciliation, DLQ naming, limits.

The broker's conformance rules as pure functions, so the conformance tests run them without a broker;
:mod:`.binding` applies them to a live client.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from ...core import envelope as bq

__all__ = [
    "ATTRIBUTE_NAME",
    "BODY_ENCODING_ATTRIBUTE",
    "DEDUP_ID",
    "HINTS",
    "MAX_DELAY_SECONDS",
    "MAX_VISIBILITY_TIMEOUT",
    "MISSING",
    "NAME",
    "NOT_SQS_TEXT",
    "SERVICE_MAX_MESSAGE_BYTES",
    "Receipt",
    "dead_letter_queue_name",
    "dead_letter_source_names",
    "entry_size",
    "error_code",
    "message_attributes",
    "receive_count",
    "reconcile_attempts",
    "whole_seconds",
]

#: Warnings go to the public module's logger, the name users configure.
logger = logging.getLogger("airflow_provider_babelqueue.bindings.sqs")

MAX_DELAY_SECONDS, MAX_VISIBILITY_TIMEOUT = 900, 43200
#: The service's largest message since 2025; a queue's ``MaximumMessageSize`` still defaults to 256 KiB.
SERVICE_MAX_MESSAGE_BYTES = 1_048_576
#: Our extension: a body SQS cannot carry as text is sent as base64, with this attribute = ``base64``.
BODY_ENCODING_ATTRIBUTE = "bq-body-encoding"
NAME = re.compile(r"[A-Za-z0-9_-]+")
NOT_SQS_TEXT = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
ATTRIBUTE_NAME = re.compile(r"(?!\.)(?!.*\.\.)(?!.*\.$)(?!(?i:aws\.|amazon\.))[A-Za-z0-9_.-]{1,256}")
DEDUP_ID = re.compile(r"[!-~]{1,128}")
MISSING = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
HINTS = {  # AWS error code or botocore error class -> what to check
    **dict.fromkeys(MISSING, "the queue does not exist; create it, or enable create_queues"),
    **dict.fromkeys(
        ("InvalidClientTokenId", "SignatureDoesNotMatch", "UnrecognizedClientException", "ExpiredToken"),
        "the credentials were refused; check access key, secret, session token and region",
    ),
    **dict.fromkeys(
        ("AccessDenied", "AccessDeniedException", "KMS.AccessDeniedException"),
        "access denied; grant the identity sqs rights on the queue (and kms ones if it is encrypted)",
    ),
    "NoCredentialsError": "no AWS credentials; set login and password, or configure the default chain",
    "NoRegionError": "no region; set region_name",
    **dict.fromkeys(
        ("ConnectionError", "HTTPClientError"),  # botocore's: refused, timed out, TLS, proxy
        "cannot reach the endpoint; check endpoint_url / region and this worker's network",
    ),
}


def dead_letter_queue_name(queue_name: str, suffix: str = "-failed") -> str:
    """The fallback DLQ of a queue without a ``RedrivePolicy``: ``<queue><suffix>``, before ``.fifo``
    (a FIFO queue's DLQ must be FIFO too, and ``.`` is legal in SQS names only in that suffix)."""
    return f"{queue_name[:-5]}{suffix}.fifo" if queue_name.endswith(".fifo") else f"{queue_name}{suffix}"


def dead_letter_source_names(queue_name: str, entries: tuple[str, ...]) -> list[str]:
    """The queue names ``dead_letter_sources`` entries give for ``queue_name``, in order, with the entry forms
    every binding shares: a template holds ``{queue}`` (``dead-{queue}``); an entry starting with a letter or
    digit is a full name, read for every queue; any other is a suffix (``-dlq``). On a FIFO queue the name is
    made from the queue name without ``.fifo``, and ``.fifo`` is kept last (``orders-dlq.fifo``): a FIFO
    queue's DLQ must be FIFO, and ``.`` is legal in SQS names only in that suffix."""
    base, fifo = (queue_name[:-5], ".fifo") if queue_name.endswith(".fifo") else (queue_name, "")
    names = []
    for entry in entries:
        if "{queue}" in entry:
            name = entry.replace("{queue}", base)
        else:
            name = entry.removesuffix(".fifo") if entry[:1].isalnum() else f"{base}{entry}"
        names.append(name + fifo)
    return names


def message_attributes(envelope: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The six ``bq-*`` MessageAttributes of an envelope (conformance ``sqs.attribute_projection``): ids and
    strings are ``String``, schema version and creation time ``Number``. A field that is missing, or in a
    form SQS would refuse (empty, not an integer), is left out rather than sent broken."""
    raw_meta = envelope.get("meta")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    out: dict[str, dict[str, str]] = {}
    for name, value, kind in (
        ("bq-job", bq.urn_of(envelope), "String"),
        ("bq-trace-id", envelope.get("trace_id"), "String"),
        ("bq-message-id", meta.get("id"), "String"),
        ("bq-schema-version", meta.get("schema_version"), "Number"),
        ("bq-source-lang", meta.get("lang"), "String"),
        ("bq-created-at", meta.get("created_at"), "Number"),
    ):
        if kind == "Number" and value.__class__ is int:
            out[name] = {"DataType": kind, "StringValue": str(value)}
        elif kind == "String" and isinstance(value, str) and value and not NOT_SQS_TEXT.search(value):
            out[name] = {"DataType": kind, "StringValue": value}
    return out


def receive_count(value: Any) -> int | None:
    """``ApproximateReceiveCount`` (a decimal string) as an int; ``None`` when absent or garbage."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value)
    return value if value.__class__ is int else None


def reconcile_attempts(body_attempts: int, approximate_receive_count: Any) -> int:
    """``max(body_attempts, ApproximateReceiveCount - 1)`` (conformance ``sqs.attempts_reconciliation``): a
    first delivery reads 0, a count raised by a consumer is never lowered, an absent/garbage count is ignored."""
    count = receive_count(approximate_receive_count)
    return body_attempts if count is None else max(body_attempts, count - 1)




class Receipt(NamedTuple):
    """Where and what to settle; the field names are the API's, so ``**receipt._asdict()`` are the arguments."""

    QueueUrl: str  # noqa: N815
    ReceiptHandle: str  # noqa: N815


def whole_seconds(delay: float, cap: int, what: str) -> int:
    """A delay in whole seconds, rounded up (never early), capped with a warning rather than refused."""
    seconds = (math.ceil(round(delay, 3)) if math.isfinite(delay) else cap + 1) if delay > 0 else 0
    if seconds > cap:
        logger.warning("SQS %s of %s s is over the service maximum; capped to %d s", what, delay, cap)
    return min(seconds, cap)


def entry_size(entry: Mapping[str, Any]) -> int:
    """Bytes as SQS counts them: the body plus each attribute's name, type and value."""
    attributes = entry.get("MessageAttributes", {}).items()
    return len(entry["MessageBody"].encode()) + sum(
        len(f"{k}{a['DataType']}{a['StringValue']}".encode()) for k, a in attributes
    )


def error_code(exc: BaseException | None) -> str:
    """The AWS error code of a botocore error (``""`` for a transport error)."""
    error = (getattr(exc, "response", None) or {}).get("Error", {})
    return error["Code"] if error.get("Code") in MISSING else error.get("QueryErrorCode", error.get("Code", ""))
