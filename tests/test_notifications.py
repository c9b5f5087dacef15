"""The dead-letter notifier posts the exact summary of a known DLQ to a webhook (a real HTTP server on loopback),
renders its templated fields, works as a task's and a DAG's callback, and never shows the webhook's secrets."""

from __future__ import annotations

import datetime
import http.server
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG, task

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.core.errors import ConnectionConfigError
from airflow_provider_babelqueue.core.fingerprint import error_fingerprint, error_pattern
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.notifications import BabelQueueDeadLetterNotifier, WebhookError
from tests.airflow_harness import run_dag, task_states
from tests.connections import define

TOKEN = "tok-secret-8f3a91"
SECRET_PATH = "services/T0/B0/xoxsecretpath77"
TIMEOUT = "App\\Exceptions\\GatewayTimeout"
REFUSED = "psycopg2.OperationalError"


@dataclass
class Webhook:
    """A loopback HTTP server that records every request and answers ``status`` with ``reply``."""

    server: http.server.ThreadingHTTPServer
    requests: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    reply: bytes = b"ok"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[Webhook]:
    recorded: list[dict[str, Any]] = []
    state: dict[str, Any] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            recorded.append({"path": self.path, "headers": dict(self.headers), "body": body})
            hook: Webhook = state["hook"]
            self.send_response(hook.status)
            self.send_header("Content-Length", str(len(hook.reply)))
            self.end_headers()
            self.wfile.write(hook.reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook = Webhook(server, recorded)
    state["hook"] = hook
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AIRFLOW_CONN_BQ_WEBHOOK", json.dumps(
        {"conn_type": "http", "host": f"{hook.url}/{SECRET_PATH}", "password": TOKEN}))
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


def _dead_letter(binding: Binding, queue: str, meta_id: str, error: str, exception: str | None,
                 reason: str = "failed") -> None:
    env = bq.make_envelope("urn:babel:orders:created", {"order_id": 1}, queue_name=queue)
    env["meta"]["id"] = meta_id
    binding.publish(bq.encode(env), queue)
    message = binding.reserve(queue, timeout=2)
    assert message is not None and message.meta_id == meta_id
    binding.dead_letter(message, reason, error=error, exception=exception)


@pytest.fixture
def known_dlq() -> Iterator[tuple[str, str, str]]:
    """(orders queue, an empty queue, the DLQ table) on the embedded SQLite queue: two timeouts, a refused
    connection, an unknown URN."""
    orders, billing = f"orders-{uuid.uuid4().hex[:8]}", f"billing-{uuid.uuid4().hex[:8]}"
    hook = get_hook()
    binding = hook.get_binding()
    try:
        _dead_letter(binding, orders, "00000000-0000-4000-8000-000000000001", "timeout after 30s for order 1042",
                     TIMEOUT)
        _dead_letter(binding, orders, "00000000-0000-4000-8000-000000000002", "timeout after 45s for order 77",
                     TIMEOUT)
        _dead_letter(binding, orders, "00000000-0000-4000-8000-000000000003", "connection to db-7 refused", REFUSED)
        _dead_letter(binding, orders, "00000000-0000-4000-8000-000000000004",
                     "no handler for urn:babel:orders:created", None, "unknown_urn")
        yield orders, billing, binding.dead_letter_name(orders)
    finally:
        hook.close()


def _fingerprint(exception: str | None, error: str) -> str:
    return error_fingerprint(exception, error_pattern(error))


def _context(dag: DAG) -> dict[str, Any]:
    return {"dag": dag, "run_id": "manual__r1", "ti": SimpleNamespace(task_id="load_orders")}


