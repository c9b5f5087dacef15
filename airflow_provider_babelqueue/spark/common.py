"""Shared helpers of the PySpark jobs: session, argument parsing, Hadoop-FS text output.

No Airflow here (the jobs run under ``spark-submit`` on any cluster); the only project import allowed in
``spark/`` is the pure envelope module.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

__all__ = [
    "base_parser",
    "get_spark",
    "print_summary",
    "join_url",
    "short_exception",
    "split_names",
    "write_text",
]

def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--input", nargs="+", required=True,
                        help="input path(s): files, folders or globs, local or any Hadoop-FS URL")
    parser.add_argument("--output", required=True, help="output folder, local or any Hadoop-FS URL")
    parser.add_argument("--app-name", default=None, help="Spark application name")
    return parser


def get_spark(app_name: str) -> SparkSession:
    """The session ``spark-submit`` configured (master, memory, ...); nothing is forced here."""
    spark = SparkSession.builder.appName(app_name).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def split_names(values: Sequence[str] | None) -> list[str] | None:
    """``--reasons a,b --reasons c`` or ``--reasons a b`` → ``["a", "b", "c"]``; nothing → ``None`` (no filter)."""
    if not values:
        return None
    names = [part.strip() for value in values for part in value.split(",") if part.strip()]
    return names or None


def write_text(spark: SparkSession, url: str, text: str) -> None:
    """Write one small UTF-8 file through the Hadoop FileSystem API (local, HDFS, S3A, ABFS, GCS ...),
    overwriting it. Runs on the driver; used for summary.json and report.html only."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path(url)
    fs = path.getFileSystem(conf)
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def join_url(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def print_summary(summary: dict[str, Any]) -> None:
    """The job's summary: one compact JSON object on one stdout line (it starts with ``{"job":``)."""
    print(json.dumps(summary, separators=(",", ":")), flush=True)


def short_exception(column: Column) -> Column:
    """Last segment of an exception type name: ``App\\Exceptions\\GatewayTimeout`` → ``GatewayTimeout``
    (``.``, ``\\``, ``:``, ``/`` and ``$`` separate segments, as the replay selection reads them)."""
    return F.regexp_extract(column, r"([^\\.:/$]*)$", 1)
