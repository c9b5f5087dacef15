"""W3C trace context through every binding's native headers: a message published inside a send span is processed
in a span whose parent is that send span where the binding carries headers (AMQP headers, SQS message attributes,
Service Bus application properties, Pulsar properties, Redis header frames), and under the remote span its
``trace_id`` stands for where it does not (the SQL table, Redis without frames). Same trace either way."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.engine.consume import Consumer
from airflow_provider_babelqueue.observability.tracing import SpanTracer, bridge_span_id, otel_trace_id
from tests.bindings.conftest import FACTORIES, Factory
from tests.observability.otel import EXPORTER, ours, provider

URN = "urn:babel:orders:created"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider()
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def test_the_consumer_continues_the_producers_trace(make_binding: Factory, queue_name: str,
                                                    spans: InMemorySpanExporter) -> None:
    _round_trip(make_binding(), queue_name, spans)


def test_redis_header_frames_carry_the_producer_span(tmp_path: Path, queue_name: str,
                                                     spans: InMemorySpanExporter) -> None:
    cleanups: list[Callable[[], None]] = []
    try:
        binding = FACTORIES["redis"](tmp_path, cleanups, frames=True)
        assert binding.carries_headers
        _round_trip(binding, queue_name, spans)
    finally:
        for cleanup in reversed(cleanups):
            cleanup()


def _round_trip(binding: Binding, queue_name: str, spans: InMemorySpanExporter) -> None:
    tracer = SpanTracer(binding.name, conn_id="c", carries_headers=binding.carries_headers)
    with tracer.send(queue_name, 1, urn=URN) as send:
        body = bq.encode(bq.make_envelope(URN, {"n": 1}, queue_name=queue_name, trace_id=send.trace_id))
        binding.publish(body, queue_name, headers=send.headers({"x-team": "orders"}))
    handled: list[dict[str, Any]] = []
    summary = Consumer(binding, queue_name, {URN: handled.append}, tracer=tracer).run(reserve_timeout=2)
    assert summary.handled == 1 and len(handled) == 1
    [producer] = [s for s in ours(spans) if s.name == f"send {queue_name}"]
    [process] = [s for s in ours(spans) if s.name == f"process {queue_name}"]
    trace_id = handled[0]["trace_id"]
    assert process.context.trace_id == producer.context.trace_id == otel_trace_id(trace_id)
    if binding.carries_headers:
        assert process.parent.span_id == producer.context.span_id
    else:
        assert binding.name in ("memory", "sql", "redis")
        assert process.parent.span_id == bridge_span_id(trace_id)
    assert process.attributes["messaging.system"] == tracer.system
    assert process.attributes["babelqueue.outcome"] == "handled"
