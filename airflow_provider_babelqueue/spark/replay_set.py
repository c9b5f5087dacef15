"""Spark job: build a replay set. Triage Parquet + a policy in; the selected dead letters' drain records out,
untouched, ready for ``BabelQueueReplayOperator(replay_set=...)``.

Run it with ``spark-submit replay_set.py --input <triage folder> --output <folder> [policy]``. :func:`select`
expresses the replay engine's selection rules (``engine.replay.Selection``) over the triage columns in Spark SQL
(no Python UDF: the rows never leave the JVM); ``tests/spark/test_selection_parity.py`` runs both on one corpus
and compares. Poison rows are never selected.

Nothing is decoded, reset or re-encoded here: each selected row is written back as the drain record it came from
(``docs/drain-records.md``), its ``body`` exactly as triage read it, so ``core.records.record_body`` gives the
stored bytes back. The replay operator resets each body once and routes it by its original queue
(``dead_letter.original_queue``, else ``meta.queue``, else the record's ``queue_name``), so one folder holds
every target queue.

Layout: ``<output>/part-*.json`` (one drain record per line, ordered by original queue, then ``meta.id``) and
``<output>/_replay_summary.json``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

try:
    from airflow_provider_babelqueue.core.envelope import Reason
    from airflow_provider_babelqueue.core.records import RECORD_VERSION
    from airflow_provider_babelqueue.spark.common import (
        base_parser,
        get_spark,
        join_url,
        print_summary,
        split_names,
        stop_spark,
        write_text,
    )
except ImportError as exc:  # pragma: no cover - a cluster without the package on its Python path
    raise SystemExit(f"cannot import airflow_provider_babelqueue ({exc}); pass the package zip with --py-files "
                     "(see docs/spark.md)") from exc

__all__ = ["main", "policy_filters", "records", "select", "skip_cause"]

#: The skip cause of a poison row (never selected, whatever the policy).
POISON = str(Reason.POISON)


def _nonblank(column: Column) -> Column:
    """``column`` unless it is blank (null then), as the triage columns read blank text."""
    return F.when(F.trim(column) != "", column)


def policy_filters(*, reasons: Sequence[str] | None = None, urns: Sequence[str] | None = None,
                   exception_types: Sequence[str] | None = None, original_queues: Sequence[str] | None = None,
                   max_attempts: int | None = None, min_age_seconds: float | None = None,
                   max_age_seconds: float | None = None, now_ms: int | None = None) -> list[tuple[str, Column]]:
    """The policy's filters as ``(name, condition)`` pairs over the triage columns, in the order the replay
    engine's ``Selection.matches`` tests them; each condition is never null (an unknown value does not match).

    The rules are ``Selection``'s: ``reason`` is ``unannotated`` without a ``dead_letter`` reason (triage writes
    it so); a URN is ``job``, else the ``urn`` alias, else ``""``; an exception type matches the full name or its
    last segment (split on ``\\ . : / $``, triage's ``exception_type``); the original queue is
    ``dead_letter.original_queue``, else ``meta.queue``, else the drained-from queue (triage's ``original_queue``);
    attempts are ``dead_letter.attempts``, else ``attempts``, else 0; the age is now − ``failed_at`` and a row
    without ``failed_at`` does not match an age filter. An empty or missing list is no filter.

    :param now_ms: "now" for the age filters in Unix ms; default the time of this call. Give one value for a
        whole run so every row is judged against the same instant.
    """
    def known(condition: Column) -> Column:
        return F.coalesce(condition, F.lit(False))

    filters: list[tuple[str, Column]] = []
    if reasons:
        filters.append(("reasons", known(F.col("reason").isin(list(reasons)))))
    if urns:
        filters.append(("urns", known(F.coalesce(F.col("urn"), F.lit("")).isin(list(urns)))))
    if exception_types:
        names = list(exception_types)
        filters.append(("exception_types", known(F.col("exception").isin(names)
                                                 | F.col("exception_type").isin(names))))
    if original_queues:
        filters.append(("original_queues", known(_nonblank(F.col("original_queue")).isin(list(original_queues)))))
    if max_attempts is not None:
        filters.append(("max_attempts", known(F.coalesce(F.col("attempts"), F.lit(0)) <= max_attempts)))
    if min_age_seconds is not None or max_age_seconds is not None:
        now = int(time.time() * 1000) if now_ms is None else int(now_ms)
        age = (F.lit(now) - F.col("failed_at")) / 1000
        if min_age_seconds is not None:
            filters.append(("min_age_seconds", known(age >= min_age_seconds)))
        if max_age_seconds is not None:
            filters.append(("max_age_seconds", known(age <= max_age_seconds)))
    return filters


def skip_cause(filters: Sequence[tuple[str, Column]]) -> Column:
    """Why a row is left out: ``poison``, else the name of the first filter it fails; null for a selected row.

    :param filters: :func:`policy_filters`' pairs.
    """
    cause = F.when(F.coalesce(F.col("poison"), F.lit(True)), F.lit(POISON))  # unknown counts as poison
    for name, condition in filters:
        cause = cause.when(~condition, F.lit(name))
    return cause


def select(rows: DataFrame, **policy: Any) -> DataFrame:
    """The triage rows the policy selects: every given filter must match, and poison rows never do.

    :param rows: triage Parquet rows (``spark/triage.py``'s columns).
    :param policy: :func:`policy_filters`' keyword arguments.
    """
    return rows.where(skip_cause(policy_filters(**policy)).isNull())


def records(rows: DataFrame) -> DataFrame:
    """Each row as the drain record it came from (one struct column, ``record``), keys in the format's order.

    ``body`` and ``body_encoding`` are the stored ones, untouched; the broker is triage's ``source_broker`` (the
    record's ``broker`` unless triage was given ``--source-broker``); ``meta_id`` is ``""`` where triage has none,
    as a drain writes it; ``headers`` are ``{}`` unless the rows carry a map of them (the triage Parquet
    does not keep them).
    """
    kind = rows.schema["headers"].dataType if "headers" in rows.columns else None
    if isinstance(kind, T.MapType):
        headers = F.coalesce(F.col("headers"), F.create_map().cast(kind))
    else:
        headers = F.create_map().cast(T.MapType(T.StringType(), T.StringType()))
    return rows.select(F.struct(
        F.lit(RECORD_VERSION).cast("long").alias("v"),
        F.col("body"),
        F.col("body_encoding"),
        F.col("source_broker").alias("broker"),
        F.col("queue_name"),
        F.col("dead_letter_queue"),
        F.col("source_conn_id"),
        F.coalesce(F.col("meta_id"), F.lit("")).alias("meta_id"),
        F.col("delivery_count"),
        F.col("native_reason"),
        headers.alias("headers"),
        F.col("drained_at"),
    ).alias("record"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser("BabelQueue replay set: triage Parquet + policy → the selected dead letters' drain records")
    parser.add_argument("--reasons", nargs="*", help="dead_letter.reason values to include (comma-separated ok)")
    parser.add_argument("--urns", nargs="*", help="message URNs to include")
    parser.add_argument("--exception-types", nargs="*", help="exception types, full name or last segment")
    parser.add_argument("--original-queues", nargs="*", help="original queues to include")
    parser.add_argument("--max-attempts", type=int, default=None, help="include attempts <= this")
    parser.add_argument("--min-age-seconds", type=float, default=None, help="failed at least this long ago")
    parser.add_argument("--max-age-seconds", type=float, default=None, help="failed at most this long ago")
    parser.add_argument("--now-ms", type=int, default=None, help="'now' for the age filters (default: job start)")
    args = parser.parse_args(argv)
    spark = get_spark(args.app_name or "babelqueue-replay-set")
    now_ms = args.now_ms if args.now_ms is not None else int(time.time() * 1000)
    policy: dict[str, Any] = {
        "reasons": split_names(args.reasons), "urns": split_names(args.urns),
        "exception_types": split_names(args.exception_types), "original_queues": split_names(args.original_queues),
        "max_attempts": args.max_attempts, "min_age_seconds": args.min_age_seconds,
        "max_age_seconds": args.max_age_seconds, "now_ms": now_ms,
    }
    try:
        rows = spark.read.parquet(*args.input)
        marked = rows.withColumn("_skip", skip_cause(policy_filters(**policy)))
        selected = marked.where(F.col("_skip").isNull())
        # One folder, globally ordered (part files in name order, rows sorted within): a re-run writes the same
        # lines. The body breaks ties between rows without a meta.id.
        ordered = records(selected.orderBy("original_queue", "meta_id", "body"))
        ordered.select("record.*").write.mode("overwrite").option("ignoreNullFields", "false").json(args.output)
        # a second, narrow scan (only the filter columns): cheaper than keeping the selected bodies around
        counts = marked.groupBy(F.col("_skip"), F.when(F.col("_skip").isNull(), F.col("original_queue"))
                                .alias("queue")).count().collect()
        targets: dict[str, int] = {}
        skipped: dict[str, int] = {}
        for row in counts:
            if row["_skip"] is None:
                queue = row["queue"] or ""  # no queue at all: the replay operator reports it as no_target_queue
                targets[queue] = targets.get(queue, 0) + row["count"]
            else:
                skipped[row["_skip"]] = skipped.get(row["_skip"], 0) + row["count"]
        summary = {
            "job": "replay_set", "output": args.output, "path": args.output, "lines": sum(targets.values()),
            "targets": dict(sorted(targets.items())), "skipped": dict(sorted(skipped.items())), "policy": policy,
        }
        # "_"-prefixed: the replay operator's folder reader skips it
        write_text(spark, join_url(args.output, "_replay_summary.json"), json.dumps(summary, indent=2) + "\n")
        print_summary(summary)
        return 0
    finally:
        stop_spark(spark)


if __name__ == "__main__":
    sys.exit(main())
