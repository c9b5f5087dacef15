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
* Dead letters go to the ``RedrivePolicy`` target, else ``<queue><dead_letter_suffix>``. Every read of
  dead letters (count, drain, redrive) takes, in order, the ``RedrivePolicy`` target, the written queue and
  ``dead_letter_sources`` (default ``-failed``, ``-dlq``: the official SDKs' workers write ``<queue>-dlq``).
  A read never creates a queue; a missing source is empty. Counts are approximate.
* FIFO dead-letter queues are read ten messages per receive (see :meth:`SqsBinding.reserve_dead_letters`
  for what SQS's message groups mean for a drain).
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
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ...core import envelope as bq
from .. import base, bodies
from ..base import Binding, BindingError, PublishBatchError
from ..message import ReceivedMessage, parse_body
from ..redaction import redact, scrub, url_secrets
from .config import SqsConfig
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
    dead_letter_queue_name,
    dead_letter_source_names,
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
    "dead_letter_queue_name",
    "message_attributes",
    "reconcile_attempts",
]

logger = logging.getLogger(__name__)
#: SQS's visibility timeout for a queue created without one.
_SQS_DEFAULT_VISIBILITY = 30.0

#: Seconds a queue found missing is taken as missing before a read asks SQS again (a drain reads its sources
#: many times a run; a DLQ that appears later is found within this time).
MISSING_TTL = 30.0
#: Most messages one ReceiveMessage / DeleteMessageBatch call handles (SQS's cap).
RECEIVE_MAX = 10
#: How many ``meta.id`` values read from dead-letter queues this process remembers (see :func:`_redriven`).
REDRIVEN_MEMORY = 100_000
_redriven_ids: OrderedDict[str, None] = OrderedDict()
_redriven_lock = threading.Lock()


def _remember_dead_letter_id(meta_id: str) -> None:
    """Note a ``meta.id`` read from a dead-letter queue: a FIFO publish of it is then a redrive (:func:`_redriven`)."""
    if meta_id:
        with _redriven_lock:
            _redriven_ids[meta_id] = None
            _redriven_ids.move_to_end(meta_id)
            while len(_redriven_ids) > REDRIVEN_MEMORY:
                _redriven_ids.popitem(last=False)


def _redriven(meta_id: str) -> bool:
    """Whether ``meta_id`` was read from a dead-letter queue by this process. A FIFO queue drops a send whose
    deduplication id it saw in the last 5 minutes, and accepts the call as if it had stored it: a redrive of
    a message dead-lettered minutes after its publish, sent with ``meta.id`` as the id, would vanish while
    its DLQ copy is deleted. Such a send gets a fresh id instead; the replay ledger, not SQS, keeps a
    redrive from publishing twice."""
    with _redriven_lock:
        return meta_id in _redriven_ids


class SqsBinding(Binding):
    """Queues as SQS queues (see the module docstring). The DLQ cannot be browsed: SQS has no peek, and a
    receive hides messages and raises their receive counts (which can trip a RedrivePolicy), so a browse
    would change what it reads; drain it with :meth:`reserve_dead_letter` + :meth:`ack`."""

    name = "sqs"
    client_loggers = ("boto3", "botocore")
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
        self._missing: dict[str, float] = {}  # queue name -> when it was found missing (monotonic)
        self._policies: dict[str, tuple[str, str] | None] = {}  # queue -> its RedrivePolicy (target, account)
        self._visibility: dict[str, float] = {}  # queue -> its VisibilityTimeout attribute, in seconds

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
            text = scrub(str(exc), [self.config.aws_secret_access_key or "", self.config.aws_session_token or ""])
            text = scrub(text, url_secrets(self.config.endpoint_url))  # userinfo and secret query parameters
            names = [error_code(exc)] + [kind.__name__ for kind in type(exc).__mro__]
            hint = next((HINTS[n] for n in names if n in HINTS), "SQS refused the request")
            endpoint, region = self.config.endpoint_url, self.config.region_name
            where = redact(endpoint) if endpoint else f"region {region or '(from the AWS config)'}"
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
        _check_name(name)
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
        self._missing.pop(name, None)
        self._urls[name] = url
        return url

    def _find(self, name: str, owner: str | None = None) -> str | None:
        """The URL of queue ``name`` if it exists, else ``None``, never creating it: a read (a count, a drain)
        that created a dead-letter queue would leave an empty one beside the queue holding the dead letters.
        A miss is remembered for :data:`MISSING_TTL` seconds. :param owner: the owning account (a
        ``RedrivePolicy`` target may live in another one)."""
        if (url := self._urls.get(name)) is not None:
            return url
        if (since := self._missing.get(name)) is not None and time.monotonic() - since < MISSING_TTL:
            return None
        _check_name(name)
        params = {"QueueName": name} | ({"QueueOwnerAWSAccountId": owner} if owner else {})
        with self._guard("resolve the URL of queue", name):
            try:
                url = self.client.get_queue_url(**params)["QueueUrl"]
            except self._errors.ClientError as exc:
                if error_code(exc) not in MISSING:
                    raise
                self._missing[name] = time.monotonic()
                return None
        self._missing.pop(name, None)
        self._urls[name] = url
        return url

    def _forget(self, name: str) -> None:
        """Drop a cached URL whose queue turned out to be gone (deleted since it was found)."""
        self._urls.pop(name, None)
        self._missing[name] = time.monotonic()

    def _attribute(self, url: str, name: str, target: str) -> str | None:
        return (
            self._call(f"read {name} of queue", target, "get_queue_attributes", QueueUrl=url, AttributeNames=[name])
            .get("Attributes", {})
            .get(name)
        )

    def _redrive_target(self, queue_name: str) -> tuple[str, str] | None:
        """``(name, account)`` of the queue's ``RedrivePolicy`` target, or ``None``. Asked once per binding for
        a queue that exists; a missing queue has no policy yet (and is not created by asking)."""
        if queue_name in self._policies:
            return self._policies[queue_name]
        url = self._find(queue_name)
        if url is None:
            return None
        target: tuple[str, str] | None = None
        if policy := self._attribute(url, "RedrivePolicy", queue_name):
            try:
                _, _, _, _, account, name = json.loads(policy)["deadLetterTargetArn"].split(":")
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise BindingError(f"SQS queue {queue_name!r} has an unreadable RedrivePolicy {policy!r}") from exc
            target = (name, account)
        self._policies[queue_name] = target
        return target

    def dead_letter_name(self, queue_name: str) -> str:
        """Where dead letters are written: the ``RedrivePolicy`` target if any (this asks SQS once), else
        ``<queue><dead_letter_suffix>``. Naming it creates nothing."""
        target = self._redrive_target(queue_name)
        return target[0] if target else dead_letter_queue_name(queue_name, self.config.dead_letter_suffix)

    def dead_letter_sources(self, queue_name: str) -> list[str]:
        """Every DLQ a read takes, in order: the ``RedrivePolicy`` target, the written fallback
        ``<queue><dead_letter_suffix>``, then ``dead_letter_sources`` (default ``-failed``, ``-dlq``), each
        once. The official SDKs' workers write ``<queue>-dlq`` where we write ``<queue>-failed``; a count or a
        drain that looked at one of them would miss half the dead letters of a mixed fleet."""
        target = self._redrive_target(queue_name)
        names = [target[0]] if target else []
        names.append(dead_letter_queue_name(queue_name, self.config.dead_letter_suffix))
        names += dead_letter_source_names(queue_name, Binding.source_entries(self.config.dead_letter_sources))
        return list(dict.fromkeys(names))

    def dead_letters_hidden_while_held(self, queue_name: str) -> bool:
        """Whether dead letters this binding holds unsettled can hide the rest of ``queue_name``'s DLQ from the
        next reservation: true for a FIFO queue (its DLQs are FIFO, and SQS returns nothing more of a message
        group while one of it is in flight). A drain or redrive then settles what it holds before it takes an
        empty reservation for an empty DLQ (see :meth:`reserve_dead_letters`)."""
        return queue_name.endswith(".fifo")

    def _dead_letter_urls(self, queue_name: str) -> list[tuple[str, str]]:
        """``(name, url)`` of each source of :meth:`dead_letter_sources` that exists, in order."""
        target = self._redrive_target(queue_name)
        out = []
        for name in self.dead_letter_sources(queue_name):
            url = self._find(name, target[1] if target and name == target[0] else None)
            if url is not None:
                out.append((name, url))
        return out

    def _written_dead_letter_queue(self, queue_name: str) -> tuple[str, str]:
        """``(name, url)`` dead letters are written to: the ``RedrivePolicy`` target (which must exist), else
        the fallback, created when ``create_queues``."""
        if (target := self._redrive_target(queue_name)) is not None:
            name, account = target
            if (url := self._urls.get(name)) is None:
                url = self._call(
                    "resolve the RedrivePolicy target", name, "get_queue_url", QueueName=name,
                    QueueOwnerAWSAccountId=account,
                )["QueueUrl"]
                self._urls[name] = url
            return name, url
        name = dead_letter_queue_name(queue_name, self.config.dead_letter_suffix)
        return name, self._url(name, dead=True)

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
            # A retry or a move is a new send, and so is a redrive (see _redriven): with the original's id,
            # or the hash of the same bytes, SQS would deduplicate it away (5 minutes).
            if fresh_dedup or _redriven(meta_id):
                entry["MessageDeduplicationId"] = uuid.uuid4().hex
            elif not self.config.content_based_dedup:
                entry["MessageDeduplicationId"] = (
                    meta_id if DEDUP_ID.fullmatch(meta_id) else hashlib.sha256(body).hexdigest()
                )
        elif delay > 0:
            entry["DelaySeconds"] = whole_seconds(delay, MAX_DELAY_SECONDS, "DelaySeconds")
        return entry

    def _receive_batch(
        self, queue_name: str, url: str, count: int, wait: int, source: str | None = None
    ) -> list[ReceivedMessage]:
        """One ReceiveMessage of up to ``count`` (at most 10) messages, waiting up to ``wait`` whole seconds.

        :param source: the dead-letter queue read, for a DLQ read; such a queue deleted since it was found
            counts as empty rather than failing the drain.
        """
        params: dict[str, Any] = {
            "QueueUrl": url,
            "MaxNumberOfMessages": max(1, min(count, RECEIVE_MAX)),
            "MessageAttributeNames": ["All"],
            "AttributeNames": ["ApproximateReceiveCount"],
            "WaitTimeSeconds": wait,
        }
        if self.config.visibility_timeout is not None:
            params["VisibilityTimeout"] = math.ceil(self.config.visibility_timeout)
        try:
            reply = self._call("receive from", source or queue_name, "receive_message", **params)
        except BindingError as exc:
            if source is None or error_code(exc.__cause__) not in MISSING:
                raise
            self._forget(source)
            return []
        return [self._message(raw, queue_name, url, source) for raw in reply.get("Messages") or []]

    def _message(self, raw: Mapping[str, Any], queue_name: str, url: str, source: str | None) -> ReceivedMessage:
        """A received SQS message as a :class:`ReceivedMessage` (a base64-marked body decoded, attempts
        reconciled with ``ApproximateReceiveCount``; the body itself is never rewritten)."""
        attributes, body = raw.get("MessageAttributes") or {}, raw.get("Body", "").encode()
        if attributes.get(BODY_ENCODING_ATTRIBUTE, {}).get("StringValue") == "base64":
            try:
                body = base64.b64decode(body, validate=True)
            except binascii.Error:
                logger.warning("SQS message on %r is marked base64 but is not; kept as it came", queue_name)
        envelope, error, body_attempts = parse_body(body, self.decode_limit)
        count = (raw.get("Attributes") or {}).get("ApproximateReceiveCount")
        if source is not None and envelope is not None:
            _remember_dead_letter_id(bq.meta_id_of(envelope))
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
            receipt=Receipt(url, raw["ReceiptHandle"]),
            from_dead_letter=source is not None,
            dead_letter_source=source,
        )

    def _receive(self, queue_name: str, url: str, timeout: float) -> ReceivedMessage | None:
        """One message, long polling (whole seconds, ``wait_time_seconds`` at most per call) until ``timeout``."""
        deadline = time.monotonic() + max(timeout, 0)
        while True:
            left = deadline - time.monotonic()
            wait = min(math.ceil(left), self.config.wait_time_seconds) if left > 0 else 0
            if messages := self._receive_batch(queue_name, url, 1, wait):
                return messages[0]
            if deadline - time.monotonic() <= 0.01:
                return None

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
        return self._receive(queue_name, self._url(queue_name), timeout)

    def reserve_many(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """ReceiveMessage of up to ten at a time (SQS's most), long polling up to ``timeout`` (whole seconds) for
        the first, then taking what else is there without waiting; settle them with :meth:`ack_many`
        (DeleteMessageBatch, ten per call)."""
        if limit <= 0:
            return []
        url, out = self._url(queue_name), list[ReceivedMessage]()
        deadline = time.monotonic() + max(timeout, 0)
        while len(out) < limit:
            left = deadline - time.monotonic()
            wait = min(math.ceil(left), self.config.wait_time_seconds) if left > 0 and not out else 0
            batch = self._receive_batch(queue_name, url, limit - len(out), wait)
            out += batch
            if not batch and (out or deadline - time.monotonic() <= 0.01):
                break
        return out

    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        """The next dead letter of any source (:meth:`dead_letter_sources`, in order); see
        :meth:`reserve_dead_letters`."""
        messages = self.reserve_dead_letters(queue_name, 1, timeout)
        return messages[0] if messages else None

    def reserve_dead_letters(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """Up to ``limit`` dead letters, source after source (:meth:`dead_letter_sources`), ten per
        ReceiveMessage; each carries its source in ``dead_letter_source``. Missing sources are skipped (never
        created). ``timeout`` is waited for the first message only, long polling the sources in turn.

        FIFO dead-letter queues (both SDKs write every dead letter of a queue into one message group): SQS
        returns no further message of a group while one of it is in flight ("If the message is received and
        not deleted, messages with the same MessageGroupId are not returned until the visibility timeout
        expires", FIFO delivery logic, Amazon SQS Developer Guide), but one ReceiveMessage may return up to
        ten messages of the same group, in order ("These messages retain their FIFO order and can have the
        same message group ID"). So each call takes whole receives of ten: receiving one at a time held one
        message per group and hid the rest of the group until that one was settled. A group longer than what
        the caller holds unsettled (a drain or redrive acks a batch only once it is durable or published)
        continues after the caller's ack: the next call then finds the group's next messages. Deleting before
        the caller made them durable would free the group sooner, and lose them on a crash.
        """
        if limit <= 0:
            return []
        sources = self._dead_letter_urls(queue_name)
        out: list[ReceivedMessage] = []
        deadline = time.monotonic() + max(timeout, 0)
        wait = 0
        while True:
            for name, url in sources:
                while len(out) < limit:
                    batch = self._receive_batch(queue_name, url, limit - len(out), 0 if out else wait, name)
                    if not batch:
                        break
                    out += batch
                if len(out) >= limit:
                    break
            left = deadline - time.monotonic()
            if out or left <= 0.01:
                return out
            if not sources:  # nothing to long-poll: wait out the timeout, then look for the queues again
                time.sleep(min(left, 1.0))
                sources = self._dead_letter_urls(queue_name)
                continue
            wait = max(1, min(math.ceil(left / len(sources)), self.config.wait_time_seconds))

    def ack(self, message: ReceivedMessage) -> None:
        """DeleteMessage. A receipt that expired meanwhile only logs a warning: SQS delivers the message again."""
        receipt = _receipt(message)
        try:
            self._call("delete a message from", receipt.QueueUrl, "delete_message", **receipt._asdict())
        except BindingError as exc:
            if error_code(exc.__cause__) != "ReceiptHandleIsInvalid":
                raise
            logger.warning("SQS receipt on %s expired (delivered again); nothing was deleted", receipt.QueueUrl)

    def ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        """DeleteMessageBatch, ten receipts a call, per queue in order: a drain's or redrive's acks in a tenth
        of the round trips. An expired receipt only logs a warning, as in :meth:`ack`; any other refused entry
        raises (settling again is harmless, so the caller may retry or release the batch)."""
        by_url: dict[str, list[Receipt]] = {}
        for message in messages:
            receipt = _receipt(message)
            by_url.setdefault(receipt.QueueUrl, []).append(receipt)
        for url, receipts in by_url.items():
            for start in range(0, len(receipts), RECEIVE_MAX):
                chunk = receipts[start:start + RECEIVE_MAX]
                entries = [{"Id": str(i), "ReceiptHandle": r.ReceiptHandle} for i, r in enumerate(chunk)]
                reply = self._call("delete messages from", url, "delete_message_batch", QueueUrl=url, Entries=entries)
                failed = reply.get("Failed") or []
                if expired := [f for f in failed if f.get("Code") == "ReceiptHandleIsInvalid"]:
                    logger.warning("%d SQS receipts on %s expired (delivered again); they were not deleted",
                                   len(expired), url)
                if refused := [f for f in failed if f.get("Code") != "ReceiptHandleIsInvalid"]:
                    raise BindingError(
                        f"SQS {url}: deleting {len(refused)} of {len(chunk)} messages failed "
                        f"({refused[0].get('Code')}: {refused[0].get('Message')})"
                    )

    def reservation_seconds(self, queue_name: str) -> float | None:
        """The ``visibility_timeout`` sent with each receive; without one, the queue's own ``VisibilityTimeout``
        (asked once per queue; SQS's default of 30 s while the queue is not found)."""
        if self.config.visibility_timeout is not None:
            return float(math.ceil(self.config.visibility_timeout))
        seconds = self._visibility.get(queue_name)
        if seconds is None:
            url = self._find(queue_name)
            value = None if url is None else self._attribute(url, "VisibilityTimeout", queue_name)
            if value is None:
                return _SQS_DEFAULT_VISIBILITY
            seconds = self._visibility[queue_name] = float(value)
        return seconds

    def hand_back(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """Make each message visible again after ``delay`` (ChangeMessageVisibility, whole seconds, up to 12 h): the
        very message, bytes and attributes unchanged. SQS counts every receive, so each hand-back moves
        ``ApproximateReceiveCount`` and, with a redrive policy, towards ``maxReceiveCount``."""
        seconds = whole_seconds(delay, MAX_VISIBILITY_TIMEOUT, "visibility timeout")
        for message in messages:
            receipt = _receipt(message)
            try:
                self._call("hand back a message to", receipt.QueueUrl, "change_message_visibility",
                           **receipt._asdict(), VisibilityTimeout=seconds)
            except BindingError as exc:
                if error_code(exc.__cause__) not in ("ReceiptHandleIsInvalid", "MessageNotInflight"):
                    raise
                logger.warning("SQS receipt on %s is no longer held (deleted, or expired and delivered again); "
                               "nothing was changed", receipt.QueueUrl)

    def hold(self, messages: Sequence[ReceivedMessage], seconds: float) -> list[str]:
        """Extend each message's visibility to ``seconds`` (at most 12 h); a receipt is the queue URL and the
        receipt handle, on two lines."""
        timeout = whole_seconds(seconds, MAX_VISIBILITY_TIMEOUT, "visibility timeout")
        out = []
        for message in messages:
            receipt = _receipt(message)
            self._call("hold a message of", receipt.QueueUrl, "change_message_visibility", **receipt._asdict(),
                       VisibilityTimeout=timeout)
            out.append(f"{receipt.QueueUrl}\n{receipt.ReceiptHandle}")
        return out

    def settle_held(self, receipts: Sequence[str], *, succeeded: bool) -> None:
        """Delete each message (``succeeded``) or make it visible again at once; a receipt no longer valid (the
        message was deleted, or handed out again) only logs a warning."""
        for text in receipts:
            url, _, handle = text.partition("\n")
            if not url or not handle:
                raise BindingError(f"{text!r} is not a receipt of a held SQS message")
            try:
                if succeeded:
                    self._call("delete a message from", url, "delete_message", QueueUrl=url, ReceiptHandle=handle)
                else:
                    self._call("hand back a message to", url, "change_message_visibility", QueueUrl=url,
                               ReceiptHandle=handle, VisibilityTimeout=0)
            except BindingError as exc:
                if error_code(exc.__cause__) not in ("ReceiptHandleIsInvalid", "MessageNotInflight"):
                    raise
                logger.warning("SQS receipt on %s is no longer held; nothing was changed", url)

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
            bodies.bumped_body(message),
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
        """Send the annotated envelope (poison: the bytes) to the written DLQ (:meth:`dead_letter_name`), then
        delete the original."""
        _receipt(message)
        name, url = self._written_dead_letter_queue(message.queue_name)
        body = bodies.dead_letter_body(message, reason, error=error, exception=exception)
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
        """The sum of :meth:`depth`'s count over the sources that exist (one call each; a missing source is
        0 and is not created)."""
        total = 0
        for name, url in self._dead_letter_urls(queue_name):
            try:
                total += self._count(url, name)
            except BindingError as exc:
                if error_code(exc.__cause__) not in MISSING:
                    raise
                self._forget(name)
        return total

    def ping(self) -> None:
        """ListQueues once: proves the endpoint, the credentials and the sqs:ListQueues right."""
        self._call(
            "list queues at", redact(self.config.endpoint_url or self.config.region_name or "sqs"), "list_queues",
            MaxResults=1
        )

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None


def _check_name(name: str) -> None:
    """Refuse a name SQS cannot hold before any call, saying why."""
    if not (len(name) <= 80 and NAME.fullmatch(name.removesuffix(".fifo"))):
        raise BindingError(
            f"{name!r} is not a valid SQS queue name: 1-80 letters, digits, '-' or '_', with an "
            "optional '.fifo' suffix ('.' is illegal anywhere else)"
        )


def _receipt(message: ReceivedMessage) -> Receipt:
    if not isinstance(message.receipt, Receipt):
        raise BindingError(f"this message was not received by an SQS binding (receipt {message.receipt!r})")
    return message.receipt


def _forwarded(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Headers a copy keeps: the caller's, not the ``bq-*`` projection (recomputed from the new body)."""
    return {k: v for k, v in headers.items() if not k.startswith("bq-")}
