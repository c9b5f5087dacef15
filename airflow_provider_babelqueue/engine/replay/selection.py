"""Which dead letters a replay takes: the selection filters and the original-queue rule. No Airflow here."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core import envelope as bq

__all__ = ["UNANNOTATED", "Selection", "attempts_of", "nonblank", "original_queue_of", "reason_of"]

#: The reason of a dead letter that carries no ``dead_letter`` block (or no reason in it): Spark's triage
#: labels such rows the same way, so a selection by reason means the same on both sides.
UNANNOTATED = "unannotated"


def nonblank(value: Any) -> str | None:
    """``value`` when it is a non-blank string, else ``None`` (a queue name read from a body or a record)."""
    return value if isinstance(value, str) and value.strip() else None


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters to replay; every given filter must match (an empty filter matches all).

    The same rules as the Spark job's ``replay_set.select`` (``tests/spark`` runs both on one corpus and compares):
    reasons match ``dead_letter.reason`` (``unannotated`` when there is none); exception types match the full
    name or its last segment (``GatewayTimeout`` matches ``App\\Exceptions\\GatewayTimeout`` and
    ``app.errors.GatewayTimeout``); original queues match ``dead_letter.original_queue``, else ``meta.queue``,
    else the queue the record was drained from; ``max_attempts`` compares ``dead_letter.attempts``, else the
    top-level ``attempts``, else 0. The age is now − ``dead_letter.failed_at``; with an age filter, a message
    without an integer ``failed_at`` does not match.
    """

    reasons: frozenset[str] | None = None
    urns: frozenset[str] | None = None
    exception_types: frozenset[str] | None = None
    original_queues: frozenset[str] | None = None
    min_age_seconds: float | None = None
    max_age_seconds: float | None = None
    max_attempts: int | None = None

    def matches(self, envelope: Mapping[str, Any], now_ms: int, fallback_queue: str | None = None) -> bool:
        """Whether ``envelope`` (a decodable dead letter) is selected.

        :param now_ms: "now" for the age filters, in Unix ms (one value for a whole run).
        :param fallback_queue: the queue the dead letter was drained from, the last source of its original queue.
        """
        dead = envelope.get("dead_letter")
        dead = dead if isinstance(dead, Mapping) else {}
        if self.reasons is not None and reason_of(envelope) not in self.reasons:
            return False
        if self.urns is not None and bq.urn_of(envelope) not in self.urns:
            return False
        if self.exception_types is not None:
            exception = dead.get("exception")
            if not isinstance(exception, str):
                return False
            short = re.split(r"[\\.:/$]", exception)[-1]
            if exception not in self.exception_types and short not in self.exception_types:
                return False
        if self.original_queues is not None and (
                (original_queue_of(envelope) or nonblank(fallback_queue)) not in self.original_queues):
            return False
        if self.max_attempts is not None and attempts_of(envelope) > self.max_attempts:
            return False
        if self.min_age_seconds is not None or self.max_age_seconds is not None:
            failed_at = dead.get("failed_at")
            if failed_at.__class__ is not int:
                return False
            age = (now_ms - failed_at) / 1000
            if self.min_age_seconds is not None and age < self.min_age_seconds:
                return False
            if self.max_age_seconds is not None and age > self.max_age_seconds:
                return False
        return True


def original_queue_of(envelope: Mapping[str, Any]) -> str | None:
    """``dead_letter.original_queue``, else ``meta.queue``, else ``None``."""
    dead, meta = envelope.get("dead_letter"), envelope.get("meta")
    original = nonblank(dead.get("original_queue")) if isinstance(dead, Mapping) else None
    return original or (nonblank(meta.get("queue")) if isinstance(meta, Mapping) else None)


def reason_of(envelope: Mapping[str, Any]) -> str:
    """``dead_letter.reason``, or :data:`UNANNOTATED` for a dead letter without one."""
    dead = envelope.get("dead_letter")
    return (nonblank(dead.get("reason")) if isinstance(dead, Mapping) else None) or UNANNOTATED


def attempts_of(envelope: Mapping[str, Any]) -> int:
    """The dead letter's attempts: ``dead_letter.attempts``, else the top-level ``attempts``, else 0."""
    dead = envelope.get("dead_letter")
    for value in (dead.get("attempts") if isinstance(dead, Mapping) else None, envelope.get("attempts")):
        if value.__class__ is int:
            return int(value)
    return 0
