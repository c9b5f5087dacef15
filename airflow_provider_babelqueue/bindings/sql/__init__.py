"""A SQL table queue (the spec's PDO transport; SQLite by default, PostgreSQL): config, tables, binding, seen-set."""

from __future__ import annotations

from .binding import SqlBinding
from .config import SqlConfig, sqlite_url

__all__ = [
    "SqlBinding",
    "SqlConfig",
    "sqlite_url",
]