def test_the_exact_summary_of_a_known_dlq_is_posted(webhook: Webhook, known_dlq: tuple[str, str, str]) -> None:
    orders, billing, source = known_dlq
    dag = DAG("orders_pipeline", schedule=None, start_date=datetime.datetime(2026, 1, 1))
    notifier = BabelQueueDeadLetterNotifier(webhook_conn_id="bq_webhook", queue_names=f"{orders},{billing}",
                                            title="Dead letters after {{ run_id }}", top=5)
    notifier(_context(dag))
    assert len(webhook.requests) == 1
    request = webhook.requests[0]
    assert request["path"] == f"/{SECRET_PATH}"
    assert request["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert request["headers"]["Content-Type"] == "application/json; charset=utf-8"
    timeout, refused = _fingerprint(TIMEOUT, "timeout after 1s for order 1"), _fingerprint(REFUSED, "connection "
                                                                                                    "to db-7 refused")
    unknown = _fingerprint(None, "no handler for urn:babel:orders:created")
    top = [
        {"fingerprint": timeout, "count": 2, "exception_type": "GatewayTimeout",
         "error_pattern": "timeout after <n>s for order <n>", "sample_error": "timeout after 30s for order 1042",
         "sample_meta_id": "00000000-0000-4000-8000-000000000001", "sample_urn": "urn:babel:orders:created",
         "reason": "failed"},
        {"fingerprint": refused, "count": 1, "exception_type": "OperationalError",
         "error_pattern": "connection to db-<n> refused", "sample_error": "connection to db-7 refused",
         "sample_meta_id": "00000000-0000-4000-8000-000000000003", "sample_urn": "urn:babel:orders:created",
         "reason": "failed"},
        {"fingerprint": unknown, "count": 1, "exception_type": None,
         "error_pattern": "no handler for urn:babel:orders:created",
         "sample_error": "no handler for urn:babel:orders:created",
         "sample_meta_id": "00000000-0000-4000-8000-000000000004", "sample_urn": "urn:babel:orders:created",
         "reason": "unknown_urn"},
    ]
    assert json.loads(request["body"]) == {
        "text": "\n".join([
            "Dead letters after manual__r1",
            f"{orders}: 4 dead letters (failed 3, unknown_urn 1)",
            f"  • 2× GatewayTimeout: timeout after <n>s for order <n> [{timeout}]",
            "    e.g. timeout after 30s for order 1042",
            f"  • 1× OperationalError: connection to db-<n> refused [{refused}]",
            "    e.g. connection to db-7 refused",
            f"  • 1× no exception: no handler for urn:babel:orders:created [{unknown}]",
            f"{billing}: 0 dead letters",
        ]),
        "babelqueue": {
            "conn_id": "babelqueue_default", "dag_id": "orders_pipeline", "run_id": "manual__r1",
            "task_id": "load_orders", "total_depth": 4, "by_reason": {"failed": 3, "unknown_urn": 1},
            "queues": [
                {"queue_name": orders, "depth": 4, "browsable": True, "browsed": 4,
                 "by_reason": {"failed": 3, "unknown_urn": 1}, "by_source": {source: 4}, "fingerprint_count": 3,
                 "top_fingerprints": top},
                {"queue_name": billing, "depth": 0, "browsable": True, "browsed": 0, "by_reason": {},
                 "by_source": {}, "fingerprint_count": 0, "top_fingerprints": []},
            ],
        },
    }
    assert b"\\u" not in request["body"]  # UTF-8 JSON, the bullets and × unescaped


def test_default_title_top_and_a_dag_level_context(webhook: Webhook, known_dlq: tuple[str, str, str]) -> None:
    orders, _, _ = known_dlq
    notifier = BabelQueueDeadLetterNotifier(webhook_conn_id="bq_webhook", queue_names=[orders], top=1)
    dag_run = SimpleNamespace(dag_id="orders_pipeline", run_id="scheduled__2026")
    notifier.notify({"dag_run": dag_run, "reason": "task_failure"})  # what a DAG callback gets: no task
    posted = json.loads(webhook.requests[0]["body"])
    assert posted["text"].splitlines()[0] == (
        f"BabelQueue: 4 dead letters on babelqueue_default ({orders}) after orders_pipeline")
    assert (posted["babelqueue"]["dag_id"], posted["babelqueue"]["run_id"], posted["babelqueue"]["task_id"]) == (
        "orders_pipeline", "scheduled__2026", None)
    assert [g["count"] for g in posted["babelqueue"]["queues"][0]["top_fingerprints"]] == [2]


def test_nothing_is_posted_for_empty_queues_when_asked(webhook: Webhook) -> None:
    notifier = BabelQueueDeadLetterNotifier(webhook_conn_id="bq_webhook", queue_names=[f"empty-{uuid.uuid4().hex}"],
                                            skip_when_empty=True)
    notifier.notify({})
    assert webhook.requests == []


def test_errors_are_clear_and_never_show_the_secrets(webhook: Webhook, known_dlq: tuple[str, str, str],
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    orders, _, _ = known_dlq
    notifier = BabelQueueDeadLetterNotifier(webhook_conn_id="bq_webhook", queue_names=[orders])
    webhook.status, webhook.reply = 500, f"no route /{SECRET_PATH} for token {TOKEN}".encode()
    with caplog.at_level(logging.DEBUG), pytest.raises(WebhookError) as refused:
        notifier({"dag": DAG("d", schedule=None)})
    message = str(refused.value)
    assert f"the webhook at {webhook.url} refused the dead-letter summary: HTTP 500" in message
    assert "no route" in message
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_CONN_BQ_GONE", json.dumps(
        {"conn_type": "http", "host": f"http://127.0.0.1:{closed}/{SECRET_PATH}?key=abc123xyz", "password": TOKEN}))
    with caplog.at_level(logging.DEBUG), pytest.raises(WebhookError, match="could not post") as unreachable:
        BabelQueueDeadLetterNotifier(webhook_conn_id="bq_gone", queue_names=[orders], timeout=2).notify({})
    for text in (message, str(unreachable.value), caplog.text):
        assert TOKEN not in text and "xoxsecretpath77" not in text and "abc123xyz" not in text
    monkeypatch.setenv("AIRFLOW_CONN_BQ_NOT_HTTP", json.dumps({"conn_type": "postgres", "host": "db"}))
    with pytest.raises(ConnectionConfigError, match="needs an 'http' connection"):
        BabelQueueDeadLetterNotifier(webhook_conn_id="bq_not_http", queue_names=[orders]).notify({})
    monkeypatch.setenv("AIRFLOW_CONN_BQ_FILE", json.dumps({"conn_type": "http", "host": "file:///etc/passwd"}))
    with pytest.raises(ConnectionConfigError, match="http:// or https:// URL"):
        BabelQueueDeadLetterNotifier(webhook_conn_id="bq_file", queue_names=[orders]).notify({})
    with pytest.raises(ValueError, match="top must be"):
        BabelQueueDeadLetterNotifier(webhook_conn_id="w", queue_names=["q"], top=-1)


