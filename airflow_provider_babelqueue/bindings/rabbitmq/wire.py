"""RabbitMQ pieces that need no connection: the contract projection, the config, the batch confirmer.

The broker's conformance rules as pure functions, so the conformance tests run them without a broker;
:mod:`.binding` applies them to a live client.
"""

from __future__ import annotations

import math
import os
import ssl as ssl_module
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ...core import envelope as bq
from ..base import Binding, BindingError
from ..message import parse_body

__all__ = ["DEFAULT_DEAD_LETTER_SOURCES", "MAX_BODY", "MIRROR", "RabbitMQConfig", "amqp_properties"]

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


def amqp_properties(
    envelope_or_body: Mapping[str, Any] | bytes, headers: Mapping[str, Any] | None = None
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
        raw_meta = env.get("meta")
        meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
        props["content_encoding"] = "utf-8"
        for name, value in (
            ("type", bq.urn_of(env)),
            ("correlation_id", env.get("trace_id")),
            ("message_id", meta.get("id")),
        ):
            if isinstance(value, str) and value and len(value.encode("utf-8", "surrogatepass")) <= 255:
                props[name] = value
        props["app_id"] = "babelqueue"
        attempts = env.get("attempts", 0)
        contract = {
            "x-schema-version": meta.get("schema_version"),
            "x-source-lang": meta.get("lang"),
            "x-attempts": attempts if _int64(attempts) and attempts >= 0 else 0,
        }
        table = {k: v for k, v in table.items() if k not in _CONTRACT}
        table.update((k, v) for k, v in contract.items() if (isinstance(v, str) if k == "x-source-lang" else _int64(v)))
    if table:
        props["headers"] = table
    return props


def _flag(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


#: What the binding reads besides the written DLQ unless configured: the spec's queue and the SDKs' apps' queue.
DEFAULT_DEAD_LETTER_SOURCES = (".failed", ".dlq")

_URL_PARAMS: dict[str, Any] = {
    "ssl_ca_certs": str,
    "dead_letter_suffix": str,
    "dead_letter_sources": str,
    "heartbeat": int,
    "socket_timeout": float,
    "blocked_connection_timeout": float,
    "visibility_timeout": float,
    "declare_queues": _flag,
    "publisher_confirms": _flag,
}


@dataclass(frozen=True, slots=True)
class RabbitMQConfig:
    """Where the broker is and how queues are handled.

    :param host: broker host (with ``port``), named in every error so a failing worker says where it tried.
    :param virtual_host: every SDK sharing the queues must use the same one.
    :param password: never printed: excluded from ``repr`` and from error messages.
    :param ssl: AMQPS (usually port 5671); ``ssl_ca_certs``: a CA bundle the system store lacks.
    :param dead_letter_suffix: dead letters are *written* to ``<queue><suffix>``: ``".failed"`` is the spec's
        name, ``".dlq"`` the one the SDKs' apps write.
    :param dead_letter_sources: the DLQs *read* besides the written one (always read, first): suffixes,
        ``{queue}`` templates or full names, as a list or comma text. The default reads the spec's and the SDKs'
        queues, so counts, drains and redrives see a mixed fleet's dead letters; ``()`` reads only the written
        one. A read never declares a queue: a missing one counts as empty.
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
    :param max_message_bytes: larger bodies are refused before anything is sent; the default is the broker's
        default ``max_message_size`` (128 MiB). Set it to your broker's value if you changed that.
    """

    host: str = "127.0.0.1"
    port: int = 5672
    virtual_host: str = "/"
    username: str = "guest"
    password: str = field(default="guest", repr=False)
    ssl: bool = False
    ssl_ca_certs: str | None = None
    dead_letter_suffix: str = ".failed"
    dead_letter_sources: tuple[str, ...] | str | None = DEFAULT_DEAD_LETTER_SOURCES
    declare_queues: bool = True
    publisher_confirms: bool = True
    heartbeat: int | None = None
    blocked_connection_timeout: float | None = 300.0
    socket_timeout: float | None = 10.0
    visibility_timeout: float | None = None
    max_message_bytes: int = MAX_BODY

    def __post_init__(self) -> None:
        if not (isinstance(self.max_message_bytes, int) and self.max_message_bytes >= 1):
            raise ValueError(f"max_message_bytes must be a positive whole number, got {self.max_message_bytes!r}")
        if not self.dead_letter_suffix:
            raise ValueError("dead_letter_suffix must not be empty: the DLQ would be the queue itself")
        object.__setattr__(self, "dead_letter_sources", Binding.source_entries(self.dead_letter_sources))
        if (vt := self.visibility_timeout) is not None and not (math.isfinite(vt) and vt > 0):
            raise ValueError(f"visibility_timeout must be a positive number of seconds or None, got {vt}")
        if self.ssl_ca_certs and not self.ssl:
            raise ValueError("ssl_ca_certs is set but ssl is off: turn ssl on (amqps) or remove the CA bundle")

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> RabbitMQConfig:
        """A config from ``amqp[s]://[user:password@]host[:port][/vhost][?heartbeat=30&...]``.

        As in pika and the SDKs, no path (or ``/``) is the vhost ``/``. ``amqps`` turns TLS on (port 5671).
        Query parameters may set the fields ``ssl_ca_certs``, ``dead_letter_suffix``, ``dead_letter_sources``
        (comma text), ``declare_queues``,
        ``publisher_confirms``, ``heartbeat``, ``socket_timeout``, ``blocked_connection_timeout`` and
        ``visibility_timeout``; unknown ones are rejected, so a typo does not fall back to a default.
        :param overrides: field values that win over the URL (e.g. an Airflow connection's extras).
        """
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise ValueError(f"expected an amqp:// or amqps:// URL, got scheme {parts.scheme!r}")
        tls = parts.scheme == "amqps"
        try:
            port = parts.port
        except ValueError:  # never echo the netloc: a password with an unencoded '/', '?' or '#' is cut into it
            raise ValueError("the AMQP URL's host:port is malformed (percent-encode a password's special "
                             "characters)") from None
        values: dict[str, Any] = {
            "host": parts.hostname or "127.0.0.1",
            "port": port or (5671 if tls else 5672),
            "ssl": tls,
        }
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
            options["ssl_options"] = pika.SSLOptions(
                ssl_module.create_default_context(cafile=self.ssl_ca_certs), self.host
            )
        return pika.ConnectionParameters(
            host=self.host,
            port=self.port,
            virtual_host=self.virtual_host,
            credentials=pika.PlainCredentials(self.username, self.password),
            connection_attempts=1,
            **options,
        )


def confirmed_batch(
    pika: Any, parameters: Any, queue: str, bodies: list[bytes], props: list[Any]
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

    conn = pika.SelectConnection(
        parameters,
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_open_error_callback=on_closed,
        on_close_callback=on_closed,
    )
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
