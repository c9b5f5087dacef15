"""Spark job: dead-letter triage. Drain records (JSON Lines) in, one deduplicated Parquet row per dead letter out.

Run it with ``spark-submit triage.py --input <paths/globs/folders> --output <folder> [--source-broker NAME]``.
See ``docs/spark.md`` for the output schema. Only native Spark expressions are used (no Python UDF), so the
job scales with the cluster; the only project import is the pure envelope module (reason codes).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

try:
    from airflow_provider_babelqueue.envelope import Reason
    from airflow_provider_babelqueue.spark.common import (
        base_parser,
        get_spark,
        join_url,
        print_summary,
        short_exception,
        write_text,
    )
except ImportError as exc:  # pragma: no cover - a cluster without the package on its Python path
    raise SystemExit(f"cannot import airflow_provider_babelqueue ({exc}); pass the package zip with --py-files "
                     "(see docs/spark.md)") from exc

__all__ = ["POISON_INVALID_JSON", "POISON_INVALID_UTF8", "RECORD_SCHEMA", "classify", "deduplicate",
           "fingerprint_pattern", "main", "triage"]

#: The drain record (docs/drain-records.md), read with an explicit schema.
RECORD_SCHEMA = T.StructType([
    T.StructField("v", T.LongType()),
    T.StructField("body", T.StringType()),
    T.StructField("body_encoding", T.StringType()),
    T.StructField("broker", T.StringType()),
    T.StructField("queue_name", T.StringType()),
    T.StructField("dead_letter_queue", T.StringType()),
    T.StructField("source_conn_id", T.StringType()),
    T.StructField("meta_id", T.StringType()),
    T.StructField("delivery_count", T.LongType()),
    T.StructField("native_reason", T.StringType()),
    T.StructField("drained_at", T.LongType()),
])

# The body is parsed in two levels. Every field is read as a string first (a JSON string gives its text,
# any other value its JSON text), so a value of an unexpected type never hides a well-formed body: only
# bodies that are not a JSON object land in _corrupt and become poison. Numbers are then cast leniently.
_CORRUPT = "_corrupt"
_BODY_SCHEMA = T.StructType(
    [T.StructField(name, T.StringType()) for name in ("job", "urn", "trace_id", "data", "meta", "attempts",
                                                      "dead_letter", _CORRUPT)]
)
_META_SCHEMA = T.StructType(
    [T.StructField(name, T.StringType()) for name in ("id", "queue", "lang", "schema_version", "created_at")]
)
_DEAD_LETTER_SCHEMA = T.StructType(
    [T.StructField(name, T.StringType()) for name in ("reason", "error", "exception", "failed_at",
                                                      "original_queue", "attempts", "lang")]
)
_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT, "allowNonNumericNumbers": "false"}

POISON_INVALID_UTF8 = "body is not valid UTF-8"
POISON_INVALID_JSON = "body is not a JSON object"

_UUID = r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
_HEX = r"(?i)\b0x[0-9a-f]+\b|\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b"
_QUOTED = r"\"[^\"]*\"|'[^']*'"
_NUMBER = r"\d+(?:[.,]\d+)*"
_ERROR_CHARS = 2000


def fingerprint_pattern(error: Column) -> Column:
    """The error text with its variable parts masked, so similar errors group: quoted strings → ``<str>``,
    UUIDs → ``<uuid>``, hex ids (``0x…`` or 8+ hex chars with a digit and a letter) → ``<hex>``, numbers →
    ``<n>``; whitespace runs collapse to one space. Only the first 2,000 characters count."""
    text = F.substring(error, 1, _ERROR_CHARS)
    for pattern, mask in ((_QUOTED, "<str>"), (_UUID, "<uuid>"), (_HEX, "<hex>"), (_NUMBER, "<n>"), (r"\s+", " ")):
        text = F.regexp_replace(text, pattern, mask)
    return F.trim(text)


def _text(column: Column) -> Column:
    """A JSON string field read as text: blank (or absent) → null."""
    return F.when(F.trim(column) != "", column)


def read_records(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """The drain records of every input path; torn lines and records of unknown versions are dropped."""
    reader = spark.read.schema(RECORD_SCHEMA).option("mode", "DROPMALFORMED").option("encoding", "UTF-8")
    records = reader.json(list(paths))
    return records.where((F.col("v") == 1) & F.col("body").isNotNull()).withColumn(
        "input_file", F.col("_metadata.file_path"))


def triage(records: DataFrame, source_broker: str | None = None) -> DataFrame:
    """Decode, classify, fingerprint and deduplicate drain records (see docs/spark.md for the columns)."""
    return deduplicate(classify(records, source_broker))


def classify(records: DataFrame, source_broker: str | None = None) -> DataFrame:
    """One row per drain record: decoded, classified and fingerprinted (duplicates still in)."""
    # A utf-8 body is the text itself. A base64 body is decoded; its bytes are used only if they are UTF-8
    # (the drain writes base64 precisely when they are not, so it is normally poison).
    base64_body = F.col("body_encoding") == "base64"
    decoded = F.try_to_binary(F.col("body"), F.lit("base64")).cast("string")
    df = records.withColumn("_decoded", F.when(base64_body, decoded))
    df = df.withColumn("_utf8", ~base64_body | (F.col("_decoded").isNotNull() & F.is_valid_utf8("_decoded")))
    df = df.withColumn("_text", F.when(~base64_body, F.col("body")).when(F.col("_utf8"), F.col("_decoded")))
    df = df.withColumn("_b", F.from_json("_text", _BODY_SCHEMA, _JSON_OPTIONS))
    poison = F.col("_text").isNull() | F.col("_b").isNull() | F.col(f"_b.{_CORRUPT}").isNotNull()
    df = df.withColumn("poison", poison)
    df = df.withColumn("_m", F.when(~poison, F.from_json("_b.meta", _META_SCHEMA, _JSON_OPTIONS)))
    df = df.withColumn("_d", F.when(~poison, F.from_json("_b.dead_letter", _DEAD_LETTER_SCHEMA, _JSON_OPTIONS)))

    meta_id = F.coalesce(_text(F.col("_m.id")), _text(F.col("meta_id")))
    urn = F.coalesce(_text(F.col("_b.job")), _text(F.col("_b.urn")))
    reason = F.when(poison, F.lit(str(Reason.POISON))).otherwise(
        F.coalesce(_text(F.col("_d.reason")), F.lit("unannotated")))
    poison_error = F.when(F.col("_utf8"), F.lit(POISON_INVALID_JSON)).otherwise(F.lit(POISON_INVALID_UTF8))
    error = F.when(poison, poison_error).otherwise(F.col("_d.error"))
    exception = F.when(~poison, _text(F.col("_d.exception")))
    created_at = F.col("_m.created_at").try_cast("long")
    failed_at = F.col("_d.failed_at").try_cast("long")
    attempts = F.coalesce(F.col("_d.attempts").try_cast("long"), F.col("_b.attempts").try_cast("long"))
    broker = F.lit(source_broker) if source_broker else F.col("broker")

    df = df.select(
        meta_id.alias("meta_id"),
        reason.alias("reason"),
        F.col("poison"),
        urn.alias("urn"),
        F.coalesce(_text(F.col("_d.original_queue")), _text(F.col("_m.queue")), F.col("queue_name"))
        .alias("original_queue"),
        F.col("queue_name"),
        F.col("dead_letter_queue"),
        _text(F.col("_m.lang")).alias("lang"),
        _text(F.col("_d.lang")).alias("dead_letter_lang"),
        F.col("_m.schema_version").try_cast("long").alias("schema_version"),
        _text(F.col("_b.trace_id")).alias("trace_id"),
        F.col("_b.data").alias("data"),
        attempts.alias("attempts"),
        exception.alias("exception"),
        short_exception(exception).alias("exception_type"),
        error.alias("error"),
        created_at.alias("created_at"),
        failed_at.alias("failed_at"),
        (failed_at - created_at).alias("age_ms"),
        broker.alias("source_broker"),
        F.col("source_conn_id"),
        F.col("delivery_count"),
        F.col("native_reason"),
        F.col("drained_at"),
        F.col("body"),
        F.col("body_encoding"),
        F.col("input_file"),
    )
    # A poison row's error is this job's own fixed text: it is its pattern as it is.
    pattern = F.when(F.col("poison"), F.col("error")).otherwise(fingerprint_pattern(F.col("error")))
    df = df.withColumn("error_pattern", pattern).withColumn(
        "fingerprint",
        F.substring(F.sha2(F.concat_ws("\u0000", F.coalesce(F.col("exception"), F.lit("")),
                                       F.coalesce(F.col("error_pattern"), F.lit(""))), 256), 1, 16))
    return df


def deduplicate(df: DataFrame) -> DataFrame:
    # At-least-once drains: one row per meta.id (poison and id-less bodies: per exact body), the earliest
    # drained copy winning (ties broken by the rest of the row, so the choice is deterministic).
    key = F.when(F.col("meta_id").isNotNull() & ~F.col("poison"), F.concat(F.lit("id:"), F.col("meta_id"))) \
        .otherwise(F.concat(F.lit("body:"), F.col("body_encoding"), F.lit(":"), F.sha2(F.col("body"), 256)))
    columns = [c for c in df.columns if c != "drained_at"]
    first = F.min(F.struct(F.col("drained_at"), *[F.col(c) for c in columns])).alias("_first")
    deduped = df.groupBy(key.alias("_key")).agg(first, F.count(F.lit(1)).alias("copies"))
    return deduped.select(*[F.col(f"_first.{c}").alias(c) for c in columns],
                          F.col("_first.drained_at").alias("drained_at"), F.col("copies"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser("BabelQueue dead-letter triage: drain records (JSON Lines) → partitioned Parquet")
    parser.add_argument("--source-broker", default=None,
                        help="record this broker name instead of each drain record's 'broker'")
    parser.add_argument("--report-output", default=None,
                        help="also write report.py's summary.json and report.html here, in the same Spark "
                             "application (saves a second start-up)")
    parser.add_argument("--partitions", type=int, default=0,
                        help="output partitions before the write (0 = Spark's default)")
    args = parser.parse_args(argv)
    spark = get_spark(args.app_name or "babelqueue-triage")
    try:
        rows = triage(read_records(spark, args.input), args.source_broker)
        if args.partitions > 0:
            rows = rows.repartition(args.partitions, "reason")
        rows.write.mode("overwrite").partitionBy("reason").parquet(args.output)
        written = spark.read.schema(rows.schema).parquet(args.output)
        counts = written.groupBy("reason").agg(F.count(F.lit(1)).alias("n"), F.sum("copies").alias("copies")).collect()
        by_reason = {row["reason"]: row["n"] for row in sorted(counts, key=lambda r: r["reason"])}
        rows_out = sum(by_reason.values())
        records_in = sum(int(row["copies"]) for row in counts)
        summary = {
            "job": "triage", "output": args.output, "records": records_in, "rows": rows_out,
            "duplicates_removed": records_in - rows_out, "poison": by_reason.get(str(Reason.POISON), 0),
            "by_reason": by_reason,
        }
        if args.report_output:
            from airflow_provider_babelqueue.spark.report import write_report

            write_report(spark, written, args.output, args.report_output)
            summary["report"] = join_url(args.report_output, "report.html")
        # Files whose names start with "_" are invisible to Parquet readers and to the replay-set reader.
        write_text(spark, join_url(args.output, "_triage_summary.json"), json.dumps(summary, indent=2) + "\n")
        print_summary(summary)
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
