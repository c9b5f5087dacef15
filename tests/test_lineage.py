"""Operator-level OpenLineage (``airflow_provider_babelqueue.lineage``): the exact datasets each operator reports.

Per broker (the SQLite default, Redis and RabbitMQ connections of tests/connections.py): first from given return
values (what the listener's ``task_instance.xcom_pull`` hands back), then from real runs' return values, so the
lineage reads the XCom shapes the operators really return. The naming rules for files and namespaces are checked
on their own. The end-to-end check through the OpenLineage listener is tests/dags/test_lineage_dag.py.

Nothing here turns the OpenLineage listener on: the operators' methods are called directly.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue import assets
from airflow_provider_babelqueue.lineage import Lineage, location_identity, spark_lineage
from airflow_provider_babelqueue.operators.consume import BabelQueueConsumeOperator
from airflow_provider_babelqueue.operators.drain import BabelQueueDrainDeadLettersOperator
from airflow_provider_babelqueue.operators.publish import BabelQueuePublishOperator
from airflow_provider_babelqueue.operators.replay import BabelQueueReplayOperator
from airflow_provider_babelqueue.operators.spark import BabelQueueSparkTriageOperator
from tests.connections import define

Pairs = list[tuple[str, str]]


class RunOf:
    """A task instance as the OpenLineage listener passes it: ``xcom_pull`` gives its own run's return value."""

    def __init__(self, task_id: str, value: Any) -> None:
        self.task_id = task_id
        self.value = value

    def xcom_pull(self, task_ids: str) -> Any:
        assert task_ids == self.task_id
        return self.value


class Unreadable(RunOf):
    def xcom_pull(self, task_ids: str) -> Any:
        raise RuntimeError("the API server is gone")


def reported(operator: Any, value: Any) -> tuple[Pairs, Pairs]:
    """``(inputs, outputs)`` of the operator's ``OperatorLineage`` for a run that returned ``value``."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    lineage = operator.get_openlineage_facets_on_complete(RunOf(operator.task_id, value))
    assert isinstance(lineage, OperatorLineage)
    assert all(type(dataset) is Dataset for dataset in (*lineage.inputs, *lineage.outputs))
    return ([(d.namespace, d.name) for d in lineage.inputs], [(d.namespace, d.name) for d in lineage.outputs])


def sqlite_namespace() -> str:
    return f"sqlite:{(Path(os.environ['AIRFLOW_HOME']) / 'babelqueue.sqlite').resolve()}"


#: conn id → (namespace, the DLQ the binding writes for ``q``, every DLQ it reads for ``q``). Written out by hand
#: from docs/bindings.md's defaults: SQL dead letters go to the connection's ``jobs_failed`` table; Redis writes
#: ``<prefix><queue>:failed`` and also reads the SDKs' ``.dlq``; RabbitMQ writes ``<queue>.failed``, reads ``.dlq``.
BROKERS: dict[str, tuple[Any, str, list[str]]] = {
    "babelqueue_default": (sqlite_namespace, "jobs_failed", ["jobs_failed"]),
    "bq_redis": (lambda: "redis://127.0.0.1:6379", "bqop:{q}:failed", ["bqop:{q}:failed", "bqop:{q}.dlq"]),
    "bq_rabbitmq": (lambda: "amqp://127.0.0.1:5672", "{q}.failed", ["{q}.failed", "{q}.dlq"]),
}


@pytest.fixture(params=list(BROKERS))
def broker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    conn_id = define(monkeypatch, request.param)
    namespace, written, read = BROKERS[conn_id]
    return {"conn_id": conn_id, "namespace": namespace(),
            "written": lambda q: written.format(q=q), "read": lambda q: [name.format(q=q) for name in read]}


# -- naming rules -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("location", "identity"), [
    ("/data/runs/drain/dlq-1.jsonl", ("file", "/data/runs/drain/dlq-1.jsonl")),
    ("/data/runs/triage/", ("file", "/data/runs/triage")),
    ("file:///data/runs/triage", ("file", "/data/runs/triage")),
    ("file://localhost/data/runs", ("file", "/data/runs")),
    ("file://nas01/share/runs/", ("file://nas01", "/share/runs")),
    ("/data/with%20space", ("file", "/data/with%20space")),  # a local path is taken literally
    ("file:///data/with%20space", ("file", "/data/with space")),  # a URL is unquoted
    ("s3://bucket/runs/triage/", ("s3://bucket", "runs/triage")),
    ("s3a://bucket/runs/triage", ("s3://bucket", "runs/triage")),
    ("s3n://bucket/runs/x.jsonl", ("s3://bucket", "runs/x.jsonl")),
    ("s3://bucket", ("s3://bucket", "/")),
    ("s3://aws_default@bucket/runs/x.jsonl", ("s3://bucket", "runs/x.jsonl")),  # ObjectStoragePath's conn id
    ("gs://google_cloud_default@bucket/runs", ("gs://bucket", "runs")),
    ("gs://bucket/runs", ("gs://bucket", "runs")),
    ("gcs://bucket/runs", ("gs://bucket", "runs")),
    ("abfss://dlq@acct.dfs.core.windows.net/runs/", ("abfss://dlq@acct.dfs.core.windows.net", "runs")),
    ("hdfs://namenode:8020/runs/triage/", ("hdfs://namenode:8020", "/runs/triage")),
])
def test_locations_are_named_as_openlineage_names_files(location: str, identity: tuple[str, str]) -> None:
    """Namespace ``file`` + absolute path; object stores ``scheme://bucket`` + key (OpenLineage's Spark integration
    names ``s3a``/``s3n`` as ``s3``); other URLs ``scheme://authority`` + path."""
    assert location_identity(location) == identity


