"""OpenTelemetry spans of publish and consume, through real DAG runs (``dag.test()``) on Redis and RabbitMQ,
captured with the OpenTelemetry SDK's in-memory exporter; the official Python SDK (1.24) as an independent peer.

The global tracer provider can be set once per process: the first test that needs it installs an SDK provider
with an in-memory exporter, and each test reads the spans it made. ``[babelqueue] tracing`` stays ``auto`` (off,
Airflow's tracing being off) outside the tests that set it, so other tests in the process see no headers added.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk import DAG
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from airflow_provider_babelqueue.observability import tracing
from airflow_provider_babelqueue.operators.consume import BabelQueueConsumeOperator
from airflow_provider_babelqueue.operators.publish import BabelQueuePublishOperator
from tests.airflow_harness import run_dag, task_states, xcom
from tests.connections import SPECS, define
from tests.observability.otel import EXPORTER as _EXPORTER
from tests.observability.otel import ours as _ours
from tests.observability.otel import provider as _provider

URN = "urn:babel:orders:created"
@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    _provider()
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__TRACING", "on")
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _by_name(exporter: InMemorySpanExporter, prefix: str) -> list[Any]:
    return [s for s in _ours(exporter) if s.name.startswith(prefix)]


# ----------------------------------------------------------------------------------- the trace_id bridge


@given(st.one_of(st.uuids().map(str), st.text(max_size=40), st.just("00000000-0000-0000-0000-000000000000"),
                 st.uuids().map(lambda u: u.hex.upper())))
def test_trace_id_bridge_equals_the_official_sdk(trace_id: str) -> None:
    from babelqueue import otel

    assert tracing.otel_trace_id(trace_id) == otel.trace_id_of(trace_id)
    assert tracing.bridge_span_id(trace_id) == otel._span_id_of(trace_id)  # the SDK's own derivation
    assert tracing.trace_uuid(tracing.otel_trace_id(trace_id)) == otel.uuid_of(otel.trace_id_of(trace_id))


# ------------------------------------------------------------------------------- publish → consume in DAGs


def _redis_with_frames(monkeypatch: pytest.MonkeyPatch) -> str:
    import json

    spec = {**SPECS["bq_redis"], "extra": {"key_prefix": "bqtrace:", "frames": True}}  # type: ignore[dict-item]
    monkeypatch.setenv("AIRFLOW_CONN_BQ_REDIS_FRAMES", json.dumps(spec))
    return "bq_redis_frames"


def _publish_consume_dag(conn_id: str, queue: str, **publish: Any) -> Any:
    with DAG(f"bq_trace_{uuid.uuid4().hex[:8]}", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
        send = BabelQueuePublishOperator(task_id="publish", babelqueue_conn_id=conn_id, queue_name=queue, urn=URN,
                                         data={"order_id": 7}, **publish)
        take = BabelQueueConsumeOperator(task_id="consume", babelqueue_conn_id=conn_id, queue_name=queue,
                                         reserve_timeout=0.5, handlers={URN: "tests.operators.handlers.record"})
        send >> take
    return dag


@pytest.mark.parametrize("conn", ["bq_redis_frames", "bq_rabbitmq"])
def test_publish_and_consume_tasks_make_one_trace(conn: str, spans: InMemorySpanExporter,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = _redis_with_frames(monkeypatch) if conn == "bq_redis_frames" else define(monkeypatch, conn)
    queue = f"traced-{uuid.uuid4().hex[:8]}"
    run = run_dag(_publish_consume_dag(conn_id, queue))
    assert task_states(run) == {"publish": "success", "consume": "success"}
    [meta_id] = xcom(run, "publish")
    [send] = _by_name(spans, "send ")
    [process] = _by_name(spans, "process ")
    receive = _by_name(spans, "receive ")
    assert send.name == f"send {queue}" and send.kind == trace.SpanKind.PRODUCER
    assert send.attributes["messaging.system"] == ("redis" if conn == "bq_redis_frames" else "rabbitmq")
    assert send.attributes["messaging.destination.name"] == queue
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messaging.message.id"] == meta_id
    assert send.attributes["babelqueue.urn"] == URN
    # the consumer's span is a child of the producer span: the traceparent came in the native headers
    assert process.context.trace_id == send.context.trace_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert process.kind == trace.SpanKind.CONSUMER
    assert process.attributes["messaging.message.id"] == meta_id
    assert process.attributes["babelqueue.outcome"] == "handled"
    assert process.attributes["babelqueue.trace_id"] == tracing.trace_uuid(send.context.trace_id)
    assert len(receive) == 1 and receive[0].attributes["messaging.batch.message_count"] == 1
    assert [link.context.span_id for link in process.links] == [receive[0].context.span_id]
    settle = _by_name(spans, "settle ")
    assert sum(s.attributes["babelqueue.acked"] for s in settle) == 1
    assert {s.context.trace_id for s in _ours(spans)} >= {send.context.trace_id}


def test_without_headers_the_trace_id_carries_the_trace(spans: InMemorySpanExporter,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis without frames carries no header: the envelope's trace_id (the producer's trace as a UUID) still
    puts the consumer in the producer's trace, under the remote span the id stands for."""
    conn_id = define(monkeypatch, "bq_redis")
    queue = f"bare-{uuid.uuid4().hex[:8]}"
    run = run_dag(_publish_consume_dag(conn_id, queue))
    assert task_states(run) == {"publish": "success", "consume": "success"}
    [send], [process] = _by_name(spans, "send "), _by_name(spans, "process ")
    assert process.context.trace_id == send.context.trace_id
    trace_id = process.attributes["babelqueue.trace_id"]
    assert process.parent.span_id == tracing.bridge_span_id(trace_id) != send.context.span_id


