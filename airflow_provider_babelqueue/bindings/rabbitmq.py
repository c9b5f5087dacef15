"""RabbitMQ (AMQP 0-9-1) binding: durable queues on the default exchange, in the official SDKs' layout.

Queues of ``q`` (durable; default exchange, routing key = queue name): ``q`` holds persistent
``application/json`` messages whose properties project the envelope (:func:`amqp_properties`, as every SDK
writes them); ``q<dead_letter_suffix>`` (``q.failed`` per the spec, ``.dlq`` for the SDKs' apps) the annotated
dead letters; ``q.delay.<ms>`` one queue per distinct delay, with ``x-message-ttl=<ms>`` and dead-lettering
through the default exchange back to ``q`` (no broker plugin). One TTL per queue keeps expiry in arrival
order; per-message ``expiration`` on one shared queue would hold a short delay behind a long one (RabbitMQ
only expires the head). ``x-expires`` drops a delay queue a minute after its last use.

Reserving is ``basic.get`` with manual ack, polled while ``reserve(timeout=...)`` waits. A reservation is an
unacked delivery on this binding's channel: when the process dies (SIGKILL included) or the connection drops,
RabbitMQ requeues it itself. That is the crash recovery, with no deadline to tune. Queues declared by someone
else (``x-dead-letter-exchange``, TTL, quorum type) are used as they are: a queue is declared only after a
passive declare, on a separate channel, found it missing (a failed declare closes its channel, and closing
the channel that holds reservations would requeue them all).

One binding may serve several threads: channel operations take a lock (pika is not thread-safe). A daemon
thread keeps heartbeats flowing while a handler holds a reservation, so a slow handler does not lose it.
"""

from __future__ import annotations

import logging
import math
import os
import ssl as ssl_module
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .. import envelope as bq
from .base import (
    Binding,
    BindingError,
    NotSupportedError,
    PublishBatchError,
    ReceivedMessage,
    bumped_body,
    dead_letter_body,
    parse_body,
    require_extra,
)

__all__ = ["MAX_BODY", "MIRROR", "RabbitMQBinding", "RabbitMQConfig", "amqp_properties"]

logger = logging.getLogger(__name__)

#: RabbitMQ's default ``max_message_size``: a larger body is refused before anything is sent.
MAX_BODY = 128 * 1024 * 1024
#: Prefix of the received properties mirrored into ``ReceivedMessage.headers`` (dropped again on publish).
MIRROR = "amqp."
_CONTRACT = ("x-schema-version", "x-source-lang", "x-attempts")
#: Written by the broker (native dead-lettering, quorum queues): never forwarded on a republish.
_BROKER_HEADERS = ("x-death", "x-first-death-", "x-last-death-", "x-delivery-count")
_CONFIRM_TIMEOUT = 120.0  # longest wait for a batch's confirms


def _int64(value: Any) -> bool:
    return value.__class__ is int and -(2**63) <= value < 2**63