def test_a_relative_local_path_is_made_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert location_identity("runs/drain.jsonl") == ("file", str(tmp_path / "runs" / "drain.jsonl"))
    assert location_identity(tmp_path / "x") == ("file", str(tmp_path / "x"))


@pytest.mark.parametrize(("conn_type", "host", "port", "schema", "extra", "namespace"), [
    ("babelqueue+rabbitmq", "mq", 5672, "/", {}, "amqp://mq:5672"),
    ("babelqueue+rabbitmq", "mq", 5672, None, {}, "amqp://mq:5672"),
    ("babelqueue+rabbitmq", "mq", 5673, "prod", {}, "amqp://mq:5673/prod"),
    ("babelqueue+rabbitmq", "mq", None, "team/a", {}, "amqp://mq:5672/team%2Fa"),
    ("babelqueue+sql", "/data/q.sqlite", None, None, {}, "sqlite:/data/q.sqlite"),
    ("babelqueue+sql", None, None, None, {"sqlalchemy_url": "sqlite:////data/other.sqlite"},
     "sqlite:/data/other.sqlite"),
    ("babelqueue+sql", "ignored", None, None, {"sqlalchemy_url": "postgresql+psycopg2://u:s3cret@pg:5433/jobs"},
     "postgres://pg:5433/jobs"),
    ("babelqueue+sql", "pg", None, "jobs", {"dialect": "postgres"}, "postgres://pg:5432/jobs"),
])
def test_connection_namespaces(conn_type: str, host: str | None, port: int | None, schema: str | None,
                               extra: dict[str, str], namespace: str) -> None:
    """The one namespace function the assets and the operators share: a RabbitMQ virtual host other than ``/``
    is part of it (its queues are other queues), a SQL connection's ``sqlalchemy_url`` names its store (never its
    password)."""
    assert assets.lineage_namespace(conn_type, host, port, schema, extra) == namespace


def test_the_embedded_default_is_the_sqlite_file_in_airflow_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_BABELQUEUE_DEFAULT", raising=False)
    assert assets.connection_namespace("babelqueue_default") == sqlite_namespace()
    assert assets.lineage_namespace("babelqueue+sql") == sqlite_namespace()
    assert assets.connection_namespace("bq_nowhere") == "babelqueue://bq_nowhere"  # unreadable: never fails


# -- each operator, from given return values -------------------------------------------------------------------


def test_publish_writes_its_queue(broker: dict[str, Any]) -> None:
    queue = (broker["namespace"], "orders")
    operator = BabelQueuePublishOperator(task_id="publish", babelqueue_conn_id=broker["conn_id"], queue_name="orders",
                                         urn="urn:babel:orders:created", data={"order_id": 1})
    assert reported(operator, ["0f6e2f0e-5d38-4d1e-a4a5-2f3f1f0b6a11"]) == ([], [queue])
    assert reported(operator, []) == ([], [])  # nothing published
    assert reported(operator, None) == ([], [])  # no return value: it failed, what it wrote is unknown


def test_consume_reads_its_queue_and_writes_the_dlq_when_it_dead_lettered(broker: dict[str, Any]) -> None:
    namespace = broker["namespace"]
    operator = BabelQueueConsumeOperator(task_id="consume", babelqueue_conn_id=broker["conn_id"],
                                         queue_name="orders", handlers={})
    clean = {"received": 2, "handled": 2, "dead_lettered": {}, "results": []}
    assert reported(operator, clean) == ([(namespace, "orders")], [])
    dead = {"received": 3, "handled": 1, "dead_lettered": {"failed": 1, "poison": 1}, "results": []}
    assert reported(operator, dead) == ([(namespace, "orders")], [(namespace, broker["written"]("orders"))])
    assert reported(operator, None) == ([(namespace, "orders")], [])


