"""Shared by the plugin tests: a realistic report on disk, and a task that carries the report link."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
