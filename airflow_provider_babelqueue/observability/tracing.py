"""OpenTelemetry spans for publish, receive, process and settle, named and attributed per the OpenTelemetry
messaging semantic conventions, with W3C Trace Context carried in the brokers' native headers.

When it is on. ``[babelqueue] tracing``: ``auto`` (the default) traces when Airflow's own tracing is on
(``[traces] otel_on``), ``on`` always (spans go to the global tracer provider, whichever the process set up),
``off`` never. Off, :func:`tracer_for` returns ``None`` and no span is made; OpenTelemetry is imported only
when tracing is on (Airflow depends on ``opentelemetry-api`` already).

One trace across languages. A message says which trace it belongs to twice:

* the W3C ``traceparent``/``tracestate`` headers of the producer's span, in the broker's native headers (AMQP
  headers, SQS message attributes, Service Bus application properties, Pulsar properties, the header frame on
  Redis when the connection writes frames). A consumer's process span is a child of that producer span;
* the envelope's ``trace_id``, which every SDK carries. Without a usable ``traceparent`` the process span's
  parent is derived from it exactly as the official SDKs' ``otel`` modules derive it (:func:`otel_trace_id`,
  :func:`bridge_span_id`): a UUID is the 128-bit trace id itself; any other text is hashed. A message from a
  PHP, Go, Node or Python service that traced its publish therefore continues that service's trace. When this
  provider builds an envelope while tracing, its ``trace_id`` is the producer span's trace id as a UUID, so a
  consumer that reads no headers still lands in the same trace.

Spans: ``send <queue>`` (PRODUCER) per publish call; ``receive <queue>`` (CONSUMER) per reserve that brought
messages; ``process <queue>`` (CONSUMER) per message, current while its handler runs (a handler's own spans nest
under it); ``settle <queue>`` (CLIENT) per settlement of a batch. The attributes: ``messaging.system`` (the broker),
``messaging.destination.name`` (the queue), ``messaging.operation.type`` and ``.name``, ``messaging.message.id``
(``meta.id``), ``messaging.batch.message_count``, ``babelqueue.urn``, ``babelqueue.trace_id``,
``babelqueue.outcome``. Inside an Airflow task with Airflow's tracing on, the task's span is the parent of the send,
receive and settle spans (it is the current span); a process span has the producer as its parent and links to the
receive span that brought it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..bindings.base import Binding
    from ..bindings.message import ReceivedMessage

__all__ = [
    "HEADER_TRACEPARENT",
    "HEADER_TRACESTATE",
    "MESSAGING_SYSTEMS",
    "SpanTracer",
    "bridge_span_id",
    "otel_trace_id",
    "trace_uuid",
    "tracer_for",
    "tracing_mode",
]

HEADER_TRACEPARENT = "traceparent"
HEADER_TRACESTATE = "tracestate"

#: ``messaging.system`` per binding name: the semantic conventions' values where they name one.
MESSAGING_SYSTEMS = {
    "sqs": "aws_sqs",
    "azure-service-bus": "servicebus",
    "rabbitmq": "rabbitmq",
    "pulsar": "pulsar",
    "redis": "redis",
    "sql": "babelqueue_sql",
    "memory": "babelqueue_memory",
}

_INSTRUMENTATION = "airflow_provider_babelqueue"


def tracing_mode() -> str:
    """``on`` or ``off``: ``[babelqueue] tracing`` with ``auto`` resolved through ``[traces] otel_on``."""
    from airflow.sdk.configuration import conf

    mode = (conf.get("babelqueue", "tracing", fallback="auto") or "auto").strip().lower()
    if mode in ("on", "true", "1"):
        return "on"
    if mode in ("off", "false", "0"):
        return "off"
    if mode != "auto":
        raise ValueError(f"[babelqueue] tracing must be auto, on or off, got {mode!r}")
    return "on" if conf.getboolean("traces", "otel_on", fallback=False) else "off"


def otel_trace_id(trace_id: str) -> int:
    """The 128-bit OpenTelemetry trace id an envelope's ``trace_id`` stands for, as the SDKs' ``otel`` modules
    compute it: a UUID (32 hex digits, hyphens ignored) is its own 16 bytes; anything else, or the all-zero UUID
    (OpenTelemetry's invalid id), is the first 16 bytes of its SHA-256 (1 when those are all zero)."""
    digits = trace_id.replace("-", "")
    if len(digits) == 32:
        try:
            value = int.from_bytes(bytes.fromhex(digits), "big")
        except ValueError:
            value = 0
        if value:
            return value
    return int.from_bytes(hashlib.sha256(trace_id.encode("utf-8")).digest()[:16], "big") or 1


def bridge_span_id(trace_id: str) -> int:
    """The 64-bit span id of the remote parent that stands for a ``trace_id`` when no ``traceparent`` came with
    the message: the first 8 bytes of SHA-256 over ``babelqueue-span:<trace_id>`` (1 when zero), as the SDKs
    derive it, so the parent is the same span whichever language consumed the message."""
    digest = hashlib.sha256(("babelqueue-span:" + trace_id).encode("utf-8")).digest()[:8]
    return int.from_bytes(digest, "big") or 1


def trace_uuid(trace_id: int) -> str:
    """An OpenTelemetry trace id written as the UUID an envelope's ``trace_id`` carries."""
    digits = format(trace_id & ((1 << 128) - 1), "032x")
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def tracer_for(binding: Binding, *, conn_id: str | None = None) -> SpanTracer | None:
    """The tracer for a run on ``binding``, or ``None`` when tracing is off."""
    if tracing_mode() == "off":
        return None
    return SpanTracer(binding.name, conn_id=conn_id, carries_headers=binding.carries_headers)


def _text_headers(headers: Mapping[str, Any]) -> dict[str, str]:
    """The string-valued headers (AMQP and frames may carry bytes; the propagator reads text)."""
    out: dict[str, str] = {}
    for key in (HEADER_TRACEPARENT, HEADER_TRACESTATE):
        value = headers.get(key)
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(value, str) and value:
            out[key] = value
    return out


class SpanTracer:
    """Makes the spans of one run on one broker (see the module docstring).

    :param binding_name: the binding's :attr:`~.Binding.name`, mapped to ``messaging.system``.
    :param conn_id: the Airflow connection, kept as ``babelqueue.conn_id`` so spans of two connections to one
        broker type stay apart.
    :param carries_headers: whether headers given to ``publish`` reach consumers; without, the ``trace_id`` alone
        carries the trace and no header is added.
    """

    def __init__(self, binding_name: str, *, conn_id: str | None = None, carries_headers: bool = True) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from .. import __version__

        self._trace = trace
        self._tracer = trace.get_tracer(_INSTRUMENTATION, __version__)
        self._propagator = TraceContextTextMapPropagator()
        self.system = MESSAGING_SYSTEMS.get(binding_name, binding_name)
        self.conn_id = conn_id
        self.carries_headers = carries_headers
        #: The span context of the last ``receive`` span, linked from the process spans of its messages.
        self._receive_context: Any = None

    def _attributes(self, operation: str, kind: str, queue_name: str, **more: Any) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "messaging.system": self.system,
            "messaging.destination.name": queue_name,
            "messaging.operation.type": kind,
            "messaging.operation.name": operation,
        }
        if self.conn_id:
            attributes["babelqueue.conn_id"] = self.conn_id
        attributes.update({key: value for key, value in more.items() if value is not None})
        return attributes

    def bridged_context(self, trace_id: str) -> Any:
        """A context whose current span is the remote parent a ``trace_id`` stands for."""
        trace = self._trace
        span_context = trace.SpanContext(trace_id=otel_trace_id(trace_id), span_id=bridge_span_id(trace_id),
                                         is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
        return trace.set_span_in_context(trace.NonRecordingSpan(span_context))

    def parent_of(self, headers: Mapping[str, Any], trace_id: str | None) -> Any:
        """The parent of a message's process span: the producer span its ``traceparent`` names, else the remote
        span its ``trace_id`` stands for, else ``None`` (the current context)."""
        carried = _text_headers(headers)
        if carried.get(HEADER_TRACEPARENT):
            context = self._propagator.extract(carried)
            if self._trace.get_current_span(context).get_span_context().is_valid:
                return context
        if trace_id:
            return self.bridged_context(trace_id)
        return None

    # ------------------------------------------------------------------------------------------- publish

    @contextmanager
    def send(self, queue_name: str, count: int, *, trace_id: str | None = None,
             urn: str | None = None) -> Iterator[SendSpan]:
        """The producer span of one publish call, current inside the block.

        :param trace_id: the ``trace_id`` every message of the call continues, when they share one: the span then
            belongs to that trace (its parent is the remote span the id stands for), with a link to the span that
            was current (the Airflow task's). ``None``: the span is a child of the current span, and
            :attr:`SendSpan.trace_id` is the ``trace_id`` new envelopes should carry.
        """
        trace = self._trace
        links = []
        context = None
        if trace_id:
            context = self.bridged_context(trace_id)
            current = trace.get_current_span().get_span_context()
            if current.is_valid:
                links.append(trace.Link(current))
        attributes = self._attributes("send", "send", queue_name, **{
            "messaging.batch.message_count": count if count != 1 else None, "babelqueue.urn": urn})
        with self._tracer.start_as_current_span(f"send {queue_name}", context=context, kind=trace.SpanKind.PRODUCER,
                                                attributes=attributes, links=links) as span:
            yield SendSpan(self, span)

    # ------------------------------------------------------------------------------------------- consume

    def received(self, queue_name: str, messages: Sequence[ReceivedMessage], started_ns: int, *,
                 acked: int = 0, released: int = 0) -> None:
        """Record the ``receive`` span of a reserve that brought messages (started at ``started_ns``), after the
        fact: an empty poll makes no span. ``acked``/``released``: the previous batch's settlement, carried by the
        same call (one transaction on the SQL table); on the span as ``babelqueue.acked``/``.released``, or as a
        ``settle`` span of its own when the reserve brought nothing."""
        if not messages:
            self._receive_context = None
            self.settled(queue_name, acked, released, started_ns)
            return
        attributes = self._attributes("receive", "receive", queue_name, **{
            "messaging.batch.message_count": len(messages), "babelqueue.acked": acked or None,
            "babelqueue.released": released or None})
        span = self._tracer.start_span(f"receive {queue_name}", kind=self._trace.SpanKind.CONSUMER,
                                       attributes=attributes, start_time=started_ns)
        span.end()
        self._receive_context = span.get_span_context()

    @contextmanager
    def process(self, message: ReceivedMessage) -> Iterator[ProcessSpan]:
        """The span of one message's processing, current inside the block (the handler's spans nest under it)."""
        trace = self._trace
        envelope = message.envelope if isinstance(message.envelope, Mapping) else {}
        trace_id = envelope.get("trace_id") if isinstance(envelope.get("trace_id"), str) else None
        urn = envelope.get("job") if isinstance(envelope.get("job"), str) else envelope.get("urn")
        links = [trace.Link(self._receive_context)] if self._receive_context is not None else []
        attributes = self._attributes("process", "process", message.queue_name, **{
            "messaging.message.id": message.meta_id or None, "babelqueue.urn": urn if isinstance(urn, str) else None,
            "babelqueue.trace_id": trace_id, "babelqueue.attempts": message.attempts})
        with self._tracer.start_as_current_span(f"process {message.queue_name}",
                                                context=self.parent_of(message.headers, trace_id),
                                                kind=trace.SpanKind.CONSUMER, attributes=attributes, links=links,
                                                record_exception=False, set_status_on_exception=False) as span:
            yield ProcessSpan(self, span)

    def settled(self, queue_name: str, acked: int, released: int, started_ns: int) -> None:
        """Record the ``settle`` span of a settlement (started at ``started_ns``) after the fact."""
        if not acked and not released:
            return
        attributes = self._attributes("settle", "settle", queue_name, **{
            "messaging.batch.message_count": acked + released, "babelqueue.acked": acked,
            "babelqueue.released": released})
        span = self._tracer.start_span(f"settle {queue_name}", kind=self._trace.SpanKind.CLIENT,
                                       attributes=attributes, start_time=started_ns)
        span.end()


class SendSpan:
    """The producer span of a publish call, as the publisher needs it."""

    def __init__(self, tracer: SpanTracer, span: Any) -> None:
        self._tracer = tracer
        self._span = span

    @property
    def trace_id(self) -> str:
        """The span's trace id as the UUID a new envelope's ``trace_id`` carries."""
        return trace_uuid(self._span.get_span_context().trace_id)

    def headers(self, headers: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``headers`` with this span's ``traceparent`` (and ``tracestate``) added, where the binding carries
        headers to consumers; the caller's own keys win a clash."""
        if not self._tracer.carries_headers:
            return dict(headers) if headers else None
        carrier: dict[str, str] = {}
        self._tracer._propagator.inject(carrier, context=self._tracer._trace.set_span_in_context(self._span))
        return {**carrier, **(headers or {})} or None

    def message_ids(self, ids: Sequence[str]) -> None:
        """Name the message sent (one) on the span."""
        if len(ids) == 1:
            self._span.set_attribute("messaging.message.id", ids[0])


class ProcessSpan:
    """A message's process span, as the consumer reports to it."""

    def __init__(self, tracer: SpanTracer, span: Any) -> None:
        self._tracer = tracer
        self._span = span

    def outcome(self, outcome: str) -> None:
        self._span.set_attribute("babelqueue.outcome", outcome)

    def failed(self, exc: BaseException) -> None:
        """The handler raised: the exception is recorded and the span's status is an error."""
        self._span.record_exception(exc)
        self._span.set_status(self._tracer._trace.Status(self._tracer._trace.StatusCode.ERROR, type(exc).__name__))
