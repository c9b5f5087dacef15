"""The Redis binding's configuration: where the server is and how queues map onto its keys.

Checked when built, and readable from a ``redis://`` URL whose unknown parameters are refused, so a wrong
connection extra or a typo fails where it is configured, not at the first reserve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ..base import Binding

__all__ = ["DEFAULT_DEAD_LETTER_SOURCES", "RedisConfig"]


#: What the binding reads besides the written DLQ unless configured: the spec's list and the SDKs' apps' list.
DEFAULT_DEAD_LETTER_SOURCES = (":failed", ".dlq")


_URL_PARAMS: dict[str, Any] = {
    "db": int, "ssl_ca_certs": str, "key_prefix": str, "dead_letter_suffix": str, "visibility_timeout": float,
    "socket_timeout": lambda text: None if text.lower() in ("", "none", "null") else float(text),
    "dead_letter_sources": str, "frames": lambda text: text.strip().lower() in ("1", "true", "yes", "on"),
}


@dataclass(frozen=True, slots=True)
class RedisConfig:
    """Where the Redis server is and how queues map onto its keys.

    :param host: server host (and ``port``); named in errors so a failing worker says where it tried.
    :param db: logical database; every SDK sharing the queues must use the same one.
    :param username: ACL user (Redis 6+); ``None`` for the default user.
    :param password: never printed: excluded from ``repr`` and from every error message.
    :param ssl: use TLS (``rediss://``), as managed Redis services require.
    :param ssl_ca_certs: CA bundle for a server certificate the system store does not trust.
    :param key_prefix: prepended to every key, to isolate environments sharing one server. Keep it empty to
        share queues with the official SDKs' legacy layout, which uses bare queue names.
    :param dead_letter_suffix: dead letters are *written* to the list ``<prefix><queue><suffix>``; ``":failed"``
        is the spec's name, ``".dlq"`` the one the official SDKs' apps write.
    :param dead_letter_sources: the DLQ lists *read* besides the written one (which is always read, first):
        suffixes (``.dlq``), ``{queue}`` templates or full names, as a list or comma text; every key takes the
        prefix. The default reads both the spec's and the SDKs' lists, so a drain, a count or a redrive sees the
        dead letters of a mixed fleet; ``()`` reads only the written list.
    :param frames: with headers, ``publish`` stores the SDKs' header frame instead of the bare envelope. Off by
        default: the frame is not in the spec, and a consumer that does not unwrap it (PHP, older SDKs) would
        see a message without ``job``. Off, headers given to ``publish`` are dropped (logged at DEBUG once).
    :param visibility_timeout: seconds a reservation may stay unsettled before it is delivered again; it must
        exceed the longest handler run, or a slow message is processed twice.
    :param socket_timeout: seconds to wait for a reply, so a half-open connection cannot hang a worker.
    :param max_message_bytes: larger bodies are refused before anything is sent; the default is Redis's
        ``proto-max-bulk-len`` (512 MiB), the largest string a server accepts unless reconfigured.
    """

    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl: bool = False
    ssl_ca_certs: str | None = None
    key_prefix: str = ""
    dead_letter_suffix: str = ":failed"
    dead_letter_sources: tuple[str, ...] | str | None = DEFAULT_DEAD_LETTER_SOURCES
    frames: bool = False
    visibility_timeout: float = 300.0
    socket_timeout: float | None = 10.0
    max_message_bytes: int = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        object.__setattr__(self, "dead_letter_sources", Binding.source_entries(self.dead_letter_sources))
        if not (isinstance(self.max_message_bytes, int) and self.max_message_bytes >= 1):
            raise ValueError(f"max_message_bytes must be a positive whole number, got {self.max_message_bytes!r}")
        if not (math.isfinite(self.visibility_timeout) and self.visibility_timeout > 0):
            raise ValueError(f"visibility_timeout must be a positive number of seconds, got {self.visibility_timeout}")
        if not self.dead_letter_suffix:
            raise ValueError("dead_letter_suffix must not be empty: the DLQ would be the queue itself")

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> RedisConfig:
        """A config from ``redis[s]://[user:password@]host[:port][/db][?key_prefix=...&...]``.

        :param url: ``rediss://`` turns TLS on. Query parameters may set ``db``, ``ssl_ca_certs``,
            ``key_prefix``, ``dead_letter_suffix``, ``dead_letter_sources`` (comma text), ``frames``,
            ``visibility_timeout`` and ``socket_timeout``; unknown ones are rejected so a typo does not silently
            fall back to a default.
        :param overrides: field values that win over the URL (e.g. an Airflow connection's extras).
        """
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"expected a redis:// or rediss:// URL, got scheme {parts.scheme!r}")
        try:
            port = parts.port
        except ValueError:  # never echo the netloc: a password with an unencoded '/', '?' or '#' is cut into it
            raise ValueError("the Redis URL's host:port is malformed (percent-encode a password's special "
                             "characters)") from None
        values: dict[str, Any] = {"host": parts.hostname or "127.0.0.1", "port": port or 6379,
                                  "ssl": parts.scheme == "rediss"}
        if parts.username:
            values["username"] = unquote(parts.username)
        if parts.password:
            values["password"] = unquote(parts.password)
        if parts.path.strip("/"):
            values["db"] = int(parts.path.strip("/"))
        for key, items in parse_qs(parts.query, keep_blank_values=True).items():
            if key not in _URL_PARAMS:
                raise ValueError(f"unknown Redis URL parameter {key!r}; known: {', '.join(sorted(_URL_PARAMS))}")
            values[key] = _URL_PARAMS[key](items[-1])
        return cls(**{**values, **overrides})
