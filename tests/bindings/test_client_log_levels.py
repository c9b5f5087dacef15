"""The broker clients behind the SQS, Service Bus, Redis and Pulsar hooks stay below their INFO chatter in task
logs too (RabbitMQ's pika: ``tests/hooks/test_client_logs.py``). SQS runs on moto's server, Service Bus on the
AMQP test double with the real azure-servicebus SDK; nothing else is contacted."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import Connection

from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.hooks.client_logs import CLIENT_LOG_LEVEL
from airflow_provider_babelqueue.hooks.connection_specs import CONNECTION_SPECS
from tests.bindings.asb_double import AsbDouble, shared_double
from tests.bindings.sqs_server import REGION

CLIENTS = ("boto3", "botocore", "azure", "uamqp", "redis", "pulsar", "pika",
           "airflow_provider_babelqueue.bindings.pulsar.binding.client")
#: The standard fields each type needs for its binding to be built (no broker is contacted by building).
FIELDS = {"babelqueue+servicebus": {"host": "contoso.servicebus.windows.net"}}


@pytest.fixture(autouse=True)
def fresh_loggers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Client loggers as a fresh worker has them (no level), and no ``namespace_levels`` choice."""
    monkeypatch.delenv("AIRFLOW__LOGGING__NAMESPACE_LEVELS", raising=False)
    saved = {name: logging.getLogger(name).level for name in CLIENTS}
    for name in CLIENTS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, spec: dict[str, Any]) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(spec))
    return conn_id


def round_trip(conn_id: str, queue: str) -> None:
    hook = get_hook(conn_id)
    try:
        binding = hook.get_binding()
        body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": 1}, queue_name=queue))
        binding.publish(body, queue)
        message = binding.reserve(queue, timeout=2)
        assert message is not None and message.body == body
        binding.ack(message)
        assert binding.dead_letter_depth(queue) == 0
    finally:
        hook.close()


def client_lines(records: list[logging.LogRecord], *roots: str) -> list[str]:
    """The records at INFO or above from loggers under ``roots`` (a task log shows INFO and above)."""
    return [f"{r.name} {r.levelname}: {r.getMessage()[:120]}" for r in records
            if r.name.split(".")[0] in roots and r.levelno >= logging.INFO]


@pytest.mark.parametrize("spec", CONNECTION_SPECS, ids=lambda spec: spec.conn_type)
def test_the_hook_sets_its_clients_loggers_to_warning(spec: Any, tmp_path: Path) -> None:
    module, _, name = spec.hook_class.rpartition(".")
    fields = FIELDS.get(spec.conn_type, {"host": str(tmp_path / "q.sqlite")} if spec.conn_type.endswith("sql") else {})
    hook = getattr(import_module(module), name)("levels", connection=Connection(
        conn_id="levels", conn_type=spec.conn_type, **fields))
    try:
        binding = hook.get_binding()
    finally:
        hook.close()
    assert {logging.getLogger(client).level for client in binding.client_loggers} <= {CLIENT_LOG_LEVEL}
    assert binding.client_loggers or spec.conn_type == "babelqueue+sql"  # SQLAlchemy logs only when asked (echo)


def test_an_sqs_round_trip_logs_nothing_from_botocore(monkeypatch: pytest.MonkeyPatch, endpoint: str, admin: Any,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Without the quieting, botocore says "Found credentials in environment variables." at INFO on every new
    client (the credentials here come from the environment, as with a role on a worker). urllib3, which
    botocore sends through, logs below INFO only and is left alone: other libraries share it."""
    conn_id = define(monkeypatch, "bq_sqs_quiet", {"conn_type": "babelqueue+sqs", "extra": {
        "region_name": REGION, "endpoint_url": endpoint, "create_queues": True}})
    caplog.set_level(logging.DEBUG)
    round_trip(conn_id, f"quiet-{uuid.uuid4().hex[:10]}")
    assert client_lines(caplog.records, "boto3", "botocore", "urllib3") == []


@pytest.fixture(scope="module")
def double() -> AsbDouble:
    return shared_double()


def test_a_service_bus_round_trip_logs_nothing_below_warning_from_azure(
    monkeypatch: pytest.MonkeyPatch, double: AsbDouble, caplog: pytest.LogCaptureFixture
) -> None:
    """The azure-servicebus SDK logs its AMQP link and connection states at INFO; none of it reaches the log."""
    queue = f"quiet-{uuid.uuid4().hex[:10]}"
    conn_id = define(monkeypatch, "bq_asb_quiet", {"conn_type": "babelqueue+servicebus",
                                                   "password": double.connection_string,
                                                   "extra": {"connection_verify": double.ca_file,
                                                             "create_queues": "true"}})
    caplog.set_level(logging.DEBUG)
    try:
        round_trip(conn_id, queue)
    finally:
        for entity in [e for e in list(double.entities) if e.startswith(queue)]:
            double.delete_queue(entity)
    assert client_lines(caplog.records, "azure", "uamqp") == []
