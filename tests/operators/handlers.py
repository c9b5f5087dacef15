"""Handlers referenced by dotted path from test DAGs (the way a DAG file keeps imports out)."""

from __future__ import annotations

from typing import Any

HANDLED: list[dict[str, Any]] = []


def record(envelope: dict[str, Any]) -> None:
    HANDLED.append(envelope)


def always_fail(envelope: dict[str, Any]) -> None:
    raise TimeoutError(f"downstream timed out for order {envelope['data'].get('order_id')}")


def order_total(envelope: dict[str, Any]) -> dict[str, Any]:
    """What a handler hands on to the next task: a small JSON result."""
    data = envelope["data"]
    return {"order_id": data["order_id"], "total": data["amount"] * 2}


def record_then_terminate_at_third(envelope: dict[str, Any]) -> None:
    """Record the message; at the third, send this process SIGTERM, as Airflow's supervisor does to a task that
    was marked failed or whose run was stopped (its task runner then calls the operator's ``on_kill``)."""
    import os
    import signal

    HANDLED.append(envelope)
    if len(HANDLED) == 3:
        os.kill(os.getpid(), signal.SIGTERM)


def with_context(envelope: dict[str, Any], context: dict[str, Any]) -> None:
    """A handler written for another calling convention: the consumer refuses it before taking a message."""
