"""Counters, gauges and timings sent through Airflow's metrics client (StatsD, Datadog or OpenTelemetry, as the
deployment configures ``[metrics]``; nothing when none is on).

Every name starts with ``babelqueue.``; Airflow's client adds its own prefix (``airflow.`` by default). A name
carries what a plain StatsD server cannot take as a tag (the dead-letter reason, the queue of a depth gauge) as
its last parts; the same values go as tags (``conn_id``, ``queue_name``, ``reason``) to the clients that keep them.
docs/observability.md lists them all.

Airflow's client is imported when a metric is sent, not when this module is imported, so the engines and the
trigger stay importable without the Airflow SDK; the client itself is set up by the process Airflow runs the
code in (a task, the triggerer).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "PREFIX",
    "count",
    "count_consumed",
    "gauge",
    "gauge_dlq_depth",
    "metric_part",
    "timing",
]

PREFIX = "babelqueue"

_log = logging.getLogger(__name__)
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def metric_part(value: str) -> str:
    """One part of a metric name from a queue, connection id or reason: anything but letters, digits, ``_`` and
    ``-`` becomes ``_`` (a ``.`` would add a level to the name, a ``:`` or ``|`` would break the StatsD line)."""
    return _UNSAFE.sub("_", value) or "_"


def _stats() -> Any:
    from airflow.sdk.observability import stats

    return stats


def _tags(tags: Mapping[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in tags.items() if value is not None}


def count(name: str, value: int = 1, **tags: Any) -> None:
    """Add ``value`` to the counter ``babelqueue.<name>``; a zero is not sent."""
    if value:
        _stats().incr(f"{PREFIX}.{name}", count=value, tags=_tags(tags))


def gauge(name: str, value: float, **tags: Any) -> None:
    """Set the gauge ``babelqueue.<name>``."""
    _stats().gauge(f"{PREFIX}.{name}", value, tags=_tags(tags))


def timing(name: str, seconds: float, **tags: Any) -> None:
    """Record a duration as the timer ``babelqueue.<name>`` (milliseconds on the wire, as Airflow's own)."""
    from datetime import timedelta

    _stats().timing(f"{PREFIX}.{name}", timedelta(seconds=seconds), tags=_tags(tags))


def count_consumed(counts: Mapping[str, Any], **tags: Any) -> None:
    """The counters of one consume run, from its summary's counts (``ConsumeSummary.as_dict()``)."""
    count("consumed", int(counts.get("received", 0)), **tags)
    count("handled", int(counts.get("handled", 0)), **tags)
    count("retried", int(counts.get("retried", 0)), **tags)
    count("skipped.duplicate", int(counts.get("skipped_duplicates", 0)), **tags)
    count("skipped.unknown_urn", int(counts.get("deleted_unknown", 0)) + int(counts.get("released_unknown", 0)),
          **tags)
    count("unmatched", int(counts.get("unmatched", 0)), **tags)
    for reason, value in counts.get("dead_lettered", {}).items():
        count(f"dead_lettered.{metric_part(reason)}", value, reason=reason, **tags)


def gauge_dlq_depth(conn_id: str, queue_name: str, depth: int) -> None:
    """Send a DLQ depth just read as the gauge ``babelqueue.dlq_depth.<conn>.<queue>`` (tags ``conn_id``,
    ``queue_name``), so a dashboard sees every dead-letter queue a sensor or trigger watches without a task of
    its own. A metrics failure is logged, never raised: a gauge must not fail a wait."""
    try:
        gauge(f"dlq_depth.{metric_part(conn_id)}.{metric_part(queue_name)}", depth, conn_id=conn_id,
              queue_name=queue_name)
    except Exception:  # noqa: BLE001 - observability only
        _log.debug("could not send the dlq_depth gauge of %s", queue_name, exc_info=True)
