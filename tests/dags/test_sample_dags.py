"""The sample DAGs in dags/: they parse with no connection or network access, and each runs end to end under
``dag.test()`` on the embedded SQLite queue and on Redis (the triage DAGs with real spark-submit, local mode).

The dead letters come from the demo's seed: a real consumer whose handler fails for known orders, plus poison
bodies, an unknown URN and an unsupported schema version, so every expected count below follows from
``tools.demo``'s rules, not from the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.hooks import get_hook
from tests.airflow_harness import run_dag, task_states, xcom
from tests.conftest import take_all
from tools import demo

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
VENV_BIN = str(Path(sys.executable).parent)
SAMPLE_DAGS = {
    "babelqueue_dlq_triage_report": ["check_spark", "drain", "gate", "plan", "replay", "replay_set", "triage",
                                     "wait_for_dead_letters"],
    "babelqueue_dlq_replay": ["replay"],
    "babelqueue_event_triggered_triage": ["check_spark", "drain", "plan", "triage"],
    "babelqueue_publish_example": ["publish_lines", "publish_order", "start_trace"],
    "babelqueue_consume_example": ["consume_orders"],
    "babelqueue_order_events": ["process_orders", "settle"],
}
BROKERS = ["sqlite-default", "redis"]

PARSE_GUARD = textwrap.dedent(
    """
    import sys

    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import BaseHook, Variable

    calls = []

    def refuse(*args, **kwargs):
        calls.append(("lookup", args))
        raise RuntimeError("looked up at parse time")

    BaseHook.get_connection = classmethod(refuse)
    Variable.get = staticmethod(refuse)

    def audit(event, args):
        if event in ("socket.connect", "socket.getaddrinfo", "subprocess.Popen"):
            calls.append((event, repr(args)[:200]))
            raise RuntimeError(f"{event} at parse time")

    sys.addaudithook(audit)
    bag = DagBag(dag_folder=sys.argv[1])
    print(repr({"errors": {k: str(v)[:500] for k, v in bag.import_errors.items()}, "calls": calls,
                "dags": {d.dag_id: sorted(t.task_id for t in d.tasks) for d in bag.dags.values()}}))
    """
)


def test_every_sample_dag_parses_without_connections_or_network() -> None:
    """DagBag over dags/ with connection/variable lookups, sockets and subprocesses all made to fail."""
    env = {**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    done = subprocess.run([sys.executable, "-c", PARSE_GUARD, str(DAGS)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    import ast

    result = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    assert result["calls"] == []
    assert result["dags"] == SAMPLE_DAGS


@pytest.fixture
def bag() -> Any:
    """A fresh parse per test: ``dag.test(run_conf=...)`` writes the run's conf into the DAG's params."""
    from airflow.dag_processing.dagbag import DagBag

    dagbag = DagBag(dag_folder=str(DAGS))
    assert not dagbag.import_errors
    return dagbag


def test_schedules_and_safe_defaults(bag: Any) -> None:
    triage = bag.get_dag("babelqueue_dlq_triage_report")
    assert triage.params["dry_run"] is True and triage.params["replay_reasons"] == ["failed"]
    assert triage.params["babelqueue_conn_id"] == "babelqueue_default"
    assert bag.get_dag("babelqueue_dlq_replay").params["dry_run"] is True
    assert type(bag.get_dag("babelqueue_dlq_replay").timetable).__name__ == "NullTimetable"  # manual only
    assert triage.timetable.expression == "0 0 * * *"  # @daily
    event = bag.get_dag("babelqueue_event_triggered_triage")
    [asset] = event.timetable.asset_condition.objects
    [watcher] = asset.watchers
    assert asset.uri == "babelqueue://babelqueue_default/orders/dead-letters"
    assert type(watcher.trigger).__name__ == "BabelQueueDeadLetterTrigger"
    [orders] = bag.get_dag("babelqueue_order_events").timetable.asset_condition.objects
    [messages] = orders.watchers
    assert orders.uri == "babelqueue://babelqueue_default/order-events"
    assert messages.trigger.serialize() == (
        "airflow_provider_babelqueue.triggers.messages.BabelQueueMessageTrigger",
        {"queue_name": "order-events", "babelqueue_conn_id": "babelqueue_default", "urns": ["urn:babel:orders:*"],
         "jsonpath": None, "batch_size": 1, "max_event_bytes": 65536, "reserve_timeout": 5.0,
         "unmatched_delay": 5.0, "max_pending": 100, "settle": "run_finished", "run_timeout": 3600.0,
         "reservation_timeout": 600.0})


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_order_events_dag_processes_each_message_once(bag: Any, broker: dict[str, Any]) -> None:
    """The run's task on the events a trigger made: a message in two events (a triggerer restart) and a message
    an earlier run processed are processed once; the seen-set lives on the broker's connection."""
    from types import SimpleNamespace

    sys.path.insert(0, str(DAGS))
    try:
        import babelqueue_order_events as sample
    finally:
        sys.path.remove(str(DAGS))
    from airflow_provider_babelqueue.triggers.messages import envelopes_from

    envelopes = [bq.make_envelope("urn:babel:orders:created", {"order_id": n, "amount": 10.5 * n},
                                  queue_name="order-events") for n in (1, 2, 3)]

    def event(*chosen: dict[str, Any]) -> Any:
        return SimpleNamespace(extra={"from_trigger": True, "payload": {"count": len(chosen), "messages": [
            {"meta_id": e["meta"]["id"], "urn": e["job"], "attempts": 0, "envelope": e} for e in chosen]}})

    first = {"asset": [event(envelopes[0]), event(envelopes[1]), event(envelopes[0])]}
    assert envelopes_from(first) == envelopes[:2]
    assert sample.process(envelopes_from(first), broker["conn_id"]) == {
        "received": 2, "processed": 2, "already_processed": 0, "total_amount": 31.5}
    second = {"asset": [event(envelopes[1], envelopes[2])]}  # envelope 1 again: the broker handed it out twice
    assert sample.process(envelopes_from(second), broker["conn_id"]) == {
        "received": 2, "processed": 1, "already_processed": 1, "total_amount": 31.5}


