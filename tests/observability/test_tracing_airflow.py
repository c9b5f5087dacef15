"""Traces as a deployment meets them: a real local Airflow (scheduler, LocalExecutor workers, api-server) with its
own OpenTelemetry tracing on (``[traces] otel_on``, the OTLP/HTTP exporter) sends its spans to a collector on
loopback; ``[babelqueue] tracing`` stays ``auto``. A publish task and a consume task on RabbitMQ make one trace:
the send span is a child of the publish task's ``worker.publish`` span, the process span a child of the send span,
and the consume task's receive span a child of ``worker.consume``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.connections import SPECS
from tests.local_airflow import LocalAirflow, connection_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DAG = '''
import datetime
from airflow.sdk import DAG
from airflow_provider_babelqueue.operators.consume import BabelQueueConsumeOperator
from airflow_provider_babelqueue.operators.publish import BabelQueuePublishOperator

with DAG("bq_traced", schedule="@once", start_date=datetime.datetime(2026, 1, 1), catchup=False):
    publish = BabelQueuePublishOperator(task_id="publish", babelqueue_conn_id="bq_rabbitmq", queue_name="{queue}",
                                        urn="urn:babel:orders:created", data={{"order_id": 1}})
    consume = BabelQueueConsumeOperator(task_id="consume", babelqueue_conn_id="bq_rabbitmq", queue_name="{queue}",
                                        reserve_timeout=1, handlers={{"urn:babel:orders:created": "builtins.len"}})
    publish >> consume
'''


class Collector:
    """An OTLP/HTTP trace receiver: keeps every span it is sent, by name."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[Any] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        collector.spans.extend(scope.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def named(self, name: str) -> list[Any]:
        return [span for span in list(self.spans) if span.name == name]


@pytest.fixture
def collector() -> Iterator[Collector]:
    receiver = Collector()
    yield receiver
    receiver.server.shutdown()


def test_a_dag_run_with_airflows_tracing_on_is_one_trace(tmp_path: Path, collector: Collector) -> None:
    queue = f"traced-{uuid.uuid4().hex[:8]}"
    env = {
        **connection_env("bq_rabbitmq", SPECS["bq_rabbitmq"]),  # type: ignore[arg-type]
        "AIRFLOW__TRACES__OTEL_ON": "True",
        "OTEL_TRACES_EXPORTER": "otlp_proto_http",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    airflow = LocalAirflow(tmp_path, {"traced.py": DAG.format(queue=queue)}, env)
    with airflow:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (collector.named(f"process {queue}")
                                                   and collector.named("worker.consume")):
            airflow.check_alive()
            time.sleep(1)
        assert collector.named(f"process {queue}"), airflow.tails()
    [worker_publish] = collector.named("worker.publish")
    [worker_consume] = collector.named("worker.consume")
    [send] = collector.named(f"send {queue}")
    [process] = collector.named(f"process {queue}")
    receive = collector.named(f"receive {queue}")
    assert send.parent_span_id == worker_publish.span_id and send.trace_id == worker_publish.trace_id
    assert process.parent_span_id == send.span_id and process.trace_id == send.trace_id
    assert [span.parent_span_id for span in receive] == [worker_consume.span_id]
    attributes = {a.key: a.value.string_value or a.value.int_value for a in process.attributes}
    assert attributes["messaging.system"] == "rabbitmq" and attributes["babelqueue.outcome"] == "handled"
