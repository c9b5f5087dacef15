"""Optional: a JVM class-data archive for a local-mode Spark driver, so a small job starts sooner.

On a local master the driver JVM runs every task, and much of a small job is that JVM loading and verifying
Spark's classes. Java's application class-data sharing (CDS) maps them, already parsed, from an archive file.
This module builds one by running the triage job (with the report) once on a small generated sample under
``-XX:ArchiveClassesAtExit``, and gives the driver option that maps it. Its measured worth is in
``docs/spark.md`` (Start-up aid).

Build it once per worker, with the same Spark installation and JDK the jobs use::

    python -m airflow_provider_babelqueue.spark.class_archive ~/.cache/babelqueue/spark-driver.jsa

(or with no path, at ``$BABELQUEUE_SPARK_CLASS_ARCHIVE``, which ``BabelQueueSparkTriageOperator`` reads when
its ``class_archive`` is not given). An archive from another JDK or Spark is refused by the JVM with a
warning on stderr and the job runs without it (``-Xshare:auto``): a stale archive costs only its saving.

Nothing else depends on this module: the jobs never import it, and without an archive they run the same.
It imports only the project's core (to write the training sample) and the standard library.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CLASS_ARCHIVE_ENV", "archive_option", "build_class_archive", "main", "sample_records", "with_archive"]

#: The environment variable naming a worker's archive: the operator's default ``class_archive`` and this
#: module's default output path.
CLASS_ARCHIVE_ENV = "BABELQUEUE_SPARK_CLASS_ARCHIVE"

_JAVA = "spark.driver.extraJavaOptions"


def archive_option(path: str | os.PathLike[str] | None) -> str | None:
    """``-XX:SharedArchiveFile=<path>`` when ``path`` is an existing file, else ``None``.

    :param path: the archive; a missing one means "run without", never an error, since the archive only
        saves time.
    """
    if not path or not os.path.isfile(path):
        return None
    return f"-XX:SharedArchiveFile={os.fspath(path)}"


def with_archive(settings: Mapping[str, str], path: str | os.PathLike[str] | None) -> dict[str, str]:
    """``settings`` with the archive's option appended to ``spark.driver.extraJavaOptions`` (unchanged when
    there is no archive at ``path``).

    :param settings: the job's Spark settings (e.g. :func:`~airflow_provider_babelqueue.spark.recommended_conf`
        for a local master); the archive joins whatever JVM options they hold rather than replacing them.
    :param path: the archive file.
    """
    joined = dict(settings)
    option = archive_option(path)
    if option is not None:
        joined[_JAVA] = " ".join(filter(None, (joined.get(_JAVA), option)))
    return joined


@dataclass(frozen=True)
class _Dead:
    """A dead letter as the drain record writer reads it (the fields of ``core.records.DrainedMessage``)."""

    body: bytes
    meta_id: str
    queue_name: str = "orders"
    delivery_count: int | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)


def sample_records(count: int = 200) -> bytes:
    """``count`` drain records (JSON Lines) of every kind the jobs branch on: handler failures, unknown URNs,
    bodies that are not JSON and bodies that are not UTF-8, so the training run loads the classes real runs do.

    :param count: records to write; a few hundred load every class a run needs, and more only slow the build.
    """
    from ..core import envelope as bq
    from ..core.records import drain_record

    lines = []
    for n in range(count):
        kind = n % 4
        if kind == 2:
            message = _Dead(b'{"meta": {"id": "x-%d"}, "data": not json' % n, meta_id="")
        elif kind == 3:
            message = _Dead(b"\xff\xfe binary %d" % n, meta_id="")
        else:
            urn = f"urn:babel:orders:{'created' if kind == 0 else 'unknown'}"
            envelope = bq.annotate_dead_letter(
                bq.make_envelope(urn, {"order_id": n, "note": "Zoë"}, queue_name="orders"),
                "failed" if kind == 0 else "unknown_urn", original_queue="orders", attempts=3,
                error=f"timeout after {n} ms", exception="app.errors.Timeout")
            message = _Dead(bq.encode(envelope), meta_id=bq.meta_id_of(envelope))
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

    The JVM writes the archive at exit into a temporary file that is renamed into place only when complete,
    so a job starting meanwhile, or a second build at once, never maps a torn file.

    :param path: where the archive goes (its folder is created).
    :param spark_submit: the ``spark-submit`` to train with: the same installation the jobs will use, or the
        JVM refuses the archive; default the one next to this Python, else on ``PATH``.
    :param conf: Spark settings of the training run (default: ``recommended_conf("local[2]")``); the archive
        works with other settings too.
    :param env: the environment of the run (default: this process's, with ``PYSPARK_PYTHON`` this Python).
    :param timeout: seconds before the training run is given up.
    :raises RuntimeError: the run failed (its stderr tail says why); an archive already at ``path`` is left as
        it was.
    """
    from . import job_path, recommended_conf

    target = Path(path).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    submit = (spark_submit or shutil.which("spark-submit", path=str(Path(sys.executable).parent))
              or shutil.which("spark-submit"))
    if submit is None:
        raise RuntimeError("spark-submit not found: install pyspark or pass spark_submit")
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="babelqueue-cds-") as work:
        sample = Path(work, "in", "sample.jsonl")
        sample.parent.mkdir()
        sample.write_bytes(sample_records())
        handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        os.close(handle)
        partial = Path(name)
        partial.unlink()  # the JVM creates it at exit
        settings = dict(recommended_conf("local[2]") if conf is None else conf)
        settings[_JAVA] = " ".join(filter(None, (settings.get(_JAVA), f"-XX:ArchiveClassesAtExit={partial}")))
        command = [submit, "--master", "local[2]"]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        command += [job_path("triage"), "--input", str(sample.parent), "--output", str(Path(work, "rows")),
                    "--report-output", str(Path(work, "report"))]
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
    """The build step: ``python -m airflow_provider_babelqueue.spark.class_archive [PATH]``.

    :param argv: the arguments (default ``sys.argv[1:]``).
    """
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