def test_drain_reads_every_dlq_of_each_source_and_writes_its_file(broker: dict[str, Any], tmp_path: Path) -> None:
    namespace, conn_id = broker["namespace"], broker["conn_id"]
    path = str(tmp_path / "drain" / "dlq-run-abc.jsonl")
    result = {"path": path, "records": 2, "bytes": 10, "by_source": {f"{conn_id}/orders": 2}}
    one = BabelQueueDrainDeadLettersOperator(task_id="drain", babelqueue_conn_id=conn_id, queue_name="orders",
                                             destination=str(tmp_path / "drain"))
    assert reported(one, result) == ([(namespace, name) for name in broker["read"]("orders")], [("file", path)])
    assert reported(one, None) == ([(namespace, name) for name in broker["read"]("orders")], [])

    several = BabelQueueDrainDeadLettersOperator(task_id="drain", destination="s3://bucket/drains/", sources=[
        {"babelqueue_conn_id": conn_id, "queue_name": "orders"},
        {"queue_name": "payments"},  # on the embedded default
    ])
    s3 = {**result, "path": "s3://bucket/drains/dlq-run-abc.jsonl"}
    inputs = [(namespace, name) for name in broker["read"]("orders")]
    if conn_id != "babelqueue_default":
        inputs.append((sqlite_namespace(), "jobs_failed"))
    # on the default connection both sources read the one jobs_failed table: named once
    assert reported(several, s3) == (inputs, [("s3://bucket", "drains/dlq-run-abc.jsonl")])


def test_replay_reads_the_dlq_or_the_replay_set_and_writes_the_queues_it_replayed_to(broker: dict[str, Any],
                                                                                     tmp_path: Path) -> None:
    namespace, conn_id = broker["namespace"], broker["conn_id"]
    done = {"replayed": 3, "skipped": {}, "duplicates_avoided": 0, "duplicates_kept": 0, "dry_run": False,
            "targets": {"orders": 2, "payments": 1}}
    redrive = BabelQueueReplayOperator(task_id="replay", source_conn_id=conn_id, queue_name="orders",
                                       replay_set="None")  # a template that rendered blank counts as not given
    dlqs = [(namespace, name) for name in broker["read"]("orders")]
    assert reported(redrive, done) == (dlqs, [(namespace, "orders"), (namespace, "payments")])
    assert reported(redrive, {**done, "dry_run": True}) == (dlqs, [])  # a dry run republishes nothing

    folder = str(tmp_path / "replay_set")
    across = BabelQueueReplayOperator(task_id="replay", source_conn_id=conn_id, replay_set=folder,
                                      target_conn_id="babelqueue_default")
    assert reported(across, {**done, "targets": {"orders": 2, "empty": 0}}) == (
        [("file", folder)], [(sqlite_namespace(), "orders")])


