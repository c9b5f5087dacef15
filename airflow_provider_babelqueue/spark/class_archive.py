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

The JVM will not archive classes from a signed jar, and Spark ships two: Janino and its commons-compiler, the
~500 classes that compile every query's generated code, on the critical path of every query's first task.
The build writes copies of such jars without their signature files next to the archive (``<archive>.jars/``),
trains with them ahead of Spark's own on the driver's class path, and :func:`archive_conf` puts them there
again: the next JVM maps those classes too (~0.3 s less per job, measured in docs/benchmarks.md).

The build also writes compiled copies of the installation's Python zips (``pyspark.zip``, py4j's) to
``<archive>.python/`` (:mod:`~airflow_provider_babelqueue.spark.bytecode`) and :func:`archive_conf` puts them
first on the driver's Python path (``spark.submit.pyFiles``): the driver imports PySpark's bytecode instead
of compiling its sources at every start (~0.4 s less per job).

Build one: ``python -m airflow_provider_babelqueue.spark.class_archive /path/to/spark-driver.jsa`` (or, with
no path, at ``$BABELQUEUE_SPARK_CLASS_ARCHIVE``: the worker-wide setting ``BabelQueueSparkTriageOperator`` reads
when its ``class_archive`` is not given).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import _JAVA
from .bytecode import build_compiled_copies, compiled_copies

__all__ = ["CLASS_ARCHIVE_ENV", "PY_FILES", "add_driver_conf", "archive_conf", "archive_jars", "archive_option",
           "archive_python", "build_class_archive", "main", "sample_records", "unsigned_copy"]

#: The environment variable naming a worker's archive: the operator's default ``class_archive`` and this
#: module's default output path.
CLASS_ARCHIVE_ENV = "BABELQUEUE_SPARK_CLASS_ARCHIVE"

_CLASSPATH = "spark.driver.extraClassPath"
#: The setting that puts Python files first on the driver's path (``--py-files``, which wins over it).
PY_FILES = "spark.submit.pyFiles"


def archive_option(path: str | os.PathLike[str] | None) -> str | None:
    """``-XX:SharedArchiveFile=<path>`` when ``path`` is an existing archive, else ``None`` (run without)."""
    if not path or not os.path.isfile(path):
        return None
    return f"-XX:SharedArchiveFile={os.fspath(path)}"


def archive_jars(path: str | os.PathLike[str]) -> list[str]:
    """The unsigned jar copies the archive at ``path`` was trained with (``<path>.jars/*.jar``, in name order:
    the order the build put them on the class path), or ``[]``."""
    folder = Path(f"{os.fspath(path)}.jars")
    return sorted(str(jar) for jar in folder.glob("*.jar")) if folder.is_dir() else []


def archive_python(path: str | os.PathLike[str]) -> list[str]:
    """The compiled copies of Spark's Python zips the archive at ``path`` was built with
    (``<path>.python/*.compiled.zip``), or ``[]``."""
    return compiled_copies(f"{os.fspath(path)}.python")


