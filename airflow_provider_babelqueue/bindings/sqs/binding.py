"""Amazon SQS binding: the envelope is the MessageBody, the six ``bq-*`` MessageAttributes a routable copy.

Wire facts (spec/broker-bindings.md, conformance block ``sqs``): attempts = max(body attempts,
ApproximateReceiveCount - 1); FIFO ``MessageGroupId`` = the configured group else the queue name and
``MessageDeduplicationId`` = meta.id; ``DelaySeconds`` <= 900. Choices (docs/connections/sqs.md says more):

* ``release`` sends a copy with attempts + 1 (a fresh deduplication id on FIFO, or the retry would be
  deduplicated away), then deletes the original: the body counts attempts as on every binding, and a crash
  in between duplicates rather than loses. SQS cannot delay one FIFO message, so a delayed FIFO release is
  native (ChangeMessageVisibility; the receive count then raises the reconciled attempts).
* Bodies SQS cannot carry as text (invalid UTF-8, characters outside its set) travel as base64 with the
  attribute ``bq-body-encoding: base64`` (our extension), so poison bytes survive for triage.
* Dead letters go to the ``RedrivePolicy`` target, else ``<queue><dead_letter_suffix>``. Counts are approximate.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ...core import envelope as bq
from .. import base
from ..base import Binding, BindingError, PublishBatchError, ReceivedMessage, parse_body, redact_url, scrub_url_password
from .wire import (
    ATTRIBUTE_NAME,
    BODY_ENCODING_ATTRIBUTE,
    DEDUP_ID,
    HINTS,
    MAX_DELAY_SECONDS,
    MAX_VISIBILITY_TIMEOUT,
    MISSING,
    NAME,
    NOT_SQS_TEXT,
    SERVICE_MAX_MESSAGE_BYTES,
    Receipt,
    SqsConfig,
    dead_letter_queue_name,
    entry_size,
    error_code,
    message_attributes,
    receive_count,
    reconcile_attempts,
    whole_seconds,
)

__all__ = [
    "BODY_ENCODING_ATTRIBUTE",
    "SqsBinding",
    "SqsConfig",
    "dead_letter_queue_name",
    "message_attributes",
    "reconcile_attempts",
]

logger = logging.getLogger(__name__)


class SqsBinding(Binding):
    """Queues as SQS queues (see the module docstring). The DLQ cannot be browsed: SQS has no peek, and a
    receive hides messages and raises their receive counts (which can trip a RedrivePolicy), so a browse
    would change what it reads; drain it with :meth:`reserve_dead_letter` + :meth:`ack`."""

    name = "sqs"
    carries_headers = True
    can_browse = False

    def __init__(self, config: SqsConfig, client: Any = None) -> None:
        """:param client: a ready boto3 SQS client (the test seam, or to share one); otherwise one is built
        on first use. :meth:`close` leaves an injected client open."""
        self.config = config
        self._boto3, self._errors = base.require_extra("boto3", "sqs"), base.require_extra("botocore.exceptions", "sqs")
        self._client, self._owns_client = client, client is None
        self._lock = threading.Lock()
        self._urls: dict[str, str] = {}
        self._dead: dict[str, tuple[str, str]] = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock, self._guard("create a client for", "sqs"):
                if self._client is None:  # a boto3 session is not thread-safe (its clients are)
                    self._client = self._make_client()
        return self._client

    def _make_client(self) -> Any:
        cfg = self.config
        # annotated: a base class below, which mypy must resolve before it infers the tuple form's types
        botocore: Any = base.require_extra("botocore.credentials", "sqs")
        session = self._boto3.session.Session(
            aws_access_key_id=cfg.aws_access_key_id,
            aws_secret_access_key=cfg.aws_secret_access_key,
            aws_session_token=cfg.aws_session_token,
            region_name=cfg.region_name,
        )
        if cfg.role_arn:  # credentials from STS AssumeRole, refreshed by botocore before they expire
            sts = session.client("sts")

            def fetch() -> dict[str, Any]:
                name = f"babelqueue-{uuid.uuid4().hex[:16]}"
                c = sts.assume_role(RoleArn=cfg.role_arn, RoleSessionName=name)["Credentials"]
                return {
                    "access_key": c["AccessKeyId"],
                    "secret_key": c["SecretAccessKey"],
                    "token": c["SessionToken"],
                    "expiry_time": c["Expiration"].isoformat(),
                }

            class AssumeRole(botocore.CredentialProvider):
                METHOD = CANONICAL_NAME = "babelqueue-assume-role"

                def load(self) -> Any:
                    return botocore.RefreshableCredentials.create_from_metadata(fetch(), fetch, self.METHOD)

            core = base.require_extra("botocore.session", "sqs").Session()
            core.get_component("credential_provider").insert_before("env", AssumeRole())
            session = self._boto3.session.Session(botocore_session=core, region_name=session.region_name)
        options = {"connect_timeout": 10, "read_timeout": cfg.wait_time_seconds + 40, "retries": {"mode": "standard"}}
        config = base.require_extra("botocore.config", "sqs").Config(**options)
        return session.client("sqs", endpoint_url=cfg.endpoint_url, config=config)

    @contextmanager
    def _guard(self, action: str, target: str) -> Iterator[None]:
        """Turn a botocore error into a :class:`BindingError` saying where, what failed and what to check."""
        try:
            yield
        except (self._errors.ClientError, self._errors.BotoCoreError) as exc:
            text = str(exc)
            for secret in (self.config.aws_secret_access_key, self.config.aws_session_token):
                text = text.replace(secret, "***") if secret else text
            text = scrub_url_password(text, self.config.endpoint_url)
            names = [error_code(exc)] + [kind.__name__ for kind in type(exc).__mro__]
            hint = next((HINTS[n] for n in names if n in HINTS), "SQS refused the request")
            endpoint, region = self.config.endpoint_url, self.config.region_name
            where = redact_url(endpoint) if endpoint else f"region {region or '(from the AWS config)'}"
            raise BindingError(
                f"SQS {where}: {action} {target!r} failed: {hint} ({type(exc).__name__}: {text})"
            ) from exc

    def _call(self, action: str, target: str, method: str, **params: Any) -> Any:
        with self._guard(action, target):
            return getattr(self.client, method)(**params)

    def _url(self, name: str, dead: bool = False) -> str:
        """The queue URL (GetQueueUrl, cached); a missing queue is created when ``create_queues``. A DLQ we
        create keeps messages 14 days (SQS's most) and takes the largest message SQS allows, so the
        ``dead_letter`` block cannot make a near-limit message impossible to dead-letter."""
        if (url := self._urls.get(name)) is not None:
            return url
        if not (len(name) <= 80 and NAME.fullmatch(name.removesuffix(".fifo"))):
            raise BindingError(
                f"{name!r} is not a valid SQS queue name: 1-80 letters, digits, '-' or '_', with an "
                "optional '.fifo' suffix ('.' is illegal anywhere else)"
            )
        cfg = self.config
        attributes = {"MaximumMessageSize": str(cfg.max_message_bytes)}
        if dead:
            attributes |= {"MaximumMessageSize": str(SERVICE_MAX_MESSAGE_BYTES), "MessageRetentionPeriod": "1209600"}
        if cfg.visibility_timeout is not None:
            attributes["VisibilityTimeout"] = str(math.ceil(cfg.visibility_timeout))
        if name.endswith(".fifo"):
            attributes |= {"FifoQueue": "true", "ContentBasedDeduplication": str(cfg.content_based_dedup).lower()}
        with self._guard("resolve the URL of queue", name):
            try:
                url = self.client.get_queue_url(QueueName=name)["QueueUrl"]
            except self._errors.ClientError as exc:
                if error_code(exc) not in MISSING or not cfg.create_queues:
                    raise
                url = self.client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        self._urls[name] = url
        return url

    def _attribute(self, url: str, name: str, target: str) -> str | None:
        return (
            self._call(f"read {name} of queue", target, "get_queue_attributes", QueueUrl=url, AttributeNames=[name])
            .get("Attributes", {})
            .get(name)
        )

    def _dead_letter_queue(self, queue_name: str) -> tuple[str, str]:
        """``(name, url)`` of the DLQ: the ``RedrivePolicy`` target, else the fallback. Resolved once."""
        if (cached := self._dead.get(queue_name)) is None:
            if policy := self._attribute(self._url(queue_name), "RedrivePolicy", queue_name):
                try:
                    _, _, _, _, account, name = json.loads(policy)["deadLetterTargetArn"].split(":")
                except (ValueError, KeyError, TypeError) as exc:
                    raise BindingError(f"SQS queue {queue_name!r} has an unreadable RedrivePolicy {policy!r}") from exc
                cached = (
                    name,
                    self._call(
                        "resolve the RedrivePolicy target",
                        name,
                        "get_queue_url",
                        QueueName=name,
                        QueueOwnerAWSAccountId=account,
                    )["QueueUrl"],
                )
            else:
                name = dead_letter_queue_name(queue_name, self.config.dead_letter_suffix)
                cached = (name, self._url(name, dead=True))
            self._dead[queue_name] = cached
        return cached

    def dead_letter_name(self, queue_name: str) -> str:
        """The DLQ's name: the ``RedrivePolicy`` target if any (this asks SQS once), else the fallback."""
        return self._dead_letter_queue(queue_name)[0]

    def _entry(
        self,
        body: bytes,
        queue_name: str,
        url: str,
        *,
        headers: Mapping[str, Any] | None = None,
        delay: float = 0,
        fresh_dedup: bool = False,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """SendMessage parameters for one body, refused before sending when SQS would refuse them."""
        if not body:
            raise BindingError(f"SQS cannot carry an empty body (queue {queue_name!r})")
        envelope = parse_body(body)[0]
        attributes = message_attributes(envelope) if envelope is not None else {}
        try:
            if NOT_SQS_TEXT.search(text := body.decode("utf-8")):
                raise ValueError("characters SQS does not accept")
        except ValueError:  # UnicodeDecodeError included
            text = base64.b64encode(body).decode("ascii")
            attributes[BODY_ENCODING_ATTRIBUTE] = {"DataType": "String", "StringValue": "base64"}
        for key, value in (headers or {}).items():
            if key in attributes or key == BODY_ENCODING_ATTRIBUTE or value is None or value == "":
                continue  # the projection wins a clash
            if not ATTRIBUTE_NAME.fullmatch(str(key)):
                raise BindingError(f"header {key!r} cannot be an SQS message attribute name")
            attributes[str(key)] = {"DataType": "String", "StringValue": str(value)}
        if len(attributes) > 10:
            raise BindingError(f"SQS allows 10 message attributes, this message has {len(attributes)} (bq-* take 6)")
        entry: dict[str, Any] = {"MessageBody": text} | ({"MessageAttributes": attributes} if attributes else {})
        if (size := entry_size(entry)) > (limit := limit or self.config.max_message_bytes):
            raise BindingError(
                f"message for queue {queue_name!r} is {size} bytes (body + attributes), over the "
                f"limit max_message_bytes={limit}; nothing was sent"
            )
        if queue_name.endswith(".fifo"):
            entry["MessageGroupId"] = self.config.fifo_group_id or queue_name
            meta_id = bq.meta_id_of(envelope) if envelope is not None else ""
            if fresh_dedup:  # a retry or a move is a new send; the original's id would be deduplicated away
                entry["MessageDeduplicationId"] = uuid.uuid4().hex
            elif not self.config.content_based_dedup:
                entry["MessageDeduplicationId"] = (
                    meta_id if DEDUP_ID.fullmatch(meta_id) else hashlib.sha256(body).hexdigest()
                )
        elif delay > 0:
            entry["DelaySeconds"] = whole_seconds(delay, MAX_DELAY_SECONDS, "DelaySeconds")
        return entry

    def _receive(self, queue_name: str, url: str, timeout: float, dead: bool) -> ReceivedMessage | None:
        """One message, long polling (whole seconds, ``wait_time_seconds`` at most per call) until ``timeout``."""
        params: dict[str, Any] = {
            "QueueUrl": url,
            "MaxNumberOfMessages": 1,
            "MessageAttributeNames": ["All"],
            "AttributeNames": ["ApproximateReceiveCount"],
        }
        if self.config.visibility_timeout is not None:
            params["VisibilityTimeout"] = math.ceil(self.config.visibility_timeout)
        deadline = time.monotonic() + max(timeout, 0)
        while True:
            left = deadline - time.monotonic()
            params["WaitTimeSeconds"] = min(math.ceil(left), self.config.wait_time_seconds) if left > 0 else 0
            if messages := self._call("receive from", queue_name, "receive_message", **params).get("Messages"):
                break
            if deadline - time.monotonic() <= 0.01:
                return None
        attributes, body = messages[0].get("MessageAttributes") or {}, messages[0].get("Body", "").encode()
        if attributes.get(BODY_ENCODING_ATTRIBUTE, {}).get("StringValue") == "base64":
            try:
                body = base64.b64decode(body, validate=True)
            except binascii.Error:
                logger.warning("SQS message on %r is marked base64 but is not; kept as it came", queue_name)
        envelope, error, body_attempts = parse_body(body)
        count = (messages[0].get("Attributes") or {}).get("ApproximateReceiveCount")
        return ReceivedMessage(
            body=body,
            queue_name=queue_name,
            envelope=envelope,
            decode_error=error,
            attempts=reconcile_attempts(body_attempts, count),
            delivery_count=receive_count(count),
            headers={
                k: a["StringValue"]
                for k, a in attributes.items()
                if k != BODY_ENCODING_ATTRIBUTE and "StringValue" in a
            },
            receipt=Receipt(url, messages[0]["ReceiptHandle"]),
            from_dead_letter=dead,
        )

    def publish(
        self, body: bytes, queue_name: str, *, headers: Mapping[str, Any] | None = None, delay: float = 0
    ) -> None:
        """SendMessage. :param headers: String MessageAttributes besides the ``bq-*`` projection (which wins a
        clash; SQS allows 10 in all). :param delay: ``DelaySeconds``, rounded up, capped at 900 with a
        warning. FIFO queues have no per-message delay, so a delay there is an error."""
        url = self._url(queue_name)
        if delay > 0 and queue_name.endswith(".fifo"):
            raise BindingError(f"FIFO queue {queue_name!r} has no per-message delay; set the queue's DelaySeconds")
        entry = self._entry(bytes(body), queue_name, url, headers=headers, delay=delay)
        self._call("publish to", queue_name, "send_message", QueueUrl=url, **entry)

    def publish_batch(self, bodies: Sequence[bytes], queue_name: str) -> None:
        """SendMessageBatch, in order, each call at most 10 entries and ``max_message_bytes``. Every body is
        checked first (none is sent when one is refused). ``PublishBatchError.failed`` = the entries SQS
        reported failed, plus all entries of a call that raised and of the calls after it."""
        url, limit = self._url(queue_name), self.config.max_message_bytes
        try:
            entries = [self._entry(bytes(b), queue_name, url) | {"Id": str(i)} for i, b in enumerate(bodies)]
        except BindingError as exc:
            raise PublishBatchError(f"{exc}; none of the {len(bodies)} bodies was sent", range(len(bodies))) from exc
        chunks: list[list[dict[str, Any]]] = []
        for entry in entries:
            if not chunks or len(chunks[-1]) == 10 or sum(map(entry_size, chunks[-1])) + entry_size(entry) > limit:
                chunks.append([])
            chunks[-1].append(entry)
        failed: list[int] = []
        for number, chunk in enumerate(chunks):
            try:
                reply = self._call("publish a batch to", queue_name, "send_message_batch", QueueUrl=url, Entries=chunk)
            except BindingError as exc:
                rest = [int(e["Id"]) for c in chunks[number:] for e in c]
                raise PublishBatchError(
                    f"{exc}; {len(bodies) - len(failed) - len(rest)} of {len(bodies)} bodies were delivered",
                    failed + rest,
                ) from exc
            failed += sorted(int(f["Id"]) for f in reply.get("Failed") or [])
        if failed:
            raise PublishBatchError(f"SQS refused {len(failed)} of {len(bodies)} bodies for {queue_name!r}", failed)

    def reserve(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        """ReceiveMessage; ``timeout`` is rounded up to whole seconds of long polling."""
        return self._receive(queue_name, self._url(queue_name), timeout, dead=False)

    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        return self._receive(queue_name, self._dead_letter_queue(queue_name)[1], timeout, dead=True)

    def ack(self, message: ReceivedMessage) -> None:
        """DeleteMessage. A receipt that expired meanwhile only logs a warning: SQS delivers the message again."""
        receipt = _receipt(message)
        try:
            self._call("delete a message from", receipt.QueueUrl, "delete_message", **receipt._asdict())
        except BindingError as exc:
            if error_code(exc.__cause__) != "ReceiptHandleIsInvalid":
                raise
            logger.warning("SQS receipt on %s expired (delivered again); nothing was deleted", receipt.QueueUrl)

    def release(self, message: ReceivedMessage, delay: float = 0) -> None:
        """Send a copy with ``attempts`` + 1 (``DelaySeconds`` = delay, capped at 900; a fresh deduplication id
        on FIFO), then delete the original. A delayed FIFO release, and a message read from the DLQ, is
        made visible again instead (ChangeMessageVisibility, up to 12 h): SQS cannot delay one FIFO message."""
        receipt = _receipt(message)
        if message.from_dead_letter or (delay > 0 and message.queue_name.endswith(".fifo")):
            seconds = whole_seconds(delay, MAX_VISIBILITY_TIMEOUT, "visibility timeout")
            self._call(
                "change the visibility of a message in",
                receipt.QueueUrl,
                "change_message_visibility",
                **receipt._asdict(),
                VisibilityTimeout=seconds,
            )
            return
        entry = self._entry(
            base.bumped_body(message),
            message.queue_name,
            receipt.QueueUrl,
            headers=_forwarded(message.headers),
            delay=delay,
            fresh_dedup=True,
        )
        self._call("release a message to", message.queue_name, "send_message", QueueUrl=receipt.QueueUrl, **entry)
        self.ack(message)

    def dead_letter(
        self, message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
    ) -> None:
        """Send the annotated envelope (poison: the bytes) to the DLQ, then delete the original."""
        _receipt(message)
        name, url = self._dead_letter_queue(message.queue_name)
        body = base.dead_letter_body(message, reason, error=error, exception=exception)
        entry = self._entry(
            body, name, url, headers=_forwarded(message.headers), fresh_dedup=True, limit=SERVICE_MAX_MESSAGE_BYTES
        )
        self._call("dead-letter a message to", name, "send_message", QueueUrl=url, **entry)
        self.ack(message)

    def _count(self, url: str, target: str) -> int:
        names = ["ApproximateNumberOfMessages"] + (
            ["ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"]
            if self.config.include_in_flight_in_depth
            else []
        )
        reply = self._call("count the messages of", target, "get_queue_attributes", QueueUrl=url, AttributeNames=names)
        return sum(int(reply.get("Attributes", {}).get(n, 0)) for n in names)

    def depth(self, queue_name: str) -> int:
        """``ApproximateNumberOfMessages`` (+ in-flight and delayed when configured): one call, and on AWS
        eventually consistent (it may lag a publish or a receive by a few seconds)."""
        return self._count(self._url(queue_name), queue_name)

    def dead_letter_depth(self, queue_name: str) -> int:
        name, url = self._dead_letter_queue(queue_name)
        return self._count(url, name)

    def ping(self) -> None:
        """ListQueues once: proves the endpoint, the credentials and the sqs:ListQueues right."""
        self._call(
            "list queues at", redact_url(self.config.endpoint_url or self.config.region_name or "sqs"), "list_queues",
            MaxResults=1
        )

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None


def _receipt(message: ReceivedMessage) -> Receipt:
    if not isinstance(message.receipt, Receipt):
        raise BindingError(f"this message was not received by an SQS binding (receipt {message.receipt!r})")
    return message.receipt


def _forwarded(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Headers a copy keeps: the caller's, not the ``bq-*`` projection (recomputed from the new body)."""
    return {k: v for k, v in headers.items() if not k.startswith("bq-")}
