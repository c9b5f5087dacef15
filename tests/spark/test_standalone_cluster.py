"""The triage and replay-set jobs, submitted by ``BabelQueueSparkTriageOperator`` to a Spark standalone cluster.

Every other Spark test runs ``local[N]``, where the driver JVM runs every task itself: nothing there shows that
the jobs work when the tasks run in another JVM, launched by a worker that got them from a master, which is how a
production cluster runs them. Here one DAG (triage → replay_set, under ``dag.test()``) submits both jobs through
the operator to a master and a worker started from the installed pyspark (``tests/spark/cluster.py``), in client
deploy mode: the driver runs in this process's ``spark-submit``, the executors on the worker. The outputs are
checked against what ``tests/spark/dead_letters.py`` generated; the cluster's own records (the master's
completed applications, the executors' task logs in the worker's work directory) and each driver's event log
show where the work ran and with which settings. The executors are given no usable Python, so the run also
shows that the jobs need none there.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.core.errors import EnvelopeDecodeError
from airflow_provider_babelqueue.core.records import record_body
from airflow_provider_babelqueue.engine.replay.selection import Selection, original_queue_of, reason_of
from airflow_provider_babelqueue.operators.spark import BabelQueueSparkTriageOperator
from airflow_provider_babelqueue.spark import LOCAL_CONF, recommended_conf
from tests.spark.cluster import StandaloneCluster, spark_home, standalone_cluster
from tests.spark.conftest import VENV_BIN, spark_submit_path
from tests.spark.dead_letters import DUPLICATES, Letter, letters, write_drain_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CONN_ID = "spark_standalone"
#: The replay policy the DAG submits, and the same policy for the replay engine's own rules (the oracle).
POLICY: dict[str, Any] = {"reasons": ["failed"], "exception_types": "GatewayTimeout,SmtpError", "max_attempts": 5}
SELECTION = Selection(reasons=frozenset({"failed"}), exception_types=frozenset({"GatewayTimeout", "SmtpError"}),
                      max_attempts=5)
#: JVM options for a job on 20 records, where nearly all the work is start-up and query planning, code that
#: runs a few times: the quick compiler alone (C1) and the serial collector. Measured on this module's two jobs,
#: interleaved on the shared 2-core machine: 67 → 35 CPU-seconds (driver + executor) for triage, 47 → 25 for
#: replay_set, and half the wall time. A test setting, not a recommendation: on real volumes the optimizing
#: compiler pays for itself (docs/spark.md, Performance).
SMALL_JOB_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: What a small cluster run asks for, on top of what the operator recommends for a cluster master: no driver
#: web UI to start, 4 shuffle partitions for 20 records, and the JVM options above for the driver and the
#: executor. Executors are smaller than the worker's 1 GiB.
CLUSTER_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
                "spark.driver.extraJavaOptions": SMALL_JOB_JAVA_OPTIONS,
                "spark.executor.extraJavaOptions": SMALL_JOB_JAVA_OPTIONS}
EXECUTOR_MEMORY = "512m"
#: Only for the test to read back: each application's event log (one uncompressed file of JSON lines) records
#: the settings its driver ran with and, for every task, the executor that ran it.
EVENT_LOG_CONF = {"spark.eventLog.enabled": "true", "spark.eventLog.compress": "false",
                  "spark.eventLog.rolling.enabled": "false"}
#: The Python an executor would start for Python code: a path that does not exist, so a job that ran any
#: Python on an executor would fail here. The driver gets this interpreter (``PYSPARK_DRIVER_PYTHON``).
NO_EXECUTOR_PYTHON = "/nonexistent/executors-run-no-python"


def generated_reasons() -> Counter[str]:
    """Dead letters per reason, as generated: ``dead_letter.reason`` of each body the core decodes, ``poison``
    for each it refuses."""
    reasons: Counter[str] = Counter()
    for letter in letters():
        try:
            reasons[reason_of(bq.decode(letter.body))] += 1
        except EnvelopeDecodeError:
            reasons["poison"] += 1
    return reasons


def expected_selection() -> list[Letter]:
    """The letters the replay engine's rules pick under :data:`POLICY`, in the replay set's order (original
    queue, then ``meta.id``). Poison is never selected."""
    picked = []
    for letter in letters():
        try:
            envelope = bq.decode(letter.body)
        except EnvelopeDecodeError:
            continue
        if SELECTION.matches(envelope, now_ms=0, fallback_queue=letter.queue_name):
            picked.append((original_queue_of(envelope) or letter.queue_name, envelope["meta"]["id"], letter))
    return [letter for _, _, letter in sorted(picked, key=lambda item: item[:2])]


@dataclass(frozen=True)
class ClusterRun:
    cluster: StandaloneCluster
    triage_dir: Path
    report_dir: Path
    replay_dir: Path
    event_dir: Path
    results: dict[str, Any]

    def events(self, app_id: str) -> list[dict[str, Any]]:
        """One application's event log (the driver writes it as it runs), as a list of events."""
        (path,) = self.event_dir.glob(f"{app_id}*")  # renamed from <app_id>.inprogress when it stopped
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and a worker (1 core, 1 GiB) for this module, stopped (process groups) when it ends."""
    if spark_home() is None or spark_submit_path() is None or shutil.which("java") is None:
        pytest.skip("pyspark (spark-submit) or java is not installed")
    with standalone_cluster(tmp_path_factory.mktemp("standalone")) as running:
        yield running


@pytest.fixture(scope="module")
def cluster_run(cluster: StandaloneCluster, tmp_path_factory: pytest.TempPathFactory) -> ClusterRun:
    """One DAG run, triage → replay_set, both tasks submitting to the cluster through the operator."""
    from airflow.sdk import DAG

    from tests.airflow_harness import run_dag, task_states, xcom

    root = tmp_path_factory.mktemp("standalone-run")
    drain_dir, triage_dir, report_dir, replay_dir, event_dir = (
        root / name for name in ("drained", "triage", "report", "replay", "events"))
    write_drain_files(drain_dir)
    event_dir.mkdir()
    # the connection as a deployment would define it: the master URL in the host, client deploy mode
    connection = {"conn_type": "spark", "host": cluster.master_url, "extra": {"deploy-mode": "client"}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", VENV_BIN + os.pathsep + os.environ["PATH"])
        patch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))
        with DAG("babelqueue_spark_standalone", schedule=None, start_date=datetime.datetime(2025, 1, 1),
                 catchup=False) as dag:
            conf = {**CLUSTER_CONF, **EVENT_LOG_CONF, "spark.eventLog.dir": event_dir.as_uri()}
            # client mode: spark-submit's environment is the driver's; SPARK_LOCAL_IP keeps it on loopback,
            # where the executors call it back
            env = {"PYSPARK_DRIVER_PYTHON": sys.executable, "PYSPARK_PYTHON": NO_EXECUTOR_PYTHON,
                   "SPARK_LOCAL_IP": "127.0.0.1"}
            common: dict[str, Any] = {"conn_id": CONN_ID, "conf": conf, "executor_memory": EXECUTOR_MEMORY,
                                      "total_executor_cores": 1, "env_vars": env}
            triage = BabelQueueSparkTriageOperator(task_id="triage", job="triage", input=str(drain_dir),
                                                   output=str(triage_dir), report_output=str(report_dir), **common)
            replay_set = BabelQueueSparkTriageOperator(
                task_id="replay_set", job="replay_set",
                input="{{ ti.xcom_pull(task_ids='triage')['output'] }}", output=str(replay_dir), **POLICY,
                **common)
            triage >> replay_set
        run = run_dag(dag, logical_date=datetime.datetime(2025, 6, 5, tzinfo=datetime.UTC))
        states = task_states(run)
        results = {task: xcom(run, task) for task in ("triage", "replay_set")}
    if states != {"triage": "success", "replay_set": "success"}:
        pytest.fail(f"the DAG on the standalone cluster did not succeed: {states}\n{cluster.logs()}")
    return ClusterRun(cluster, triage_dir, report_dir, replay_dir, event_dir, results)


def test_the_driver_ran_here_against_the_master_with_the_cluster_settings(cluster_run: ClusterRun) -> None:
    """What each driver ran with, from its own event log: the connection's master in client mode, the job
    settings and the task's own; none of the local-mode settings (those assume the driver is the executor: its
    heap, its JVM flags, checksums off in its one JVM)."""
    cluster = cluster_run.cluster
    apps = cluster.completed_apps()
    assert sorted(apps) == ["babelqueue-replay_set", "babelqueue-triage"], cluster.logs()
    submitted = recommended_conf(cluster.master_url, CLUSTER_CONF)
    java_options = {key for key in submitted if key.endswith("extraJavaOptions")}
    for name, app in apps.items():
        (environment,) = [e for e in cluster_run.events(app["id"]) if e["Event"].endswith("EnvironmentUpdate")]
        properties = environment["Spark Properties"]
        assert (properties["spark.app.name"], properties["spark.master"], properties["spark.submit.deployMode"],
                properties["spark.executor.memory"]) == (name, cluster.master_url, "client", EXECUTOR_MEMORY)
        # Spark puts its own module options in front of the JVM options it was given
        assert {key: properties[key] for key in set(submitted) - java_options} == {
            key: submitted[key] for key in set(submitted) - java_options}, name
        assert all(properties[key].endswith(" " + submitted[key]) for key in java_options), name
        assert not (set(LOCAL_CONF) - set(CLUSTER_CONF)) & set(properties), name


def test_triage_on_the_cluster_counts_every_generated_record(cluster_run: ClusterRun) -> None:
    reasons = generated_reasons()
    assert reasons == {"failed": 8, "poison": 3, "unknown_urn": 2, "unsupported_schema_version": 2}
    distinct = sum(reasons.values())
    summary = json.loads((cluster_run.triage_dir / "_triage_summary.json").read_text())
    # every drain line accounted for: 15 letters, 4 drained twice, 1 torn last line
    expected = {
        "job": "triage", "output": str(cluster_run.triage_dir), "records": distinct + len(DUPLICATES) + 1,
        "rows": distinct, "duplicates_removed": len(DUPLICATES), "unreadable": 1,
        "unreadable_by_cause": {"torn": 1, "too_large": 0, "unknown_version": 0}, "poison": reasons["poison"],
        "by_reason": dict(sorted(reasons.items())), "report": str(cluster_run.report_dir / "report.html"),
    }
    assert {key: summary.get(key) for key in expected} == expected
    # the Parquet the executor wrote: one folder per reason, as many rows in each as generated
    table = pq.read_table(cluster_run.triage_dir).to_pylist()
    assert Counter(row["reason"] for row in table) == reasons
    assert sorted(row["copies"] for row in table if row["copies"] > 1) == [2] * len(DUPLICATES)
    # the report written from the same application
    report = json.loads((cluster_run.report_dir / "summary.json").read_text())
    assert report["by_reason"] == dict(reasons)
    assert (report["totals"]["dead_letters"], report["totals"]["records"]) == (distinct, summary["records"])
    assert cluster_run.results["triage"] == {
        "job": "triage", "input": str(cluster_run.triage_dir.parent / "drained"), "output": str(cluster_run.triage_dir),
        "summary": f"{cluster_run.triage_dir}/_triage_summary.json",
        "report_summary": f"{cluster_run.report_dir}/summary.json", "report": f"{cluster_run.report_dir}/report.html",
    }


def test_replay_set_on_the_cluster_holds_the_policy_selection(cluster_run: ClusterRun) -> None:
    expected = expected_selection()
    assert [letter.name for letter in expected] == ["F7", "F1", "F2", "F3"]  # F8: 10 attempts; F4-F6: CardDeclined
    lines = [line for part in sorted(cluster_run.replay_dir.glob("part-*"))
             for line in part.read_bytes().splitlines()]
    assert len(lines) == len(expected)
    assert [record_body(json.loads(line)) for line in lines] == [letter.body for letter in expected]
    summary = json.loads((cluster_run.replay_dir / "_replay_summary.json").read_text())
    assert (summary["lines"], summary["targets"]) == (len(expected), {"emails": 1, "orders": 2, "orders-priority": 1})
    # the rest, by the first filter each fails: 12 decodable letters in all, 3 poison
    assert summary["skipped"] == {"poison": 3, "reasons": 4, "exception_types": 3, "max_attempts": 1}
    assert cluster_run.results["replay_set"]["input"] == str(cluster_run.triage_dir)  # the triage task's XCom


def test_both_jobs_ran_on_the_clusters_executor(cluster_run: ClusterRun) -> None:
    """The master saw both applications finish, each given the worker's core; the worker launched one executor
    for each (its task log is in the worker's work directory, under the application's id); and every task of
    both jobs ran on that executor, none in the driver. The Python that executor would have started for Python
    code (``PYSPARK_PYTHON``, :data:`NO_EXECUTOR_PYTHON`) does not exist: the tasks needed none."""
    cluster = cluster_run.cluster
    apps = cluster.completed_apps()
    assert {name: (app["state"], app["cores"]) for name, app in apps.items()} == {
        "babelqueue-triage": ("FINISHED", 1), "babelqueue-replay_set": ("FINISHED", 1)}, cluster.logs()
    assert cluster.state()["activeapps"] == []
    for name, app in apps.items():
        executors = cluster.executor_logs(app["id"])
        assert list(executors) == ["0"], (name, sorted(p.name for p in cluster.work_dir.iterdir()), cluster.logs())
        assert "Finished task" in executors["0"], (name, executors["0"][-3000:])
        events = cluster_run.events(app["id"])
        added = [e["Executor Info"]["Host"] for e in events if e["Event"].endswith("ExecutorAdded")]
        ran_on = Counter(e["Task Info"]["Executor ID"] for e in events if e["Event"].endswith("TaskEnd"))
        assert added == ["127.0.0.1"] and set(ran_on) == {"0"}, (name, added, ran_on)
        assert ran_on["0"] == executors["0"].count("Finished task"), name
