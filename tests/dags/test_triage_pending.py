"""Nothing is stranded when Spark fails: the triage DAG's dead letters leave the broker only into its pending folder.

Real runs of ``babelqueue_dlq_triage_report`` under ``dag.test()`` on the embedded SQLite queue, with real
spark-submit in local mode:

* no Spark connection at all: ``check_spark`` fails with an error naming the connection and how to define it,
  and the drain never runs (the DLQ keeps every dead letter);
* spark-submit fails after the drain (a driver memory the JVM refuses): the drain file stays in the pending
  folder, and the next run triages it together with its own dead letters, each once, saying how many came from
  the earlier run, then moves both files into its own ``drain`` folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue.operators.pending import waiting_files
from tests.airflow_harness import run_dag, task_states, xcom
from tests.dags.test_sample_dags import bag, broker_sqlite, read_jsonl, seed  # noqa: F401 - fixtures
from tools import demo

SMALL_SPARK = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}


def test_a_missing_spark_connection_fails_before_anything_is_drained(bag: Any, broker_sqlite: dict[str, Any],  # noqa: F811
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    binding, queue = broker_sqlite["binding"], broker_sqlite["queue"]
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT")
    seed(binding, queue)
    run = run_dag(bag.get_dag("babelqueue_dlq_triage_report"), run_conf={
        "queue_name": queue, "output_root": broker_sqlite["output_root"], "spark_conn_id": "spark_default"})
    states = task_states(run)
    assert states["check_spark"] == "failed" and states["drain"] == "upstream_failed", states
    assert states["triage"] == "upstream_failed"
    assert binding.dead_letter_depth(queue) == 15  # nothing left the broker
    assert not Path(broker_sqlite["output_root"], "babelqueue_dlq_triage_report", "_pending").exists()


@pytest.mark.usefixtures("spark_class_archive")
@pytest.mark.slow
def test_a_failed_triage_leaves_its_drain_file_to_the_next_run(bag: Any, broker_sqlite: dict[str, Any]) -> None:  # noqa: F811
    binding, queue = broker_sqlite["binding"], broker_sqlite["queue"]
    root = broker_sqlite["output_root"]
    pending = Path(root, "babelqueue_dlq_triage_report", "_pending")
    seed(binding, queue)
    failed = run_dag(bag.get_dag("babelqueue_dlq_triage_report"), run_conf={
        "queue_name": queue, "output_root": root, "spark_conf": {**SMALL_SPARK, "spark.driver.memory": "1z"}})
    states = task_states(failed)
    assert (states["check_spark"], states["drain"], states["triage"]) == ("success", "success", "failed"), states
    assert binding.dead_letter_depth(queue) == 0  # moved out of the broker...
    [left] = waiting_files(str(pending))  # ...into the pending folder, where the next triage looks
    first = sorted(record["body"] for record in read_jsonl(left))
    assert len(first) == 15 and Path(left).name == Path(xcom(failed, "drain")["path"]).name

    seed(binding, queue)  # a day later: 15 more dead letters (new meta.ids)
    run = run_dag(bag.get_dag("babelqueue_dlq_triage_report"), run_conf={
        "queue_name": queue, "output_root": root, "spark_conf": SMALL_SPARK})
    states = task_states(run)
    assert states["triage"] == "success" and states["replay_set"] == "success", states
    triage = xcom(run, "triage")
    assert triage["carried_over"] == [left]
    summary = json.loads(Path(triage["summary"]).read_text())
    doubled = {reason: 2 * count for reason, count in demo.expected_reasons().items()}
    assert (summary["records"], summary["rows"], summary["duplicates_removed"]) == (30, 30, 0)
    assert summary["by_reason"] == doubled
    assert summary["carried_over"] == {"files": 1, "records": 15}
    report = json.loads(Path(triage["report_summary"]).read_text())
    assert report["carried_over"] == {"files": 1, "records": 15} and report["totals"]["records"] == 30
    html = Path(triage["report"]).read_text()
    assert "15 of the drain records come from 1 file(s) left by earlier runs" in html
    # both files now sit in the second run's drain folder, the pending folder is empty
    drain_folder = Path(xcom(run, "plan")["drain"])
    assert sorted(Path(path) for path in triage["archived"]) == sorted(drain_folder.glob("*.jsonl"))
    assert len(triage["archived"]) == 2 and waiting_files(str(pending)) == []
    by_file = {Path(path).name: sorted(record["body"] for record in read_jsonl(path)) for path in triage["archived"]}
    assert by_file[Path(left).name] == first and sum(len(bodies) for bodies in by_file.values()) == 30
