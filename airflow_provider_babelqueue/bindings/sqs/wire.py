"""SQS rules that need no client: the contract projection, attempts reconciliation, DLQ naming, the config.

The broker's conformance rules as pure functions, so the conformance tests run them without a broker;
:mod:`.binding` applies them to a live client.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...core import envelope as bq
from ..base import Binding
from ..redaction import config_repr

__all__ = [
    "ATTRIBUTE_NAME",
    "BODY_ENCODING_ATTRIBUTE",
    "DEDUP_ID",
    "DEFAULT_DEAD_LETTER_SOURCES",
    "HINTS",
    "MAX_DELAY_SECONDS",
    "MAX_VISIBILITY_TIMEOUT",
    "MISSING",
    "NAME",
    "NOT_SQS_TEXT",
    "SERVICE_MAX_MESSAGE_BYTES",
    "Receipt",
    "SqsConfig",
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
#: The DLQs read besides the written one: ours, and ``-dlq`` where the official SDKs' workers write
#: (``SqsTransport.dead_letter_queue_name``), so a mixed fleet's dead letters are counted and drained together.
DEFAULT_DEAD_LETTER_SOURCES = ("-failed", "-dlq")
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


@dataclass(frozen=True, slots=True)
class SqsConfig:
    """Where SQS is, who we are, and how queues behave.

    :param region_name: ``None`` = the default chain (``AWS_DEFAULT_REGION``, profile).
    :param endpoint_url: another endpoint (VPC endpoint, LocalStack, moto); ``None`` for AWS's own.
    :param aws_access_key_id: with ``aws_secret_access_key`` (kept out of ``repr`` and errors, like
        ``aws_session_token``); neither = the default credential chain, the better choice in production.
    :param role_arn: assume this role through STS (``AWS_ENDPOINT_URL_STS`` points elsewhere); botocore
        refreshes the credentials before they expire, so long-lived workers keep working.
    :param fifo_group_id: ``MessageGroupId`` on FIFO queues; ``None`` = the queue name (one ordered group).
    :param content_based_dedup: send no ``MessageDeduplicationId`` (the FIFO queue hashes the body; queues we
        create get the attribute). Sending meta.id works on either kind of queue.
    :param dead_letter_suffix: fallback DLQ = ``<queue><suffix>`` for queues without a ``RedrivePolicy``: where
        dead letters are written.
    :param dead_letter_sources: the DLQs *read* besides the ``RedrivePolicy`` target and the written one
        (both always read, first): suffixes, ``{queue}`` templates or full names, as a list or comma text
        (:func:`dead_letter_source_names`). The default adds ``-dlq``, where the official SDKs' workers write,
        so their dead letters are counted, drained and redriven without configuration; ``()`` reads only the
        written one. A read never creates a queue: a missing one counts as empty.
    :param wait_time_seconds: longest single long poll (1-20); ``reserve`` loops for longer timeouts.
    :param visibility_timeout: whole seconds a received message stays hidden (sent with every receive, set
        on queues we create); ``None`` keeps the queue's own (30 s unless changed).
    :param max_message_bytes: checked before sending (body + attributes, as SQS counts); also the
        ``MaximumMessageSize`` of queues we create and the byte budget of one native batch.
    :param include_in_flight_in_depth: ``depth`` also counts in-flight and delayed messages.
    :param create_queues: create missing queues on first use. Off by default: a missing queue is an error naming
        it, so a mistyped queue name never creates a queue nobody reads (nor one without the RedrivePolicy, KMS
        key or tags that infrastructure code gives real queues).
    """

    region_name: str | None = None
    endpoint_url: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)
    role_arn: str | None = None
    fifo_group_id: str | None = None
    content_based_dedup: bool = False
    dead_letter_suffix: str = "-failed"
    dead_letter_sources: tuple[str, ...] | str | None = DEFAULT_DEAD_LETTER_SOURCES
    wait_time_seconds: int = 20
    visibility_timeout: float | None = None
    max_message_bytes: int = SERVICE_MAX_MESSAGE_BYTES
    include_in_flight_in_depth: bool = False
    create_queues: bool = False

    #: ``endpoint_url`` may carry a password or a token (userinfo, query): the repr redacts it.
    __repr__ = config_repr

    def __post_init__(self) -> None:
        sources = Binding.source_entries(self.dead_letter_sources)
        object.__setattr__(self, "dead_letter_sources", sources)
        bad_source = next(
            (s for s in sources if not NAME.fullmatch(s.replace("{queue}", "q").removesuffix(".fifo"))), None
        )
        for bad, problem in (
            (
                bad_source is not None,
                f"dead_letter_sources entry {bad_source!r} must be a suffix, a full name or a {{queue}} template "
                "of letters, digits, '-' or '_' (SQS names allow nothing else)",
            ),
            (
                bool(self.aws_access_key_id) != bool(self.aws_secret_access_key),
                "aws_access_key_id and aws_secret_access_key go together (neither = the default chain)",
            ),
            (not NAME.fullmatch(self.dead_letter_suffix or ""), "dead_letter_suffix must be letters, digits, - or _"),
            (not 1 <= self.wait_time_seconds <= 20, "wait_time_seconds must be 1-20 (SQS's long-poll cap)"),
            (not 0 <= (self.visibility_timeout or 0) <= MAX_VISIBILITY_TIMEOUT, "visibility_timeout must be 0-43200"),
            (not 1024 <= self.max_message_bytes <= SERVICE_MAX_MESSAGE_BYTES, "max_message_bytes must be 1024-1048576"),
            (not DEDUP_ID.fullmatch(self.fifo_group_id or "-"), "fifo_group_id must be 1-128 printable ASCII"),
        ):
            if bad:
                raise ValueError(problem)


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
