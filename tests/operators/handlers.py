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
