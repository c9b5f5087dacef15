"""The OpenTelemetry SDK's in-memory exporter on the process's global tracer provider, for tests that read spans.

The global provider can be set once per process: the first test that needs it installs an SDK provider, and every
test reads (and clears) the one exporter. Spans are made only where a test turns tracing on.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()


def provider() -> TracerProvider:
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        current = trace.get_tracer_provider()
    assert isinstance(current, TracerProvider), "another global tracer provider is installed"
    if not getattr(current, "_bq_test_exporter", False):
        current.add_span_processor(SimpleSpanProcessor(EXPORTER))
        current._bq_test_exporter = True  # type: ignore[attr-defined]
    return current


def ours(exporter: InMemorySpanExporter = EXPORTER) -> list[Any]:
    """The spans the provider made."""
    return [s for s in exporter.get_finished_spans() if s.instrumentation_scope.name == "airflow_provider_babelqueue"]
