"""Spark job: dead-letter report. Triage Parquet in; ``summary.json`` and a self-contained ``report.html`` out.

Run it with ``spark-submit report.py --input <triage folder> --output <folder>``. Aggregation runs on the
cluster; only the small aggregates reach the driver, which renders the page (see ``report_html.py``).
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

try:
    from airflow_provider_babelqueue.core.envelope import Reason
    from airflow_provider_babelqueue.spark.common import (
        base_parser,
        get_spark,
        join_url,
        print_summary,
        read_text,
        stop_spark,
        write_text,
    )
    from airflow_provider_babelqueue.spark.report_html import render_report
except ImportError as exc:  # pragma: no cover - a cluster without the package on its Python path
    raise SystemExit(f"cannot import airflow_provider_babelqueue ({exc}); pass the package zip with --py-files "
                     "(see docs/spark.md)") from exc

__all__ = ["AGE_BUCKETS", "UNREADABLE_CAUSES", "main", "summarize", "triage_unreadable", "write_report"]

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


def _top(groups: DataFrame, n: int, ties: Sequence[str]) -> Column:
    """An aggregate over ``groups``: the ``n`` with the largest ``count``, largest first (equal counts in
    ``ties`` order, nulls first), each as a struct of all the group's columns. It keeps ``n`` groups per
    partition and never sorts them all.

    :param groups: aggregated groups with a ``count`` column.
    :param n: how many to keep.
    :param ties: the columns that order groups of equal count (together unique, so the order is total).
    """
    return F.min_by(F.struct(*groups.columns), F.struct(-F.col("count"), *ties), n)


#: Why an input line was not triaged (triage.UNREADABLE_CAUSES; the report does not import the triage job).
UNREADABLE_CAUSES = ("torn", "too_large", "unknown_version")


def summarize(rows: DataFrame, input_path: str = "", unreadable: Mapping[str, int] | None = None,
              carried_over: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The report's numbers, from triage rows (see docs/spark.md for the layout of ``summary.json``).

    Three Spark queries, run at once, each reading only the columns it needs straight from the input (Parquet
    is columnar, so that is cheap, and nothing is cached: the report adds no memory to a triage that just
    wrote the rows):

    * the totals and the small complete breakdowns (by reason, language, hour and age bucket): the rows are
      first aggregated by all four at once (far fewer groups than rows), and the grouping sets are taken
      over those groups, so each row is aggregated once rather than once per breakdown; every aggregate keeps
      a fixed-size buffer, so Spark hash-aggregates them;
    * the top (reason, URN, queue) groups and the top error fingerprints, each taken by one aggregate over
      the aggregated groups (:func:`_top`), which also counts the distinct URNs, queues and fingerprints
      among those groups (one row per group, not per dead letter): no count-distinct over the rows, no second
      pass over them, and only N groups reach the driver.

    :param rows: triage rows (the Parquet ``triage.py`` writes, or the DataFrame it wrote).
    :param input_path: what to name as the input in the summary.
    :param unreadable: the input lines triage could not read, per cause (its summary's ``unreadable_by_cause``):
        ``totals.records`` counts them with the triaged records, ``totals.unreadable`` and ``unreadable_by_cause``
        name them. None: zero.
    :param carried_over: ``{"files", "records"}``: the drain files of earlier runs whose triage had not finished,
        and the input lines read from them (triage's summary's ``carried_over``); kept as ``carried_over``.
        None: zero.
    """
    keys = ("reason", "lang", "h", "bucket")
    hour = F.floor(F.col("failed_at") / HOUR_MS) * HOUR_MS
    fine = rows.select("reason", "lang", hour.alias("h"), _bucket(F.col("age_ms")).alias("bucket"), "copies",
                       "failed_at").groupBy(*keys).agg(
        F.count(F.lit(1)).alias("n"), F.sum("copies").alias("copies"), F.min("failed_at").alias("first"),
        F.max("failed_at").alias("last"), F.count("failed_at").alias("dated"))
    sets = fine.groupingSets([[], ["reason"], ["lang"], ["h"], ["bucket"]], *keys).agg(
        F.sum("n").alias("count"), F.grouping_id(*keys).alias("gid"), F.sum("copies").alias("records"),
        F.min("first").alias("first_failed_at"), F.max("last").alias("last_failed_at"),
        F.sum("dated").alias("with_failed_at"))

    group_keys = ("reason", "urn", "original_queue")
    groups = rows.groupBy(*group_keys).count()
    groups = groups.agg(_top(groups, TOP_GROUPS, group_keys).alias("top"),
                        F.size(F.collect_set("urn")).alias("urns"),
                        F.size(F.collect_set("original_queue")).alias("queues"))

    prints = rows.groupBy("fingerprint").agg(
        F.count(F.lit(1)).alias("count"), F.min("exception").alias("exception"),
        F.min("exception_type").alias("exception_type"), F.min("error_pattern").alias("error_pattern"),
        F.min("error").alias("example_error"), F.sort_array(F.collect_set("reason")).alias("reasons"),
        F.min("failed_at").alias("first_failed_at"), F.max("failed_at").alias("last_failed_at"))
    prints = prints.agg(_top(prints, TOP_FINGERPRINTS, ["fingerprint"]).alias("top"),
                        F.count("fingerprint").alias("fingerprints"))

    # Submitted together: while the driver plans and compiles one query, the executors run another's tasks.
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="babelqueue-report") as pool:
        sets_rows, (groups_row,), (prints_row,) = [f.result() for f in [pool.submit(df.collect)
                                                                         for df in (sets, groups, prints)]]
    top_groups, top_prints = groups_row["top"] or [], prints_row["top"] or []

    by_set: dict[str, list[Any]] = {"all": [], "reason": [], "lang": [], "h": [], "bucket": []}
    for r in sets_rows:
        name = {0b1111: "all", 0b0111: "reason", 0b1011: "lang", 0b1101: "h", 0b1110: "bucket"}[r["gid"]]
        by_set[name].append(r)
    by_reason = {r["reason"]: r["count"]
                 for r in sorted(by_set["reason"], key=lambda r: (r["reason"] is not None, r["reason"] or ""))}
    langs = {(r["lang"] or "unknown"): r["count"] for r in by_set["lang"]}
    hours = {r["h"]: r["count"] for r in by_set["h"] if r["h"] is not None}
    hour_keys: Sequence[int]
    if hours and (max(hours) - min(hours)) // HOUR_MS <= _MAX_HOURS_FILLED:
        hour_keys = range(min(hours), max(hours) + HOUR_MS, HOUR_MS)
    else:
        hour_keys = sorted(hours)
    hourly = [{"hour": _hour_iso(h), "epoch_ms": h, "count": hours.get(h, 0)} for h in hour_keys]
    ages = {r["bucket"]: r["count"] for r in by_set["bucket"]}
    age_buckets = [{"bucket": label, "count": ages.get(label, 0)} for label, _ in AGE_BUCKETS]
    if ages.get("unknown"):
        age_buckets.append({"bucket": "unknown", "count": ages["unknown"]})
    by_group = [r.asDict() for r in top_groups]  # reason, urn, original_queue, count
    top = [r.asDict() for r in top_prints]

    overall = by_set["all"][0] if by_set["all"] else None  # no group at all when there are no rows
    dead_letters = overall["count"] if overall else 0
    lost = {cause: int((unreadable or {}).get(cause) or 0) for cause in UNREADABLE_CAUSES}
    records_read = int(overall["records"] or 0) if overall else 0
    totals = {
        "dead_letters": dead_letters, "records": records_read + sum(lost.values()),
        "poison": by_reason.get(str(Reason.POISON), 0),
        "urns": groups_row["urns"], "queues": groups_row["queues"], "fingerprints": prints_row["fingerprints"],
        "first_failed_at": overall["first_failed_at"] if overall else None,
        "last_failed_at": overall["last_failed_at"] if overall else None,
        "without_failed_at": dead_letters - (overall["with_failed_at"] if overall else 0),
    }
    # every input line once: records = dead_letters + duplicates_removed + unreadable
    totals["duplicates_removed"] = records_read - dead_letters
    totals["unreadable"] = sum(lost.values())
    return {
        "version": 1, "input": input_path, "totals": totals, "unreadable_by_cause": lost,
        "carried_over": {"files": int((carried_over or {}).get("files") or 0),
                         "records": int((carried_over or {}).get("records") or 0)},
        "by_reason": by_reason,
        "by_reason_urn_queue": by_group, "top_fingerprints": top, "hourly": hourly, "age_buckets": age_buckets,
        "by_lang": dict(sorted(langs.items())),
    }


