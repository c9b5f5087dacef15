"""RabbitMQ (AMQP 0-9-1) binding: durable queues on the default exchange, in the official SDKs' layout.

Queues of ``q`` (durable; default exchange, routing key = queue name): ``q`` holds persistent
``application/json`` messages whose properties project the envelope (:func:`amqp_properties`, as every SDK
writes them); ``q<dead_letter_suffix>`` (``q.failed`` per the spec, ``.dlq`` for the SDKs' apps) the annotated
dead letters we write, while every DLQ read (count, reserve, redrive) takes each of
:meth:`RabbitMQBinding.dead_letter_sources` in order (by default ``q.failed`` and ``q.dlq``, where the SDKs'
workers put theirs), with a passive declare only, so a read never creates a queue; ``q.delay.<ms>`` one
queue per distinct delay, with ``x-message-ttl=<ms>`` and dead-lettering through the default exchange back to
``q`` (no broker plugin). One TTL per queue keeps expiry in arrival
order; per-message ``expiration`` on one shared queue would hold a short delay behind a long one (RabbitMQ
only expires the head). ``x-expires`` drops a delay queue a minute after its last use.

A single reserve is ``basic.get`` with manual ack, polled while ``reserve(timeout=...)`` waits. A batch
(:meth:`RabbitMQBinding.reserve_many`, what the consumer uses) comes from ``basic.consume`` on a channel of its own
with a prefetch window of twice the batch (:class:`~.prefetch.Prefetch`): the broker pushes the next batch while
this one is handled, a wait blocks on the socket until a delivery arrives, and handled messages are acked with one
``basic.ack(multiple=True)`` when they are all the channel holds up to the last. A reservation is an unacked
delivery on this binding's channel: when the process dies (SIGKILL included) or the connection drops, RabbitMQ
requeues it itself. That is the crash recovery, with no deadline to tune. Deliveries pushed ahead and never handed
out are requeued by :meth:`RabbitMQBinding.end_reservations` (the consumer calls it when its run ends).

Dead letters are reserved on a channel of their own in transaction mode (``tx.select``): their acks and
requeues take effect at ``tx.commit``, which returns once the broker has applied them. That lets a redrive
publish the replayed copies and ack their dead letters in one transaction (:meth:`publish_acking`): after a
crash each message is either still in the DLQ or at the target, never both, so a re-run cannot replay it
twice. Main-queue reservations stay on the confirm-mode channel (a channel cannot be in both modes).

Queues declared by someone else (``x-dead-letter-exchange``, TTL, quorum type) are used as they are: a queue
is declared only after a passive declare, on a separate channel, found it missing (a failed declare closes
its channel, and closing the channel that holds reservations would requeue them all).

One binding may serve several threads: channel operations take a lock (pika is not thread-safe). A daemon
thread keeps heartbeats flowing while a handler holds a reservation, so a slow handler does not lose it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ..base import Binding, BindingError, NotSupportedError, PublishBatchError, check_sizes, require_extra
from ..bodies import bumped_body, dead_letter_body
from ..message import ReceivedMessage, parse_body
from .config import RabbitMQConfig
from .prefetch import Prefetch
from .wire import MAX_BODY, MIRROR, amqp_properties, confirmed_batch

__all__ = ["MAX_BODY", "MIRROR", "RabbitMQBinding", "RabbitMQConfig", "amqp_properties"]

T = TypeVar("T")
#: Longest wait on the socket while holding the binding's lock in :meth:`RabbitMQBinding.reserve_many`.
_WAIT_SLICE = 0.1
#: Pause between ``basic.get`` polls while the prefetch window is full.
_YIELD_SECONDS = 0.02
logger = logging.getLogger(__name__)

#: The binding whose passive declare runs in this thread, while it runs (see :class:`_ExpectedNotFound`).
_probing = threading.local()


class _ExpectedNotFound(logging.Filter):
    """Logs at DEBUG, not WARNING, the broker's 404 answer to one of our passive declares.

    AMQP 0-9-1 has one way to ask whether a queue exists: a passive declare, which the broker answers for a
    missing queue by closing the channel with 404 NOT_FOUND. pika logs every channel close from the broker at
    WARNING. Here that 404 is an answer, not a fault: the first publish to a new queue, a dead-letter source
    nobody created. The filter sits on the ``pika.channel`` logger and lowers only a 404 close of the probe
    channel of the binding that is declaring in the calling thread (pika handles the reply in the thread that
    waits for it); every other close keeps its WARNING. The lowered record is kept where ``pika.channel``
    is enabled for DEBUG.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        binding = getattr(_probing, "binding", None)
        if binding is None or not str(record.msg).startswith("Received remote Channel.Close"):
            return True
        try:
            code, _text, channel = cast("tuple[Any, Any, Any]", record.args)
            probe = binding._probe
            expected = code == 404 and probe is not None and channel.channel_number == probe.channel_number
        except (TypeError, ValueError, AttributeError):
            return True
        if not expected:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_EXPECTED_NOT_FOUND = _ExpectedNotFound()


