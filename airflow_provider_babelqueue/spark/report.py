"""Spark job: dead-letter report. Triage Parquet in; ``summary.json`` and a self-contained ``report.html`` out.

Run it with ``spark-submit report.py --input <triage folder> --output <folder>``. Aggregation runs on the
cluster; only the small aggregates reach the driver, which renders the page (see ``report_html.py``).
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

try:
    from airflow_provider_babelqueue.envelope import Reason
    from airflow_provider_babelqueue.spark.common import base_parser, get_spark, join_url, print_summary, write_text
    from airflow_provider_babelqueue.spark.report_html import render_report
except ImportError as exc:  # pragma: no cover - a cluster without the package on its Python path
    raise SystemExit(f"cannot import airflow_provider_babelqueue ({exc}); pass the package zip with --py-files "
                     "(see docs/spark.md)") from exc

__all__ = ["AGE_BUCKETS", "main", "summarize", "write_report"]

HOUR_MS = 3_600_000
#: Age buckets (``age_ms`` = failed_at − created_at): label and upper bound in ms (exclusive).
AGE_BUCKETS = (("< 1 s", 1_000), ("1–10 s", 10_000), ("10 s–1 min", 60_000), ("1–10 min", 600_000),
               ("10 min–1 h", HOUR_MS), ("1 h–1 day", 24 * HOUR_MS), ("≥ 1 day", None))
_MAX_HOURS_FILLED = 24 * 90  # fill empty hours with zeros for ranges up to 90 days
TOP_FINGERPRINTS = 20
TOP_GROUPS = 200


def _hour_iso(epoch_ms: int) -> str:
    return datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:00:00Z")


def _bucket(age: F.Column) -> F.Column:
    expr = F.when(age.isNull(), F.lit("unknown"))
    for label, bound in AGE_BUCKETS:
        expr = expr.when(age < bound, F.lit(label)) if bound is not None else expr.otherwise(F.lit(label))
    return expr


def summarize(rows: DataFrame, input_path: str = "") -> dict[str, Any]:
    """The report's numbers, from triage rows (see docs/spark.md for the layout of ``summary.json``).

    Four Spark jobs, each reading only the columns it needs straight from the input (Parquet is columnar, so
    that is cheap, and nothing is cached: the report adds no memory to a triage that just wrote the rows):
    the totals with the age buckets (a fixed set of labels, so they are conditional counts), the small
    complete breakdowns (by reason, by language, per hour) as grouping sets of one aggregate, and the two
    top-N lists, ranked on the cluster so that only N rows reach the driver.

    :param rows: triage rows (the Parquet ``triage.py`` writes, or the DataFrame it wrote).
    :param input_path: what to name as the input in the summary.
    """
    bucket = _bucket(F.col("age_ms"))
    labels = [label for label, _ in AGE_BUCKETS] + ["unknown"]
    totals_row = rows.agg(
        F.count(F.lit(1)).alias("dead_letters"), F.coalesce(F.sum("copies"), F.lit(0)).alias("records"),
        F.sum(F.when(F.col("reason") == str(Reason.POISON), 1).otherwise(0)).alias("poison"),
        F.countDistinct("urn").alias("urns"), F.countDistinct("original_queue").alias("queues"),
        F.countDistinct("fingerprint").alias("fingerprints"),
        F.min("failed_at").alias("first_failed_at"), F.max("failed_at").alias("last_failed_at"),
        F.sum(F.when(F.col("failed_at").isNull(), 1).otherwise(0)).alias("without_failed_at"),
        *[F.count(F.when(bucket == label, 1)).alias(f"_age_{i}") for i, label in enumerate(labels)],
    ).first().asDict()
    ages = {label: totals_row.pop(f"_age_{i}") for i, label in enumerate(labels)}
    totals = {key: (value if value is not None or key.endswith("failed_at") else 0)
              for key, value in totals_row.items()}
    totals["records"] = int(totals["records"])
    totals["duplicates_removed"] = totals["records"] - totals["dead_letters"]
    age_buckets = [{"bucket": label, "count": ages[label]} for label, _ in AGE_BUCKETS]
    if ages["unknown"]:
        age_buckets.append({"bucket": "unknown", "count": ages["unknown"]})

    # by reason, by language and per hour: one scan; grouping_id tells which breakdown a row belongs to
    hour = F.floor(F.col("failed_at") / HOUR_MS) * HOUR_MS
    small = rows.select("reason", "lang", hour.alias("h")).groupingSets(
        [["reason"], ["lang"], ["h"]], "reason", "lang", "h").agg(
        F.count(F.lit(1)).alias("count"), F.grouping_id("reason", "lang", "h").alias("gid")).collect()
    by_set: dict[str, list[Any]] = {"reason": [], "lang": [], "h": []}
    for r in small:
        name = {0b011: "reason", 0b101: "lang", 0b110: "h"}[r["gid"]]
        by_set[name].append(r)
    by_reason = {r["reason"]: r["count"]
                 for r in sorted(by_set["reason"], key=lambda r: (r["reason"] is not None, r["reason"] or ""))}
    langs = {(r["lang"] or "unknown"): r["count"] for r in by_set["lang"]}
    hours = {r["h"]: r["count"] for r in by_set["h"] if r["h"] is not None}
    if hours and (max(hours) - min(hours)) // HOUR_MS <= _MAX_HOURS_FILLED:
        keys = range(min(hours), max(hours) + HOUR_MS, HOUR_MS)
    else:
        keys = sorted(hours)
    hourly = [{"hour": _hour_iso(h), "epoch_ms": h, "count": hours.get(h, 0)} for h in keys]

    groups = rows.groupBy("reason", "urn", "original_queue").count()
    by_group = [{"reason": r["reason"], "urn": r["urn"], "original_queue": r["original_queue"], "count": r["count"]}
                for r in groups.orderBy(F.desc("count"), "reason", "urn", "original_queue").limit(TOP_GROUPS)
                .collect()]

    prints = rows.groupBy("fingerprint").agg(
        F.count(F.lit(1)).alias("count"), F.min("exception").alias("exception"),
        F.min("exception_type").alias("exception_type"), F.min("error_pattern").alias("error_pattern"),
        F.min("error").alias("example_error"), F.sort_array(F.collect_set("reason")).alias("reasons"),
        F.min("failed_at").alias("first_failed_at"), F.max("failed_at").alias("last_failed_at"))
    top = [r.asDict() for r in prints.orderBy(F.desc("count"), "fingerprint").limit(TOP_FINGERPRINTS).collect()]
    return {
        "version": 1, "input": input_path, "totals": totals, "by_reason": by_reason,
        "by_reason_urn_queue": by_group, "top_fingerprints": top, "hourly": hourly, "age_buckets": age_buckets,
        "by_lang": dict(sorted(langs.items())),
    }


def write_report(spark: SparkSession, rows: DataFrame, input_path: str, output: str) -> dict[str, Any]:
    """Summarize triage rows and write ``<output>/summary.json`` and ``<output>/report.html``."""
    summary = summarize(rows, input_path)
    text = json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    write_text(spark, join_url(output, "summary.json"), text)
    write_text(spark, join_url(output, "report.html"), render_report(summary))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser("BabelQueue dead-letter report: triage Parquet → summary.json + report.html")
    args = parser.parse_args(argv)
    spark = get_spark(args.app_name or "babelqueue-report")
    try:
        summary = write_report(spark, spark.read.parquet(*args.input), ",".join(args.input), args.output)
        print_summary({"job": "report", "output": args.output, "dead_letters": summary["totals"]["dead_letters"],
                       "by_reason": summary["by_reason"], "summary": join_url(args.output, "summary.json"),
                       "report": join_url(args.output, "report.html")})
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
