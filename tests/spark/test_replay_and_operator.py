"""The replay set holds the selected dead letters' drain records untouched; BabelQueueReplayOperator replays the
whole folder, each message to its original queue; the Spark operator runs under dag.test()."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.core.records import record_body
from airflow_provider_babelqueue.operators import replay as replay_module
from airflow_provider_babelqueue.operators.replay import BabelQueueReplayOperator
from airflow_provider_babelqueue.operators.spark import BabelQueueSparkTriageOperator
from airflow_provider_babelqueue.spark import LOCAL_CONF
from airflow_provider_babelqueue.spark.class_archive import CLASS_ARCHIVE_ENV
from tests.spark.conftest import SPARK_CONF, VENV_BIN, SparkRun
from tests.spark.dead_letters import CREATED, by_name, drained_at_of, expected_reset, record

pytestmark = pytest.mark.timeout(600)

#: The session's replay set (no policy): every letter that is not poison, by original queue, in the order the
#: job writes them (original queue, then meta.id). S1 and S2 (schema_version 2 and 3) are selected: only the
#: replay operator, which resets and checks each envelope, leaves them out.
REPLAY_SET = {"emails": ["F7", "F8"], "orders": ["F1", "F2", "U1", "U2"], "orders-priority": ["F3"],
              "payments": ["F4", "F5", "F6", "S1", "S2"]}
#: What the replay operator publishes from it, per queue.
REPLAYED = {queue: [name for name in names if name[0] != "S"] for queue, names in REPLAY_SET.items()}


def read_replay_set(folder: Path) -> list[bytes]:
    """Every line of a replay set's part files, in file-name order (as the replay operator reads them)."""
    assert not [path for path in folder.iterdir() if path.is_dir()], "one folder, no partitions"
    return [line for part in sorted(folder.glob("part-*")) for line in part.read_bytes().splitlines()]


class FakeHook:
    def __init__(self, binding: Binding) -> None:
        self.binding = binding

    def get_binding(self) -> Binding:
        return self.binding

    def close(self) -> None:
        pass


def drain_queue(binding: MemoryBinding, queue_name: str) -> list[bytes]:
    bodies = []
    while (message := binding.reserve(queue_name, timeout=0)) is not None:
        bodies.append(message.body)
        binding.ack(message)
    return bodies


def test_replay_set_holds_the_drain_records_untouched(spark_run: SparkRun) -> None:
    named = by_name()
    lines = read_replay_set(spark_run.replay_dir)
    order = [name for queue in sorted(REPLAY_SET) for name in REPLAY_SET[queue]]
    # each line is the earliest drained copy's record, byte for byte: same keys, same values, the body as stored
    assert lines == [record(named[name], drained_at_of(name)).rstrip(b"\n") for name in order]
    assert [record_body(json.loads(line)) for line in lines] == [named[name].body for name in order]
    summary = spark_run.replay
    assert summary == {
        "job": "replay_set", "output": str(spark_run.replay_dir), "path": str(spark_run.replay_dir), "lines": 12,
        "targets": {queue: len(names) for queue, names in REPLAY_SET.items()}, "skipped": {"poison": 3},
        "policy": {**dict.fromkeys(("reasons", "urns", "exception_types", "original_queues", "max_attempts",
                                    "min_age_seconds", "max_age_seconds")), "now_ms": summary["policy"]["now_ms"]},
    }
    assert json.loads((spark_run.replay_dir / "_replay_summary.json").read_text()) == summary


def test_replay_operator_replays_the_folder_each_message_to_its_original_queue(
        spark_run: SparkRun, monkeypatch: pytest.MonkeyPatch) -> None:
    binding = MemoryBinding()
    monkeypatch.setattr(replay_module, "get_hook", lambda conn_id: FakeHook(binding))
    named = by_name()
    result = BabelQueueReplayOperator(task_id="replay", source_conn_id="bq",
                                      replay_set=str(spark_run.replay_dir)).execute(context={})
    # reset once, here: S1 and S2 cannot be made valid and stay out; F3 goes to its dead_letter.original_queue
    assert result == {"replayed": 10, "skipped": {"unsupported_schema_version": 2}, "duplicates_avoided": 0,
                      "duplicates_kept": 0, "dry_run": False,
                      "targets": {queue: len(names) for queue, names in REPLAYED.items()}}
    for queue, names in REPLAYED.items():
        assert drain_queue(binding, queue) == [expected_reset(named[name].body) for name in names]
    # a re-run publishes nothing twice (each target queue's ledger knows every meta.id)
    rerun = BabelQueueReplayOperator(task_id="rerun", source_conn_id="bq",
                                     replay_set=str(spark_run.replay_dir)).execute(context={})
    assert rerun["replayed"] == 0 and rerun["duplicates_avoided"] == 10


