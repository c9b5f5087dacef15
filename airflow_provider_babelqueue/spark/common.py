"""Shared helpers of the PySpark jobs: session, argument parsing, Hadoop-FS text output.

No Airflow here (the jobs run under ``spark-submit`` on any cluster); the only project imports allowed in
``spark/`` are the pure core modules (``core.envelope``, ``core.errors``, ``core.records``).
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from ..core.fingerprint import EXCEPTION_TYPE_PATTERN

__all__ = [
    "LOCAL_CHECKSUMS",
    "base_parser",
    "get_spark",
    "print_summary",
    "join_url",
    "log_warning",
    "read_text",
    "short_exception",
    "split_names",
    "stop_spark",
    "write_text",
]

def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--input", nargs="+", required=True,
                        help="input path(s): files, folders or globs, local or any Hadoop-FS URL")
    parser.add_argument("--output", required=True, help="output folder, local or any Hadoop-FS URL")
    parser.add_argument("--app-name", default=None, help="Spark application name")
    return parser


#: Our Spark setting: ``false`` stops this JVM's Hadoop local file system from writing a checksum file
#: (``.NAME.crc``) beside every file it writes and from reading them back. ``LOCAL_CONF`` sets it for local
#: masters, where the driver JVM runs every task; on a cluster it would reach the driver's own writes only.
LOCAL_CHECKSUMS = "spark.babelqueue.localChecksums"


def _jvm(spark: SparkSession) -> Any:
    """The driver's py4j gateway view of the JVM (present once the session runs)."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the Spark session has no JVM gateway (was it stopped?)")
    return jvm


def get_spark(app_name: str) -> SparkSession:
    """The session ``spark-submit`` configured (master, memory, ...); nothing is forced here, and
    :data:`LOCAL_CHECKSUMS` is read from that configuration."""
    spark = SparkSession.builder.appName(app_name).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if (spark.conf.get(LOCAL_CHECKSUMS, "true") or "true").strip().lower() == "false":
        # Hadoop caches one local file system per JVM and user, and every task of a local master uses it
        jvm = _jvm(spark)
        local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark.sparkContext._jsc.hadoopConfiguration())
        local.setWriteChecksum(False)
        local.setVerifyChecksum(False)
    return spark


def stop_spark(spark: SparkSession) -> None:
    """``spark.stop()``, without waiting for PySpark's accumulator server to stop.

    That server's thread looks for a shutdown request every half second, and ``SparkContext.stop()`` waits
    for it: 0–0.5 s at the end of every job, after all its work is done. Here the context stops first, then
    the server stops on a daemon thread: a job's process exits at once, a longer-lived one loses nothing.
    """
    context = spark.sparkContext
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        # so spark.stop() leaves it to us; PySpark types the attribute without None, though its own stop sets None
        context._accumulatorServer = None  # type: ignore[assignment]
    try:
        spark.stop()
    finally:
        if server is not None:
            threading.Thread(target=server.shutdown, name="babelqueue-accumulator-stop", daemon=True).start()


def split_names(values: Sequence[str] | None) -> list[str] | None:
    """``--reasons a,b --reasons c`` or ``--reasons a b`` → ``["a", "b", "c"]``; nothing → ``None`` (no filter)."""
    if not values:
        return None
    names = [part.strip() for value in values for part in value.split(",") if part.strip()]
    return names or None


def write_text(spark: SparkSession, url: str, text: str) -> None:
    """Write one small UTF-8 file through the Hadoop FileSystem API (local, HDFS, S3A, ABFS, GCS ...),
    overwriting it. Runs on the driver; used for summary.json and report.html only."""
    jvm = _jvm(spark)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path(url)
    fs = path.getFileSystem(conf)
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def read_text(spark: SparkSession, url: str) -> str | None:
    """Read one small UTF-8 file through the Hadoop FileSystem API; ``None`` when it does not exist. Runs on the
    driver; used for a triage folder's ``_triage_summary.json`` only."""
    jvm = _jvm(spark)
    path = jvm.org.apache.hadoop.fs.Path(url)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(path) or not fs.getFileStatus(path).isFile():
        return None
    stream = fs.open(path)
    try:
        return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream)).decode("utf-8")
    finally:
        stream.close()


def log_warning(spark: SparkSession, name: str, message: str) -> None:
    """Log a warning through the driver's log4j, where Spark's own warnings go (spark-submit's stderr, the task
    log): a job's Python ``stderr`` would land on spark-submit's stdout, beside the summary line."""
    _jvm(spark).org.apache.logging.log4j.LogManager.getLogger(name).warn(message)


def join_url(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def print_summary(summary: dict[str, Any]) -> None:
    """The job's summary: one compact JSON object on one stdout line (it starts with ``{"job":``)."""
    print(json.dumps(summary, separators=(",", ":")), flush=True)


def short_exception(column: Column) -> Column:
    """Last segment of an exception type name: ``App\\Exceptions\\GatewayTimeout`` → ``GatewayTimeout``
    (``.``, ``\\``, ``:``, ``/`` and ``$`` separate segments, as the replay selection reads them)."""
    return F.regexp_extract(column, EXCEPTION_TYPE_PATTERN, 1)