def _broker(kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A connection id, a unique queue, its binding, and a Spark connection in local mode."""
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("PATH", VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    prefix = f"bqdags{uuid.uuid4().hex[:6]}:"
    if kind == "redis":
        conn_id = "bq_dags_redis"
        monkeypatch.setenv("AIRFLOW_CONN_BQ_DAGS_REDIS", json.dumps(
            {"conn_type": "babelqueue_redis", "host": "127.0.0.1", "port": 6379, "extra": {"key_prefix": prefix}}))
    else:
        conn_id = "babelqueue_default"
        monkeypatch.delenv("AIRFLOW_CONN_BABELQUEUE_DEFAULT", raising=False)
    hook = get_hook(conn_id)
    binding = hook.get_binding()
    yield {"conn_id": conn_id, "queue": queue, "binding": binding, "output_root": str(tmp_path / "runs")}
    if kind == "redis":
        keys = list(binding.client.scan_iter(match=f"{prefix}*"))
        if keys:
            binding.client.delete(*keys)
    hook.close()


@pytest.fixture
def broker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    yield from _broker(request.param, monkeypatch, tmp_path)


@pytest.fixture
def broker_sqlite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    yield from _broker("sqlite-default", monkeypatch, tmp_path)


def seed(binding: Binding, queue: str) -> None:
    summary = demo.seed(binding, queue, log=lambda *_: None)
    assert summary["dead_lettered"] == demo.expected_reasons()
    assert binding.dead_letter_depth(queue) == sum(demo.expected_reasons().values()) == 15


def read_jsonl(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def drain_file(run: Any) -> str:
    """Where the run's drain file is after its triage succeeded: moved from the pending folder into the run's
    ``drain`` folder (the triage's ``archived`` paths)."""
    name = Path(xcom(run, "drain")["path"]).name
    [path] = [path for path in xcom(run, "triage")["archived"] if Path(path).name == name]
    assert not Path(xcom(run, "drain")["path"]).exists(), "the triaged file is still pending"
    return str(path)


def drained_bodies(records: list[dict[str, Any]]) -> list[bytes]:
    from airflow_provider_babelqueue.core.records import record_body

    return [record_body(record) for record in records]


def is_failed(body: bytes) -> bool:
    """Whether a stored dead letter decodes and its reason is ``failed`` (the sample DAGs' default policy)."""
    try:
        envelope = bq.decode(body)
    except Exception:  # noqa: BLE001 - poison
        return False
    return bool(envelope.get("dead_letter", {}).get("reason") == "failed")


def expected_replays(stored: list[bytes]) -> list[bytes]:
    """The reset bytes of the stored dead letters whose reason is ``failed``, sorted."""
    return sorted(bq.encode(bq.reset_for_replay(bq.decode(body))) for body in stored if is_failed(body))


@pytest.mark.usefixtures("spark_class_archive")
@pytest.mark.slow
@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_triage_report_dag_end_to_end(bag: Any, broker: dict[str, Any]) -> None:
    """sensor → drain → Spark triage + report → replay set → gate → replay, with dry_run off."""
    binding, queue = broker["binding"], broker["queue"]
    seed(binding, queue)
    run = run_dag(bag.get_dag("babelqueue_dlq_triage_report"), run_conf={
        "babelqueue_conn_id": broker["conn_id"], "queue_name": queue, "output_root": broker["output_root"],
        "dry_run": False, "spark_conf": {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}})
    states = task_states(run)
    assert states == dict.fromkeys(SAMPLE_DAGS["babelqueue_dlq_triage_report"], "success"), states

    drained = xcom(run, "drain")
    assert drained["records"] == 15 and sum(drained["by_source"].values()) == 15, drained
    stored = drained_bodies(read_jsonl(drain_file(run)))
    assert len(stored) == 15 and binding.dead_letter_depth(queue) == 0  # moved, not copied

    triage = json.loads(Path(xcom(run, "triage")["summary"]).read_text())
    assert triage["by_reason"] == demo.expected_reasons() and triage["rows"] == 15
    assert triage["duplicates_removed"] == 0
    report = Path(xcom(run, "triage")["report"])
    assert report.is_file() and b"<svg" in report.read_bytes()
    replay_set = xcom(run, "replay_set")
    replay_summary = json.loads(Path(replay_set["summary"]).read_text())
    # the 5 others are left out: the 2 poison bodies always, unknown_urn and unsupported_schema_version by reason
    assert {key: replay_summary[key] for key in ("path", "lines", "targets", "skipped")} == {
        "path": replay_set["output"], "lines": 10, "targets": {queue: 10}, "skipped": {"poison": 2, "reasons": 3}}
    assert replay_summary["policy"]["reasons"] == ["failed"] and replay_summary["policy"]["max_attempts"] is None
    # the replay set holds the selected dead letters' drain records, bodies exactly as drained
    records = [json.loads(line) for part in sorted(Path(replay_set["output"]).glob("part-*"))
               for line in part.read_bytes().splitlines()]
    assert sorted(drained_bodies(records)) == sorted(body for body in stored if is_failed(body))
    assert {(record["queue_name"], record["v"]) for record in records} == {(queue, 1)}

    # one replay task: each selected dead letter published once, reset, to its original queue
    assert xcom(run, "replay") == {"replayed": 10, "skipped": {}, "duplicates_avoided": 0, "duplicates_kept": 0,
                                   "dry_run": False, "targets": {queue: 10}}
    replayed = take_all(binding, queue)
    assert sorted(replayed) == expected_replays(stored) and len(replayed) == 10
    orders = sorted(bq.decode(body)["data"]["order_id"] for body in replayed)
    assert orders == sorted(demo.failing_orders())  # each failing order once
    assert all(bq.decode(body)["attempts"] == 0 and "dead_letter" not in bq.decode(body) for body in replayed)


PEER_DEAD_LETTERS = ("node-redis-dead-letter", "python-redis-dead-letter-headers")


@pytest.mark.usefixtures("spark_class_archive")
@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_triage_report_dag_triages_what_peer_workers_dead_lettered(bag: Any, broker: dict[str, Any]) -> None:
    """The official SDKs' workers dead-letter to ``<queue>.dlq`` (the Python SDK's entry of a framed message stays a
    frame): with default settings the triage DAG drains, triages and replays them to the peers' own queues."""
    import base64

    from tests.conftest import ROOT

    binding, queue = broker["binding"], broker["queue"]
    captures = [json.loads((ROOT.parent / "shared" / "interop" / "peer-captures" / f"{name}.json").read_text())
                for name in PEER_DEAD_LETTERS]
    raws = [base64.b64decode(c["body_b64"]) for c in captures]
    dlq = f"{binding.config.key_prefix}{queue}.dlq"
    binding.client.rpush(dlq, *raws)  # where the peers' workers put them, under this test's key prefix
    inner = [json.loads(json.loads(raw)["body"]) if b'"__bq_frame"' in raw else json.loads(raw) for raw in raws]
    assert binding.dead_letter_depth(queue) == 2
    run = run_dag(bag.get_dag("babelqueue_dlq_triage_report"), run_conf={
        "babelqueue_conn_id": broker["conn_id"], "queue_name": queue, "output_root": broker["output_root"],
        "dry_run": False, "spark_conf": {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}})
    states = task_states(run)
    assert states == dict.fromkeys(SAMPLE_DAGS["babelqueue_dlq_triage_report"], "success"), states

    drained = read_jsonl(drain_file(run))
    assert sorted(drained_bodies(drained)) == sorted(raws)
    assert {record["dead_letter_queue"] for record in drained} == {dlq}
    triage = json.loads(Path(xcom(run, "triage")["summary"]).read_text())
    assert triage["by_reason"] == {"failed": 2} and triage["rows"] == 2
    targets = {envelope["dead_letter"]["original_queue"]: 1 for envelope in inner}
    replay = xcom(run, "replay")
    assert replay["replayed"] == 2 and replay["targets"] == targets and replay["skipped"] == {}, replay
    for envelope in inner:
        [body] = take_all(binding, envelope["dead_letter"]["original_queue"])
        replayed = bq.decode(body)
        assert replayed["meta"]["id"] == envelope["meta"]["id"] and replayed["attempts"] == 0
        assert "dead_letter" not in replayed and "__bq_frame" not in replayed
    assert binding.dead_letter_depth(queue) == 0


@pytest.mark.usefixtures("spark_class_archive")
@pytest.mark.slow
def test_triage_report_dry_run_republishes_nothing(bag: Any, broker_sqlite: dict[str, Any]) -> None:
    binding, queue = broker_sqlite["binding"], broker_sqlite["queue"]
    seed(binding, queue)
    # spark_conf and a filter list as the trigger form sends them emptied (null): the recommended settings, any URN
    run = run_dag(bag.get_dag("babelqueue_dlq_triage_report"), run_conf={
        "queue_name": queue, "output_root": broker_sqlite["output_root"], "spark_conf": None, "replay_urns": None})
    states = task_states(run)
    assert states["replay_set"] == "success" and states["gate"] == "skipped" and states["replay"] == "skipped"
    assert binding.depth(queue) == 0 and binding.dead_letter_depth(queue) == 0
    replay_set = Path(xcom(run, "replay_set")["output"])
    assert sum(len(p.read_bytes().splitlines()) for p in replay_set.glob("part-*")) == 10
    assert not [path for path in replay_set.iterdir() if path.is_dir()]  # one folder, every queue's records in it


@pytest.mark.usefixtures("spark_class_archive")
@pytest.mark.slow
@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_event_triggered_triage_dag_end_to_end(bag: Any, broker: dict[str, Any]) -> None:
    binding, queue = broker["binding"], broker["queue"]
    seed(binding, queue)
    run = run_dag(bag.get_dag("babelqueue_event_triggered_triage"), run_conf={
        "babelqueue_conn_id": broker["conn_id"], "queue_name": queue, "output_root": broker["output_root"],
        "spark_conf": {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}})
    assert task_states(run) == {"plan": "success", "check_spark": "success", "drain": "success", "triage": "success"}
    assert xcom(run, "drain")["records"] == 15 and binding.dead_letter_depth(queue) == 0
    triage = xcom(run, "triage")
    assert json.loads(Path(triage["summary"]).read_text())["by_reason"] == demo.expected_reasons()
    assert Path(triage["report"]).is_file()
    assert triage["output"].startswith(broker["output_root"] + "/babelqueue_event_triggered_triage/")


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_replay_dag_dry_run_then_replay(bag: Any, broker: dict[str, Any]) -> None:
    binding, queue = broker["binding"], broker["queue"]
    seed(binding, queue)
    stored = [message.body for message in binding.browse_dead_letters(queue)]
    dag = bag.get_dag("babelqueue_dlq_replay")
    conf = {"source_conn_id": broker["conn_id"], "queue_name": queue, "reasons": ["failed"]}

    first = run_dag(dag, run_conf={**conf, "dry_run": True})
    assert task_states(first) == {"replay": "success"}
    result = xcom(first, "replay")
    assert result["dry_run"] is True and result["replayed"] == 10 and result["targets"] == {queue: 10}
    assert binding.depth(queue) == 0 and binding.dead_letter_depth(queue) == 15

    second = run_dag(dag, run_conf={**conf, "dry_run": False, "max_messages_per_second": 1000})
    result = xcom(second, "replay")
    assert result["dry_run"] is False and result["replayed"] == 10
    assert sorted(take_all(binding, queue)) == expected_replays(stored)
    assert binding.dead_letter_depth(queue) == 5  # poison, unknown_urn, unsupported_schema_version stay


def test_replay_dag_reads_a_null_filter_list_as_any(bag: Any, broker_sqlite: dict[str, Any]) -> None:
    """The trigger form sends null for a list param emptied by hand (tests/dags/test_trigger_form.py): the run
    selects exactly what the same run with empty lists selects, and no filter at all applies."""
    binding, queue = broker_sqlite["binding"], broker_sqlite["queue"]
    seed(binding, queue)
    dag = bag.get_dag("babelqueue_dlq_replay")
    conf = {"source_conn_id": broker_sqlite["conn_id"], "queue_name": queue, "dry_run": True}
    results = []
    for empty in (None, []):
        run = run_dag(dag, run_conf={**conf, "reasons": empty, "urns": empty, "exception_types": empty})
        assert task_states(run) == {"replay": "success"}, empty
        results.append(xcom(run, "replay"))
    assert results[0] == results[1]
    assert results[0]["replayed"] + sum(results[0]["skipped"].values()) == 15  # every dead letter was looked at
    assert binding.dead_letter_depth(queue) == 15


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_publish_example_dag_continues_one_trace(bag: Any, broker: dict[str, Any]) -> None:
    binding, queue = broker["binding"], broker["queue"]
    dag = bag.get_dag("babelqueue_publish_example")
    given = "4bf92f35-77b3-4da6-a3ce-929d0e0e4736"
    for conf in ({}, {"trace_id": given}):
        run = run_dag(dag, run_conf={"babelqueue_conn_id": broker["conn_id"], "queue_name": queue, **conf})
        assert set(task_states(run).values()) == {"success"}
        trace = xcom(run, "start_trace")
        assert trace == given if conf else str(uuid.UUID(trace)) == trace
        envelopes = [bq.decode(body) for body in take_all(binding, queue)]
        assert [e["job"] for e in envelopes] == ["urn:babel:orders:created"] + ["urn:babel:orders:line-added"] * 2
        assert [e["data"] for e in envelopes] == [dag.params["order"], *dag.params["lines"]]
        assert {e["trace_id"] for e in envelopes} == {trace}
        assert {e["meta"]["queue"] for e in envelopes} == {queue}
        assert all(bq.check(e) is None for e in envelopes)
        assert xcom(run, "publish_order") == [envelopes[0]["meta"]["id"]]
        assert xcom(run, "publish_lines") == [e["meta"]["id"] for e in envelopes[1:]]


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_consume_example_dag_handles_quarantines_and_deduplicates(bag: Any, broker: dict[str, Any]) -> None:
    binding, queue = broker["binding"], broker["queue"]
    good = [bq.encode(bq.make_envelope("urn:babel:orders:created", {"order_id": "A-1", "total": 9.5},
                                       queue_name=queue)),
            bq.encode(bq.make_envelope("urn:babel:orders:line-added", {"order_id": "A-1", "sku": "S", "quantity": 1},
                                       queue_name=queue))]
    unknown = bq.encode(bq.make_envelope("urn:babel:orders:archived", {"order_id": "A-1"}, queue_name=queue))
    poison = b"{not json"
    binding.publish_batch([*good, unknown, poison], queue)
    dag = bag.get_dag("babelqueue_consume_example")
    conf = {"babelqueue_conn_id": broker["conn_id"], "queue_name": queue}

    run = run_dag(dag, run_conf=conf)
    summary = xcom(run, "consume_orders")
    assert summary["received"] == 4 and summary["handled"] == 2
    assert summary["dead_lettered"] == {"poison": 1, "unknown_urn": 1}
    assert binding.depth(queue) == 0 and binding.dead_letter_depth(queue) == 2

    binding.publish_batch(good, queue)  # delivered again: same bytes, same meta.id
    again = xcom(run_dag(dag, run_conf=conf), "consume_orders")
    assert again["received"] == 2 and again["handled"] == 0 and again["skipped_duplicates"] == 2

    binding.publish_batch(good, queue)  # without the seen-set the handlers run again
    off = xcom(run_dag(dag, run_conf={**conf, "idempotency": False}), "consume_orders")
    assert off["handled"] == 2 and off["skipped_duplicates"] == 0
