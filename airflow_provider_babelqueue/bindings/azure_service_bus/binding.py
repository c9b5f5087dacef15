"""Azure Service Bus binding: the envelope is the message body, native fields and ``bq-*`` properties a copy.

Wire facts (spec/broker-bindings.md §4, conformance block ``asb``): subject = URN, correlation_id = trace_id,
message_id = meta.id, content_type ``application/json``, application properties ``bq-schema-version`` (int),
``bq-source-lang`` (str), ``bq-created-at`` (int ms); attempts = max(body attempts, DeliveryCount - 1), where
DeliveryCount is Service Bus's 1-based count (the Python SDK shows the 0-based AMQP header; we add 1).
Choices (docs/connections/azure-service-bus.md says more):

* Receives are PeekLock. ``ack`` completes. ``release`` sends a copy with attempts + 1 (a delay becomes
  ``scheduled_enqueue_time_utc``), then completes the original, so the body counts attempts as on every
  binding; a message read from a dead-letter queue is abandoned instead (Service Bus cannot delay that).
* ``dead_letter`` is native: the message moves to ``<queue>/$DeadLetterQueue`` with DeadLetterReason = the
  reason and DeadLetterErrorDescription = JSON of error, exception, failed_at and attempts. Service Bus keeps
  the body as it was, so every DLQ read (reserve, browse) hands out the body with a ``dead_letter`` block,
  rebuilt from those properties (or from the DeliveryCount for foreign dead letters). Every DLQ read takes each
  of :meth:`AzureServiceBusBinding.dead_letter_sources` in order: by default the sub-queue and the SDKs' apps'
  plain ``<queue>.dlq`` queue (absent: empty, never created by a read). The plain queue is written instead with
  ``native_dead_letter=False``.
* ``depth`` / ``dead_letter_depth`` are one management call (``get_queue_runtime_properties``, HTTPS, Manage
  rights): ActiveMessageCount counts peek-locked messages too; scheduled ones are not counted.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ...core import envelope as bq
from ..base import Binding, BindingError, NotSupportedError, PublishBatchError, require_extra
from ..bodies import bumped_body, dead_letter_body
from ..message import ReceivedMessage
from .config import AzureServiceBusConfig
from .wire import (
    _HINTS,
    DEAD_LETTER_SUBQUEUE,
    MAX_DEAD_LETTER_TEXT,
    Receipt,
    application_properties,
    dead_letter_description,
    forwarded,
    message_fields,
    native_dead_letter_body,
    outgoing_message,
    parse_dead_letter_description,
    receipt_of,
    received_message,
    reconcile_attempts,
    service_delivery_count,
)

__all__ = [
    "DEAD_LETTER_SUBQUEUE",
    "AzureServiceBusBinding",
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

logger = logging.getLogger(__name__)

_SLICE = 1.0  # longest single receive: other threads' settles on the same receiver wait at most this long
#: Seconds a plain dead-letter queue found missing is skipped before it is looked for again.
_MISSING_RECHECK = 60.0
#: Service Bus's lock duration for a queue created without one; what a consumer assumes before its first receive.
_DEFAULT_LOCK_SECONDS = 60.0


class AzureServiceBusBinding(Binding):
    """Queues of one Service Bus namespace (see the module docstring). The DLQ can be browsed: a Service Bus
    peek reads without locking, removing or counting a delivery."""

    name = "azure-service-bus"
    held_reservations_note = "a message lock belongs to the receiver that received it (the triggerer's)"
    client_loggers = ("azure", "uamqp")
    carries_headers = True
    can_browse = True

    def __init__(self, config: AzureServiceBusConfig, client: Any = None, admin_client: Any = None) -> None:
        """:param client: a ready ``ServiceBusClient`` (the test seam, or to share one); otherwise one is built on
        first use. :param admin_client: likewise a ``ServiceBusAdministrationClient`` (counts, creating
        queues). :meth:`close` leaves injected clients open."""
        self.config = config
        self._sb = require_extra("azure.servicebus", "azure")
        self._long = require_extra("azure.servicebus._pyamqp.utils", "azure").amqp_long_value
        self._client, self._admin = client, admin_client
        self._owns = (client is None, admin_client is None)
        self._credential: Any = None
        self._lock = threading.Lock()  # guards the caches; each sender/receiver has its own lock
        self._senders: dict[str, tuple[Any, threading.Lock]] = {}
        self._receivers: dict[str, tuple[Any, threading.Lock]] = {}
        self._ensured: set[str] = set()
        self._lock_seconds: dict[str, float] = {}  # queue -> the lock left at its last receive
        #: Plain dead-letter queues found absent (read as empty) → when; looked up again after a while.
        self._missing: dict[str, float] = {}

    # ---------------------------------------------------------------------------------------- clients

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.config.connection_verify:
            options["connection_verify"] = self.config.connection_verify
        return options

    def _identity(self) -> Any:
        if self._credential is None:
            self._credential = require_extra("azure.identity", "azure").DefaultAzureCredential()
        return self._credential

    def _built(self, attribute: str, what: str, kind: Any, **options: Any) -> Any:
        """The client in ``attribute``, built on first use from the connection string or the namespace."""
        cfg = self.config
        with self._lock:
            if getattr(self, attribute) is None:
                with self._guard(f"connect to {what}", cfg.namespace, ValueError):
                    setattr(self, attribute, kind.from_connection_string(cfg.connection_string, **options)
                            if cfg.connection_string
                            else kind(cfg.fully_qualified_namespace, self._identity(), **options))
        return getattr(self, attribute)

    @property
    def client(self) -> Any:
        options = self._options()
        if self.config.use_websockets:
            options["transport_type"] = self._sb.TransportType.AmqpOverWebsocket
        return self._built("_client", "the namespace", self._sb.ServiceBusClient, **options)

    @property
    def admin(self) -> Any:
        kind = require_extra("azure.servicebus.management", "azure").ServiceBusAdministrationClient
        return self._built("_admin", "the management API of", kind, **self._options())

    def _outgoing(self, body: bytes, headers: Mapping[str, Any] | None = None, delay: float = 0, **more: Any) -> Any:
        return outgoing_message(self._sb.ServiceBusMessage, self._long, body, headers, delay, **more)

    @contextmanager
    def _guard(self, action: str, target: str, *also: type[BaseException]) -> Iterator[None]:
        """Turn an SDK error into a :class:`BindingError` saying where, what failed and what to check."""
        core = require_extra("azure.core.exceptions", "azure")
        try:
            yield
        except (self._sb.exceptions.ServiceBusError, core.AzureError, *also) as exc:
            from ..redaction import scrub, url_secrets

            text = re.sub(r"(?i)(SharedAccessKey|SharedAccessSignature|sig)=[^;&\s]+", r"\1=***", str(exc))
            text = scrub(text, url_secrets(self.config.connection_string))
            names = [kind.__name__ for kind in type(exc).__mro__]
            hint = next((_HINTS[n] for n in names if n in _HINTS), "Service Bus refused the request")
            raise BindingError(
                f"Service Bus {self.config.namespace}: {action} {target!r} failed: {hint} ({type(exc).__name__}: "
                f"{text})"
            ) from exc

    @staticmethod
    def _caused_by(exc: BaseException, *names: str) -> bool:
        return any(kind.__name__ in names for kind in type(exc.__cause__).__mro__)

    def _ensure(self, queue: str) -> None:
        """Create the queue once when ``create_queues`` (an existing one is used as it is)."""
        if not self.config.create_queues or not queue or queue in self._ensured:
            return
        options: dict[str, Any] = {}
        if self.config.lock_duration is not None:
            options["lock_duration"] = dt.timedelta(seconds=self.config.lock_duration)
        if self.config.max_delivery_count is not None:
            options["max_delivery_count"] = self.config.max_delivery_count
        core = require_extra("azure.core.exceptions", "azure")
        with self._guard("create queue", queue):
            try:
                self.admin.create_queue(queue, **options)
            except core.ResourceExistsError:
                pass
        self._ensured.add(queue)

    def _plain(self, queue: str) -> str:
        return f"{queue}{self.config.dead_letter_queue_suffix}"

    def _handler(self, cache: dict[str, Any], key: str, queue: str, open_: Any) -> tuple[Any, threading.Lock]:
        """A cached sender/receiver, its link opened now (a receive's wait budget would also bound opening it)."""
        if (entry := cache.get(key)) is None:
            self._ensure(queue)
            with self._guard("open a link to", key):
                handler = open_()
                handler.__enter__()
            with self._lock:
                entry = cache.setdefault(key, (handler, threading.Lock()))
            if entry[0] is not handler:
                handler.close()
        return entry

    def _sender(self, queue: str) -> tuple[Any, threading.Lock]:
        return self._handler(self._senders, queue, queue, lambda: self.client.get_queue_sender(queue))

    @staticmethod
    def _native(name: str) -> bool:
        """Whether a dead-letter source name is a queue's ``$DeadLetterQueue`` sub-queue (else a plain queue)."""
        return name.endswith(f"/{DEAD_LETTER_SUBQUEUE}")

    def _receiver(self, queue: str, source: str) -> tuple[str, Any, threading.Lock]:
        """The PeekLock receiver of ``source``: ``"queue"`` (the queue itself) or one of the queue's dead-letter
        sources. Only the queue itself, whose sub-queue a native source is, and the plain DLQ we write are
        created (with ``create_queues``): a read never creates another DLQ."""
        if source == "queue":
            name, sub, ensured = queue, None, queue
        elif self._native(source):
            name, sub = source.removesuffix(f"/{DEAD_LETTER_SUBQUEUE}"), self._sb.ServiceBusSubQueue.DEAD_LETTER
            ensured = name
        else:
            name, sub, ensured = source, None, source if source == self.dead_letter_name(queue) else ""
        key = queue if source == "queue" else source
        return (key, *self._handler(self._receivers, key, ensured, lambda: self.client.get_queue_receiver(
            name, sub_queue=sub, prefetch_count=0)))

    def _take(self, queue: str, source: str, limit: int, timeout: float) -> list[ReceivedMessage]:
        """Up to ``limit`` messages, waiting up to ``timeout`` (at least ``min_receive_wait``) for the first.

        Waits in slices so other threads can settle on the same receiver meanwhile. A message whose lock
        expired while it sat in the SDK's buffer is dropped: Service Bus hands it out again anyway."""
        started = time.monotonic()
        deadline = started + max(timeout, self.config.min_receive_wait)
        dead = source != "queue"
        with self._absent(source):
            key, receiver, lock = self._receiver(queue, source)
            while True:
                wait = min(max(deadline - time.monotonic(), 0.01), _SLICE)
                with lock, self._guard("receive from", key):
                    got = receiver.receive_messages(max_message_count=limit, max_wait_time=wait)
                now = dt.datetime.now(dt.UTC)
                live = [m for m in got if m.locked_until_utc is None or m.locked_until_utc > now]
                locks = [m.locked_until_utc for m in live if m.locked_until_utc is not None]
                if locks and not dead:  # a lock starts when the SDK takes the message, which can be earlier
                    self._lock_seconds[queue] = (min(locks) - now).total_seconds() + time.monotonic() - started
                if live or time.monotonic() >= deadline:
                    return [received_message(m, queue, dead, Receipt(key, m), source, self.decode_limit)
                            for m in live]
        return []

    @contextmanager
    def _absent(self, source: str) -> Iterator[None]:
        """A plain dead-letter queue that does not exist reads as empty (said at DEBUG: with the default sources
        that is the usual case); anything else raises."""
        try:
            yield
        except BindingError as exc:
            if source == "queue" or self._native(source) or not self._caused_by(exc, "MessagingEntityNotFoundError"):
                raise
            logger.debug("plain dead-letter queue %r does not exist; read as empty", source)
            self._missing[source] = time.monotonic()
            with self._lock:
                handler = self._receivers.pop(source, (None,))[0]
            if handler is not None:
                handler.close()

    def dead_letter_sources(self, queue_name: str) -> list[str]:
        """The written DLQ, then :attr:`AzureServiceBusConfig.dead_letter_sources` (by default
        ``<queue>/$DeadLetterQueue`` and the plain ``<queue>.dlq``), then the plain ``dead_letter_queue_suffix``
        queue when one is set."""
        entries = self.config.dead_letter_sources
        assert isinstance(entries, tuple)  # normalised by AzureServiceBusConfig
        suffix = self.config.dead_letter_queue_suffix
        return self.named_dead_letter_sources(queue_name, [*entries, *([suffix] if suffix else [])])

    def _sources(self, queue: str) -> list[str]:
        """The dead-letter sources to read now: a plain queue found missing is skipped for a minute."""
        now = time.monotonic()
        return [source for source in self.dead_letter_sources(queue)
                if now - self._missing.get(source, -math.inf) >= _MISSING_RECHECK]

    def _settle(self, message: ReceivedMessage, action: str, **extra: Any) -> None:
        receipt = receipt_of(message)
        if (entry := self._receivers.get(receipt.key)) is None:
            raise BindingError(f"the receiver that reserved this message from {receipt.key!r} was closed")
        receiver, lock = entry
        settled = self._sb.exceptions.MessageAlreadySettled
        with lock, self._guard(f"{action.replace('_', ' ')} on", receipt.key, settled):
            getattr(receiver, action)(receipt.message, **extra)

    # ------------------------------------------------------------------------------------- protocol

    def publish(
        self, body: bytes, queue_name: str, *, headers: Mapping[str, Any] | None = None, delay: float = 0
    ) -> None:
        """One send. :param headers: extra application properties (str, numbers, bool, bytes; anything else as
        text). :param delay: seconds, as ``scheduled_enqueue_time_utc`` (Service Bus holds it until then)."""
        sender, lock = self._sender(queue_name)  # first: opening the link takes a while, then the delay starts
        message = self._outgoing(bytes(body), headers, delay)
        with lock, self._guard("publish to", queue_name):
            sender.send_messages(message)

    def publish_batch(self, bodies: Sequence[bytes], queue_name: str) -> None:
        """``ServiceBusMessageBatch`` sends, in order, each as large as the link's max message size allows.
        Every body is fitted first (none is sent when one can never fit). ``PublishBatchError.failed`` = the
        bodies of the batch whose send raised and of the batches after it."""
        bodies = [bytes(b) for b in bodies]
        if not bodies:
            return
        sender, lock = self._sender(queue_name)
        too_big = self._sb.exceptions.MessageSizeExceededError
        batches: list[tuple[Any, list[int]]] = []
        with lock:
            for index, body in enumerate(bodies):
                message = self._outgoing(body)
                for attempt in range(2):
                    if attempt or not batches:
                        with self._guard("prepare a batch for", queue_name):
                            batches.append((sender.create_message_batch(), []))
                    try:
                        batches[-1][0].add_message(message)
                    except too_big:
                        if attempt or not batches[-1][1]:
                            raise PublishBatchError(
                                f"body {index} ({len(body)} bytes) does not fit in one Service Bus message on "
                                f"{queue_name!r} (at most {batches[-1][0].max_size_in_bytes} bytes); none of the "
                                f"{len(bodies)} bodies was sent",
                                range(len(bodies)),
                            ) from None
                        continue
                    batches[-1][1].append(index)
                    break
            for number, (batch, _) in enumerate(batches):
                try:
                    with self._guard("publish a batch to", queue_name):
                        sender.send_messages(batch)
                except BindingError as exc:
                    rest = [i for _, indexes in batches[number:] for i in indexes]
                    raise PublishBatchError(
                        f"{exc}; {len(bodies) - len(rest)} of {len(bodies)} bodies were delivered", rest
                    ) from exc

    def reserve(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        """One PeekLock receive; ``timeout`` is at least ``min_receive_wait`` (a receive is a round trip)."""
        got = self._take(queue_name, "queue", 1, timeout)
        return got[0] if got else None

    def reserve_many(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """One PeekLock receive of up to ``limit`` messages (the SDK waits up to ``timeout``, at least
        ``min_receive_wait``, for the first and returns what arrived); each is completed on its own
        (:meth:`ack_many`), the SDK settling one lock token per call."""
        return self._take(queue_name, "queue", limit, timeout) if limit > 0 else []

    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        got = self.reserve_dead_letters(queue_name, 1, timeout)
        return got[0] if got else None

    def reserve_dead_letters(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """From each of :meth:`dead_letter_sources` in order (by default ``$DeadLetterQueue``, then the plain
        ``<queue>.dlq``): one receive per source, each message with a ``dead_letter`` block (see
        :func:`native_dead_letter_body`) and its source named; its settlement goes through the receiver of the
        source it came from."""
        out: list[ReceivedMessage] = []
        deadline = time.monotonic() + max(timeout, 0)
        while limit > len(out):
            sources = self._sources(queue_name)
            for source in sources:
                wait = self.config.min_receive_wait if len(sources) > 1 else deadline - time.monotonic()
                out += self._take(queue_name, source, limit - len(out), wait)
                if len(out) >= limit:
                    break
            if out or time.monotonic() >= deadline:
                break
        return out

    def ack(self, message: ReceivedMessage) -> None:
        """Complete. A lock that expired meanwhile only logs a warning: Service Bus delivers the message again."""
        try:
            self._settle(message, "complete_message")
        except BindingError as exc:
            if self._caused_by(exc, "MessageAlreadySettled"):
                return
            if not self._caused_by(exc, "MessageLockLostError"):
                raise
            logger.warning("Service Bus lock on %s expired (delivered again); nothing completed", message.queue_name)

    def reservation_seconds(self, queue_name: str) -> float | None:
        """What was left of the earliest lock of the last receive from the queue when it returned
        (``locked_until_utc``: the SDK may have taken a message, and its lock started, before the receive), plus
        the receive's own time, so it counts from the call; before any, ``lock_duration`` when set, else Service
        Bus's default of 60 s."""
        return self._lock_seconds.get(queue_name, self.config.lock_duration or _DEFAULT_LOCK_SECONDS)

    def hand_back(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """Send each message again as it is (bytes and application properties; scheduled ``delay`` s ahead), then
        complete the original: the copy is a new message, so its delivery count starts again and the entity's
        ``max_delivery_count`` is not used up. A dead letter is abandoned back to its DLQ, as :meth:`release`
        does."""
        for message in messages:
            if message.from_dead_letter:
                self.release(message)
                continue
            if not self._still_locked(message):
                continue
            sender, lock = self._sender(message.queue_name)
            copy = self._outgoing(message.body, forwarded(message.headers), delay)
            with lock, self._guard("hand back a message to", message.queue_name):
                sender.send_messages(copy)
            self.ack(message)

    @staticmethod
    def _still_locked(message: ReceivedMessage) -> bool:
        """Whether this receiver still holds the message's lock (the SDK drops the lock token once it settled the
        message; the lock's expiry is in the delivery): a copy must not be sent for a message already settled."""
        held = receipt_of(message).message
        until = held.locked_until_utc
        if held.lock_token is None or (until is not None and until <= dt.datetime.now(dt.UTC)):
            logger.warning("Service Bus message %s is no longer locked by this receiver (settled already, or its "
                           "lock expired); nothing was changed", message.meta_id or "(no meta.id)")
            return False
        return True

    def release(self, message: ReceivedMessage, delay: float = 0) -> None:
        """Send a copy with ``attempts`` + 1 (scheduled ``delay`` s ahead), then complete the original. A message
        from a dead-letter queue is abandoned instead (back at once: Service Bus cannot delay an abandon)."""
        receipt_of(message)
        if message.from_dead_letter:
            try:
                self._settle(message, "abandon_message")
            except BindingError as exc:
                if not self._caused_by(exc, "MessageLockLostError", "MessageAlreadySettled"):
                    raise
            return
        if not self._still_locked(message):  # settled meanwhile: a copy would be a second message
            return
        sender, lock = self._sender(message.queue_name)
        retry_id = f"{message.meta_id}:{message.attempts + 1}" if self.config.duplicate_detection else None
        retry_id = retry_id if message.meta_id and len(message.meta_id) <= 100 else None
        copy = self._outgoing(bumped_body(message), forwarded(message.headers), delay, message_id=retry_id)
        with lock, self._guard("release a message to", message.queue_name):
            sender.send_messages(copy)
        self.ack(message)

    def dead_letter(
        self, message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
    ) -> None:
        """Native: DeadLetterReason = ``reason``, DeadLetterErrorDescription = JSON of the other block fields
        (:func:`dead_letter_description`). With ``native_dead_letter=False``: the annotated envelope (poison: the
        bytes) goes to the plain queue, then the original is completed."""
        receipt_of(message)
        if not self.config.native_dead_letter:
            target = self._plain(message.queue_name)
            copy = self._outgoing(dead_letter_body(message, reason, error=error, exception=exception),
                                 forwarded(message.headers))
            sender, lock = self._sender(target)
            with lock, self._guard("dead-letter a message to", target):
                sender.send_messages(copy)
            self.ack(message)
            return
        if message.from_dead_letter:
            raise NotSupportedError(
                f"a message read from the dead-letter queue of {message.queue_name!r} is already dead-lettered; "
                "ack it or release it back"
            )
        description = dead_letter_description(
            error=error, exception=exception, failed_at=bq.now_ms(), attempts=message.attempts
        )
        self._settle(message, "dead_letter_message", reason=str(reason)[:MAX_DEAD_LETTER_TEXT],
                     error_description=description)

    def _counts(self, queue: str, ensure: bool = True) -> Any:
        if ensure:
            self._ensure(queue)
        with self._guard("count the messages of", queue):
            return self.admin.get_queue_runtime_properties(queue)

    def depth(self, queue_name: str) -> int:
        """ActiveMessageCount: one management call. It includes peek-locked (reserved) messages, which
        Service Bus still counts as active; scheduled (delayed) ones are not counted."""
        return self._counts(queue_name).active_message_count

    def dead_letter_depth(self, queue_name: str) -> int:
        """Per source one management call: a sub-queue's DeadLetterMessageCount, a plain queue's
        ActiveMessageCount (absent: 0, not created)."""
        count = 0
        for source in self._sources(queue_name):
            if self._native(source):
                count += self._counts(source.removesuffix(f"/{DEAD_LETTER_SUBQUEUE}")).dead_letter_message_count
                continue
            try:
                count += self._counts(source, ensure=source == self.dead_letter_name(queue_name)).active_message_count
            except BindingError as exc:
                if not self._caused_by(exc, "ResourceNotFoundError"):
                    raise
        return count

    def browse_dead_letters(self, queue_name: str, limit: int = 100) -> list[ReceivedMessage]:
        """Peek (no lock, no delivery counted) from the head of each dead-letter source in order."""
        out: list[ReceivedMessage] = []
        for source in self._sources(queue_name):
            sequence = 1
            with self._absent(source):
                key, receiver, lock = self._receiver(queue_name, source)
                while len(out) < limit:
                    with lock, self._guard("peek into", key):
                        got = receiver.peek_messages(max_message_count=limit - len(out), sequence_number=sequence)
                    if not got:
                        break
                    out += [received_message(m, queue_name, True, None, source, self.decode_limit)
                            for m in got]
                    sequence = got[-1].sequence_number + 1
        return out

    def dead_letter_name(self, queue_name: str) -> str:
        if not self.config.native_dead_letter:
            return self._plain(queue_name)
        return f"{queue_name}/{DEAD_LETTER_SUBQUEUE}"

    def ping(self) -> None:
        """Read the first page of the namespace's queue list: proves the endpoint, TLS, the credentials and the
        management rights that counts need, and changes nothing."""
        with self._guard("list the queues of", self.config.namespace):
            next(iter(self.admin.list_queues()), None)

    def close(self) -> None:
        with self._lock:
            handlers = [*self._senders.values(), *self._receivers.values()]
            self._senders, self._receivers = {}, {}
        for handler, lock in handlers:
            with lock:
                try:
                    handler.close()
                except Exception:  # noqa: BLE001 - closing is best effort; the broker releases locks itself
                    logger.debug("Service Bus handler close failed", exc_info=True)
        for owned, attribute in zip(self._owns, ("_client", "_admin"), strict=True):
            if owned and getattr(self, attribute) is not None:
                getattr(self, attribute).close()
                setattr(self, attribute, None)
        if self._credential is not None:
            self._credential.close()
            self._credential = None