def test_a_host_name_connection_with_an_endpoint(webhook: Webhook, monkeypatch: pytest.MonkeyPatch) -> None:
    port = webhook.server.server_address[1]
    monkeypatch.setenv("AIRFLOW_CONN_BQ_HOSTONLY", json.dumps(
        {"conn_type": "http", "host": "127.0.0.1", "port": port, "schema": "http"}))
    BabelQueueDeadLetterNotifier(webhook_conn_id="bq_hostonly", queue_names=[f"q-{uuid.uuid4().hex[:6]}"],
                                 endpoint="/hooks/dlq").notify({})
    request = webhook.requests[0]
    assert request["path"] == "/hooks/dlq" and "Authorization" not in request["headers"]


def test_a_broker_that_cannot_browse_gives_its_depth(webhook: Webhook, monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = define(monkeypatch, "bq_rabbitmq")
    queue = f"notify-{uuid.uuid4().hex[:8]}"
    hook = get_hook(conn_id)
    try:
        binding = hook.get_binding()
        _dead_letter(binding, queue, str(uuid.uuid4()), "boom 1", "E")
        deadline = time.monotonic() + 10
        while binding.dead_letter_depth(queue) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        hook.close()
    BabelQueueDeadLetterNotifier(webhook_conn_id="bq_webhook", babelqueue_conn_id=conn_id,
                                 queue_names=[queue]).notify({})
    posted = json.loads(webhook.requests[0]["body"])
    assert posted["babelqueue"]["queues"] == [
        {"queue_name": queue, "depth": 1, "browsable": False, "browsed": 0, "by_reason": {}, "by_source": {},
         "fingerprint_count": 0, "top_fingerprints": []}]
    assert "depth only" in posted["text"]


def test_as_task_and_dag_failure_callbacks_in_a_dag_run(webhook: Webhook, known_dlq: tuple[str, str, str]) -> None:
    orders, _, _ = known_dlq
    notifier = BabelQueueDeadLetterNotifier(webhook_conn_id="bq_webhook", queue_names=[orders],
                                            title="{{ ti.task_id }} failed in {{ dag.dag_id }}")
    dag_notifier = BabelQueueDeadLetterNotifier(webhook_conn_id="bq_webhook", queue_names=[orders],
                                                title="{{ dag.dag_id }} failed: {{ reason }}")
    with DAG(f"bq_notify_{uuid.uuid4().hex[:6]}", schedule=None, start_date=datetime.datetime(2026, 1, 1),
             on_failure_callback=dag_notifier) as dag:

        @task(on_failure_callback=notifier)
        def load_orders() -> None:
            raise RuntimeError("the load failed")

        load_orders()
    run = run_dag(dag)
    assert task_states(run) == {"load_orders": "failed"}
    assert len(webhook.requests) == 2  # the task's callback, then the DAG's
    posted, dag_posted = (json.loads(request["body"]) for request in webhook.requests)
    assert posted["text"].splitlines()[0] == f"load_orders failed in {dag.dag_id}"
    assert (posted["babelqueue"]["dag_id"], posted["babelqueue"]["task_id"]) == (dag.dag_id, "load_orders")
    assert posted["babelqueue"]["total_depth"] == 4
    assert dag_posted["text"].splitlines()[0] == f"{dag.dag_id} failed: task_failure"
    # (Airflow's DAG failure context carries the task instance that failed the run)
    assert (dag_posted["babelqueue"]["dag_id"], dag_posted["babelqueue"]["run_id"],
            dag_posted["babelqueue"]["task_id"]) == (dag.dag_id, run.run_id, "load_orders")
    assert dag_posted["babelqueue"]["queues"] == posted["babelqueue"]["queues"]
