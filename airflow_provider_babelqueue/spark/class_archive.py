"""A JVM class-data archive for the Spark driver, so a local-mode job starts in about half the time.

Most of a small job's wall time on a small machine is the JVM loading and verifying Spark's classes. Java's
application class-data sharing (CDS) keeps them pre-parsed in an archive file that later JVMs map instead.
:func:`build_class_archive` creates one by running the triage and report jobs once on a small generated
sample with ``-XX:ArchiveClassesAtExit`` (into a temporary file renamed into place when complete, so two
builds at once never leave a torn archive); :func:`archive_option` gives the option that uses it.

Measured on this project's 2-core machine (docs/benchmarks.md): a bare ``spark-submit`` 8.8–9.9 s → 5.1 s, the
1M-record triage + report 33.5–35.1 s → 30.1–32.2 s. The archive belongs to one JDK and one Spark
installation: after an upgrade the JVM reports the mismatch on stderr and runs without it (``-Xshare:auto``),
so a stale archive costs only the saving; rebuild it.

Build one: ``python -m airflow_provider_babelqueue.spark.class_archive /path/to/spark-driver.jsa`` (or, with
no path, at ``$BABELQUEUE_SPARK_CLASS_ARCHIVE``: the worker-wide setting ``BabelQueueSparkTriageOperator`` reads
when its ``class_archive`` is not given).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["CLASS_ARCHIVE_ENV", "archive_option", "build_class_archive", "main", "sample_records"]

#: The environment variable naming a worker's archive: the operator's default ``class_archive`` and this
#: module's default output path.
CLASS_ARCHIVE_ENV = "BABELQUEUE_SPARK_CLASS_ARCHIVE"


def archive_option(path: str | os.PathLike[str] | None) -> str | None:
    """``-XX:SharedArchiveFile=<path>`` when ``path`` is an existing archive, else ``None`` (run without)."""
    if not path or not os.path.isfile(path):
        return None
    return f"-XX:SharedArchiveFile={os.fspath(path)}"


def sample_records(count: int = 200) -> bytes:
    """Drain records (JSON Lines) of ``count`` dead letters of every kind the jobs branch on (handler failures,
    unknown URNs, poison bytes, a body that is not UTF-8), so the training run loads the classes real runs use."""
    from ..bindings.base import ReceivedMessage, parse_body
    from ..drain import drain_record
    from ..envelope import annotate_dead_letter, encode, make_envelope

    lines = []
    for n in range(count):
        kind = n % 4
        if kind == 2:
            body = b'{"meta": {"id": "x-%d"}, "data": not json' % n
        elif kind == 3:
            body = b"\xff\xfe binary %d" % n
        else:
            envelope = make_envelope(f"urn:babel:orders:{'created' if kind == 0 else 'unknown'}",
                                     {"order_id": n, "note": "Zoë"}, queue_name="orders")
            reason = "failed" if kind == 0 else "unknown_urn"
            body = encode(annotate_dead_letter(envelope, reason, original_queue="orders", attempts=3,
                                               error=f"timeout after {n} ms", exception="app.errors.Timeout"))
        envelope, error, attempts = parse_body(body)
        message = ReceivedMessage(body, "orders", envelope, error, attempts, from_dead_letter=True)
        lines.append(drain_record(message, broker="sql", dead_letter_queue="orders:failed",
                                  source_conn_id="class-archive", drained_at=1_700_000_000_000 + n))
    return b"".join(lines)


def build_class_archive(
    path: str | os.PathLike[str],
    *,
    spark_submit: str | None = None,
    conf: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
) -> Path:
    """Create (or replace) the archive at ``path`` with one local triage + report run; returns its path.

    :param spark_submit: the ``spark-submit`` to train with: the same installation the jobs will use, or the
        archive does not match; default the one next to this Python, else on ``PATH``.
    :param conf: Spark settings of the training run (default: :func:`recommended_conf` for ``local[2]``); the
        archive works with other settings too.
    :param env: the environment of the run (default: this process's, with ``PYSPARK_PYTHON`` this Python).
    :raises RuntimeError: the run failed (its stderr tail says why); nothing is left at ``path``.
    """
    from . import job_path, recommended_conf

    target = Path(path).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    bin_dir = str(Path(sys.executable).parent)
    submit = spark_submit or shutil.which("spark-submit", path=bin_dir) or shutil.which("spark-submit")
    if submit is None:
        raise RuntimeError("spark-submit not found: install pyspark or pass spark_submit")
    settings = dict(recommended_conf("local[2]") if conf is None else conf)
    with tempfile.TemporaryDirectory(prefix="babelqueue-cds-") as work:
        sample = Path(work, "in", "sample.jsonl")
        sample.parent.mkdir()
        sample.write_bytes(sample_records())
        partial = Path(tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)[1])
        partial.unlink()  # the JVM writes it at exit
        java = " ".join(filter(None, (settings.get("spark.driver.extraJavaOptions"),
                                      f"-XX:ArchiveClassesAtExit={partial}")))
        settings["spark.driver.extraJavaOptions"] = java
        command = [submit, "--master", "local[2]"]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        command += [job_path("triage"), "--input", str(sample.parent), "--output", str(Path(work, "rows")),
                    "--report-output", str(Path(work, "report"))]
        run_env = dict(os.environ if env is None else env)
        run_env.setdefault("PYSPARK_PYTHON", sys.executable)
        try:
            done = subprocess.run(command, env=run_env, capture_output=True, text=True, timeout=timeout, check=False)
            if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
                raise RuntimeError(f"building the class archive failed (exit {done.returncode}): "
                                   f"{done.stderr[-2000:]}")
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the Spark driver's class-data archive (see the module doc).")
    parser.add_argument("path", nargs="?", default=os.environ.get(CLASS_ARCHIVE_ENV),
                        help="where to write the archive, e.g. ~/.cache/babelqueue/spark-driver.jsa "
                             f"(default: ${CLASS_ARCHIVE_ENV})")
    args = parser.parse_args(argv)
    if not args.path:
        parser.error(f"give the archive's path, or set {CLASS_ARCHIVE_ENV}")
    print(build_class_archive(args.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