def test_operator_builds_the_job_command() -> None:
    op = BabelQueueSparkTriageOperator(task_id="t", job="replay_set", input=["a", "b/*.parquet"], output="out",
                                       reasons="failed, unknown_urn", exception_types=["GatewayTimeout"],
                                       max_attempts=5, min_age_seconds=60, conn_id="spark_local")
    assert op.application.endswith("airflow_provider_babelqueue/spark/replay_set.py") and Path(op.application).is_file()
    assert op.job_args() == ["--input", "a", "b/*.parquet", "--output", "out", "--reasons", "failed,unknown_urn",
                             "--exception-types", "GatewayTimeout", "--max-attempts", "5", "--min-age-seconds", "60"]
    assert op.env_vars["PYSPARK_PYTHON"] and op.name == "babelqueue-replay_set" and op._conn_id == "spark_local"
    assert {"input_path", "output_path", "reasons", "application_args"} <= set(op.template_fields)
    # a list param rendered as null (the trigger form's emptied list) or [] is no filter: no flag at all
    for empty in (None, [], ""):
        op.reasons = op.exception_types = empty
        assert op.job_args() == ["--input", "a", "b/*.parquet", "--output", "out", "--max-attempts", "5",
                                 "--min-age-seconds", "60"], empty
    # templates render lists as text: JSON (| tojson) or Python's text of the list; "None" is an unset param
    op.reasons, op.exception_types, op.max_attempts = "['failed', 'unknown_urn']", '["GatewayTimeout"]', "None"
    op.input_path = "['a', 'b/*.parquet']"
    assert op.job_args() == ["--input", "a", "b/*.parquet", "--output", "out", "--reasons", "failed,unknown_urn",
                             "--exception-types", "GatewayTimeout", "--min-age-seconds", "60"]
    op.min_age_seconds = "1234567.25"
    assert op.job_args()[-2:] == ["--min-age-seconds", "1234567.25"]
    for key, text, message in (("max_attempts", "three", "max_attempts must be a whole number, got 'three'"),
                               ("min_age_seconds", "-5", "min_age_seconds must be a finite number >= 0")):
        setattr(op, key, text)
        with pytest.raises(ValueError, match=message):
            op.job_args()  # before spark-submit starts
        setattr(op, key, 60 if key == "min_age_seconds" else None)
    op.input_path = "[ab]*.jsonl"  # a glob, not a list
    assert op.job_args()[:2] == ["--input", "[ab]*.jsonl"]
    triage = BabelQueueSparkTriageOperator(task_id="t2", job="triage", input="in", output="o", source_broker="redis",
                                           report_output="r", env_vars={"PYSPARK_PYTHON": "python3"})
    assert triage.job_args() == ["--input", "in", "--output", "o", "--source-broker", "redis", "--report-output", "r"]
    triage.source_broker, triage.report_output = "None", " "  # rendered from unset params: no flag
    assert triage.job_args() == ["--input", "in", "--output", "o"]
    triage.source_broker, triage.report_output = "redis", "r"
    with pytest.raises(ValueError, match="pending and archive_to go together"):
        BabelQueueSparkTriageOperator(task_id="t5", job="triage", input="i", output="o", pending="p")
    with pytest.raises(ValueError, match="only apply to job='triage'"):
        BabelQueueSparkTriageOperator(task_id="t6", job="replay_set", input="i", output="o", pending="p",
                                      archive_to="a")
    assert triage.env_vars == {"PYSPARK_PYTHON": "python3"}
    with pytest.raises(ValueError, match="only apply to job='replay_set'"):
        BabelQueueSparkTriageOperator(task_id="t3", job="report", input="i", output="o", reasons=["failed"])
    with pytest.raises(ValueError, match="job must be one of"):
        BabelQueueSparkTriageOperator(task_id="t4", job="nope", input="i", output="o")


def test_operator_submits_the_recommended_conf_under_the_users_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from airflow_provider_babelqueue.spark import JOB_CONF, recommended_conf

    submitted: list[dict[str, Any]] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: submitted.append(dict(self.conf)))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL_CONF", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN_CONF", json.dumps({"conn_type": "spark", "host": "yarn"}))
    monkeypatch.setenv("HADOOP_CONF_DIR", "/etc/hadoop/conf")  # the connection check wants YARN's configuration
    monkeypatch.delenv(CLASS_ARCHIVE_ENV, raising=False)
    BabelQueueSparkTriageOperator(task_id="l", job="report", input="i", output="o", conn_id="spark_local_conf",
                                  conf={"spark.driver.memory": "2g"}).execute(context={})
    BabelQueueSparkTriageOperator(task_id="y", job="report", input="i", output="o",
                                  conn_id="spark_yarn_conf").execute(context={})
    # spark-submit's --driver-memory (the Spark operator's driver_memory) wins over spark.driver.memory
    BabelQueueSparkTriageOperator(task_id="m", job="report", input="i", output="o", conn_id="spark_local_conf",
                                  conf={"spark.driver.memory": "2g"}, driver_memory="768m").execute(context={})
    assert submitted[:2] == [recommended_conf("local[2]", {"spark.driver.memory": "2g"}), JOB_CONF]
    # the driver's heap starts at the memory that caps it, whichever way it was given
    assert [(c["spark.driver.memory"], c["spark.driver.extraJavaOptions"].split()[0]) for c in submitted[::2]] == [
        ("2g", "-Xms2g"), ("768m", "-Xms768m")]


