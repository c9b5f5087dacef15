"""Secrets (passwords, SAS keys, tokens) never reach task logs, XCom, rendered templates or exception messages.

Every broker gets a connection through ``AIRFLOW_CONN_<ID>`` carrying distinctive secrets, built to fail:

* Redis at 127.0.0.1:6379 with an unknown ACL user and a password (the server refuses the AUTH);
* RabbitMQ at 127.0.0.1:5672 as ``guest`` with a wrong password (ACCESS_REFUSED);
* PostgreSQL (``babelqueue+sql``) with a password, once on a closed port and once on the real server with an
  unknown role (the server refuses it);
* SQS with an access key, a secret key and a session token, ``endpoint_url`` on a closed port;
* Pulsar with a token, on a closed port; Azure Service Bus with a connection string holding a SharedAccessKey,
  on a closed port (when their hooks are registered).

Each connection also carries an unknown extra, ``password_in_extra``, with its own secret: extras are read by
allowlist only, so that value must never be echoed anywhere.

A real DAG (publish, a depth sensor, a drain, and a task returning ``hook.test_connection()``) runs under
``dag.test()``; the test then reads the captured output (``capfd``), the log records (``caplog``), any log file
under ``$AIRFLOW_HOME/logs``, every XCom of the run and the rendered template fields stored for its task
instances. ``dag.test()`` does not mask log output, and Airflow's masker is switched off for these runs too
(``add_mask`` made a no-op, which also stops the redaction of rendered fields), so what is checked is what *our*
code writes. The failures are asserted to be the expected ones (the server's refusal for Redis, RabbitMQ and
PostgreSQL), so these tests fail, never skip, when a server is down.

Separate tests check exceptions directly (``str``, ``repr`` and the whole formatted chain), trigger events, the
extras allowlist, Airflow's own masking of a deliberately templated password, and the regression for secrets
Airflow cannot know about (a password in a URL's userinfo).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import json
import os
import secrets
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from airflow.sdk import DAG, Connection, task

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.hooks import HOOK_CLASSES, get_hook
from airflow_provider_babelqueue.hooks.base import BabelQueueHook, connection_secrets, scrub
from airflow_provider_babelqueue.operators.drain import BabelQueueDrainDeadLettersOperator
from airflow_provider_babelqueue.operators.publish import BabelQueuePublishOperator
from airflow_provider_babelqueue.sensors.queue import BabelQueueQueueDepthSensor
from airflow_provider_babelqueue.triggers.queue import BabelQueueDepthTrigger
from tests.airflow_harness import run_dag, task_states
from tests.conftest import free_port

CONN_TYPES = {
    "redis": "babelqueue+redis",
    "rabbitmq": "babelqueue+rabbitmq",
    "postgres": "babelqueue+sql",
    "postgres_auth": "babelqueue+sql",
    "sqs": "babelqueue+sqs",
    "pulsar": "babelqueue+pulsar",
    "azure_service_bus": "babelqueue+servicebus",
}
#: What the failure must say: the server's own refusal where a server runs, so a broker that is down fails the test.
EXPECTED_FAILURE = {
    "redis": "authentication failed",
    "rabbitmq": "authentication failed",
    "postgres": "cannot reach the database",
    "postgres_auth": "does not exist",
    "sqs": "cannot reach the endpoint",
    "pulsar": "Pulsar",
    "azure_service_bus": "cannot reach the namespace",
}
BROKERS = [broker for broker, conn_type in CONN_TYPES.items() if conn_type in HOOK_CLASSES]
#: Service Bus's SDK retries a refused connection for ~5-11 s per operation: its DAG skips the drain.
SLOW = {"azure_service_bus"}


class Secrets:
    """The distinctive secret strings of one connection, unique per test (Airflow's masker is process-wide)."""

    def __init__(self, broker: str) -> None:
        tag = secrets.token_hex(5)
        self.password = f"bq-{broker}-Pw/{tag}@x:y" if broker.startswith("postgres") else f"bq-{broker}-Pw-{tag}"
        self.extra = f"bq-{broker}-unknown-extra-{tag}"
        self.token = f"bq-{broker}-session-token-{tag}"
        self.sas_key = base64.b64encode(f"bq-{broker}-sas-key-{tag}".encode()).decode()
        self.tag = tag

    def all(self) -> list[str]:
        values = [self.password, self.extra, self.token, self.sas_key]
        return [form for value in values for form in dict.fromkeys((value, quote(value, safe=""), quote_plus(value)))]

    def leaks(self, text: str) -> list[str]:
        return [value for value in self.all() if value in text]


def connection_spec(broker: str, s: Secrets, closed_port: int) -> dict[str, Any]:
    unknown = {"password_in_extra": s.extra, f"extra__{CONN_TYPES[broker]}__password_in_extra": s.extra}
    if broker == "redis":
        return {"conn_type": "babelqueue+redis", "host": "127.0.0.1", "port": 6379, "login": f"bq-ghost-{s.tag}",
                "password": s.password, "extra": {"key_prefix": f"bqsecret:{s.tag}:", **unknown}}
    if broker == "rabbitmq":
        return {"conn_type": "babelqueue+rabbitmq", "host": "127.0.0.1", "port": 5672, "login": "guest",
                "password": s.password, "extra": {"heartbeat": 0, **unknown}}
    if broker == "postgres":
        return {"conn_type": "babelqueue+sql", "host": "127.0.0.1", "port": closed_port, "login": "postgres",
                "password": s.password, "schema": "test", "extra": {"dialect": "postgresql", **unknown}}
    if broker == "postgres_auth":
        return {"conn_type": "babelqueue+sql", "host": "127.0.0.1", "port": 5432, "login": f"bq_ghost_{s.tag}",
                "password": s.password, "schema": "test", "extra": {"dialect": "postgresql", **unknown}}
    if broker == "sqs":
        return {"conn_type": "babelqueue+sqs", "login": f"AKIABQ{s.tag.upper()}", "password": s.password,
                "extra": {"region_name": "us-east-1", "endpoint_url": f"http://127.0.0.1:{closed_port}",
                          "aws_session_token": s.token, **unknown}}
    if broker == "pulsar":
        return {"conn_type": "babelqueue+pulsar", "host": "127.0.0.1", "port": closed_port, "password": s.token,
                "extra": {"admin_url": f"http://127.0.0.1:{closed_port}", "operation_timeout_seconds": 2, **unknown}}
    if broker == "azure_service_bus":
        return {"conn_type": "babelqueue+servicebus",
                "password": f"Endpoint=sb://127.0.0.1:{closed_port};SharedAccessKeyName=RootManageSharedAccessKey;"
                            f"SharedAccessKey={s.sas_key};UseDevelopmentEmulator=true",
                "extra": unknown}
    raise AssertionError(broker)


@pytest.fixture
def airflow_masking_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow's secrets masker learns nothing (``add_mask`` is a no-op): what the logs, XCom and rendered
    fields hold is then exactly what our code put there (``dag.test()`` never masks logs anyway; the rendered
    fields would otherwise be redacted)."""
    import airflow._shared.secrets_masker.secrets_masker as core_masker
    import airflow.sdk._shared.secrets_masker.secrets_masker as sdk_masker

    for module in (core_masker, sdk_masker):
        monkeypatch.setattr(module.SecretsMasker, "add_mask", lambda self, secret, name=None: None)


def define(monkeypatch: pytest.MonkeyPatch, broker: str, s: Secrets) -> str:
    conn_id = f"bq_secret_{broker}_{s.tag}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection_spec(broker, s, free_port())))
    return conn_id


# ------------------------------------------------------------------------------------------- evidence


def log_files_since(started: float) -> str:
    """Every task log file written under ``$AIRFLOW_HOME/logs`` since ``started`` (dag.test writes to stdout,
    but a configured file handler would write here)."""
    root = Path(os.environ["AIRFLOW_HOME"]) / "logs"
    texts = []
    for path in root.rglob("*") if root.is_dir() else []:
        if path.is_file() and path.stat().st_mtime >= started - 1:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


def _plain(value: Any) -> Any:
    """An XCom value as stored: the column holds JSON text or an already decoded value, by backend."""
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def run_rows(dag_run: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(xcoms, rendered fields)`` of every task instance of the run, as plain dicts."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        xcoms = [{"task_id": row.task_id, "key": row.key, "value": _plain(row.value)}
                 for row in session.query(XComModel).filter(XComModel.dag_id == dag_run.dag_id,
                                                            XComModel.run_id == dag_run.run_id)]
        rtifs = [{"task_id": row.task_id, "rendered_fields": row.rendered_fields}
                 for row in session.query(RenderedTaskInstanceFields).filter(
                     RenderedTaskInstanceFields.dag_id == dag_run.dag_id,
                     RenderedTaskInstanceFields.run_id == dag_run.run_id)]
    return xcoms, rtifs


def exception_text(exc: BaseException) -> str:
    """``str``, ``repr`` and the whole formatted chain (causes included), as a task log would print it."""
    return "\n".join([str(exc), repr(exc), "".join(traceback.format_exception(exc))])


def health_check(conn_id: str) -> list[Any]:
    """What a connection health-check task returns to XCom: ``[ok, message]`` of ``test_connection``."""
    ok, message = get_hook(conn_id).test_connection()
    return [ok, message]


def secret_dag(broker: str, conn_id: str, queue: str, drain_to: Path) -> DAG:
    with DAG(f"bq_secrets_{broker}_{uuid.uuid4().hex[:6]}", schedule=None,
             start_date=datetime.datetime(2026, 1, 1)) as dag:
        BabelQueuePublishOperator(task_id="publish", babelqueue_conn_id=conn_id, queue_name=queue,
                                  urn="urn:babel:orders:created", data={"order_id": 1})
        BabelQueueQueueDepthSensor(task_id="sensor", babelqueue_conn_id=conn_id, queue_name=queue,
                                   poke_interval=0.2, timeout=30, mode="poke")
        if broker not in SLOW:
            BabelQueueDrainDeadLettersOperator(task_id="drain", babelqueue_conn_id=conn_id, queue_name=queue,
                                               destination=str(drain_to))
        task(task_id="health")(health_check)(conn_id)
    return dag


# ----------------------------------------------------------------------------------------- DAG runs


@pytest.mark.usefixtures("airflow_masking_off")
@pytest.mark.parametrize("broker", BROKERS)
def test_failing_tasks_leak_no_secret_to_logs_xcom_or_rendered_fields(
    broker: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:
    s = Secrets(broker)
    conn_id = define(monkeypatch, broker, s)
    started = time.time()
    run = run_dag(secret_dag(broker, conn_id, f"orders-{s.tag}", tmp_path / "drain"))
    captured = capfd.readouterr()
    output = "\n".join([captured.out, captured.err, caplog.text, log_files_since(started)])

    expected_states = {"publish": "failed", "sensor": "failed", "health": "success"}
    if broker not in SLOW:
        expected_states["drain"] = "failed"
    assert task_states(run) == expected_states
    xcoms, rtifs = run_rows(run)

    # the evidence is real: the failures were captured, with the reason we provoked
    assert output.count("Task failed with exception") >= len(expected_states) - 1, output[-3000:]
    assert EXPECTED_FAILURE[broker] in output
    [health] = [row["value"] for row in xcoms if row["task_id"] == "health"]
    assert health[0] is False and EXPECTED_FAILURE[broker] in health[1], health
    assert {row["task_id"] for row in rtifs} == set(expected_states)

    assert s.leaks(output) == [], "a secret reached the task log output"
    assert s.leaks(json.dumps(xcoms, default=str)) == [], "a secret reached XCom"
    assert s.leaks(json.dumps(rtifs, default=str)) == [], "a secret reached the rendered template fields"


# ----------------------------------------------------------------------------------------- exceptions


def _operations(broker: str) -> dict[str, Callable[[Any], Any]]:
    body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"order_id": 1}, queue_name="orders"))
    operations: dict[str, Callable[[Any], Any]] = {
        "depth": lambda binding: binding.depth("orders"),
        "publish": lambda binding: binding.publish(body, "orders"),
        "publish_batch": lambda binding: binding.publish_batch([body, body], "orders"),
        "reserve_dead_letter": lambda binding: binding.reserve_dead_letter("orders", timeout=0),
    }
    return {"depth": operations["depth"]} if broker in SLOW else operations


@pytest.mark.parametrize("broker", BROKERS)
def test_exceptions_and_test_connection_carry_no_secret(broker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Secrets(broker)
    conn_id = define(monkeypatch, broker, s)
    hook = get_hook(conn_id)
    ok, message = hook.test_connection()
    assert ok is False and EXPECTED_FAILURE[broker] in message, message
    assert s.leaks(message) == []
    assert s.leaks(hook.describe(hook.connection)) == []
    try:
        for name, operation in _operations(broker).items():
            with pytest.raises(Exception) as caught:
                operation(hook.get_binding())
            text = exception_text(caught.value)
            assert EXPECTED_FAILURE[broker] in text, (name, text)
            assert s.leaks(text) == [], f"{name}: a secret is in the exception"
        assert s.leaks(repr(hook.get_binding().config)) == []
    finally:
        hook.close()


def test_trigger_error_events_carry_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trigger's error event is stored in the metadata DB and shown by the task: it must be clean too."""
    s = Secrets("redis")
    conn_id = define(monkeypatch, "redis", s)
    trigger = BabelQueueDepthTrigger(queue_name="orders", babelqueue_conn_id=conn_id, poll_interval=0.1)

    async def first_event() -> Any:
        async for event in trigger.run():
            return event.payload
        return None

    payload = asyncio.run(asyncio.wait_for(first_event(), timeout=60))
    assert payload["status"] == "error" and "authentication failed" in payload["message"], payload
    assert s.leaks(json.dumps(payload)) == []


# ---------------------------------------------------------------------------------------- the extras


def _hook_class(conn_type: str) -> type[BabelQueueHook]:
    from importlib import import_module

    module, _, name = HOOK_CLASSES[conn_type].rpartition(".")
    return getattr(import_module(module), name)


@pytest.mark.parametrize("conn_type", sorted(HOOK_CLASSES))
def test_extras_are_read_by_allowlist_only(conn_type: str) -> None:
    s = Secrets(conn_type)
    raw = {"password_in_extra": s.extra, f"extra__{conn_type}__password_in_extra": s.extra, "password": s.extra,
           "connection_string": s.extra, "token": s.extra, "__class__": s.extra}
    cls = _hook_class(conn_type)
    hook = cls("unused", connection=Connection(conn_id="unused", conn_type=conn_type, extra=json.dumps(raw)))
    extras = hook.extras(hook.connection)
    assert extras == {} and set(cls.extra_fields).isdisjoint(raw)
    assert s.extra not in connection_secrets(hook.connection, extras)  # an ignored extra is never even read


def test_unknown_extras_never_reach_the_binding_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for broker in ("redis", "rabbitmq", "postgres", "sqs"):
        s = Secrets(broker)
        hook = get_hook(define(monkeypatch, broker, s))
        try:
            config = hook.get_binding().config
            values = [getattr(config, item.name) for item in dataclasses.fields(config)]
            assert s.extra not in repr(config) and s.extra not in repr(values), broker
        finally:
            hook.close()


# ------------------------------------------------------------------- Airflow's masking, and a regression


def test_airflow_masks_a_deliberately_templated_password(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With Airflow's masker on (production), a template that renders the connection's password and an extra
    on purpose is stored as ``***`` in the rendered fields, and our failing task's log does not carry them. The
    control run with the masker off stores the raw values: the check sees secrets when they are there."""
    seen: dict[bool, tuple[str, str]] = {}
    for masked in (True, False):
        s = Secrets("redis")
        conn_id = define(monkeypatch, "redis", s)
        with monkeypatch.context() as patch:
            if not masked:
                import airflow._shared.secrets_masker.secrets_masker as core_masker
                import airflow.sdk._shared.secrets_masker.secrets_masker as sdk_masker

                for module in (core_masker, sdk_masker):
                    patch.setattr(module.SecretsMasker, "add_mask", lambda self, secret, name=None: None)
            with DAG(f"bq_secrets_templated_{uuid.uuid4().hex[:6]}", schedule=None,
                     start_date=datetime.datetime(2026, 1, 1)) as dag:
                BabelQueuePublishOperator(
                    task_id="publish", babelqueue_conn_id=conn_id, queue_name=f"orders-{s.tag}",
                    urn="urn:babel:orders:created",
                    data={"p": f"{{{{ conn.{conn_id}.password }}}}",
                          "e": f"{{{{ conn.{conn_id}.extra_dejson.password_in_extra }}}}"},
                )
            run = run_dag(dag)
            captured = capfd.readouterr()
        assert task_states(run) == {"publish": "failed"}
        _, rtifs = run_rows(run)
        [rendered] = [row["rendered_fields"] for row in rtifs]
        seen[masked] = (json.dumps(rendered), captured.out + captured.err)
        if masked:
            assert rendered["data"] == {"p": "***", "e": "***"}
            assert s.leaks(seen[masked][0] + seen[masked][1]) == []
        else:
            assert rendered["data"] == {"p": s.password, "e": s.extra}


def test_a_password_in_a_url_is_scrubbed_from_test_connection_and_registered_with_the_log_masker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: Airflow masks the password field and extras named like secrets, but not the password in a
    URL's userinfo (``endpoint_url``, ``admin_url``, ``sqlalchemy_url``). The SQS binding's errors (and
    botocore's, chained under them) echo the endpoint, and ``test_connection`` returned that verbatim to the UI.
    The hook now scrubs its message, and registers such secrets with Airflow's masker before it builds a
    binding, so a supervised task's log (masked by Airflow; ``dag.test()`` does not mask) hides them."""
    from airflow.sdk._shared.secrets_masker import redact

    userinfo = f"url-Pw-{secrets.token_hex(5)}"
    conn_id = f"bq_secret_url_{secrets.token_hex(3)}"
    endpoint = f"http://bq:{userinfo}@127.0.0.1:{free_port()}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
        "conn_type": "babelqueue+sqs", "login": "AKIABQURL", "password": f"sqs-key-{secrets.token_hex(5)}",
        "extra": {"region_name": "us-east-1", "endpoint_url": endpoint}}))
    assert userinfo in redact(f"error at {endpoint}")  # Airflow alone does not know this secret
    hook = get_hook(conn_id)
    ok, message = hook.test_connection()
    assert ok is False and "cannot reach the endpoint" in message and "http://bq:***@127.0.0.1" in message
    assert userinfo not in message

    try:
        with pytest.raises(Exception, match="cannot reach the endpoint") as caught:
            hook.get_binding().depth("orders")
    finally:
        hook.close()
    log_line = redact(exception_text(caught.value))
    assert userinfo not in log_line and "bq:***@127.0.0.1" in log_line


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"password": "pw-Secret1"}, ["pw-Secret1"]),
        ({"password": "Endpoint=sb://ns/;SharedAccessKeyName=Root;SharedAccessKey=K3y+/=="},
         ["Endpoint=sb://ns/;SharedAccessKeyName=Root;SharedAccessKey=K3y+/==", "K3y+/=="]),
        ({"host": "pulsar+ssl://u:h0st-pw@broker:6651"}, ["h0st-pw"]),
        ({"password": "abc"}, []),  # too short to scrub without garbling every message
    ],
    ids=["password", "azure-connection-string", "url-in-host", "short"],
)
def test_connection_secrets(spec: dict[str, str], expected: list[str]) -> None:
    connection = Connection(conn_id="c", conn_type="babelqueue+redis", **spec)
    assert connection_secrets(connection) == expected
    extras = {"aws_session_token": "tok-123456", "sqlalchemy_url": "postgresql://u:p%40ss-word@h/db", "table": "jobs"}
    assert connection_secrets(Connection(conn_id="c", conn_type="x"), extras) == ["tok-123456", "p@ss-word"]
    assert scrub("at postgresql://u:p%40ss-word@h and p@ss-word", ["p@ss-word"]) == "at postgresql://u:***@h and ***"


