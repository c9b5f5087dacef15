"""Dead-letter drains: the drain loop, its sinks and the pipelined move. No Airflow here.

The record format itself is :mod:`airflow_provider_babelqueue.core.records`.
"""

from __future__ import annotations

from .loop import DrainResult, DrainSource, drain_dead_letters, template_for
from .sinks import LocalFileSink, Sink, StreamSink, file_name, safe_segment

__all__ = [
    "DrainResult",
    "DrainSource",
    "LocalFileSink",
    "Sink",
    "StreamSink",
    "drain_dead_letters",
    "file_name",
    "safe_segment",
    "template_for",
]