def test_a_given_trace_id_is_continued(spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = define(monkeypatch, "bq_rabbitmq")
    queue, trace_id = f"given-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    run = run_dag(_publish_consume_dag(conn_id, queue, trace_id=trace_id))
    assert task_states(run) == {"publish": "success", "consume": "success"}
    [send], [process] = _by_name(spans, "send "), _by_name(spans, "process ")
    assert send.context.trace_id == process.context.trace_id == int(trace_id.replace("-", ""), 16)
    assert send.parent.span_id == tracing.bridge_span_id(trace_id)
    assert process.parent.span_id == send.context.span_id
    assert process.attributes["babelqueue.trace_id"] == trace_id


def test_a_failing_handler_marks_its_span(spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = define(monkeypatch, "bq_rabbitmq")
    queue = f"failing-{uuid.uuid4().hex[:8]}"
    with DAG(f"bq_trace_fail_{uuid.uuid4().hex[:8]}", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
        send = BabelQueuePublishOperator(task_id="publish", babelqueue_conn_id=conn_id, queue_name=queue, urn=URN,
                                         data={"order_id": 8})
        take = BabelQueueConsumeOperator(task_id="consume", babelqueue_conn_id=conn_id, queue_name=queue,
                                         reserve_timeout=0.5, max_attempts=1,
                                         handlers={URN: "tests.operators.handlers.always_fail"})
        send >> take
    run = run_dag(dag)
    assert task_states(run) == {"publish": "success", "consume": "success"}
    [process] = _by_name(spans, "process ")
    assert process.attributes["babelqueue.outcome"] == "dead_letter:failed"
    assert process.status.status_code == trace.StatusCode.ERROR
    assert [event.name for event in process.events] == ["exception"]


# ----------------------------------------------------------------------------- the official SDK as producer


@pytest.mark.interop
@pytest.mark.parametrize("conn", ["bq_redis_frames", "bq_rabbitmq"])
def test_a_message_from_the_official_sdk_continues_its_trace(conn: str, spans: InMemorySpanExporter,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from babelqueue import BabelQueue, otel

    conn_id = _redis_with_frames(monkeypatch) if conn == "bq_redis_frames" else define(monkeypatch, conn)
    queue = f"sdk-{uuid.uuid4().hex[:8]}"
    # the SDK writes the legacy Redis layout's list under the queue's own name; our connection prefixes keys
    url = "redis://127.0.0.1:6379/0" if conn == "bq_redis_frames" else "amqp://guest:guest@127.0.0.1:5672/%2F"
    app = BabelQueue(url, queue=("bqtrace:" + queue) if conn == "bq_redis_frames" else queue)
    tracer = trace.get_tracer("an-sdk-service")
    with tracer.start_as_current_span("checkout") as root:
        meta_id = otel.publish(tracer, app, URN, {"order_id": 42})
    with DAG(f"bq_trace_sdk_{uuid.uuid4().hex[:8]}", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
        BabelQueueConsumeOperator(task_id="consume", babelqueue_conn_id=conn_id, queue_name=queue, reserve_timeout=0.5,
                                  handlers={URN: "tests.operators.handlers.record"})
    run = run_dag(dag)
    assert task_states(run) == {"consume": "success"}
    assert xcom(run, "consume")["handled"] == 1
    [sdk_send] = [s for s in spans.get_finished_spans() if s.name == f"publish {URN}"]
    [process] = _by_name(spans, "process ")
    assert process.context.trace_id == root.get_span_context().trace_id == sdk_send.context.trace_id
    assert process.parent.span_id == sdk_send.context.span_id
    assert process.attributes["messaging.message.id"] == meta_id


# ---------------------------------------------------------------------------------------------- tracing off


def test_with_tracing_off_no_span_is_made_and_no_header_added(monkeypatch: pytest.MonkeyPatch) -> None:
    _provider()
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__TRACING", "off")
    _EXPORTER.clear()
    conn_id = define(monkeypatch, "bq_rabbitmq")
    queue = f"untraced-{uuid.uuid4().hex[:8]}"
    with DAG(f"bq_untraced_{uuid.uuid4().hex[:8]}", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
        BabelQueuePublishOperator(task_id="publish", babelqueue_conn_id=conn_id, queue_name=queue, urn=URN,
                                  data={"order_id": 9})
    run = run_dag(dag)
    assert task_states(run) == {"publish": "success"}
    assert _ours(_EXPORTER) == []
    from airflow_provider_babelqueue.hooks import get_hook

    hook = get_hook(conn_id)
    try:
        [message] = hook.get_binding().reserve_many(queue, 1, timeout=2)
        assert "traceparent" not in message.headers
        hook.get_binding().ack(message)
    finally:
        hook.close()


def test_auto_follows_airflows_own_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__TRACING", "auto")
    monkeypatch.setenv("AIRFLOW__TRACES__OTEL_ON", "False")
    assert tracing.tracing_mode() == "off"
    monkeypatch.setenv("AIRFLOW__TRACES__OTEL_ON", "True")
    assert tracing.tracing_mode() == "on"
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__TRACING", "sometimes")
    with pytest.raises(ValueError, match=r"\[babelqueue\] tracing must be auto, on or off, got 'sometimes'"):
        tracing.tracing_mode()


def test_the_current_task_span_is_the_parent_of_send(spans: InMemorySpanExporter,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker with Airflow's tracing on runs ``execute`` inside the task's span (``worker.<task id>``): the send
    span is its child, so the message's trace is the DAG run's."""
    conn_id = define(monkeypatch, "bq_rabbitmq")
    queue = f"in-task-{uuid.uuid4().hex[:8]}"
    operator = BabelQueuePublishOperator(task_id="publish", babelqueue_conn_id=conn_id, queue_name=queue, urn=URN,
                                         data={"order_id": 5})
    with trace.get_tracer("airflow.sdk.execution_time.task_runner").start_as_current_span("worker.publish") as task:
        [meta_id] = operator.execute({})  # type: ignore[arg-type]
    [send] = _by_name(spans, "send ")
    assert send.parent.span_id == task.get_span_context().span_id
    assert send.context.trace_id == task.get_span_context().trace_id
    assert send.attributes["messaging.message.id"] == meta_id