def write_report(spark: SparkSession, rows: DataFrame, input_path: str, output: str,
                 unreadable: Mapping[str, int] | None = None,
                 carried_over: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Summarize triage rows and write ``<output>/summary.json`` and ``<output>/report.html`` (``unreadable``,
    ``carried_over``: see :func:`summarize`)."""
    summary = summarize(rows, input_path, unreadable, carried_over)
    text = json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    write_text(spark, join_url(output, "summary.json"), text)
    write_text(spark, join_url(output, "report.html"), render_report(summary))
    return summary


def triage_unreadable(spark: SparkSession, inputs: Sequence[str]) -> dict[str, int]:
    """The unreadable input lines of the triage runs that wrote ``inputs``, per cause, from each folder's
    ``_triage_summary.json`` (summed; an input without one, e.g. a glob of Parquet files, adds nothing)."""
    lost = dict.fromkeys(UNREADABLE_CAUSES, 0)
    for folder in inputs:
        text = read_text(spark, join_url(folder, "_triage_summary.json"))
        causes = json.loads(text).get("unreadable_by_cause") or {} if text else {}
        for cause in UNREADABLE_CAUSES:
            lost[cause] += int(causes.get(cause) or 0)
    return lost


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser("BabelQueue dead-letter report: triage Parquet → summary.json + report.html")
    args = parser.parse_args(argv)
    spark = get_spark(args.app_name or "babelqueue-report")
    try:
        summary = write_report(spark, spark.read.parquet(*args.input), ",".join(args.input), args.output,
                               triage_unreadable(spark, args.input))
        print_summary({"job": "report", "output": args.output, "dead_letters": summary["totals"]["dead_letters"],
                       "unreadable": summary["totals"]["unreadable"], "by_reason": summary["by_reason"],
                       "summary": join_url(args.output, "summary.json"),
                       "report": join_url(args.output, "report.html")})
        return 0
    finally:
        stop_spark(spark)


if __name__ == "__main__":
    sys.exit(main())