def archive_conf(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """The driver settings that use the archive at ``path``: ``spark.driver.extraJavaOptions`` to map it;
    when its build made unsigned jar copies, ``spark.driver.extraClassPath`` to put them first, as in training
    (with another class path the JVM does not use the archive); when it made compiled copies of Spark's Python
    zips, ``spark.submit.pyFiles`` to put them first on the driver's Python path. ``{}`` when there is no
    archive."""
    option = archive_option(path)
    if option is None:
        return {}
    conf = {_JAVA: option}
    jars = archive_jars(path)  # type: ignore[arg-type]  # not None: the archive exists
    if jars:
        conf[_CLASSPATH] = os.pathsep.join(jars)
    copies = archive_python(path)  # type: ignore[arg-type]
    if copies:
        conf[PY_FILES] = ",".join(copies)
    return conf


def add_driver_conf(settings: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """``settings`` with the archive's driver settings ``extra`` (:func:`archive_conf`, or the training run's)
    joined in: its JVM options after the ones there (they join them), its class path before the one there (the
    order the archive was trained with), its Python files before the ones there (so PySpark's compiled copy is
    found before the installation's zip)."""
    joined = dict(settings)
    if _JAVA in extra:
        joined[_JAVA] = " ".join(filter(None, (settings.get(_JAVA), extra[_JAVA])))
    if _CLASSPATH in extra:
        joined[_CLASSPATH] = os.pathsep.join(filter(None, (extra[_CLASSPATH], settings.get(_CLASSPATH))))
    if PY_FILES in extra:
        joined[PY_FILES] = ",".join(filter(None, (extra[PY_FILES], settings.get(PY_FILES))))
    return joined


#: A jar's signature: the signature file and its signature block (``META-INF/NAME.SF`` with ``.RSA``, ``.DSA``
#: or ``.EC``, or ``META-INF/SIG-NAME``); the JVM treats a jar without them as unsigned.
_SIGNATURE_FILE = re.compile(r"META-INF/(?:[^/]+\.(?:SF|RSA|DSA|EC)|SIG-[^/]+)", re.IGNORECASE)


def unsigned_copy(jar: Path, target: Path) -> bool:
    """Write ``jar`` without its signature files to ``target``, unless ``jar`` is not signed (``False``).

    Every other entry keeps its bytes, compression and date, in the same order, and the file gets ``jar``'s
    modification time, so two builds write the same file (the JVM checks a class-path jar's size and time
    against the archive's record). A ``target`` of that size and time is left as it is (a running job may be
    reading it); otherwise the copy is written to a temporary file and renamed into place.
    """
    with zipfile.ZipFile(jar) as source:
        entries = source.infolist()
        if not any(_SIGNATURE_FILE.fullmatch(entry.filename) for entry in entries):
            return False
        mtime_ns = jar.stat().st_mtime_ns
        partial = target.with_name(f".{target.name}.{os.getpid()}.part")
        try:
            with zipfile.ZipFile(partial, "w") as copy:
                for entry in entries:
                    if not _SIGNATURE_FILE.fullmatch(entry.filename):
                        copy.writestr(entry, source.read(entry))
            os.utime(partial, ns=(mtime_ns, mtime_ns))
            if target.is_file():
                have, made = target.stat(), partial.stat()
                if (have.st_size, have.st_mtime_ns) == (made.st_size, made.st_mtime_ns):
                    return True
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return True


def _spark_jars(submit: str, env: Mapping[str, str]) -> Path | None:
    """The ``jars`` folder of the Spark installation ``submit`` runs: ``$SPARK_HOME/jars``, the folder next
    to ``bin/spark-submit``, or (a pip-installed ``spark-submit`` finds its home itself) pyspark's own."""
    candidates = [Path(env["SPARK_HOME"], "jars")] if env.get("SPARK_HOME") else []
    candidates.append(Path(submit).resolve().parent.parent / "jars")
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "jars")
    return next((folder for folder in candidates if folder.is_dir()), None)


def _unsigned_jars(archive: Path, jars: Path | None) -> list[str]:
    """Unsigned copies of the signed jars in the installation's ``jars`` folder in ``<archive>.jars/``, nothing
    else left there (no folder when none is signed); returns their paths, in class-path order."""
    folder = Path(f"{archive}.jars")
    folder.mkdir(exist_ok=True)
    copied = {jar.name for jar in (sorted(jars.glob("*.jar")) if jars else []) if unsigned_copy(jar, folder / jar.name)}
    for stale in folder.glob("*.jar"):
        if stale.name not in copied:
            stale.unlink()
    if not copied:
        shutil.rmtree(folder, ignore_errors=True)
    return archive_jars(archive)


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
    :raises RuntimeError: the run failed (its stderr tail says why); an archive already at ``path`` is left as
        it was.
    """
    from . import job_path, recommended_conf

    target = Path(path).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    bin_dir = str(Path(sys.executable).parent)
    submit = spark_submit or shutil.which("spark-submit", path=bin_dir) or shutil.which("spark-submit")
    if submit is None:
        raise RuntimeError("spark-submit not found: install pyspark or pass spark_submit")
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("PYSPARK_PYTHON", sys.executable)
    spark_jars = _spark_jars(submit, run_env)
    jars = _unsigned_jars(target, spark_jars)
    if spark_jars is not None:  # the installation's python/lib is next to its jars (SPARK_HOME or pyspark's own)
        build_compiled_copies(spark_jars.parent / "python" / "lib", f"{target}.python")
    with tempfile.TemporaryDirectory(prefix="babelqueue-cds-") as work:
        sample = Path(work, "in", "sample.jsonl")
        sample.parent.mkdir()
        sample.write_bytes(sample_records())
        partial = Path(tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)[1])
        partial.unlink()  # the JVM writes it at exit
        training = {_JAVA: f"-XX:ArchiveClassesAtExit={partial}"}
        if jars:  # first on the class path, where archive_conf puts them again
            training[_CLASSPATH] = os.pathsep.join(jars)
        settings = add_driver_conf(recommended_conf("local[2]") if conf is None else conf, training)
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