def test_operator_reads_the_workers_class_archive_unless_given_one(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    submitted: list[str | None] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: submitted.append(
        self.conf.get("spark.driver.extraJavaOptions")))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL_CDS", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    worker, own = tmp_path / "worker.jsa", tmp_path / "own.jsa"
    worker.write_bytes(b"w")
    own.write_bytes(b"o")
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, str(worker))
    for archive in (None, str(own), str(tmp_path / "missing.jsa")):
        BabelQueueSparkTriageOperator(task_id="t", job="report", input="i", output="o", conn_id="spark_local_cds",
                                      class_archive=archive).execute(context={})
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN_CDS", json.dumps({"conn_type": "spark", "host": "yarn"}))
    monkeypatch.setenv("HADOOP_CONF_DIR", "/etc/hadoop/conf")  # the connection check wants YARN's configuration
    BabelQueueSparkTriageOperator(task_id="t", job="report", input="i", output="o", conn_id="spark_yarn_cds",
                                  class_archive=str(own)).execute(context={})
    local = LOCAL_CONF["spark.driver.extraJavaOptions"]
    # the worker's archive by default; the task's own wins; a task's missing file means none (logged), not the
    # worker's: what the task asked for is what runs; a cluster's driver runs elsewhere: no archive option
    assert submitted == [f"{local} -XX:SharedArchiveFile={worker}", f"{local} -XX:SharedArchiveFile={own}", local,
                         None]


def test_package_zip_holds_the_jobs(tmp_path: Path) -> None:
    import zipfile

    from airflow_provider_babelqueue.operators.spark import package_zip

    names = zipfile.ZipFile(package_zip(tmp_path)).namelist()
    assert {"airflow_provider_babelqueue/__init__.py", "airflow_provider_babelqueue/core/envelope.py",
            "airflow_provider_babelqueue/spark/triage.py", "airflow_provider_babelqueue/spark/common.py"} <= set(names)


def test_operator_runs_replay_set_under_dag_test(spark_run: SparkRun, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from airflow.sdk import DAG

    from tests.airflow_harness import run_dag, task_states, xcom

    monkeypatch.setenv("PATH", VENV_BIN + ":" + __import__("os").environ["PATH"])
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    now = CREATED + 10 * 3_600_000
    with DAG("babelqueue_spark_replay_set", schedule=None, start_date=datetime.datetime(2025, 1, 1),
             catchup=False) as dag:
        BabelQueueSparkTriageOperator(
            task_id="replay_set", job="replay_set", conn_id="spark_local", conf=dict(SPARK_CONF),
            input=str(spark_run.triage_dir), output=str(tmp_path / "{{ ds_nodash }}"),
            reasons=["failed"], exception_types="GatewayTimeout,SmtpError", max_attempts=5,
            min_age_seconds=9.5 * 3600, max_age_seconds=86_400, now_ms=now)
    run = run_dag(dag, logical_date=datetime.datetime(2025, 6, 5, tzinfo=datetime.UTC))
    assert task_states(run) == {"replay_set": "success"}
    # the task log carries spark-submit's output (the Spark hook's lines): from WARN up once the SparkContext
    # applies spark.log.level; before that only its three version lines, not Spark's ~50 lines of INFO start-up
    out = capfd.readouterr().out
    spark_lines = [line for line in out.splitlines() if "hooks.spark_submit.SparkSubmitHook]" in line]
    assert any('"job":"replay_set"' in line for line in spark_lines), "the job's summary did not reach the task log"
    info = [line for line in spark_lines if " INFO " in line]
    assert len(info) <= 3 and all(" INFO SparkContext: " in line for line in info), info
    assert len(spark_lines) < 15, spark_lines
    out = tmp_path / "20250605"
    result: dict[str, Any] = xcom(run, "replay_set")
    assert result == {"job": "replay_set", "input": str(spark_run.triage_dir), "output": str(out),
                      "summary": f"{out}/_replay_summary.json"}
    # failed + GatewayTimeout/SmtpError + attempts <= 5 + failed 9.5 h..1 day before now: F1, F2, F3 only
    # (F7 failed 8.9 h before now; F8 has 10 attempts; F4-F6 are CardDeclined; U*, S* are other reasons)
    named = by_name()
    assert [record_body(json.loads(line)) for line in read_replay_set(out)] == [
        named[name].body for name in ("F1", "F2", "F3")]
    summary = json.loads((out / "_replay_summary.json").read_text())
    assert summary["targets"] == {"orders": 2, "orders-priority": 1} and summary["lines"] == 3
    # what the policy left out, by the first filter each row fails (in the replay engine's order)
    assert summary["skipped"] == {"exception_types": 3, "max_attempts": 1, "min_age_seconds": 1, "poison": 3,
                                  "reasons": 4}
    assert summary["policy"]["now_ms"] == now and summary["policy"]["max_attempts"] == 5
