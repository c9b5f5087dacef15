"""Spark job: build a replay set. Triage Parquet + a policy in; reset envelopes (JSON Lines) out, one folder per
target queue, ready for ``BabelQueueReplayOperator(replay_set=...)``.

Run it with ``spark-submit replay_set.py --input <triage folder> --output <folder> [policy]``. Each selected
dead letter's ORIGINAL body is decoded and reset with the pure envelope functions (``dead_letter`` removed,
``attempts`` 0, everything else kept, ``meta.id`` and unknown keys included) and encoded in canonical key
order: the exact bytes the replay operator itself would publish for it. Poison rows are never included;
envelopes the reset cannot make valid (e.g. ``schema_version`` 2) are counted and left out.

Layout: ``<output>/target_queue=<queue>/part-*.txt`` (one envelope per line) and ``<output>/_replay_summary.json``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

try:
    from airflow_provider_babelqueue.core.envelope import Reason
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

__all__ = ["RESET_SCHEMA", "main", "reset_line", "select"]

RESET_SCHEMA = T.StructType([T.StructField("line", T.StringType()), T.StructField("skip", T.StringType())])


def reset_line(body: str | None, body_encoding: str | None) -> tuple[str | None, str | None]:
    """``(reset envelope, None)`` for a replayable body, else ``(None, why)``. Runs on the executors."""
    import base64

    from airflow_provider_babelqueue.core import envelope as bq
    from airflow_provider_babelqueue.core.errors import EnvelopeDecodeError, EnvelopeEncodeError

    if body is None:
        return None, str(Reason.POISON)
    try:
        raw = base64.b64decode(body, validate=True) if body_encoding == "base64" else body.encode("utf-8")
        envelope = bq.decode(raw, exact=True)  # exact: integers beyond 64 bits are not rounded
    except (EnvelopeDecodeError, ValueError):
        return None, str(Reason.POISON)
    reset = bq.reset_for_replay(envelope)
    reason = bq.check(reset)
    if reason is not None:
        return None, str(reason)
    if not bq.meta_id_of(reset):
        return None, "missing_meta_id"
    try:
        return bq.encode(reset).decode("utf-8"), None
    except EnvelopeEncodeError:
        return None, "unencodable"


def select(rows: DataFrame, *, reasons: list[str] | None = None, urns: list[str] | None = None,
           exception_types: list[str] | None = None, original_queues: list[str] | None = None,
           max_attempts: int | None = None, min_age_seconds: float | None = None,
           max_age_seconds: float | None = None, now_ms: int | None = None) -> DataFrame:
    """The rows the policy selects (every given filter must match; poison rows never do).

    Exception types match the full name or its last segment; ages are now − ``failed_at`` (a row without
    ``failed_at`` does not match an age filter), as in the replay operator; ``max_attempts`` compares the
    dead letter's attempts (a row without attempts counts as 0).
    """
    selected = rows.where(~F.col("poison"))
    if reasons:
        selected = selected.where(F.col("reason").isin(reasons))
    if urns:
        selected = selected.where(F.col("urn").isin(urns))
    if exception_types:
        selected = selected.where(F.col("exception").isin(exception_types)
                                  | F.col("exception_type").isin(exception_types))
    if original_queues:
        selected = selected.where(F.col("original_queue").isin(original_queues))
    if max_attempts is not None:
        selected = selected.where(F.coalesce(F.col("attempts"), F.lit(0)) <= max_attempts)
    if min_age_seconds is not None or max_age_seconds is not None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        age = (F.lit(now) - F.col("failed_at")) / 1000
        if min_age_seconds is not None:
            selected = selected.where(age >= min_age_seconds)
        if max_age_seconds is not None:
            selected = selected.where(age <= max_age_seconds)
    return selected


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser("BabelQueue replay set: triage Parquet + policy → reset envelopes per target queue")
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
        selected = select(rows, **policy)
        reset = F.udf(reset_line, RESET_SCHEMA)
        done = selected.select(F.col("original_queue").alias("target_queue"), F.col("meta_id"),
                               reset("body", "body_encoding").alias("r")).persist()
        try:
            lines = done.where(F.col("r.line").isNotNull()).select("target_queue", F.col("r.line").alias("value"))
            # One folder per target queue; sorted by meta.id so a re-run writes the same files.
            lines.repartition("target_queue").sortWithinPartitions("target_queue", "value") \
                .write.mode("overwrite").partitionBy("target_queue").text(args.output)
            counts = done.groupBy("target_queue", F.col("r.skip").alias("skip")).count().collect()
        finally:
            done.unpersist()
        targets = {r["target_queue"]: r["count"] for r in sorted(counts, key=lambda r: r["target_queue"])
                   if r["skip"] is None}
        skipped: dict[str, int] = {}
        for r in counts:
            if r["skip"] is not None:
                skipped[r["skip"]] = skipped.get(r["skip"], 0) + r["count"]
        summary = {
            "job": "replay_set", "output": args.output, "lines": sum(targets.values()), "targets": targets,
            "paths": {queue: join_url(args.output, f"target_queue={queue}") for queue in targets},
            "skipped": dict(sorted(skipped.items())), "policy": policy,
        }
        write_text(spark, join_url(args.output, "_replay_summary.json"), json.dumps(summary, indent=2) + "\n")
        print_summary(summary)
        return 0
    finally:
        stop_spark(spark)


if __name__ == "__main__":
    sys.exit(main())