def test_spark_jobs_read_their_inputs_and_write_their_folders(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "run-1"
    pending = tmp_path / "runs" / "_pending"
    triage = BabelQueueSparkTriageOperator(
        task_id="triage", job="triage", input=str(pending / "dlq-1.jsonl"), output=str(run / "triage"),
        report_output=str(run / "report"), pending=str(pending), archive_to=str(run / "drain"))
    submitted = [str(pending / "dlq-1.jsonl"), str(pending / "dlq-0.jsonl")]  # one an earlier run left pending
    result = {"job": "triage", "input": submitted, "output": str(run / "triage"),
              "summary": f"{run}/triage/_triage_summary.json", "report": f"{run}/report/report.html"}
    assert reported(triage, result) == (
        [("file", path) for path in submitted], [("file", str(run / "triage")), ("file", str(run / "report"))])
    # failed: what it was given, nothing written
    assert reported(triage, None) == ([("file", str(pending / "dlq-1.jsonl"))], [])

    report = BabelQueueSparkTriageOperator(task_id="report", job="report", input=f"s3a://lake/{run.name}/triage/",
                                           output=f"s3://lake/{run.name}/report")
    assert reported(report, {"job": "report", "input": f"s3a://lake/{run.name}/triage/",
                             "output": f"s3://lake/{run.name}/report"}) == (
        [("s3://lake", f"{run.name}/triage")], [("s3://lake", f"{run.name}/report")])

    replay_set = BabelQueueSparkTriageOperator(task_id="replay_set", job="replay_set", input=str(run / "triage"),
                                               output=str(run / "replay_set"), reasons=["failed"])
    assert reported(replay_set, {"job": "replay_set", "input": str(run / "triage"),
                                 "output": str(run / "replay_set")}) == (
        [("file", str(run / "triage"))], [("file", str(run / "replay_set"))])
    assert spark_lineage("triage", ["/a"], {"output": "/b"}) == Lineage(inputs=(("file", "/a"),),
                                                                         outputs=(("file", "/b"),))


def test_an_unreadable_return_value_reports_only_what_was_read() -> None:
    operator = BabelQueueConsumeOperator(task_id="consume", queue_name="orders", handlers={})
    lineage = operator.get_openlineage_facets_on_complete(Unreadable("consume", None))
    assert [(d.namespace, d.name) for d in lineage.inputs] == [(sqlite_namespace(), "orders")]
    assert lineage.outputs == []


def test_without_openlineage_installed_the_methods_return_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider does not depend on OpenLineage: with its client missing, every method returns ``None``."""
    monkeypatch.setitem(sys.modules, "openlineage.client.event_v2", None)  # import raises ImportError
    operators = [
        BabelQueuePublishOperator(task_id="p", queue_name="orders", urn="urn:x", data={}),
        BabelQueueConsumeOperator(task_id="c", queue_name="orders", handlers={}),
        BabelQueueDrainDeadLettersOperator(task_id="d", queue_name="orders", destination="/tmp/d"),
        BabelQueueReplayOperator(task_id="r", queue_name="orders"),
        BabelQueueSparkTriageOperator(task_id="s", job="triage", input="/tmp/in", output="/tmp/out"),
    ]
    for operator in operators:
        assert operator.get_openlineage_facets_on_complete(RunOf(operator.task_id, {"path": "/x"})) is None


# -- real runs: the return values the lineage reads ------------------------------------------------------------


@pytest.fixture
def queue(broker: dict[str, Any]) -> Iterator[str]:
    """A fresh queue name; its keys (Redis) or queues (RabbitMQ) are removed afterwards."""
    name = f"lin-{uuid.uuid4().hex[:8]}"
    yield name
    if broker["conn_id"] == "bq_redis":
        import redis

        client = redis.Redis(host="127.0.0.1", port=6379)
        keys = list(client.scan_iter(match=f"bqop:{name}*"))
        if keys:
            client.delete(*keys)
        client.close()
    elif broker["conn_id"] == "bq_rabbitmq":
        import pika

        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
        channel = connection.channel()
        for suffix in ("", ".failed", ".dlq"):
            channel.queue_delete(f"{name}{suffix}")
        connection.close()


def test_real_runs_report_the_queues_and_file_they_touched(broker: dict[str, Any], queue: str,
                                                           tmp_path: Path) -> None:
    """publish → consume (the handler fails: both dead-lettered) → drain → replay of the drain file: each run's
    real return value, through its operator's method."""
    namespace, conn_id = broker["namespace"], broker["conn_id"]
    publish = BabelQueuePublishOperator(task_id="publish", babelqueue_conn_id=conn_id, queue_name=queue,
                                        urn="urn:babel:orders:created", data=[{"order_id": 1}, {"order_id": 2}])
    published = publish.execute(context={})
    assert reported(publish, published) == ([], [(namespace, queue)])

    consume = BabelQueueConsumeOperator(task_id="consume", babelqueue_conn_id=conn_id, queue_name=queue,
                                        handlers={"urn:babel:orders:created": "tests.operators.handlers.always_fail"},
                                        max_attempts=1, reserve_timeout=1.0)
    summary = consume.execute(context={})
    assert summary["dead_lettered"] == {"failed": 2}, summary
    assert reported(consume, summary) == ([(namespace, queue)], [(namespace, broker["written"](queue))])

    drain = BabelQueueDrainDeadLettersOperator(task_id="drain", babelqueue_conn_id=conn_id, queue_name=queue,
                                               destination=str(tmp_path / "drain"), reserve_timeout=1.0)
    drained = drain.execute(context={"run_id": "manual__lineage"})
    assert drained["records"] == 2, drained
    dlqs = [(namespace, name) for name in broker["read"](queue)]
    assert reported(drain, drained) == (dlqs, [("file", drained["path"])])
    assert Path(drained["path"]).parent == tmp_path / "drain"

    replay = BabelQueueReplayOperator(task_id="replay", source_conn_id=conn_id, replay_set=drained["path"],
                                      ledger_conn_id="babelqueue_default", ledger_name=f"replay:{queue}")
    replayed = replay.execute(context={})
    assert replayed["targets"] == {queue: 2}, replayed
    assert reported(replay, replayed) == ([("file", drained["path"])], [(namespace, queue)])
