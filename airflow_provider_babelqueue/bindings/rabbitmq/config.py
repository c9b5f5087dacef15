"""The RabbitMQ binding's configuration: where the broker is, how queues are handled, and the connection it opens.

Checked when built (the URL's parameters, a CA file that exists on this worker), so a wrong connection extra fails
where it is configured, not at the first publish.
"""

from __future__ import annotations

import math
import os
import ssl as ssl_module
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ..base import Binding, BindingError
from .wire import MAX_BODY

__all__ = ["DEFAULT_DEAD_LETTER_SOURCES", "RabbitMQConfig"]


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
