"""Broker clients' own log lines stay out of task logs below WARNING, unless the user asks for them; a successful
RabbitMQ publish logs no warning. Against the real RabbitMQ on this machine."""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Iterator

import pika
import pytest
from airflow.sdk import DAG

from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.hooks.client_logs import CLIENT_LOG_LEVEL, parse_levels, quiet_client_loggers
from airflow_provider_babelqueue.operators.publish import BabelQueuePublishOperator
from tests.airflow_harness import run_dag, task_states
from tests.connections import define

#: Every logger these tests may change; reset before and after each test so no test sees another's levels.
TOUCHED = ("pika", "pika.channel", "pika.connection", "boto3", "botocore", "azure", "uamqp", "redis", "pulsar",
           "bq.test.client", "bq.test.client.wire", "bq.test")


@pytest.fixture(autouse=True)
def fresh_loggers() -> Iterator[None]:
    """Loggers as a fresh worker has them: no level set, so only the hook (or the user) sets one."""
    saved = {name: logging.getLogger(name).level for name in TOUCHED}
    for name in TOUCHED:
        logging.getLogger(name).setLevel(logging.NOTSET)
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"quiet-{uuid.uuid4().hex[:10]}"
    yield name
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    channel = connection.channel()
    for suffix in ("", ".failed", ".dlq"):
        channel.queue_delete(f"{name}{suffix}")
    connection.close()


def publish_and_count(conn_id: str, queue: str) -> None:
    """A first publish to a queue that does not exist (the passive declare is answered 404, then the queue is
    declared), a count of its two dead-letter sources (neither exists: two more 404s), a reserve and an ack."""
    hook = get_hook(conn_id)
    try:
        binding = hook.get_binding()
        body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": 1}, queue_name=queue))
        binding.publish(body, queue)
        assert binding.dead_letter_depth(queue) == 0
        message = binding.reserve(queue, timeout=2)
        assert message is not None and message.body == body
        binding.ack(message)
    finally:
        hook.close()


def not_found(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [record for record in records if "NOT_FOUND" in record.getMessage()]


def test_a_rabbitmq_publish_through_the_hook_logs_nothing_from_pika(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, queue: str
) -> None:
    """Even with the root logger at DEBUG, pika's connection chatter (about twenty INFO lines per connection) and
    its WARNING for the 404 that answers a passive declare are gone."""
    monkeypatch.delenv("AIRFLOW__LOGGING__NAMESPACE_LEVELS", raising=False)
    caplog.set_level(logging.DEBUG)
    publish_and_count(define(monkeypatch, "bq_rabbitmq"), queue)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pika")] == []
    assert not_found(caplog.records) == []
    assert logging.getLogger("pika").level == CLIENT_LOG_LEVEL


def test_airflow_namespace_levels_turn_the_client_lines_back_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, queue: str
) -> None:
    """``[logging] namespace_levels = pika=INFO`` (Airflow's own option) brings pika's INFO lines back; the
    expected 404 is still no warning."""
    monkeypatch.setenv("AIRFLOW__LOGGING__NAMESPACE_LEVELS", "pika=INFO")
    caplog.set_level(logging.DEBUG)
    publish_and_count(define(monkeypatch, "bq_rabbitmq"), queue)
    assert logging.getLogger("pika").level == logging.INFO
    assert any(r.name.startswith("pika") and r.levelno == logging.INFO for r in caplog.records)
    assert not_found(caplog.records) == []