def test_binding_errors_redact_a_password_inside_an_endpoint_url() -> None:
    """The bindings themselves (no Airflow masker involved) never repeat a URL's userinfo password."""
    from airflow_provider_babelqueue.bindings.base import BindingError
    from airflow_provider_babelqueue.bindings.pulsar import PulsarBinding, PulsarConfig
    from airflow_provider_babelqueue.bindings.redaction import redact, scrub, url_secrets
    from airflow_provider_babelqueue.bindings.sqs import SqsBinding, SqsConfig
    from tests.conftest import free_port

    secret = "Url-Pass-7731"
    assert redact(f"https://user:{secret}@proxy.internal:8443/x") == "https://user:***@proxy.internal:8443/x"
    assert redact("http://host:1/x") == "http://host:1/x"
    assert scrub(f"failed for http://u:{secret}@h/", url_secrets(f"http://u:{secret}@h/")) == "failed for http://u:***@h/"

    port = free_port()
    sqs = SqsBinding(SqsConfig(region_name="us-east-1", endpoint_url=f"http://user:{secret}@127.0.0.1:{port}",
                               aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x" * 20))
    with pytest.raises(BindingError) as caught:
        sqs.depth("orders")
    assert secret not in str(caught.value) and "user:***@127.0.0.1" in str(caught.value)
    sqs.close()

    pulsar = PulsarBinding(PulsarConfig(admin_url=f"http://admin:{secret}@127.0.0.1:{port}"))
    with pytest.raises(BindingError) as caught:
        pulsar.depth("orders")
    assert secret not in str(caught.value) and "admin:***@127.0.0.1" in str(caught.value)
    pulsar.close()
