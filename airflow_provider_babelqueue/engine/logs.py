"""What the engines log to: a standard ``logging.Logger`` or adapter, or the task logger an operator passes.

Airflow's task logger is not a ``logging.Logger`` (it is structlog-based), so the engines take anything with
these five methods, called as ``log.info("format %s", value)``.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Log"]


class Log(Protocol):
    """The logging calls the engines make: a %-format string and its arguments."""

    def debug(self, msg: str, /, *args: Any) -> Any: ...

    def info(self, msg: str, /, *args: Any) -> Any: ...

    def warning(self, msg: str, /, *args: Any) -> Any: ...

    def error(self, msg: str, /, *args: Any) -> Any: ...

    def exception(self, msg: str, /, *args: Any) -> Any: ...