def test_a_level_set_on_the_logger_is_kept_and_the_expected_404_shows_at_debug(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, queue: str
) -> None:
    """A level set by a logging config (here: by hand) is left alone. With pika at DEBUG the 404 answers of the
    passive declares are logged, at DEBUG: the queue and both dead-letter sources did not exist."""
    monkeypatch.delenv("AIRFLOW__LOGGING__NAMESPACE_LEVELS", raising=False)
    logging.getLogger("pika").setLevel(logging.DEBUG)
    caplog.set_level(logging.DEBUG)
    publish_and_count(define(monkeypatch, "bq_rabbitmq"), queue)
    assert logging.getLogger("pika").level == logging.DEBUG
    closes = [r for r in not_found(caplog.records) if r.name == "pika.channel"]
    assert {r.getMessage().split("no queue '")[1].split("'")[0] for r in closes} == {
        queue, f"{queue}.failed", f"{queue}.dlq"
    }
    assert {r.levelno for r in closes} == {logging.DEBUG}


def test_another_channels_not_found_keeps_its_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, queue: str
) -> None:
    """The filter lowers only the answers to the binding's own passive declares: a 404 on any other channel (here
    a raw pika connection of the same process) is still a warning."""
    monkeypatch.delenv("AIRFLOW__LOGGING__NAMESPACE_LEVELS", raising=False)
    publish_and_count(define(monkeypatch, "bq_rabbitmq"), queue)  # installs the filter, quiets pika
    caplog.set_level(logging.WARNING)
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            connection.channel().queue_declare(f"{queue}.nobody", passive=True)
    finally:
        connection.close()
    assert [r.levelno for r in not_found(caplog.records)] == [logging.WARNING]


def test_a_publish_task_log_has_no_pika_lines(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
    queue: str,
) -> None:
    """The user's view: a publish task under ``dag.test()`` on RabbitMQ; its log (records and printed output)
    holds the task's lines and none of pika's."""
    monkeypatch.delenv("AIRFLOW__LOGGING__NAMESPACE_LEVELS", raising=False)
    conn_id = define(monkeypatch, "bq_rabbitmq")
    caplog.set_level(logging.INFO)
    with DAG(f"bq_quiet_{uuid.uuid4().hex[:6]}", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
        BabelQueuePublishOperator(task_id="publish", babelqueue_conn_id=conn_id, queue_name=queue,
                                  urn="urn:babel:orders:created", data={"order_id": 1})
    dag_run = run_dag(dag)
    captured = capfd.readouterr()
    assert task_states(dag_run) == {"publish": "success"}
    log = "\n".join([captured.out, captured.err, *(f"{r.name}: {r.getMessage()}" for r in caplog.records)])
    assert queue in log  # the task's own lines are there
    assert "pika" not in log and "NOT_FOUND" not in log and "Channel.Close" not in log, log


def test_parse_levels_reads_airflows_namespace_levels_format() -> None:
    assert parse_levels("pika=INFO botocore=debug,  azure.core=WARNING") == {
        "pika": logging.INFO, "botocore": logging.DEBUG, "azure.core": logging.WARNING
    }
    assert parse_levels("pika, =INFO, pika=LOUD") == {}  # malformed entries: Airflow reports them itself
    assert parse_levels(None) == {} and parse_levels("") == {}


def test_client_loggers_get_warning_unless_the_user_chose_a_level() -> None:
    quiet_client_loggers(["bq.test.client"], configured={})
    assert logging.getLogger("bq.test.client").level == CLIENT_LOG_LEVEL
    logging.getLogger("bq.test.client").setLevel(logging.NOTSET)

    quiet_client_loggers(["bq.test.client"], configured={"bq.test.client.wire": logging.DEBUG})  # a child
    assert logging.getLogger("bq.test.client").level == logging.NOTSET
    assert logging.getLogger("bq.test.client.wire").level == logging.DEBUG

    quiet_client_loggers(["bq.test.client"], configured={"bq.test": logging.INFO})  # a parent
    assert (logging.getLogger("bq.test").level, logging.getLogger("bq.test.client").level) == (
        logging.INFO, logging.NOTSET
    )

    logging.getLogger("bq.test.client").setLevel(logging.ERROR)  # set by a logging config
    quiet_client_loggers(["bq.test.client"], configured={})
    assert logging.getLogger("bq.test.client").level == logging.ERROR
