"""OpenLineage end to end: the sample DAGs under ``dag.test()`` with the OpenLineage provider's listener on and its
file transport, and the exact datasets of every task's COMPLETE event.

The chain: ``babelqueue_publish_example`` writes the queue; ``babelqueue_consume_example`` reads it and writes the
dead-letter table (two messages no handler takes); ``babelqueue_dlq_triage_report`` drains that table into a file,
triages the file into Parquet and the report, selects the replay set from the Parquet and replays the set onto the
queue. Tasks without lineage of their own (the sensor, the Python tasks) report no dataset.

It runs in a subprocess, with the OpenLineage settings in that process's environment only:

* the provider decides once per process whether it is enabled (``conf.is_disabled`` is cached) and registers its
  listener when Airflow loads plugins, so it cannot be switched on inside this pytest process for one test and off
  again for the others (which run with no transport: the provider disabled);
* ``[openlineage] execute_in_thread`` is on: by default the listener forks and emits from the child, and under
  ``dag.test()`` a child cannot reach Airflow's API (the in-process Execution API runs its event loop in a thread of
  the parent, which a forked child does not have), so every COMPLETE event whose lineage reads the run's XCom or a
  connection was lost when the listener's ``execution_timeout`` killed the child (measured: drain, triage,
  replay_set and replay). A thread shares the loop; the listener joins it, so the events are in the file when the
  task ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue.workspace import run_workspace
from tests.airflow_harness import _ensure_db

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)
TRIAGE_DAG = "babelqueue_dlq_triage_report"

RUN = textwrap.dedent(
    """
    import json
    import sys

    from airflow.dag_processing.dagbag import DagBag

    from airflow_provider_babelqueue import envelope as bq
    from airflow_provider_babelqueue.hooks import get_hook
    from tests.airflow_harness import run_dag, task_states, xcom

    dags, queue, output_root = sys.argv[1:4]
    bag = DagBag(dag_folder=dags)
    assert not bag.import_errors, bag.import_errors
    runs = {"publish": run_dag(bag.get_dag("babelqueue_publish_example"), run_conf={"queue_name": queue})}
    hook = get_hook("babelqueue_default")
    try:  # two messages the consume example has no handler for: it dead-letters them (unknown_urn)
        for order_id in (1, 2):
            envelope = bq.make_envelope("urn:babel:orders:archived", {"order_id": order_id}, queue_name=queue)
            hook.get_binding().publish(bq.encode(envelope), queue)
    finally:
        hook.close()
    runs["consume"] = run_dag(bag.get_dag("babelqueue_consume_example"), run_conf={"queue_name": queue})
    runs["triage"] = run_dag(bag.get_dag("babelqueue_dlq_triage_report"), run_conf={
        "queue_name": queue, "output_root": output_root, "dry_run": False, "replay_reasons": ["unknown_urn"],
        "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}})
    print("RESULT " + json.dumps({
        "states": {name: task_states(run) for name, run in runs.items()},
        "triage_run_id": runs["triage"].run_id,
        "consumed": xcom(runs["consume"], "consume_orders")["dead_lettered"],
        "drain": xcom(runs["triage"], "drain")["path"],
        "replay": xcom(runs["triage"], "replay"),
    }))
    """
)


def complete_events(path: Path) -> dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]]:
    """Task name (``<dag id>.<task id>``) → ``(inputs, outputs)`` of its COMPLETE event; each task has one."""
    events: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        assert event["eventType"] != "FAIL", event["job"]
        if event["eventType"] != "COMPLETE" or "." not in event["job"]["name"]:  # the DAG runs' own events
            continue
        name = event["job"]["name"]
        assert name not in events, f"two COMPLETE events for {name}"
        events[name] = ([(d["namespace"], d["name"]) for d in event["inputs"]],
                        [(d["namespace"], d["name"]) for d in event["outputs"]])
    return events


@pytest.mark.usefixtures("spark_class_archive")
@pytest.mark.slow
def test_the_listener_reports_the_dead_letter_chain_of_the_sample_dags(tmp_path: Path) -> None:
    """publish → queue → consume → dead-letter table → drain → drain file → triage → Parquet (+ report) →
    replay_set → replay set → replay → queue, on the embedded SQLite queue, as the listener wrote it."""
    _ensure_db()  # the session's metadata DB, migrated here: the subprocess runs its DAGs in it
    events_file = tmp_path / "openlineage.jsonl"
    output_root = tmp_path / "runs"
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,  # this session's AIRFLOW_HOME (its metadata DB and the embedded queue) and class archive
        "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "babelqueue-tests",
        "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
        "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "60",
    }
    env.pop("AIRFLOW_CONN_BABELQUEUE_DEFAULT", None)
    done = subprocess.run([sys.executable, "-c", RUN, str(ROOT / "dags"), queue, str(output_root)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    [result_line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(result_line[len("RESULT "):])
    for dag, states in result["states"].items():
        assert set(states.values()) == {"success"}, (dag, states)
    assert result["consumed"] == {"unknown_urn": 2}
    assert result["replay"]["targets"] == {queue: 2} and result["replay"]["dry_run"] is False

    namespace = f"sqlite:{(Path(os.environ['AIRFLOW_HOME']) / 'babelqueue.sqlite').resolve()}"
    messages, dead_letters = (namespace, queue), (namespace, "jobs_failed")
    folders = run_workspace(str(output_root), TRIAGE_DAG, result["triage_run_id"])
    drain_file = result["drain"]
    assert Path(drain_file).parent == Path(folders["pending"]) and drain_file.endswith(".jsonl")
    triaged, report, replay_set = (("file", folders[name]) for name in ("triage", "report", "replay_set"))
    nothing: tuple[list[Any], list[Any]] = ([], [])
    assert complete_events(events_file) == {
        "babelqueue_publish_example.start_trace": nothing,
        "babelqueue_publish_example.publish_order": ([], [messages]),
        "babelqueue_publish_example.publish_lines": ([], [messages]),
        "babelqueue_consume_example.consume_orders": ([messages], [dead_letters]),
        f"{TRIAGE_DAG}.wait_for_dead_letters": nothing,
        f"{TRIAGE_DAG}.plan": nothing,
        f"{TRIAGE_DAG}.check_spark": nothing,
        f"{TRIAGE_DAG}.drain": ([dead_letters], [("file", drain_file)]),
        f"{TRIAGE_DAG}.triage": ([("file", drain_file)], [triaged, report]),
        f"{TRIAGE_DAG}.replay_set": ([triaged], [replay_set]),
        f"{TRIAGE_DAG}.gate": nothing,
        f"{TRIAGE_DAG}.replay": ([replay_set], [messages]),
    }
