"""Airflow connections for the real brokers on this machine, for tests that run operators in DAGs.

``define(monkeypatch, conn_id)`` sets ``AIRFLOW_CONN_<ID>`` for one of them. ``babelqueue_default`` needs
nothing: it is the embedded SQLite queue.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

SPECS: dict[str, dict[str, Any] | None] = {
    "babelqueue_default": None,
    "bq_postgres": {
        "conn_type": "babelqueue+sql",
        "host": "127.0.0.1",
        "port": 5432,
        "login": "postgres",
        "schema": "test",
        "extra": {"dialect": "postgresql", "table": "op_jobs"},
    },
    "bq_redis": {"conn_type": "babelqueue+redis", "host": "127.0.0.1", "port": 6379, "extra": {"key_prefix": "bqop:"}},
    "bq_rabbitmq": {
        "conn_type": "babelqueue+rabbitmq",
        "host": "127.0.0.1",
        "port": 5672,
        "login": "guest",
        "password": "guest",
    },
    "bq_sqs": {"conn_type": "babelqueue+sqs", "login": "testing", "password": "testing"},  # + moto endpoint
}
ALL = list(SPECS)
#: connections whose broker can browse its dead-letter queue (filters by reason/URN, browse drains)
BROWSABLE = ["babelqueue_default", "bq_postgres", "bq_redis"]


def spec(conn_id: str) -> dict[str, Any] | None:
    value = SPECS[conn_id]
    if conn_id == "bq_sqs":
        from tests.bindings.sqs_server import REGION, moto_endpoint

        # create_queues: the operator tests publish to fresh queues, and SQS creates none by default
        value = {**value, "extra": {"region_name": REGION, "endpoint_url": moto_endpoint(), "create_queues": True}}
    return value


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str) -> str:
    value = spec(conn_id)
    if value is not None:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(value))
    return conn_id
