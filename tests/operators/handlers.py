"""Handlers referenced by dotted path from test DAGs (the way a DAG file keeps imports out)."""

from __future__ import annotations

from typing import Any

HANDLED: list[dict[str, Any]] = []


def record(envelope: dict[str, Any]) -> None:
    HANDLED.append(envelope)


def always_fail(envelope: dict[str, Any]) -> None:
    raise TimeoutError(f"downstream timed out for order {envelope['data'].get('order_id')}")
