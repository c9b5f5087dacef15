"""Shared by the plugin tests: a realistic report on disk, a task that carries the report link, and Airflow's API
application with the plugin mounted and tokens of the simple auth manager's users."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue.spark.report_html import render_report

HOUR_MS = 3_600_000
FIRST = 1_764_000_000_000


def sample_summary() -> dict[str, Any]:
    """A summary shaped as ``report.summarize`` returns it, with ordinary values."""
    reasons = {"failed": 9, "poison": 2, "unknown_urn": 3, "unsupported_schema_version": 1}
    return {
        "version": 1,
        "input": "/data/babelqueue/runs/drain/*.jsonl",
        "totals": {"dead_letters": 15, "records": 17, "poison": 2, "urns": 3, "queues": 2, "fingerprints": 2,
                   "first_failed_at": FIRST, "last_failed_at": FIRST + 2 * HOUR_MS, "without_failed_at": 0,
                   "duplicates_removed": 2},
        "by_reason": reasons,
        "by_reason_urn_queue": [{"reason": reason, "urn": "urn:babel:orders:created", "original_queue": "orders",
                                 "count": count} for reason, count in reasons.items()],
        "top_fingerprints": [
            {"fingerprint": "a1b2c3", "count": 9, "exception": "TimeoutError", "exception_type": "TimeoutError",
             "error_pattern": "timeout after <n>s for order <n>", "example_error": "timeout after 30s for order 7",
             "reasons": ["failed"], "first_failed_at": FIRST, "last_failed_at": FIRST + HOUR_MS},
            {"fingerprint": "d4e5f6", "count": 3, "exception": None, "exception_type": None,
             "error_pattern": None, "example_error": None, "reasons": ["unknown_urn"],
             "first_failed_at": FIRST, "last_failed_at": FIRST + 2 * HOUR_MS},
        ],
        "hourly": [{"hour": f"2025-11-24T{16 + i:02d}:00:00Z", "epoch_ms": FIRST + i * HOUR_MS, "count": count}
                   for i, count in enumerate((6, 4, 5))],
        "age_buckets": [{"bucket": "< 1 s", "count": 4}, {"bucket": "1–10 s", "count": 8},
                        {"bucket": "10 s–1 min", "count": 3}],
        "by_lang": {"python": 8, "php": 4, "node": 3},
    }


def write_report(folder: Path, marker: str = "") -> tuple[Path, Path]:
    """``report.html`` and ``summary.json`` in ``folder`` as the report job writes them; ``marker`` goes into the
    summary's input, so each copy's bytes differ."""
    summary = sample_summary()
    summary["input"] += marker
    folder.mkdir(parents=True, exist_ok=True)
    html, data = folder / "report.html", folder / "summary.json"
    html.write_text(render_report(summary), encoding="utf-8")
    data.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return html, data


def report_task_class() -> Any:
    """A PythonOperator that carries the link, as ``BabelQueueSparkTriageOperator`` does, so a test DAG runs
    the real link code at the end of a real task without Spark."""
    from airflow.providers.standard.operators.python import PythonOperator

    from airflow_provider_babelqueue.operators.links import BabelQueueReportLink

    class ReportTask(PythonOperator):
        operator_extra_links = (BabelQueueReportLink(),)

    return ReportTask


def airflow_api_client(patch: pytest.MonkeyPatch) -> tuple[Any, dict[str, str]]:
    """Airflow's API application (``create_app``) with the plugin mounted by Airflow's own plugin code, and
    tokens of the simple auth manager's users."""
    from airflow import plugins_manager
    from airflow.api_fastapi import app as api_app
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    from airflow_provider_babelqueue.plugins.plugin import BabelQueuePlugin

    patch.setenv("AIRFLOW__CORE__AUTH_MANAGER",
                 "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    patch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    patch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,viewer:viewer")
    patch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "plugin-tests-" + "0123456789abcdef" * 4)
    # Airflow loads a provider's plugins when providers are discovered eagerly; hand it ours the same way
    patch.setattr(plugins_manager, "get_fastapi_plugins", lambda: (BabelQueuePlugin.fastapi_apps, []))
    api_app.purge_cached_app()
    app = api_app.create_app(apps="core")
    manager = api_app.get_auth_manager()
    tokens = {role: manager.generate_jwt(SimpleAuthManagerUser(username=role, role=role))
              for role in ("admin", "viewer", "user", "op")}
    tokens["norole"] = manager.generate_jwt(SimpleAuthManagerUser(username="norole", role=None))
    return TestClient(app), tokens