def amqp_properties(envelope_or_body: Mapping[str, Any] | bytes, headers: Mapping[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The AMQP properties of one message as plain values (pure: the conformance test needs no broker).

    ``type`` = URN, ``correlation_id`` = trace_id, ``message_id`` = meta.id, ``app_id`` ``babelqueue``, the
    native-typed headers ``x-schema-version`` (int), ``x-source-lang`` (str), ``x-attempts`` (int), plus
    persistence and ``content_encoding`` ``utf-8`` like the official SDK. ``headers`` join the table but never
    replace a contract header; ``amqp.*`` mirrors and broker-written headers are dropped, so a received
    message's headers forward safely. An undecodable body gets the content type and persistence only:
    there is nothing to project. A string over AMQP's 255-byte short-string limit is left out rather than
    failing the publish (the body stays authoritative).
    """
    env = envelope_or_body if isinstance(envelope_or_body, Mapping) else parse_body(bytes(envelope_or_body))[0]
    table = {str(k): v for k, v in (headers or {}).items() if not str(k).startswith((MIRROR, *_BROKER_HEADERS))}
    props: dict[str, Any] = {"content_type": "application/json", "delivery_mode": 2}
    if env is not None:
        meta = env.get("meta") if isinstance(env.get("meta"), Mapping) else {}
        props["content_encoding"] = "utf-8"
        for name, value in (("type", bq.urn_of(env)), ("correlation_id", env.get("trace_id")),
                            ("message_id", meta.get("id"))):
            if isinstance(value, str) and value and len(value.encode("utf-8", "surrogatepass")) <= 255:
                props[name] = value
        props["app_id"] = "babelqueue"
        attempts = env.get("attempts", 0)
        contract = {"x-schema-version": meta.get("schema_version"), "x-source-lang": meta.get("lang"),
                    "x-attempts": attempts if _int64(attempts) and attempts >= 0 else 0}
        table = {k: v for k, v in table.items() if k not in _CONTRACT}
        table.update((k, v) for k, v in contract.items() if (isinstance(v, str) if k == "x-source-lang" else _int64(v)))
    if table:
        props["headers"] = table
    return props


def _flag(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


_URL_PARAMS: dict[str, Any] = {
    "ssl_ca_certs": str, "dead_letter_suffix": str, "heartbeat": int, "socket_timeout": float,
    "blocked_connection_timeout": float, "visibility_timeout": float, "declare_queues": _flag,
    "publisher_confirms": _flag,
}


@dataclass(frozen=True, slots=True)
class RabbitMQConfig:
    """Where the broker is and how queues are handled.

    :param host: broker host (with ``port``), named in every error so a failing worker says where it tried.
    :param virtual_host: every SDK sharing the queues must use the same one.
    :param password: never printed: excluded from ``repr`` and from error messages.
    :param ssl: AMQPS (usually port 5671); ``ssl_ca_certs``: a CA bundle the system store lacks.
    :param dead_letter_suffix: the DLQ is ``<queue><suffix>``; ``".dlq"`` shares it with the SDKs' apps.
    :param declare_queues: create (durable, no arguments) queues that do not exist. ``False``: passive
        declares only, for queues an operator owns; a missing one is then an error.
    :param publisher_confirms: wait for the broker's confirm of every publish and every body of a batch.
        Without it publishing is fire-and-forget: a connection lost meanwhile drops messages silently.
    :param heartbeat: seconds; ``None`` takes the broker's (60), ``0`` turns heartbeats off.
    :param blocked_connection_timeout: give up after this long blocked by a broker resource alarm.
    :param socket_timeout: seconds to connect and per socket wait, so a dead network cannot hang a worker.
    :param visibility_timeout: optional lease: a reservation held longer is requeued (``basic.nack``) and its
        late settle ignored. ``None``: held until settled or the connection closes (RabbitMQ's model). The
        broker's ``consumer_timeout`` (30 min by default) closes a channel whose delivery stays unacked longer.
    """

    host: str = "127.0.0.1"
    port: int = 5672
    virtual_host: str = "/"
    username: str = "guest"
    password: str = field(default="guest", repr=False)
    ssl: bool = False
    ssl_ca_certs: str | None = None
    dead_letter_suffix: str = ".failed"
    declare_queues: bool = True
    publisher_confirms: bool = True
    heartbeat: int | None = None
    blocked_connection_timeout: float | None = 300.0
    socket_timeout: float | None = 10.0
    visibility_timeout: float | None = None

    def __post_init__(self) -> None:
        if not self.dead_letter_suffix:
            raise ValueError("dead_letter_suffix must not be empty: the DLQ would be the queue itself")
        if (vt := self.visibility_timeout) is not None and not (math.isfinite(vt) and vt > 0):
            raise ValueError(f"visibility_timeout must be a positive number of seconds or None, got {vt}")
        if self.ssl_ca_certs and not self.ssl:
            raise ValueError("ssl_ca_certs is set but ssl is off: turn ssl on (amqps) or remove the CA bundle")

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> RabbitMQConfig:
        """A config from ``amqp[s]://[user:password@]host[:port][/vhost][?heartbeat=30&...]``.

        As in pika and the SDKs, no path (or ``/``) is the vhost ``/``. ``amqps`` turns TLS on (port 5671).
        Query parameters may set the fields ``ssl_ca_certs``, ``dead_letter_suffix``, ``declare_queues``,
        ``publisher_confirms``, ``heartbeat``, ``socket_timeout``, ``blocked_connection_timeout`` and
        ``visibility_timeout``; unknown ones are rejected, so a typo does not fall back to a default.
        :param overrides: field values that win over the URL (e.g. an Airflow connection's extras).
        """
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise ValueError(f"expected an amqp:// or amqps:// URL, got scheme {parts.scheme!r}")
        tls = parts.scheme == "amqps"
        values: dict[str, Any] = {"host": parts.hostname or "127.0.0.1", "port": parts.port or (5671 if tls else 5672),
                                  "ssl": tls}
        if parts.username is not None:
            values.update(username=unquote(parts.username), password=unquote(parts.password or ""))
        if len(parts.path) > 1:
            values["virtual_host"] = unquote(parts.path[1:])
        for key, items in parse_qs(parts.query, keep_blank_values=True).items():
            if key not in _URL_PARAMS:
                raise ValueError(f"unknown AMQP URL parameter {key!r}; known: {', '.join(sorted(_URL_PARAMS))}")
            values[key] = _URL_PARAMS[key](items[-1])
        return cls(**{**values, **overrides})

    def parameters(self, pika: Any) -> Any:
        """``pika.ConnectionParameters`` with one connection attempt (the caller reports a failure)."""
        options: dict[str, Any] = {"blocked_connection_timeout": self.blocked_connection_timeout}
        if self.heartbeat is not None:
            options["heartbeat"] = self.heartbeat
        if self.socket_timeout is not None:
            options.update(socket_timeout=self.socket_timeout, stack_timeout=self.socket_timeout * 3)
        if self.ssl:
            if self.ssl_ca_certs and not os.path.isfile(self.ssl_ca_certs):  # checked here: the worker's files
                raise BindingError(f"ssl_ca_certs {self.ssl_ca_certs!r} is not a readable file on this worker")
            options["ssl_options"] = pika.SSLOptions(ssl_module.create_default_context(cafile=self.ssl_ca_certs),
                                                     self.host)
        return pika.ConnectionParameters(host=self.host, port=self.port, virtual_host=self.virtual_host,
                                         credentials=pika.PlainCredentials(self.username, self.password),
                                         connection_attempts=1, **options)


def _confirmed_batch(pika: Any, parameters: Any, queue: str, bodies: list[bytes], props: list[Any]
                     ) -> tuple[list[int], str]:
    """Publish a batch on a fresh asynchronous connection and collect its confirms as they stream back.

    pika's ``BlockingChannel`` in confirm mode waits a round trip per message (about 1,100 msg/s here); this
    runs at the speed of unconfirmed publishing and still knows which body was acked, nacked or returned
    (delivery tags count the channel's publishes from 1). Returns the indexes not confirmed, and why.
    """
    outcome: list[str | None] = [None] * len(bodies)
    returned: set[int] = set()
    low, pending, next_return, opened, error = 1, len(bodies), 0, False, None

    def on_confirm(frame: Any) -> None:
        nonlocal low, pending
        method, ok = frame.method, isinstance(frame.method, pika.spec.Basic.Ack)
        for tag in range(low, method.delivery_tag + 1) if method.multiple else (method.delivery_tag,):
            if 0 < tag <= len(outcome) and outcome[tag - 1] is None:
                outcome[tag - 1] = ("returned" if tag - 1 in returned else "ok") if ok else "nacked"
                pending -= 1
        while low <= len(outcome) and outcome[low - 1] is not None:
            low += 1
        if not pending:
            conn.ioloop.stop()

    def on_return(_channel: Any, _method: Any, _props: Any, body: bytes) -> None:
        nonlocal next_return  # a Basic.Return has no delivery tag, but precedes its ack, in publish order
        for index in range(next_return, len(bodies)):
            if bodies[index] == body and outcome[index] is None:
                returned.add(index)
                next_return = index + 1
                return

    def on_channel(channel: Any) -> None:
        channel.add_on_close_callback(on_closed)
        channel.add_on_return_callback(on_return)
        channel.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda _frame: publish_all(channel))

    def publish_all(channel: Any) -> None:
        nonlocal opened
        opened = True
        for body, prop in zip(bodies, props, strict=True):
            channel.basic_publish("", queue, body, prop, mandatory=True)

    def on_closed(_source: Any, exc: BaseException) -> None:
        nonlocal error
        error = error or exc
        conn.ioloop.stop()

    conn = pika.SelectConnection(parameters, on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                 on_open_error_callback=on_closed, on_close_callback=on_closed)
    try:
        timer = conn.ioloop.call_later(_CONFIRM_TIMEOUT, conn.ioloop.stop)
        conn.ioloop.start()
        conn.ioloop.remove_timeout(timer)
        if not opened:
            raise error or pika.exceptions.AMQPConnectionError("timed out opening a connection")
        failed = [i for i, result in enumerate(outcome) if result != "ok"]
        why = {outcome[i] or "unconfirmed" for i in failed}
        if error is not None or pending:
            why.add(f"connection lost: {error}" if error else f"no confirm within {_CONFIRM_TIMEOUT:.0f} s")
        return failed, ", ".join(sorted(why))
    finally:
        if conn.is_open:
            conn.close()
            conn.ioloop.call_later(5.0, conn.ioloop.stop)
            conn.ioloop.start()  # until on_closed (or 5 s)
        conn.ioloop.close()


@dataclass(frozen=True, slots=True)
class _Receipt:
    """A delivery; its tag is valid only on the channel generation it came from."""

    generation: int
    tag: int
    source: str


class RabbitMQBinding(Binding):
    """Durable queues on the default exchange in the official SDKs' layout (see the module docstring)."""

    name = "rabbitmq"
    carries_headers = True
    can_browse = False

    def __init__(self, config: RabbitMQConfig | None = None, connection: Any = None) -> None:
        """:param config: broker and queue handling.
        :param connection: a ready ``pika.BlockingConnection`` (the test seam); :meth:`close` leaves it open and
            no heartbeat thread serves it. Batches still open their own connection from ``config``.
        """
        self.config = config or RabbitMQConfig()
        self._pika = require_extra("pika", "rabbitmq")
        self._connection, self._owns = connection, connection is None
        self._lock = threading.RLock()
        self._work: Any = None  # basic.get, ack, publish (confirm mode): never used for a declare that may fail
        self._probe: Any = None  # declares: a passive declare of a missing queue closes its channel
        self._generation = 0
        self._held: dict[int, float] = {}  # delivery tag on the current work channel → lease deadline
        self._known: set[str] = set()
        self._created: set[str] = set()
        self._stop = threading.Event()

    @property
    def declared_queues(self) -> frozenset[str]:
        """Queues this binding created (main, DLQ, delay queues): what a teardown deletes."""
        return frozenset(self._created)

    def dead_letter_name(self, queue_name: str) -> str:
        return f"{queue_name}{self.config.dead_letter_suffix}"

    def _where(self) -> str:
        return f"RabbitMQ {self.config.host}:{self.config.port} vhost {self.config.virtual_host!r}"

    def _channel(self, kind: str) -> Any:
        conn = self._connection
        if conn is None or conn.is_closed:
            if not self._owns:
                raise self._pika.exceptions.ConnectionWrongStateError("the injected connection is closed")
            conn = self._connection = self._pika.BlockingConnection(self.config.parameters(self._pika))
            self._work = self._probe = None
            self._start_pump()
        if kind == "probe":
            if self._probe is None or self._probe.is_closed:
                self._probe = conn.channel()
            return self._probe
        if self._work is None or self._work.is_closed:
            self._work = conn.channel()
            if self.config.publisher_confirms:
                self._work.confirm_delivery()
            self._generation += 1
            self._held.clear()  # the broker requeued what the closed channel held
        return self._work

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
                hint = (f"cannot reach the broker; check that RabbitMQ runs there, that the port is reachable from "
                        f"this worker and that TLS is {'on' if c.ssl else 'off'} on the server too")
            else:
                hint = {406: "the queue exists with other arguments or type; use another name or declare it alike",
                        404: "the queue does not exist; create it, or set declare_queues=True",
                        403: "the user lacks configure/write/read permission on this queue"}.get(code, "")
                hint = hint or ("the broker returned the message: the queue does not exist (deleted meanwhile?)"
                                if isinstance(exc, errors.UnroutableError) else
                                "the broker refused the message (nack): a full queue with x-overflow=reject-publish?"
                                if isinstance(exc, errors.NackError) else "the broker refused the operation")
            text = str(exc) or repr(exc)
            text = text.replace(c.password, "***") if c.password else text
            raise BindingError(f"{self._where()}: {action} on {queue!r} failed: {hint} ({type(exc).__name__}: "
                               f"{text})") from exc

    def _exists(self, queue: str, create: bool, arguments: dict[str, Any] | None = None) -> bool:
        """Passive declare first (cached), so a queue someone else declared with arguments is never redeclared."""
        if arguments is None:
            if queue in self._known:
                return True
            try:
                self._channel("probe").queue_declare(queue, passive=True)
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
        if len(body) > MAX_BODY:
            raise BindingError(f"a {len(body)}-byte body exceeds RabbitMQ's default max_message_size ({MAX_BODY})")
        if not self._exists(queue, self.config.declare_queues):
            raise BindingError(f"{self._where()}: queue {queue!r} does not exist and declare_queues is off")
        target = queue
        if delay > 0:  # redeclared on each use: that renews the delay queue's x-expires lease
            ms = max(1, math.ceil(delay * 1000))
            target = f"{queue}.delay.{ms}"
            self._exists(target, True, {"x-message-ttl": ms, "x-dead-letter-exchange": "",
                                        "x-dead-letter-routing-key": queue, "x-expires": ms + 60_000})
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
        """All bodies, then their confirms as they stream back (:func:`_confirmed_batch`); without
        ``publisher_confirms`` a plain loop. :class:`PublishBatchError` lists exactly the bodies nacked,
        returned or left unconfirmed; a body over :data:`MAX_BODY` fails the batch before anything is sent."""
        bodies = [bytes(b) for b in bodies]
        if too_big := [i for i, body in enumerate(bodies) if len(body) > MAX_BODY]:
            raise PublishBatchError(f"bodies {too_big[:10]} exceed RabbitMQ's default max_message_size ({MAX_BODY} "
                                    "bytes); nothing was sent", range(len(bodies)))
        props = [self._pika.BasicProperties(**amqp_properties(body)) for body in bodies]
        with self._lock:
            try:
                with self._guard("publish a batch", queue_name):
                    if not bodies:
                        return
                    if not self._exists(queue_name, self.config.declare_queues):
                        raise BindingError(f"{self._where()}: queue {queue_name!r} does not exist and "
                                           "declare_queues is off")
                    if not self.config.publisher_confirms:
                        for body, prop in zip(bodies, props, strict=True):
                            self._channel("work").basic_publish("", queue_name, body, prop)
                        return
                    failed, why = _confirmed_batch(self._pika, self.config.parameters(self._pika), queue_name,
                                                   bodies, props)
            except BindingError as exc:
                raise PublishBatchError(f"{exc}; no body of the batch is known to be delivered",
                                        range(len(bodies))) from exc
        if failed:
            raise PublishBatchError(f"{self._where()}: {len(failed)} of {len(bodies)} bodies to {queue_name!r} were "
                                    f"not confirmed ({why}); all others were", failed)

    def _take(self, queue_name: str, source: str, timeout: float, dead: bool) -> ReceivedMessage | None:
        end, pause = time.monotonic() + max(timeout, 0), 0.02
        while True:
            with self._lock, self._guard("reserve", source):
                self._expire()
                # Never basic.get a missing queue: its 404 would close the channel holding the reservations.
                if self._exists(source, self.config.declare_queues and not dead):
                    method, props, body = self._channel("work").basic_get(source, auto_ack=False)
                    if method is not None:
                        lease = self.config.visibility_timeout or math.inf
                        self._held[method.delivery_tag] = time.monotonic() + lease
                        receipt = _Receipt(self._generation, method.delivery_tag, source)
                        return self._received(method, props, bytes(body or b""), queue_name, dead, receipt)
            if (remaining := end - time.monotonic()) <= 0:
                return None
            time.sleep(min(pause, remaining))  # outside the lock: other threads keep working
            pause = min(pause * 2, 0.2)

    @staticmethod
    def _received(method: Any, props: Any, body: bytes, queue: str, dead: bool, receipt: _Receipt) -> ReceivedMessage:
        envelope, error, attempts = parse_body(body)
        table = dict(props.headers or {})
        if (native := table.get("x-attempts")).__class__ is int and native > attempts:
            attempts = native  # the Laravel driver's authoritative count
        names = ("type", "correlation_id", "message_id", "app_id", "content_type", "content_encoding", "delivery_mode")
        mirrors = {f"{MIRROR}{name}": getattr(props, name) for name in names if getattr(props, name) is not None}
        count = table.get("x-delivery-count")  # quorum queues count redeliveries natively
        return ReceivedMessage(
            body=body, queue_name=queue, envelope=envelope, decode_error=error, attempts=attempts,
            delivery_count=count if count.__class__ is int else None,
            headers={**table, **mirrors, f"{MIRROR}redelivered": bool(method.redelivered)},
            receipt=receipt, from_dead_letter=dead)

    def _expire(self) -> None:
        """Requeue reservations held past ``visibility_timeout`` (the caller holds the lock)."""
        if self.config.visibility_timeout is None or not self._held or self._work is None or self._work.is_closed:
            return
        now = time.monotonic()
        for tag in [tag for tag, deadline in self._held.items() if deadline <= now]:
            del self._held[tag]
            self._work.basic_nack(tag, requeue=True)
            logger.warning("RabbitMQ reservation (tag %s) passed its visibility timeout (%s s): requeued", tag,
                           self.config.visibility_timeout)

    def _settle(self, message: ReceivedMessage, action: str, copy: tuple[str, bytes, Mapping[str, Any]] | None = None,
                delay: float = 0, requeue: bool = False) -> None:
        """Publish ``copy`` (queue, body, headers) if any and wait for its confirm, then ack (or requeue)."""
        receipt = message.receipt
        if not isinstance(receipt, _Receipt):
            raise BindingError(f"message from queue {message.queue_name!r} was not reserved by a RabbitMQ binding")
        with self._lock, self._guard(action, receipt.source):
            self._expire()
            work = self._work
            if receipt.generation != self._generation or receipt.tag not in self._held or work is None \
                    or work.is_closed:
                logger.warning("RabbitMQ delivery from %r is no longer held (its channel closed or its visibility "
                               "timeout passed, so the broker requeued it); nothing was changed", receipt.source)
                return
            if copy is not None:
                self._send(*copy, delay=delay)
            del self._held[receipt.tag]
            if requeue:
                work.basic_nack(receipt.tag, requeue=True)
            else:
                work.basic_ack(receipt.tag)

    def reserve(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        return self._take(queue_name, queue_name, timeout, dead=False)

    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        return self._take(queue_name, self.dead_letter_name(queue_name), timeout, dead=True)

    def ack(self, message: ReceivedMessage) -> None:
        self._settle(message, "ack")

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
                return int(self._channel("probe").queue_declare(queue, passive=True).method.message_count)
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
        return self._count(self.dead_letter_name(queue_name))

    def browse_dead_letters(self, queue_name: str, limit: int = 100) -> list[ReceivedMessage]:
        """Not supported: a classic queue cannot be read without taking the messages, and emulating it
        (``basic.get`` + requeue) reorders the DLQ, marks every message redelivered and races concurrent drains."""
        raise NotSupportedError(f"RabbitMQ cannot read queue {self.dead_letter_name(queue_name)!r} without removing "
                                "messages (basic.get takes them); drain it with reserve_dead_letter + ack instead")

    def ping(self) -> None:
        with self._lock, self._guard("connect", "-"):
            self._channel("work")
            self._channel("probe")

    def close(self) -> None:
        """Close what this binding opened; unacked reservations go back to their queues (broker requeue)."""
        with self._lock:
            self._stop.set()
            channels, conn = (self._work, self._probe), self._connection
            self._work = self._probe = None
            self._held.clear()
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
