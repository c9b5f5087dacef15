"""The SQL binding's configuration: where the queue tables live and how reservations behave.

Pure values, checked when built (a table name other SDKs can interpolate into SQL, positive timings, a URL
SQLAlchemy can parse), so a wrong connection extra fails where it is configured, not at the first reserve.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from ..base import Binding

__all__ = ["SqlConfig", "sqlite_url"]

#: At most 40 characters: PostgreSQL truncates identifiers at 63 bytes and ``<table>_failed_queue_idx`` is longest.
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
#: A dead-letter table's name: the ready table's rule plus room for ``_failed``.
_FAILED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,46}")


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """The SQLAlchemy URL of an SQLite file.

    :param path: the database file; it is made absolute so the URL means the same file whatever the
        working directory of the worker, scheduler or triggerer that opens it.
    """
    return f"sqlite:///{Path(path).expanduser().resolve()}"


@dataclass(frozen=True, slots=True)
class SqlConfig:
    """Where the queue tables live and how reservations behave.

    :param url: SQLAlchemy URL (``sqlite:////abs/path.db``, ``postgresql+psycopg2://user@host/db``).
    :param table: the ready table; dead letters go to ``<table>_failed``. It is interpolated into SQL by
        other SDKs, so only letters, digits and underscores are accepted.
    :param visibility_timeout: seconds a reserved row may stay unacked before it is delivered again; it
        must exceed the longest handler run or a slow consumer's message is handed to a second one.
    :param poll_interval: sleep between polls while ``reserve(timeout=...)`` waits; a table has no push
        notification, so this trades latency for database load.
    :param create_tables: ``CREATE TABLE IF NOT EXISTS`` on first use; turn it off where the application
        role may not run DDL and the tables are migrated separately.
    :param max_message_bytes: larger bodies are refused before the INSERT; the default is SQLite's
        ``SQLITE_MAX_LENGTH`` (10^9 bytes), just under PostgreSQL's 1 GB field limit.
    :param dead_letter_sources: dead-letter tables read besides ``<table>_failed`` (which is always read, first,
        and the only one written): full table names, suffixes after ``<table>`` (``_dlq``) or ``{table}``
        templates, as a list or comma text. Each must have the ``_failed`` layout; a missing one reads as empty
        and is never created. Empty by default: the SQL layout is the spec's own, and no SDK writes another.
    """

    url: str
    table: str = "jobs"
    visibility_timeout: float = 300.0
    poll_interval: float = 0.05
    create_tables: bool = True
    max_message_bytes: int = 1_000_000_000
    dead_letter_sources: tuple[str, ...] | str | None = ()

    def __post_init__(self) -> None:
        if not isinstance(self.table, str) or not _TABLE_NAME.fullmatch(self.table):
            raise ValueError(f"table must be 1-40 letters, digits or underscores, not led by a digit: {self.table!r}")
        entries = Binding.source_entries(self.dead_letter_sources)
        object.__setattr__(self, "dead_letter_sources", entries)
        for entry in entries:
            name = entry.replace("{table}", self.table) if "{table}" in entry else (
                entry if entry[:1].isalnum() else f"{self.table}{entry}")
            if not _FAILED_NAME.fullmatch(name):
                raise ValueError(f"dead_letter_sources: {name!r} is not a table name (letters, digits and "
                                 "underscores, not led by a digit, at most 47 characters)")
        if not self.visibility_timeout > 0:
            raise ValueError(f"visibility_timeout must be positive, got {self.visibility_timeout!r}")
        if not self.poll_interval > 0:
            raise ValueError(f"poll_interval must be positive, got {self.poll_interval!r}")
        if not (isinstance(self.max_message_bytes, int) and self.max_message_bytes >= 1):
            raise ValueError(f"max_message_bytes must be a positive whole number, got {self.max_message_bytes!r}")
        try:
            sa.make_url(self.url)
        except (sa.exc.ArgumentError, TypeError, ValueError) as exc:
            from ..redaction import redact_url, scrub, url_secrets

            # SQLAlchemy's message quotes the whole URL: show it redacted, and scrub what parsing could not place
            text = str(exc).replace(str(self.url), redact_url(str(self.url)))
            raise ValueError(f"url is not a SQLAlchemy URL: {scrub(text, url_secrets(str(self.url)))}") from None

    @property
    def safe_url(self) -> str:
        """The URL with its password masked, for messages and logs: the userinfo password (SQLAlchemy's own
        masking) and secret query parameters such as libpq's ``?password=`` (see :mod:`..redaction`)."""
        from ..redaction import redact_url

        return redact_url(sa.make_url(self.url).render_as_string(hide_password=True))

    def __repr__(self) -> str:
        return (
            f"SqlConfig(url={self.safe_url!r}, table={self.table!r}, visibility_timeout={self.visibility_timeout!r}, "
            f"poll_interval={self.poll_interval!r}, create_tables={self.create_tables!r})"
        )
