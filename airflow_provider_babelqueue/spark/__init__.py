"""PySpark jobs for dead-letter triage and reporting (run with ``spark-submit``; no Airflow imports here).

* ``triage.py``: drain records (JSON Lines) → deduplicated, classified Parquet partitioned by reason;
* ``report.py``: triage Parquet → ``summary.json`` and a self-contained ``report.html``;
* ``replay_set.py``: triage Parquet + a policy → the selected dead letters' drain records (JSON Lines), untouched,
  in one folder, ready for ``BabelQueueReplayOperator(replay_set=...)``.

:func:`job_path` gives the file to hand to ``spark-submit``; :func:`recommended_conf` the settings to submit it
with. ``class_archive.py`` is an optional start-up aid for local masters that no job imports. Importing this
package does not import pyspark.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["JOBS", "JOB_CONF", "LOCAL_CONF", "is_local", "job_path", "recommended_conf"]

#: The jobs by name (the operator's ``job`` argument), each a file next to this one.
JOBS = {"triage": "triage.py", "report": "report.py", "replay_set": "replay_set.py"}


#: Spark settings the jobs are tuned for, right on any cluster. ``BabelQueueSparkTriageOperator`` passes them
#: (its own ``conf`` wins key by key) and ``benchmarks/bench_spark.py`` measures with them.
JOB_CONF = {
    # Triage writes its rows partitioned by reason. With a writer per reason open at once, Spark writes them as
    # they come instead of sorting every (wide) row by reason first; past 8 open files it falls back to sorting.
    "spark.sql.maxConcurrentOutputFileWriters": "8",
    # The task log shows what spark-submit prints. At Spark's default INFO level that is ~50 lines of start-up
    # (security managers, block managers, resource profiles) before the job says anything; from WARN on, the
    # driver prints what needs attention and the job's own summary. The submitting client's own lines (the
    # application id the Spark provider tracks in cluster mode) are not the driver's, so they stay.
    "spark.log.level": "WARN",
}

#: Extra settings for local mode (a ``local``/``local[N]`` master: one JVM on a small machine, as in the
#: benchmark and the tests), added by the operator when its connection's master is local.
LOCAL_CONF = {
    "spark.ui.enabled": "false",  # no web UI to start (time and memory) for a batch job nobody watches
    "spark.sql.shuffle.partitions": "8",  # 200 is sized for clusters; adaptive execution coalesces from 8
    "spark.driver.memory": "1g",  # the driver is the executor: this caps the heap of the whole job
    # Hadoop's local file system writes a checksum file (.NAME.crc) beside every file it writes and reads it
    # back on every read. In this one JVM nothing else checks them; the jobs turn both off
    # (spark/common.py, LOCAL_CHECKSUMS), which also keeps the output folders free of .crc files.
    "spark.babelqueue.localChecksums": "false",
    # Every open Parquet file reserves a 128 MiB row group by default; seven open at once (two tasks writing
    # reasons) claim more than Parquet's 95 % share of that heap, and it logs a WARN for every file opened or
    # closed (~24 lines in a 1M-record task log). 32 MiB row groups fit the 16 files two tasks may hold.
    "spark.hadoop.parquet.block.size": str(32 * 1024 * 1024),
    # One JVM with a small heap and few cores: the parallel collector costs less CPU than G1 (no concurrent
    # threads) and less memory (no remembered sets), and unlike the serial one it collects with every core
    # while the tasks wait: 1.2 s less time in collections at 1M records, 1.7 s less wall (docs/benchmarks.md).
    # A short job spends much of its CPU in the JIT: with the default thresholds the optimizing compiler (C2)
    # compiles ~2,900 methods for ~45 CPU-seconds at 1M records, most of them planning and set-up code that
    # runs a few thousand times. Ten times its thresholds leave those in the quick compiler's code and keep C2
    # for the per-row loops: ~28 % less compiling, ~7 % less CPU in all. Smaller inlining budgets for C2
    # (FreqInlineSize 200 instead of 325 bytes, InlineSmallCode 1500 instead of 2500) cut what is left by a
    # fifth: Spark's generated stage code is large, and C2's cost (a third of it register allocation) grows
    # faster than the code it compiles. ~2 s less at 1M records and 3M alike; halving the budgets saves more
    # compiling but loses it again at 3M in slower code (docs/benchmarks.md).
    # C2 also prunes the branches a method's profile has not seen yet and leaves a trap there; the first row
    # that takes one (the sorted rows reach the poison bodies last, a report query meets a new type) throws
    # the compiled method away, and it is profiled and compiled again: ~230 recompilations and ~5 s of C2 at
    # 1M records, over a third of its time. With no trap budget (PerMethodTrapLimit=0) C2 compiles those
    # branches at once: 26 deoptimizations instead of 386, ~3 s less JIT, 1.4 s less wall (median of eight pairs
    # at 1M), no slower at 3M (docs/benchmarks.md).
    # The heap starts at its full size (-Xms, kept equal to spark.driver.memory by recommended_conf): grown from
    # the JVM's default start, it grows through full collections just as the write's sorters claim their pages,
    # ~0.8 s in collections for each of the first two write tasks. 0.5 s less at 1M (median; faster in 8 of 12
    # interleaved pairs), ~0.1 GiB more peak RSS (docs/benchmarks.md).
    # All of these options together against none at all, interleaved (docs/spark.md, Performance): 1.08x at 100k
    # records and 1.18x at 1M.
    "spark.driver.extraJavaOptions": "-Xms1g -XX:+UseParallelGC -XX:Tier4InvocationThreshold=50000 "
                                     "-XX:Tier4MinInvocationThreshold=6000 -XX:Tier4CompileThreshold=150000 "
                                     "-XX:Tier4BackEdgeThreshold=400000 -XX:FreqInlineSize=200 "
                                     "-XX:InlineSmallCode=1500 -XX:PerMethodTrapLimit=0",
}


#: The driver's JVM options and memory, the two settings recommended_conf keeps in step.
_JAVA, _MEMORY = "spark.driver.extraJavaOptions", "spark.driver.memory"
_INITIAL_HEAP = re.compile(r"-Xms\S+")


def is_local(master: str | None) -> bool:
    """Whether ``master`` runs the whole job in one local JVM (``local``, ``local[N]``, ``local[*]``), where
    :data:`LOCAL_CONF` and a driver class archive apply.

    :param master: the Spark master, ``None`` when unknown (then not local: nothing local-only is added).
    """
    return master is not None and (master == "local" or master.startswith("local["))


def recommended_conf(master: str | None, conf: dict[str, str] | None = None) -> dict[str, str]:
    """The settings to submit a job with: :data:`JOB_CONF`, plus :data:`LOCAL_CONF` for a local master, with
    ``conf`` (the caller's own) overriding any of them key by key.

    :param master: the Spark master (``local[2]``, ``yarn``, ``spark://...``, ...); ``None`` if unknown.
    :param conf: the caller's settings; they always win. A caller's ``spark.driver.memory`` also sets the
        initial heap (``-Xms``) in the recommended ``spark.driver.extraJavaOptions``; a caller's own
        ``spark.driver.extraJavaOptions`` replaces those options whole.
    """
    local = is_local(master)
    settings = {**JOB_CONF, **(LOCAL_CONF if local else {}), **(conf or {})}
    if local and _JAVA not in (conf or {}):
        # our options start the heap at its full size: it follows the caller's spark.driver.memory, since a
        # -Xms above the launcher's -Xmx stops the JVM from starting
        settings[_JAVA] = _INITIAL_HEAP.sub(f"-Xms{settings[_MEMORY]}", LOCAL_CONF[_JAVA])
    return settings


def job_path(job: str) -> str:
    """Absolute path of a job's module file, e.g. ``job_path("triage")``, for ``spark-submit``."""
    try:
        name = JOBS[job]
    except KeyError:
        raise ValueError(f"unknown Spark job {job!r}; choose one of {', '.join(sorted(JOBS))}") from None
    return str(Path(__file__).resolve().with_name(name))