@dataclass(frozen=True, slots=True)
class _Receipt:
    """A delivery; its tag is valid only on the channel (``work`` or ``dlq``) and generation it came from."""

    generation: int
    tag: int
    source: str
    channel: str = "work"


class RabbitMQBinding(Binding):
    """Durable queues on the default exchange in the official SDKs' layout (see the module docstring)."""

    name = "rabbitmq"
    held_reservations_note = "a delivery tag belongs to the channel that received it (the triggerer's)"
    client_loggers = ("pika",)
    carries_headers = True
    can_browse = False

    def __init__(self, config: RabbitMQConfig | None = None, connection: Any = None) -> None:
        """:param config: broker and queue handling.
        :param connection: a ready ``pika.BlockingConnection`` (the test seam); :meth:`close` leaves it open and
            no heartbeat thread serves it. Batches still open their own connection from ``config``.
        """
        self.config = config or RabbitMQConfig()
        self._pika = require_extra("pika", "rabbitmq")
        channel_log = logging.getLogger("pika.channel")
        if _EXPECTED_NOT_FOUND not in channel_log.filters:
            channel_log.addFilter(_EXPECTED_NOT_FOUND)
        self._connection, self._owns = connection, connection is None
        self._lock = threading.RLock()
        self._work: Any = None  # basic.get, ack, publish (confirm mode): never used for a declare that may fail
        self._dlq: Any = None  # dead-letter basic.get, ack, requeue and redrive publishes (transaction mode)
        self._consume: Any = None  # basic.consume of reserve_many, its acks and requeues (no confirm, no tx)
        self._feeds: dict[str, Prefetch] = {}  # queue → its consumer on the consume channel's generation
        self._probe: Any = None  # declares: a passive declare of a missing queue closes its channel
        self._generations = {"work": 0, "dlq": 0, "consume": 0}
        #: Per reserving channel: delivery tag on its current generation → lease deadline.
        self._held: dict[str, dict[int, float]] = {"work": {}, "dlq": {}, "consume": {}}
        self._known: set[str] = set()
        self._created: set[str] = set()
        self._stop = threading.Event()

    @property
    def declared_queues(self) -> frozenset[str]:
        """Queues this binding created (main, DLQ, delay queues): what a teardown deletes."""
        return frozenset(self._created)

    def dead_letter_name(self, queue_name: str) -> str:
        return f"{queue_name}{self.config.dead_letter_suffix}"

    def dead_letter_sources(self, queue_name: str) -> list[str]:
        """The written DLQ, then :attr:`RabbitMQConfig.dead_letter_sources` (by default ``<queue>.failed`` and
        ``<queue>.dlq``)."""
        entries = self.config.dead_letter_sources
        assert isinstance(entries, tuple)  # normalised by RabbitMQConfig
        return self.named_dead_letter_sources(queue_name, entries)

    def _where(self) -> str:
        return f"RabbitMQ {self.config.host}:{self.config.port} vhost {self.config.virtual_host!r}"

    def _channel(self, kind: str) -> Any:
        conn = self._connection
        if conn is None or conn.is_closed:
            if not self._owns:
                raise self._pika.exceptions.ConnectionWrongStateError("the injected connection is closed")
            conn = self._connection = self._pika.BlockingConnection(self.config.parameters(self._pika))
            self._work = self._probe = self._dlq = self._consume = None
            self._start_pump()
        if kind == "probe":
            if self._probe is None or self._probe.is_closed:
                self._probe = conn.channel()
            return self._probe
        if kind == "dlq":
            if self._dlq is None or self._dlq.is_closed:
                self._dlq = conn.channel()
                self._dlq.tx_select()
                self._generations["dlq"] += 1
                self._held["dlq"].clear()  # the broker requeued what the closed channel held
            return self._dlq
        if kind == "consume":
            if self._consume is None or self._consume.is_closed:
                self._consume = conn.channel()
                self._generations["consume"] += 1
                self._held["consume"].clear()  # the broker requeued what the closed channel held
                self._feeds.clear()  # and its consumers are gone with it
            return self._consume
        if self._work is None or self._work.is_closed:
            self._work = conn.channel()
            if self.config.publisher_confirms:
                self._work.confirm_delivery()
            self._generations["work"] += 1
            self._held["work"].clear()  # the broker requeued what the closed channel held
        return self._work

    def _open(self, kind: str) -> Any:
        """The ``work`` or ``dlq`` channel if it is open now, else ``None`` (its deliveries are requeued)."""
        channel = {"dlq": self._dlq, "consume": self._consume}.get(kind, self._work)
        return None if channel is None or channel.is_closed else channel

    def _holds(self, receipt: _Receipt) -> Any:
        """The channel still holding ``receipt``'s delivery, or ``None`` when the broker took it back (the
        channel closed, or its visibility timeout passed) and settling it now must change nothing."""
        channel = self._open(receipt.channel)
        if (channel is None or receipt.generation != self._generations[receipt.channel]
                or receipt.tag not in self._held[receipt.channel]):
            return None
        return channel

    def _start_pump(self) -> None:
        """Serve heartbeats (and leases) while no thread calls the binding, e.g. during a long handler."""
        self._stop.set()
        self._stop = stop = threading.Event()
        if self.config.heartbeat == 0 and self.config.visibility_timeout is None:
            return
        interval = min(5.0, (self.config.heartbeat or 60) / 4, (self.config.visibility_timeout or 60) / 4)
        ref = weakref.ref(self)  # a forgotten binding (and its connection) must stay collectable

        def pump() -> None:
            while not stop.wait(interval) and (binding := ref()) is not None:
                with binding._lock:
                    try:
                        if not stop.is_set() and binding._connection.is_open:
                            binding._expire()
                            binding._connection.process_data_events(0)
                    except Exception:  # noqa: BLE001 - the next operation reconnects and reports
                        logger.debug("RabbitMQ heartbeat pump: error", exc_info=True)
                del binding

        threading.Thread(target=pump, name="babelqueue-rabbitmq-heartbeat", daemon=True).start()

    def _reconnecting(self, call: Callable[[], T]) -> T:
        """``call()``; when the connection turns out to be dead (the broker restarted or dropped us), open a new
        one and call once more. Only for calls that change nothing when the connection dies under them: a
        ``basic.get`` (the broker requeues what a dead connection held) or a passive declare. Publishes and acks
        are never repeated here: they report, and the caller decides."""
        errors = self._pika.exceptions
        try:
            return call()
        except (errors.StreamLostError, errors.ConnectionClosed, errors.ConnectionWrongStateError,
                errors.AMQPHeartbeatTimeout) as exc:
            if not self._owns:
                raise
            logger.warning("%s: the connection was lost (%s); reconnecting once", self._where(), type(exc).__name__)
            self._connection = None
            return call()

    @contextmanager
    def _guard(self, action: str, queue: str) -> Iterator[None]:
        """Turn a pika error into a :class:`BindingError` saying where, what failed and what to check."""
        try:
            yield
        except (self._pika.exceptions.AMQPError, OSError) as exc:
            errors, c, code = self._pika.exceptions, self.config, getattr(exc, "reply_code", None)
            if isinstance(exc, errors.ProbableAuthenticationError | errors.AuthenticationError):
                hint = "authentication failed; check the username and password"
            elif isinstance(exc, errors.ProbableAccessDeniedError) or code == 530:
                hint = f"access to virtual host {c.virtual_host!r} was refused; check it exists and the user's rights"
            elif isinstance(exc, errors.AMQPConnectionError | OSError):
                hint = (
                    f"cannot reach the broker; check that RabbitMQ runs there, that the port is reachable from "
                    f"this worker and that TLS is {'on' if c.ssl else 'off'} on the server too"
                )
            else:
                hints = {
                    406: "the queue exists with other arguments or type; use another name or declare it alike",
                    404: "the queue does not exist; create it, or set declare_queues=True",
                    403: "the user lacks configure/write/read permission on this queue",
                }
                hint = hints.get(code, "") if isinstance(code, int) else ""  # reply_code may be absent (None)
                hint = hint or (
                    "the broker returned the message: the queue does not exist (deleted meanwhile?)"
                    if isinstance(exc, errors.UnroutableError)
                    else "the broker refused the message (nack): a full queue with x-overflow=reject-publish?"
                    if isinstance(exc, errors.NackError)
                    else "the broker refused the operation"
                )
            from ..redaction import scrub

            text = scrub(str(exc) or repr(exc), [c.password])
            raise BindingError(
                f"{self._where()}: {action} on {queue!r} failed: {hint} ({type(exc).__name__}: {text})"
            ) from exc

    @contextmanager
    def _asking(self) -> Iterator[None]:
        """Mark a passive declare in this thread, so its expected 404 is not logged as a warning."""
        previous = getattr(_probing, "binding", None)
        _probing.binding = self
        try:
            yield
        finally:
            _probing.binding = previous

    def _passive_declare(self, queue: str) -> Any:
        """``queue.declare(passive=True)`` on the probe channel; raises ``ChannelClosedByBroker`` (404) for a
        missing queue, which closes only the probe channel. After a broker restart the binding's connection is
        dead: it reconnects once."""
        with self._asking():
            return self._reconnecting(lambda: self._channel("probe").queue_declare(queue, passive=True))

    def _exists(self, queue: str, create: bool, arguments: dict[str, Any] | None = None) -> bool:
        """Passive declare first (cached), so a queue someone else declared with arguments is never redeclared."""
        if arguments is None:
            if queue in self._known:
                return True
            try:
                self._passive_declare(queue)
            except self._pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != 404:
                    raise
                if not create:
                    return False
            else:
                self._known.add(queue)
                return True
        self._channel("probe").queue_declare(queue, durable=True, arguments=arguments)
        self._created.add(queue)
        self._known.add(queue)
        return True

    def _send(self, queue: str, body: bytes, headers: Mapping[str, Any] | None, delay: float = 0) -> None:
        """Publish one body, confirmed unless turned off (the caller holds the lock and the guard)."""
        check_sizes([body], self.config.max_message_bytes, f"{self._where()} queue {queue!r}",
                    "RabbitMQ's max_message_size")
        if not self._exists(queue, self.config.declare_queues):
            raise BindingError(f"{self._where()}: queue {queue!r} does not exist and declare_queues is off")
        target = queue
        if delay > 0:  # redeclared on each use: that renews the delay queue's x-expires lease
            ms = max(1, math.ceil(delay * 1000))
            target = f"{queue}.delay.{ms}"
            self._exists(
                target,
                True,
                {
                    "x-message-ttl": ms,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": queue,
                    "x-expires": ms + 60_000,
                },
            )
        props = self._pika.BasicProperties(**amqp_properties(body, headers))
        try:
            self._channel("work").basic_publish("", target, body, props, mandatory=self.config.publisher_confirms)
        except self._pika.exceptions.UnroutableError:
            self._known.discard(queue)  # deleted meanwhile: the next publish checks (and declares) it again
            raise

    def publish(
        self, body: bytes, queue_name: str, *, headers: Mapping[str, Any] | None = None, delay: float = 0
    ) -> None:
        """:param headers: added to the AMQP header table (never replacing a contract header).
        :param delay: seconds in ``<queue>.delay.<ms>`` before the broker moves the message to the queue."""
        with self._lock, self._guard("publish", queue_name):
            self._send(queue_name, bytes(body), headers, delay)

    def publish_batch(self, bodies: Sequence[bytes], queue_name: str) -> None:
        """All bodies, then their confirms as they stream back (:func:`confirmed_batch`); without
        ``publisher_confirms`` a plain loop. :class:`PublishBatchError` lists exactly the bodies nacked,
        returned or left unconfirmed; a body over ``max_message_bytes`` fails the batch before anything is sent."""
        bodies = [bytes(b) for b in bodies]
        check_sizes(bodies, self.config.max_message_bytes, f"{self._where()} queue {queue_name!r}",
                    "RabbitMQ's max_message_size")
        props = [self._pika.BasicProperties(**amqp_properties(body)) for body in bodies]
        with self._lock:
            try:
                with self._guard("publish a batch", queue_name):
                    if not bodies:
                        return
                    if not self._exists(queue_name, self.config.declare_queues):
                        raise BindingError(
                            f"{self._where()}: queue {queue_name!r} does not exist and declare_queues is off"
                        )
                    if not self.config.publisher_confirms:
                        for body, prop in zip(bodies, props, strict=True):
                            self._channel("work").basic_publish("", queue_name, body, prop)
                        return
                    failed, why = confirmed_batch(
                        self._pika, self.config.parameters(self._pika), queue_name, bodies, props
                    )
            except BindingError as exc:
                self._known.discard(queue_name)  # the connection died: after a restart the queue may be gone
                raise PublishBatchError(
                    f"{exc}; no body of the batch is known to be delivered", range(len(bodies))
                ) from exc
        if failed:
            # A returned body means the queue is gone (deleted, or lost by a broker restart): forget that it
            # existed, so a retry of the batch checks and declares it again, as a single publish does.
            self._known.discard(queue_name)
            raise PublishBatchError(
                f"{self._where()}: {len(failed)} of {len(bodies)} bodies to {queue_name!r} were "
                f"not confirmed ({why}); all others were",
                failed,
            )

    def publish_acking(self, bodies: Sequence[bytes], queue_name: str, messages: Sequence[ReceivedMessage], *,
                       headers: Mapping[str, Any] | None = None) -> bool:
        """Publish ``bodies`` to ``queue_name`` and ack ``messages`` (dead letters reserved by this binding) in one
        AMQP transaction: after ``tx.commit`` returns both happened, and a crash or a lost connection before it
        leaves neither (the broker drops the uncommitted publishes and requeues the deliveries).

        ``False``, having done nothing, when a message is not a dead letter this binding still holds (another
        binding's reservation, or one the broker took back): the caller then publishes and acks in two steps.

        The target queue is checked with a fresh passive declare first, because in a transaction a publish to a
        missing queue is not reported: the commit would remove the dead letter and deliver nothing.

        :param headers: added to every message's AMQP header table (the replay bypass header).
        :raises PublishBatchError: every index; nothing was committed (or, when the connection dropped during
            the commit itself, all of it was: either way each message is in the DLQ or at the target, once).
        """
        bodies = [bytes(body) for body in bodies]
        receipts = [message.receipt for message in messages]
        if not bodies or not all(isinstance(r, _Receipt) and r.channel == "dlq" for r in receipts):
            return False
        check_sizes(bodies, self.config.max_message_bytes, f"{self._where()} queue {queue_name!r}",
                    "RabbitMQ's max_message_size")
        props = [self._pika.BasicProperties(**amqp_properties(body, headers)) for body in bodies]
        with self._lock:
            self._expire()
            channel = self._open("dlq")
            if channel is None or any(self._holds(receipt) is None for receipt in receipts):
                return False
            try:
                with self._guard("publish and ack a batch", queue_name):
                    self._known.discard(queue_name)
                    if not self._exists(queue_name, self.config.declare_queues):
                        raise BindingError(
                            f"{self._where()}: queue {queue_name!r} does not exist and declare_queues is off"
                        )
                    try:
                        for body, prop in zip(bodies, props, strict=True):
                            channel.basic_publish("", queue_name, body, prop)
                        for receipt in receipts:
                            channel.basic_ack(receipt.tag)
                        channel.tx_commit()
                    except BaseException:
                        self._roll_back(channel)
                        raise
            except BindingError as exc:
                raise PublishBatchError(
                    f"{exc}; the transaction did not commit, so every dead letter of the batch stays in the DLQ",
                    range(len(bodies)),
                ) from exc
            for receipt in receipts:
                del self._held["dlq"][receipt.tag]
        return True

    def _roll_back(self, channel: Any) -> None:
        """Drop an unfinished transaction (its acked deliveries stay reserved); close the channel if that fails,
        so a later commit on it can never apply half a batch."""
        if channel.is_closed:
            return
        try:
            channel.tx_rollback()
        except (self._pika.exceptions.AMQPError, OSError):
            logger.debug("RabbitMQ tx.rollback failed; closing the channel instead", exc_info=True)
            try:
                channel.close()
            except (self._pika.exceptions.AMQPError, OSError):
                logger.debug("RabbitMQ channel close failed", exc_info=True)

    def _take(self, queue_name: str, sources: Sequence[str], timeout: float, dead: bool) -> ReceivedMessage | None:
        """The first message of the first of ``sources`` that has one (one ``basic.get`` each), polled until
        ``timeout``. A dead-letter source is never declared: a missing one is skipped."""
        end, pause, kind = time.monotonic() + max(timeout, 0), 0.02, "dlq" if dead else "work"
        while True:
            for source in sources:
                with self._lock, self._guard("reserve", source):
                    self._expire()

                    def get(source: str = source) -> tuple[Any, Any, Any]:
                        # Never basic.get a missing queue: its 404 would close the channel holding the reservations.
                        if not self._exists(source, self.config.declare_queues and not dead):
                            return None, None, None
                        return self._channel(kind).basic_get(source, auto_ack=False)

                    method, props, body = self._reconnecting(get)
                    if method is not None:
                        lease = self.config.visibility_timeout or math.inf
                        self._held[kind][method.delivery_tag] = time.monotonic() + lease
                        receipt = _Receipt(self._generations[kind], method.delivery_tag, source, kind)
                        return self._received(method, props, bytes(body or b""), queue_name, dead, receipt)
            if (remaining := end - time.monotonic()) <= 0:
                return None
            time.sleep(min(pause, remaining))  # outside the lock: other threads keep working
            pause = min(pause * 2, 0.2)

    def _received(self, method: Any, props: Any, body: bytes, queue: str, dead: bool,
                  receipt: _Receipt) -> ReceivedMessage:
        envelope, error, attempts = parse_body(body, self.decode_limit)
        table = dict(props.headers or {})
        if (native := table.get("x-attempts")).__class__ is int and native > attempts:
            attempts = native  # the Laravel driver's authoritative count
        names = ("type", "correlation_id", "message_id", "app_id", "content_type", "content_encoding", "delivery_mode")
        mirrors = {f"{MIRROR}{name}": getattr(props, name) for name in names if getattr(props, name) is not None}
        count = table.get("x-delivery-count")  # quorum queues count redeliveries natively
        return ReceivedMessage(
            body=body,
            queue_name=queue,
            envelope=envelope,
            decode_error=error,
            attempts=attempts,
            delivery_count=count if count.__class__ is int else None,
            headers={**table, **mirrors, f"{MIRROR}redelivered": bool(method.redelivered)},
            receipt=receipt,
            from_dead_letter=dead,
            dead_letter_source=receipt.source if dead else None,
        )

    def _expire(self) -> None:
        """Requeue reservations held past ``visibility_timeout`` (the caller holds the lock)."""
        if self.config.visibility_timeout is None:
            return
        now = time.monotonic()
        for kind, held in self._held.items():
            channel = self._open(kind)
            expired = [tag for tag, deadline in held.items() if deadline <= now] if channel is not None else []
            for tag in expired:
                del held[tag]
                channel.basic_nack(tag, requeue=True)
                logger.warning(
                    "RabbitMQ reservation (tag %s) passed its visibility timeout (%s s): requeued",
                    tag,
                    self.config.visibility_timeout,
                )
            if expired and kind == "dlq":
                channel.tx_commit()

    def _settle(
        self,
        message: ReceivedMessage,
        action: str,
        copy: tuple[str, bytes, Mapping[str, Any]] | None = None,
        delay: float = 0,
        requeue: bool = False,
    ) -> None:
        """Publish ``copy`` (queue, body, headers) if any and wait for its confirm, then ack (or requeue)."""
        receipt = self._receipt(message)
        with self._lock, self._guard(action, receipt.source):
            self._expire()
            channel = self._holds(receipt)
            if channel is None:
                self._warn_gone(receipt)
                return
            if copy is not None:
                self._send(*copy, delay=delay)
            self._let_go(receipt, channel, requeue)
            if receipt.channel == "dlq":
                channel.tx_commit()

    def _let_go(self, receipt: _Receipt, channel: Any, requeue: bool) -> None:
        """Ack or requeue a held delivery (on the ``dlq`` channel it waits for the caller's commit)."""
        del self._held[receipt.channel][receipt.tag]
        if requeue:
            channel.basic_nack(receipt.tag, requeue=True)
        else:
            channel.basic_ack(receipt.tag)

    @staticmethod
    def _receipt(message: ReceivedMessage) -> _Receipt:
        if not isinstance(message.receipt, _Receipt):
            raise BindingError(f"message from queue {message.queue_name!r} was not reserved by a RabbitMQ binding")
        return message.receipt

    @staticmethod
    def _warn_gone(receipt: _Receipt) -> None:
        logger.warning(
            "RabbitMQ delivery from %r is no longer held (its channel closed or its visibility "
            "timeout passed, so the broker requeued it); nothing was changed",
            receipt.source,
        )

    def _settle_many(self, messages: Sequence[ReceivedMessage], action: str, requeue: bool) -> None:
        """Ack (or requeue unchanged) many reservations, one transaction commit for the dead letters among them.

        Gated like :meth:`_settle`: a delivery no longer held is skipped with a warning."""
        receipts = [self._receipt(message) for message in messages]
        if not receipts:
            return
        with self._lock, self._guard(action, receipts[0].source):
            self._expire()
            commit, fed = None, []
            for receipt in receipts:
                channel = self._holds(receipt)
                if channel is None:
                    self._warn_gone(receipt)
                    continue
                if receipt.channel == "consume" and not requeue:
                    fed.append(receipt.tag)
                    continue
                self._let_go(receipt, channel, requeue)
                if receipt.channel == "dlq":
                    commit = channel
            if fed:
                self._ack_fed(fed)
            if commit is not None:
                commit.tx_commit()

    def _ack_fed(self, tags: list[int]) -> None:
        """Ack held deliveries of the consume channel: one ``basic.ack(multiple=True)`` when they are every
        delivery the channel holds up to the highest (handed out or still in a prefetch window), else one each."""
        held, top = self._held["consume"], max(tags)
        acking = set(tags)
        channel = self._consume
        below = [tag for tag in held if tag <= top]
        waiting = any(tag <= top for feed in self._feeds.values() for tag in feed.tags())
        for tag in tags:
            del held[tag]
        if len(below) == len(acking) and not waiting:
            channel.basic_ack(top, multiple=True)
        else:
            for tag in sorted(acking):
                channel.basic_ack(tag)

    def _feed(self, queue_name: str, limit: int) -> Prefetch | None:
        """The queue's consumer on the consume channel, started with a prefetch window of ``2 * limit`` on first
        use (``None``: the queue does not exist and is not to be declared). Caller holds the lock."""
        feed = self._feeds.get(queue_name)
        if feed is not None and feed.generation == self._generations["consume"] and self._open("consume"):
            return feed
        if not self._exists(queue_name, self.config.declare_queues):
            return None
        channel = self._channel("consume")
        feed = Prefetch(queue_name, self._generations["consume"], min(2 * limit, 65535))
        channel.basic_qos(prefetch_count=feed.prefetch)
        feed.tag = channel.basic_consume(queue_name, feed.deliver, auto_ack=False)
        self._feeds[queue_name] = feed
        return feed

    def reserve_many(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """Up to ``limit`` deliveries from the queue's consumer (``basic.consume``, prefetch ``2 * limit``), in
        queue order: what the broker has pushed so far. When none has arrived, waits up to ``timeout`` on the
        connection's socket in slices of a tenth of a second, letting other threads use the binding between them;
        when the window is full of deliveries handed out and not settled (the broker pushes nothing more until
        some are), or the wait is over, a ``basic.get`` answers for the queue itself."""
        if limit <= 0:
            return []
        end = time.monotonic() + max(timeout, 0)
        while True:
            with self._lock, self._guard("reserve", queue_name):
                self._expire()
                feed = self._reconnecting(lambda: self._feed(queue_name, limit))
                if feed is None:
                    return []
                self._connection.process_data_events(0)  # what has arrived since
                if feed.waiting:
                    return self._hand_out(feed, queue_name, limit)
                full = len(self._held["consume"]) >= feed.prefetch
                remaining = end - time.monotonic()
                if remaining > 0 and not full:
                    self._connection.process_data_events(time_limit=min(remaining, _WAIT_SLICE))
                    if feed.waiting:
                        return self._hand_out(feed, queue_name, limit)
                if full or end - time.monotonic() <= 0:
                    # an empty window does not mean an empty queue (the next push may be on its way, or the window
                    # is full): basic.get answers for the queue itself, and what it takes is held like the rest
                    method, props, body = self._consume.basic_get(queue_name, auto_ack=False)
                    # pushes that arrived during the get (lower tags: the broker sent them before its answer) are
                    # dispatched into the window, which stays in tag order: a multiple ack relies on it (every
                    # tag up to the acked one is accounted for), and a get-empty is empty only without them
                    self._connection.process_data_events(0)
                    if method is not None:
                        feed.waiting.append((method, props, body))
                        feed.sort()
                    elif not feed.waiting:
                        # Get-empty can overtake pushes: the broker's channel answers the get while the pushes the
                        # queue sent before its answer still wait behind it (a window just freed by acks is refilled
                        # with every ready message, so none is left to get). One more synchronous call on the
                        # channel is answered after those pushes, which then come in first.
                        self._consume.basic_qos(prefetch_count=feed.prefetch)
                        self._connection.process_data_events(0)
                    if feed.waiting:
                        return self._hand_out(feed, queue_name, limit)
                    if end - time.monotonic() <= 0:
                        return []
            time.sleep(_YIELD_SECONDS if full else 0.0005)  # outside the lock: another thread's call gets it

    def _hand_out(self, feed: Prefetch, queue_name: str, limit: int) -> list[ReceivedMessage]:
        lease = time.monotonic() + (self.config.visibility_timeout or math.inf)
        held, generation, out = self._held["consume"], self._generations["consume"], []
        for method, props, body in feed.take(limit):
            held[method.delivery_tag] = lease
            receipt = _Receipt(generation, method.delivery_tag, queue_name, "consume")
            out.append(self._received(method, props, bytes(body or b""), queue_name, False, receipt))
        return out

    def end_reservations(self, queue_name: str) -> None:
        """Requeue the deliveries the queue's consumer was pushed and did not hand out, then cancel it."""
        with self._lock:
            feed = self._feeds.pop(queue_name, None)
            channel = self._open("consume")
            if feed is None or channel is None or feed.generation != self._generations["consume"]:
                return
            with self._guard("hand back prefetched messages of", queue_name):
                for method, _props, _body in feed.take(len(feed.waiting)):
                    channel.basic_reject(method.delivery_tag, requeue=True)
                channel.basic_cancel(feed.tag)  # pika rejects (requeues) what arrives meanwhile
                # a reject has no reply: one synchronous call on the channel returns once the broker has taken
                # every reject sent before it, so the queue holds them again when this returns
                channel.basic_qos(prefetch_count=0)

    def reserve(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        return self._take(queue_name, [queue_name], timeout, dead=False)

    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        """From the first dead-letter source that has a message, in :meth:`dead_letter_sources` order; its ack or
        requeue goes to the queue it came from (the delivery tag is that queue's)."""
        return self._take(queue_name, self.dead_letter_sources(queue_name), timeout, dead=True)

    def ack(self, message: ReceivedMessage) -> None:
        self._settle(message, "ack")

    def ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        """Ack every message; dead letters in one transaction, so the call returns once the broker removed them."""
        self._settle_many(messages, "ack", requeue=False)

    def release_many(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """Dead letters go back to their DLQ unchanged in one transaction; others as :meth:`release` each."""
        self._settle_many([m for m in messages if m.from_dead_letter], "release", requeue=True)
        for message in messages:
            if not message.from_dead_letter:
                self.release(message, delay)

    def reservation_seconds(self, queue_name: str) -> float | None:
        """An unacked delivery stays this channel's until it closes, unless ``visibility_timeout`` sets a lease."""
        return self.config.visibility_timeout

    def hand_back(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """Without a delay (and for dead letters), ``basic.nack`` with requeue: the delivery goes back where it was,
        unchanged, flagged ``redelivered`` (a quorum queue counts it in ``x-delivery-count``). With a delay, the
        same bytes and headers are republished through the delay queue, then the delivery is acked: it comes
        back at the end of the queue, and no broker count moves."""
        if delay <= 0:
            self._settle_many(messages, "hand back", requeue=True)
            return
        self._settle_many([m for m in messages if m.from_dead_letter], "hand back", requeue=True)
        for message in messages:
            if not message.from_dead_letter:
                self._settle(message, "hand back", (message.queue_name, message.body, dict(message.headers)),
                             delay=delay)

    def release(self, message: ReceivedMessage, delay: float = 0) -> None:
        """Republish with ``attempts`` + 1 (body and ``x-attempts``; a poison body keeps its bytes and counts in
        the header) to the end of the queue or through a delay queue, then ack. A message drained from the DLQ
        is requeued there unchanged (``basic.nack``; ``delay`` does not apply)."""
        if message.from_dead_letter:
            return self._settle(message, "release", requeue=True)
        headers = {**message.headers, "x-attempts": message.attempts + 1}
        self._settle(message, "release", (message.queue_name, bumped_body(message), headers), delay=delay)

    def dead_letter(
        self, message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
    ) -> None:
        """Publish the annotated copy to ``<queue><suffix>``, wait for its confirm, then ack the original."""
        body = dead_letter_body(message, reason, error=error, exception=exception)
        self._settle(message, "dead-letter", (self.dead_letter_name(message.queue_name), body, message.headers))

    def _count(self, queue: str) -> int:
        with self._lock, self._guard("count", queue):
            self._expire()
            try:
                return int(self._passive_declare(queue).method.message_count)
            except self._pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != 404:
                    raise
                self._known.discard(queue)
                return 0

    def depth(self, queue_name: str) -> int:
        """Ready messages (a passive declare; 0 for a missing queue). Reserved-but-unacked and delayed messages
        are not counted."""
        return self._count(queue_name)

    def dead_letter_depth(self, queue_name: str) -> int:
        """The sum of each dead-letter source's ready count (a passive declare each; a missing queue counts 0
        and is not created)."""
        return sum(self._count(source) for source in self.dead_letter_sources(queue_name))

    def browse_dead_letters(self, queue_name: str, limit: int = 100) -> list[ReceivedMessage]:
        """Not supported: a classic queue cannot be read without taking the messages, and emulating it
        (``basic.get`` + requeue) reorders the DLQ, marks every message redelivered and races concurrent drains."""
        names = " / ".join(repr(source) for source in self.dead_letter_sources(queue_name))
        raise NotSupportedError(
            f"RabbitMQ cannot read queue {names} without removing "
            "messages (basic.get takes them); drain it with reserve_dead_letter + ack instead"
        )

    def ping(self) -> None:
        with self._lock, self._guard("connect", "-"):
            self._channel("work")
            self._channel("probe")

    def close(self) -> None:
        """Close what this binding opened; unacked reservations go back to their queues (broker requeue)."""
        with self._lock:
            self._stop.set()
            channels, conn = (self._work, self._dlq, self._probe, self._consume), self._connection
            self._work = self._dlq = self._probe = self._consume = None
            self._feeds.clear()
            for held in self._held.values():
                held.clear()
            try:
                if self._owns and conn is not None:
                    self._connection = None
                    if conn.is_open:
                        conn.close()
                elif not self._owns:
                    for channel in channels:
                        if channel is not None and channel.is_open:
                            channel.close()
            except (self._pika.exceptions.AMQPError, OSError):
                logger.debug("RabbitMQ close failed; the broker drops the connection anyway", exc_info=True)
