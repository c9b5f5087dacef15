"""What the engines log to, and how much of it per message.

:class:`Log`: a standard ``logging.Logger`` or adapter, or the task logger an operator passes. Airflow's task
logger is not a ``logging.Logger`` (it is structlog-based), so the engines take anything with these five
methods, called as ``log.info("format %s", value)``.

:class:`LineBudget`: the lines an engine writes *per message* (a retry, a dead letter) are capped per kind and per
minute. A failing dependency makes every message of a run fail; a task log of 100,000 retry lines helps no one and
slows the log view, where the first lines of each minute and a count of the rest say the same. The run's summary
counts every message whatever was logged.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["DEFAULT_MESSAGE_LOG_LINES", "LineBudget", "Log", "check_message_log_lines"]

#: Per-message lines of one kind an engine writes in a minute before it counts the rest instead.
DEFAULT_MESSAGE_LOG_LINES = 100


class Log(Protocol):
    """The logging calls the engines make: a %-format string and its arguments."""

    def debug(self, msg: str, /, *args: Any) -> Any: ...

    def info(self, msg: str, /, *args: Any) -> Any: ...

    def warning(self, msg: str, /, *args: Any) -> Any: ...

    def error(self, msg: str, /, *args: Any) -> Any: ...

    def exception(self, msg: str, /, *args: Any) -> Any: ...


def check_message_log_lines(value: int | None) -> int | None:
    """``value`` when it is a usable ``message_log_lines`` (a whole number >= 0, or ``None``); else ``ValueError``."""
    if value is not None and (value.__class__ is bool or not isinstance(value, int) or value < 0):
        raise ValueError(f"message_log_lines must be a whole number >= 0 or None, got {value!r}")
    return value


class LineBudget:
    """At most ``per_minute`` lines of each kind in a window of ``window`` seconds; the ones over it are counted,
    and one line per kind says how many when the window ends (or at :meth:`flush`, when the run ends).

    :param log: where the count lines go (at INFO).
    :param per_minute: lines of one kind a window allows; ``None`` allows every line (nothing is counted).
    :param window: the window's length in seconds (60: "per minute").
    :param clock: a monotonic clock, replaceable in tests.
    """

    def __init__(self, log: Log, per_minute: int | None, *, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.per_minute = check_message_log_lines(per_minute)
        self.window = window
        self.clock = clock
        self._start = clock()
        self._written: Counter[str] = Counter()
        self._held: Counter[str] = Counter()

    def allow(self, kind: str) -> bool:
        """Whether a line of ``kind`` (e.g. ``"retry"``) may be written now; ``False`` counts it instead."""
        if self.per_minute is None:
            return True
        now = self.clock()
        if now - self._start >= self.window:
            self.flush()
            self._start = now
        if self._written[kind] < self.per_minute:
            self._written[kind] += 1
            return True
        self._held[kind] += 1
        return False

    def flush(self) -> None:
        """Say how many lines of each kind were counted instead of written since the window began; start again."""
        for kind, count in sorted(self._held.items()):
            self.log.info("%d more %s lines were not logged (at most %d a minute: message_log_lines); the summary "
                          "counts every message", count, kind, self.per_minute)
        self._held.clear()
        self._written.clear()
