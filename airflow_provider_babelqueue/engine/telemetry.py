"""What a consumer reports to a tracer, as protocols (pure: the engine never imports OpenTelemetry or Airflow).

:class:`~airflow_provider_babelqueue.observability.tracing.SpanTracer` implements them with OpenTelemetry spans.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..bindings.message import ReceivedMessage

__all__ = ["ConsumeTracer", "MessageSpan"]


class MessageSpan(Protocol):
    """The span of one message's processing."""

    def outcome(self, outcome: str) -> None:
        """What happened to the message (``handled``, ``retried``, ``dead_letter:<reason>``...)."""

    def failed(self, exc: BaseException) -> None:
        """The handler raised ``exc``."""


class ConsumeTracer(Protocol):
    """The calls :class:`~.consume.Consumer` makes when it is given a tracer."""

    def received(self, queue_name: str, messages: Sequence[ReceivedMessage], started_ns: int, *,
                 acked: int = 0, released: int = 0) -> None:
        """A reserve started at ``started_ns`` (``time.time_ns()``) returned ``messages``; it carried the previous
        batch's settlement (``acked``, ``released``)."""

    def process(self, message: ReceivedMessage) -> AbstractContextManager[MessageSpan]:
        """The message is processed inside the returned context."""

    def settled(self, queue_name: str, acked: int, released: int, started_ns: int) -> None:
        """A settlement started at ``started_ns`` acked and released that many messages."""
