"""BabelQueueSparkTriageOperator: submit the packaged PySpark dead-letter jobs through SparkSubmitOperator.

A thin layer over the Spark provider's ``SparkSubmitOperator`` (``apache-airflow-providers-apache-spark``):
it resolves the job file shipped in ``airflow_provider_babelqueue/spark/``, builds its arguments from the
templated ``input``/``output``/policy parameters, and returns the output locations as XCom. Submission,
connection handling, deploy modes and log streaming are the Spark provider's.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from ..spark import JOBS, is_local, job_path, recommended_conf
from ..spark.class_archive import CLASS_ARCHIVE_ENV, archive_option, with_archive
from ._params import is_unset, parse_count, parse_list, parse_number, parse_rendered
from .links import BabelQueueReportLink
from .pending import carried_over, move_into, waiting_files
from .spark_connection import check_spark_connection, submit_path

__all__ = ["BabelQueueSparkTriageOperator", "package_zip"]

_POLICY = ("reasons", "urns", "exception_types", "original_queues", "max_attempts", "min_age_seconds",
           "max_age_seconds", "now_ms")
_LISTS = ("reasons", "urns", "exception_types", "original_queues")
_COUNTS = ("max_attempts", "now_ms")
_OPTIONAL_PATHS = ("report_output", "pending", "archive_to", "class_archive", "source_broker")


def package_zip(folder: str | os.PathLike[str] | None = None) -> str:
    """Zip the installed ``airflow_provider_babelqueue`` package (for ``--py-files``) and return the zip's path.

    The jobs' driver imports the package (the jobs' helpers and the pure core modules); no job runs Python code on
    the executors. So the zip matters where the driver runs away from this machine (``deploy_mode="cluster"``);
    ``orjson`` must be installed there, since it is a compiled wheel and cannot travel in a zip.
    """
    package = Path(__file__).resolve().parents[1]
    target = Path(folder or tempfile.mkdtemp(prefix="babelqueue-pyfiles-")) / "airflow_provider_babelqueue.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*.py")):
            if "__pycache__" not in path.parts:
                archive.write(path, Path(package.name) / path.relative_to(package))
    return str(target)


class BabelQueueSparkTriageOperator(SparkSubmitOperator):
    """Run one of the BabelQueue PySpark jobs with ``spark-submit``: ``triage``, ``report`` or ``replay_set``.

    * ``triage``: drain records (JSON Lines) → deduplicated Parquet partitioned by ``reason``;
    * ``report``: triage Parquet → ``summary.json`` + self-contained ``report.html``;
    * ``replay_set``: triage Parquet + a policy → the selected dead letters' drain records, untouched, in one
      folder: give it to ``BabelQueueReplayOperator(replay_set=...)``, which resets each message and publishes it
      to its original queue (so the set needs no folder per queue and no ``target_queue_name``).

    Returns ``{"job", "input", "output", ...}`` (XCom): ``summary`` and ``report`` for ``report``, ``summary``
    for ``replay_set`` and ``triage``. Every other keyword argument is ``SparkSubmitOperator``'s (``conf``,
    ``executor_memory``, ``deploy_mode``, ``py_files``, ...).

    The jobs' recommended settings (``airflow_provider_babelqueue.spark.JOB_CONF``, plus ``LOCAL_CONF`` when the
    connection's master is ``local``/``local[N]``) are submitted too; any key given in ``conf`` replaces its
    recommended value, so every one of them can be overridden. In local mode the driver's heap starts at its
    full size: ``driver_memory`` (or ``conf["spark.driver.memory"]``) sets both.

    :param job: ``"triage"``, ``"report"`` or ``"replay_set"``.
    :param input: input path(s): a path, a folder, a glob or any Hadoop-FS URL, or a list of them (templated;
        kept as ``input_path`` on the operator).
    :param output: the output folder, local or any Hadoop-FS URL (templated; kept as ``output_path``, since
        ``output`` is every operator's XComArg); it is overwritten.
    :param conn_id: the Spark connection (``spark_default``; for local mode ``{"conn_type": "spark", "host":
        "local[*]"}``; templated, so a DAG param can pick the cluster).
    :param source_broker: triage only: record this broker name instead of each record's ``broker`` (templated).
    :param report_output: triage only: also write the report (``summary.json``, ``report.html``) into this
        folder from the same Spark application, saving the report job's start-up (templated).
    :param pending: triage only: a folder of drain files waiting for triage (templated; local or an
        object-storage URL). Every drain file in it is triaged with ``input``, and the summary and report say how
        many records came from files that earlier runs left there. A pipeline that drains into this folder never
        strands a dead letter: a triage that fails leaves the files for the next run (``operators/pending.py``).
    :param archive_to: with ``pending``: after the job succeeded, the pending files it read are moved into this
        folder (templated; the run's own drain folder in the sample DAGs). Before that, nothing is moved.
    :param reasons: replay_set only: ``dead_letter.reason`` values to include (templated; list or comma text).
        The policy parameters mean what the replay operator's filters of the same names mean (one rule set,
        ``engine.replay.Selection``), so a policy can move between the two without changing what it picks.
    :param urns: replay_set only: URNs to include (templated).
    :param exception_types: replay_set only: exception types, full name or last segment (templated).
    :param original_queues: replay_set only: original queues to include (templated).
    :param max_attempts: replay_set only: include dead letters with at most this many attempts (templated), e.g.
        to leave the ones that failed many times for a person to look at.
    :param min_age_seconds: replay_set only: include dead letters that failed at least this long ago (templated).
    :param max_age_seconds: replay_set only: include dead letters that failed at most this long ago (templated).
    :param now_ms: replay_set only: "now" for the age filters, Unix ms (templated); default the job's start.
    :param ship_package: zip the installed provider package and add it to ``py_files`` so a driver that runs on
        the cluster can import it (not needed in local or client mode, where the driver is this Python).
    :param name: the Spark application name; default ``babelqueue-<job>``.
    :param class_archive: local masters only: a JVM class-data archive for the driver, built once per worker
        with ``python -m airflow_provider_babelqueue.spark.class_archive <path>``; it shortens the JVM's
        start-up (see docs/spark.md for the measured saving). A missing file is logged and the job runs without
        it (templated). The archive belongs to the worker machine (its JDK and Spark), so by default it is read
        from the worker's environment, ``BABELQUEUE_SPARK_CLASS_ARCHIVE``, at execution: set it once per worker
        and every DAG uses it.
    :param env_vars: environment for spark-submit; ``PYSPARK_PYTHON`` defaults to this interpreter
        (``sys.executable``) unless given, and is left out when the driver runs on the cluster
        (``deploy_mode="cluster"``), where this worker's path means nothing (there, give the cluster's Python).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "conn_id", "input_path", "output_path",
                                      "source_broker", "report_output", "pending", "archive_to", "class_archive",
                                      *_POLICY)
    ui_color = "#fbe9d0"
    # the report, served by the provider's plugin (SparkSubmitOperator has no links of its own)
    operator_extra_links = (BabelQueueReportLink(),)

    def __init__(
        self,
        *,
        job: str,
        input: str | Sequence[str],  # noqa: A002 - the documented parameter name
        output: str,
        conn_id: str = "spark_default",
        source_broker: str | None = None,
        report_output: str | None = None,
        pending: str | None = None,
        archive_to: str | None = None,
        reasons: Sequence[str] | str | None = None,
        urns: Sequence[str] | str | None = None,
        exception_types: Sequence[str] | str | None = None,
        original_queues: Sequence[str] | str | None = None,
        max_attempts: int | None = None,
        min_age_seconds: float | None = None,
        max_age_seconds: float | None = None,
        now_ms: int | None = None,
        ship_package: bool = False,
        class_archive: str | None = None,
        name: str | None = None,
        env_vars: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if job not in JOBS:
            raise ValueError(f"job must be one of {', '.join(sorted(JOBS))}, got {job!r}")
        policy = {"reasons": reasons, "urns": urns, "exception_types": exception_types,
                  "original_queues": original_queues, "max_attempts": max_attempts,
                  "min_age_seconds": min_age_seconds, "max_age_seconds": max_age_seconds, "now_ms": now_ms}
        given = sorted(key for key, value in policy.items() if value is not None)
        if given and job != "replay_set":
            raise ValueError(f"{', '.join(given)} only apply to job='replay_set', not {job!r}")
        if any(value is not None for value in (source_broker, report_output, pending, archive_to)) and job != "triage":
            raise ValueError(f"source_broker, report_output, pending and archive_to only apply to job='triage', "
                             f"not {job!r}")
        if (pending is None) != (archive_to is None):
            raise ValueError("pending and archive_to go together: the files read from pending must be moved "
                             "somewhere once triaged, or the next run would triage them again")
        if kwargs.get("application"):
            raise ValueError("application is set from job; do not pass it")
        env = dict(env_vars or {})
        self._python_given = "PYSPARK_PYTHON" in env
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        super().__init__(application=job_path(job), conn_id=conn_id, name=name or f"babelqueue-{job}",
                         env_vars=env, **kwargs)
        self.job = job
        self.conn_id = conn_id  # templated; copied to the Spark provider's ``_conn_id`` at execute
        # ``output`` is BaseOperator's XComArg property, so the values live under other names.
        self.input_path = input
        self.output_path = output
        self.source_broker = source_broker
        self.report_output = report_output
        self.pending = pending
        self.archive_to = archive_to
        self._carried: list[str] = []
        self.ship_package = ship_package
        self.class_archive = class_archive
        for key, value in policy.items():
            setattr(self, key, value)

    def job_args(self) -> list[str]:
        """The job's command-line arguments, from the (rendered) parameters."""
        inputs = self._inputs()
        if not inputs or not all(inputs) or not self.output_path:
            raise ValueError("input and output must not be empty")
        args = ["--input", *inputs, "--output", str(self.output_path)]
        if not is_unset(self.source_broker):
            args += ["--source-broker", str(self.source_broker)]
        if not is_unset(self.report_output):
            args += ["--report-output", str(self.report_output)]
        if self._carried:
            args += ["--carried-over", ",".join(path.rstrip("/").rsplit("/", 1)[-1] for path in self._carried)]
        for key in _POLICY:
            value = getattr(self, key)
            if is_unset(value):
                continue
            flag = "--" + key.replace("_", "-")
            if key in _LISTS:
                names = parse_list(value, key)
                if names:
                    args += [flag, ",".join(names)]
            elif key in _COUNTS:  # checked here, naming the parameter, not in the job after Spark started
                args += [flag, str(parse_count(value, key))]
            else:
                number = parse_number(value, key)
                args += [flag, str(int(number)) if number is not None and number.is_integer() else repr(number)]
        return args

    def _inputs(self) -> list[str]:
        paths = self.input_path
        if isinstance(paths, str) and paths.lstrip().startswith(("[", "(")):
            # a list rendered as text (JSON, or Python's); a path or glob such as "[ab]*.jsonl" stays a path
            try:
                listed = parse_rendered(paths.strip(), "input", "a path or a list of paths")
            except ValueError:
                listed = None
            if isinstance(listed, list | tuple) and all(isinstance(path, str) for path in listed):
                return [str(path) for path in listed]
        return [paths] if isinstance(paths, str) else [str(path) for path in paths or ()]

    def execute(self, context: Any) -> dict[str, Any]:  # type: ignore[override] # the job's summary, for XCom
        for key in _OPTIONAL_PATHS:  # a template that rendered as unset ("None", blank) was not given
            if is_unset(getattr(self, key)):
                setattr(self, key, None)
        self._conn_id = self.conn_id
        # before any work: a missing or unusable connection fails here, naming it and how to define it
        os.environ["PATH"] = submit_path()  # the venv's spark-submit, for a worker started without it on PATH
        target = check_spark_connection(self.conn_id, {**os.environ, **(self.env_vars or {})}, self._spark_binary)
        self.log.info("Spark connection %r: master %s, %s", self.conn_id, target.master, target.binary)
        waiting: list[str] = []
        if self.pending:
            waiting = waiting_files(str(self.pending))
            given = self._inputs()
            self._carried = carried_over(waiting, given)
            self.input_path = [*given, *self._carried]
            if self._carried:
                self.log.info("%d drain file(s) left pending by earlier runs are triaged with this run's: %s",
                              len(self._carried), ", ".join(self._carried))
        archive = self.class_archive or os.environ.get(CLASS_ARCHIVE_ENV) or None
        if archive and archive_option(archive) is None:
            self.log.info("class archive %s does not exist; running without it (build it with `python -m "
                          "airflow_provider_babelqueue.spark.class_archive %s` on this worker)", archive, archive)
        if self.conf is None or isinstance(self.conf, dict):
            # rendered by now: the recommended settings under the user's own, before the hook copies them
            master, mine = target.master, self.conf
            if self._driver_memory:
                # spark-submit's --driver-memory wins over spark.driver.memory, and the recommended initial heap
                # (-Xms) must not exceed it
                mine = {**(mine or {}), "spark.driver.memory": self._driver_memory}
            self.conf = recommended_conf(master, mine)
            if archive and is_local(master):  # a cluster's driver JVM runs elsewhere, without this file
                self.conf = with_archive(self.conf, archive)
        if target.is_local:
            # one JVM on this worker: bind to loopback, without the warnings about a hostname that resolves there
            self.env_vars = {"SPARK_LOCAL_IP": "127.0.0.1", **(self.env_vars or {})}
        if (self._deploy_mode or target.deploy_mode) == "cluster" and not self._python_given:
            # the driver runs on the cluster, where this worker's interpreter path means nothing (the Spark provider
            # would hand it to the YARN application master or the Kubernetes driver pod)
            self.env_vars = {key: value for key, value in (self.env_vars or {}).items() if key != "PYSPARK_PYTHON"}
        # the job sets its application name itself (a builder's appName wins over spark-submit's --name)
        self.application_args = [*self.job_args(), "--app-name", str(self.name)]
        if self.ship_package:
            zipped = package_zip()
            self.py_files = f"{self.py_files},{zipped}" if self.py_files else zipped
        super().execute(context)
        output = str(self.output_path).rstrip("/")
        result: dict[str, Any] = {"job": self.job, "input": self.input_path, "output": str(self.output_path)}
        if self.job == "report":
            result |= {"summary": f"{output}/summary.json", "report": f"{output}/report.html"}
        elif self.job == "replay_set":
            result["summary"] = f"{output}/_replay_summary.json"
        else:
            result["summary"] = f"{output}/_triage_summary.json"
            if self.report_output:
                report = str(self.report_output).rstrip("/")
                result |= {"report_summary": f"{report}/summary.json", "report": f"{report}/report.html"}
            if self.pending:
                result["carried_over"] = self._carried
                result["archived"] = move_into(waiting, str(self.archive_to))
                self.log.info("moved %d triaged drain file(s) from %s into %s", len(waiting), self.pending,
                              self.archive_to)
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage's ``OperatorLineage`` of the run (the provider's listener calls this when the task ended): the
        locations the job read and the folders it wrote (:func:`~airflow_provider_babelqueue.lineage.spark_lineage`);
        ``None`` when OpenLineage is not installed. What the job's own Spark plans read and wrote would come from
        OpenLineage's Spark listener, which this operator does not configure."""
        from ..lineage import run_result, spark_lineage, to_operator_lineage

        result = run_result(task_instance)
        return to_operator_lineage(spark_lineage(self.job, self._inputs(), result, self.report_output))
