"""The dead-letter console's read API inside Airflow's own API application (simple auth manager), against real
bindings: the embedded SQLite queue, Redis and RabbitMQ (which cannot browse)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.hooks import get_hook
from tests.bindings.conftest import reserve_all
from tests.connections import SPECS
from tests.observability.test_metrics import StatsdListener, statsd  # noqa: F401 - statsd is a fixture
from tests.plugins.common import airflow_api_client

pytestmark = pytest.mark.timeout(300)

API = "/babelqueue/console/api"
POISON = b"\xff\xfe not json <script>alert(1)</script>"


@dataclass
class Console:
    client: Any
    tokens: dict[str, str]
    queue: str
    bodies: dict[str, list[bytes]]

    def get(self, path: str, user: str | None = "viewer", **params: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.tokens[user]}"} if user else {}
        return self.client.get(API + path, headers=headers, params=params)

    def post(self, path: str, body: dict[str, Any], user: str | None = "op") -> Any:
        headers = {"Authorization": f"Bearer {self.tokens[user]}"} if user else {}
        return self.client.post(API + path, headers=headers, json=body)


def _fill(conn_id: str, queue: str) -> list[bytes]:
    """Three dead letters (two failed, one unknown URN) and a poison body, in this order; their stored bodies."""
    hook = get_hook(conn_id)
    try:
        binding = hook.get_binding()
        bodies = [bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n, "note": "<b>bold</b>"},
                                             queue_name=queue)) for n in range(3)] + [POISON]
        for body in bodies:
            binding.publish(body, queue)
        for message in sorted(reserve_all(binding, queue, 4), key=lambda m: bodies.index(m.body)):
            n = message.envelope["data"]["n"] if message.envelope else None
            if n is None:
                binding.dead_letter(message, bq.Reason.POISON, error="not JSON")
            elif n < 2:
                binding.dead_letter(message, bq.Reason.FAILED, error=f"timeout after {n}s", exception="TimeoutError")
            else:
                binding.dead_letter(message, bq.Reason.UNKNOWN_URN, error="no handler")
        binding.publish(bodies[0], queue)  # one ready message
        return [binding.browse_dead_letter_bytes(queue, i, i + 1)[0] for i in range(4)]  # type: ignore[index]
    finally:
        hook.close()


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    home = tmp_path_factory.mktemp("console")
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as patch:
        specs = {
            "bq_console_sqlite": {"conn_type": "babelqueue+sql", "host": str(Path(home) / "queue.sqlite")},
            "bq_console_redis": {**SPECS["bq_redis"], "extra": {"key_prefix": f"bqconsole{uuid.uuid4().hex[:6]}:"}},  # type: ignore[dict-item]
            "bq_console_rabbitmq": SPECS["bq_rabbitmq"],
        }
        for conn_id, spec in specs.items():
            patch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(spec))
        with create_session() as session:  # a connection in the metadata DB, with a secret the API must not show
            session.query(Connection).filter(Connection.conn_id == "bq_console_db").delete()
            session.add(Connection(conn_id="bq_console_db", conn_type="babelqueue+redis", host="10.0.0.7",
                                   password="s3cret-password", extra=json.dumps({"key_prefix": "hidden-prefix"})))
        bodies = {conn_id: _fill(conn_id, queue) for conn_id in ("bq_console_sqlite", "bq_console_redis")}
        for conn_id in ("bq_console_sqlite", "bq_console_redis"):  # the actions' own queue
            bodies[conn_id + ":act"] = _fill(conn_id, queue + "-act")
        client, tokens = airflow_api_client(patch)
        try:
            yield Console(client, tokens, queue, bodies)
        finally:
            from airflow.api_fastapi import app as api_app

            api_app.purge_cached_app()
            with create_session() as session:
                session.query(Connection).filter(Connection.conn_id == "bq_console_db").delete()


ROUTES = ["/connections", "/queues?conn_id=bq_console_sqlite&queue_name=q", "/dead-letters?conn_id=x&queue_name=q",
          "/dead-letters/0?conn_id=x&queue_name=q"]


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_refuses_anonymous_and_role_less_callers(console: Console, route: str) -> None:
    assert console.client.get(API + route).status_code == 401
    assert console.client.get(API + route, headers={"Authorization": "Bearer not.a.jwt"}).status_code == 403
    refused = console.client.get(API + route, headers={"Authorization": f"Bearer {console.tokens['norole']}"})
    assert refused.status_code == 403


def test_connections_are_listed_without_secrets(console: Console) -> None:
    answer = console.get("/connections")
    assert answer.status_code == 200
    listed = answer.json()["connections"]
    assert {"conn_id": "bq_console_db", "conn_type": "babelqueue+redis"} in listed
    assert {"conn_id": "bq_console_sqlite", "conn_type": "babelqueue+sql"} in listed  # an AIRFLOW_CONN_* one
    assert listed[0] == {"conn_id": "babelqueue_default", "conn_type": "babelqueue+sql"}
    assert "s3cret" not in answer.text and "10.0.0.7" not in answer.text and "hidden-prefix" not in answer.text


@pytest.mark.parametrize("conn_id", ["bq_console_sqlite", "bq_console_redis"])
def test_queue_depths(console: Console, conn_id: str) -> None:
    answer = console.get("/queues", conn_id=conn_id, queue_name=[console.queue])
    assert answer.status_code == 200, answer.text
    [row] = answer.json()["queues"]
    assert (row["depth"], row["dead_letter_depth"], row["can_browse"]) == (1, 4, True)
    assert isinstance(row["oldest_failed_at"], int)


@pytest.mark.parametrize("conn_id", ["bq_console_sqlite", "bq_console_redis"])
def test_pages_filter_by_reason_and_urn(console: Console, conn_id: str) -> None:
    page = console.get("/dead-letters", conn_id=conn_id, queue_name=console.queue).json()
    assert [(e["position"], e["reason"]) for e in page["entries"]] == [
        (0, "failed"), (1, "failed"), (2, "unknown_urn"), (3, "poison")]
    assert (page["depth"], page["scanned"], page["next_position"]) == (4, 4, None)
    failed = console.get("/dead-letters", conn_id=conn_id, queue_name=console.queue, reason=["failed"]).json()
    assert [e["position"] for e in failed["entries"]] == [0, 1]
    assert failed["entries"][0]["exception_type"] == "TimeoutError"
    assert failed["entries"][0]["fingerprint"] == failed["entries"][1]["fingerprint"]  # "timeout after <n>s"
    by_urn = console.get("/dead-letters", conn_id=conn_id, queue_name=console.queue, urn=["urn:babel:orders:*"])
    assert [e["position"] for e in by_urn.json()["entries"]] == [0, 1, 2]
    second = console.get("/dead-letters", conn_id=conn_id, queue_name=console.queue, limit=2, start=2).json()
    assert [e["position"] for e in second["entries"]] == [2, 3] and second["next_position"] == 4


@pytest.mark.parametrize("conn_id", ["bq_console_sqlite", "bq_console_redis"])
def test_one_dead_letter_is_its_exact_bytes(console: Console, conn_id: str) -> None:
    stored = console.bodies[conn_id]
    one = console.get("/dead-letters/0", conn_id=conn_id, queue_name=console.queue).json()
    assert one["body_text"].encode() == stored[0] and one["body_hex"] is None and one["size"] == len(stored[0])
    assert one["dead_letter"]["reason"] == "failed" and one["dead_letter"]["error"] == "timeout after 0s"
    assert one["envelope"]["data"]["note"] == "<b>bold</b>"  # data, as JSON text: never markup
    assert one["entry"]["trace_id"] == one["envelope"]["trace_id"]
    poison = console.get("/dead-letters/3", conn_id=conn_id, queue_name=console.queue).json()
    assert poison["entry"]["poison"]
    # Redis stores the SDKs' poison wrapper; the SQL table keeps the exact bytes with the reason, error and time in
    # its columns, and reads as the same wrapper (what a drain and triage get): the consumer's error shows
    assert poison["body_hex"] is None and poison["body_text"].encode() == stored[3]
    wrapper = poison_wrapper(stored[3])
    assert wrapper is not None and wrapper.raw == POISON
    assert (poison["entry"]["error"], poison["dead_letter"]["error"]) == ("not JSON", "not JSON")
    assert poison["entry"]["original_queue"] == console.queue and isinstance(poison["entry"]["failed_at"], int)
    assert console.get("/dead-letters/9", conn_id=conn_id, queue_name=console.queue).status_code == 404


def test_a_broker_that_cannot_browse_answers_with_its_depth_and_the_reason(console: Console) -> None:
    depths = console.get("/queues", conn_id="bq_console_rabbitmq", queue_name=["console-empty"])
    assert depths.status_code == 200 and depths.json()["queues"][0]["can_browse"] is False
    refused = console.get("/dead-letters", conn_id="bq_console_rabbitmq", queue_name="console-empty")
    assert refused.status_code == 409 and "without taking its messages" in refused.json()["detail"]


def test_an_unknown_connection_is_a_404(console: Console) -> None:
    answer = console.get("/dead-letters", conn_id="no_such_connection", queue_name="q")
    assert answer.status_code == 404 and "no_such_connection" in answer.json()["detail"]


# ------------------------------------------------------------------------------------------------------ actions


def _depth(conn_id: str, queue: str) -> int:
    hook = get_hook(conn_id)
    try:
        return hook.get_binding().depth(queue)
    finally:
        hook.close()


@pytest.mark.parametrize("path", ["/actions/replay", "/actions/export"])
def test_actions_refuse_anonymous_callers_and_viewers(console: Console, path: str) -> None:
    body = {"conn_id": "bq_console_sqlite", "queue_name": console.queue, "filter": {}}
    assert console.post(path, body, user=None).status_code == 401
    assert console.post(path, body, user="viewer").status_code == 403
    assert console.post(path, body, user="user").status_code == 403  # changing an asset is for op and admin


@pytest.mark.parametrize("conn_id", ["bq_console_sqlite", "bq_console_redis"])
def test_preview_then_replay_a_selection_once(console: Console, conn_id: str) -> None:
    queue = console.queue + "-act"
    page = console.get("/dead-letters", conn_id=conn_id, queue_name=queue, reason=["failed"]).json()
    chosen = {"conn_id": conn_id, "queue_name": queue, "positions": [e["position"] for e in page["entries"]],
              "meta_ids": [e["meta_id"] for e in page["entries"]]}
    assert len(chosen["positions"]) == 2 and _depth(conn_id, queue) == 1
    preview = console.post("/actions/replay", chosen).json()
    assert (preview["dry_run"], preview["selected"], preview["replayed"], preview["targets"]) == (
        True, 2, 2, {queue: 2})
    assert _depth(conn_id, queue) == 1  # a preview publishes nothing
    done = console.post("/actions/replay", {**chosen, "dry_run": False}).json()
    assert (done["replayed"], done["targets"], done["ledgers"]) == (2, {queue: 2}, [f"replay:{queue}"])
    assert _depth(conn_id, queue) == 3
    again = console.post("/actions/replay", {**chosen, "dry_run": False}).json()
    assert (again["replayed"], again["duplicates_avoided"]) == (0, 2)  # the ledger: a second click replays nothing
    assert _depth(conn_id, queue) == 3
    everything = console.post("/actions/replay", {"conn_id": conn_id, "queue_name": queue, "filter": {}}).json()
    # everything: the unknown-URN one would go; the two replayed are in the ledger; poison is never replayed
    assert (everything["selected"], everything["replayed"], everything["duplicates_avoided"],
            everything["skipped"]) == (4, 1, 2, {"poison": 1})
    actions = console.get("/actions").json()["actions"]
    mine = [a for a in actions if a["details"]["conn_id"] == conn_id and a["details"]["queue_name"] == queue]
    assert [(a["action"], a["who"], a["details"]["replayed"]) for a in mine[:4]] == [
        ("replay_preview", "op", 1), ("replay", "op", 0), ("replay", "op", 2), ("replay_preview", "op", 2)]
    assert mine[1]["details"]["duplicates_avoided"] == 2 and mine[2]["details"]["ledgers"] == [f"replay:{queue}"]


def test_a_selection_that_changed_is_refused(console: Console) -> None:
    body = {"conn_id": "bq_console_sqlite", "queue_name": console.queue, "positions": [0], "meta_ids": ["other"]}
    refused = console.post("/actions/replay", body)
    assert refused.status_code == 409 and "reload the page" in refused.json()["detail"]
    both = console.post("/actions/replay", {**body, "filter": {}})
    assert both.status_code == 422


@pytest.mark.parametrize("conn_id", ["bq_console_sqlite", "bq_console_redis"])
def test_export_gives_drain_records_of_the_exact_bytes(console: Console, conn_id: str) -> None:
    from airflow_provider_babelqueue.core.records import record_body

    answer = console.post("/actions/export", {"conn_id": conn_id, "queue_name": console.queue,
                                              "filter": {"reason": ["failed", "poison"]}})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/x-ndjson"
    records = [json.loads(line) for line in answer.content.splitlines()]
    stored = console.bodies[conn_id]
    assert [record_body(r) for r in records] == [stored[0], stored[1], stored[3]]
    assert {r["source_conn_id"] for r in records} == {conn_id}


@pytest.mark.parametrize("conn_id", ["bq_console_sqlite", "bq_console_redis"])
def test_discard_archives_exactly_the_removed_bytes(console: Console, conn_id: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_babelqueue.core.records import record_body

    monkeypatch.setenv("AIRFLOW__BABELQUEUE__OUTPUT_ROOT", str(tmp_path / "runs"))
    queue = console.queue + "-discard"
    stored = _fill(conn_id, queue)
    page = console.get("/dead-letters", conn_id=conn_id, queue_name=queue).json()["entries"]
    chosen = [page[1], page[3]]  # a failed one and the poison body
    body = {"conn_id": conn_id, "queue_name": queue, "positions": [e["position"] for e in chosen],
            "meta_ids": [e["meta_id"] for e in chosen]}
    assert console.post("/actions/discard", body, user="viewer").status_code == 403
    done = console.post("/actions/discard", body)
    assert done.status_code == 200, done.text
    answer = done.json()
    assert (answer["selected"], answer["archived"], answer["discarded"]) == (2, 2, 2)
    archive = Path(answer["archive"])
    assert archive.parent == tmp_path / "runs" / "console" / conn_id / queue
    records = [json.loads(line) for line in archive.read_bytes().splitlines()]
    assert [record_body(r) for r in records] == [stored[1], stored[3]]
    left = console.get("/dead-letters", conn_id=conn_id, queue_name=queue).json()
    assert [e["meta_id"] for e in left["entries"]] == [page[0]["meta_id"], page[2]["meta_id"]]
    assert left["depth"] == 2
    again = console.post("/actions/discard", body)  # those positions now hold other dead letters
    assert again.status_code == 409
    [last] = [a for a in console.get("/actions").json()["actions"] if a["action"] == "discard"
              and a["details"]["queue_name"] == queue and a["details"]["conn_id"] == conn_id]
    assert last["details"]["archive"] == str(archive) and last["who"] == "op"


def test_discard_is_refused_where_a_broker_cannot_remove_chosen_dead_letters(console: Console) -> None:
    body = {"conn_id": "bq_console_rabbitmq", "queue_name": "console-empty", "filter": {}}
    refused = console.post("/actions/discard", body)
    assert refused.status_code == 409
    assert refused.json()["detail"] == ("the rabbitmq binding cannot remove chosen dead letters; drain the queue "
                                        "instead")


def test_the_page_and_its_files_are_served_with_a_strict_policy(console: Console) -> None:
    from airflow_provider_babelqueue.plugins.page import CONTENT_SECURITY_POLICY

    assert console.client.get("/babelqueue/console/").status_code == 401
    page = console.client.get("/babelqueue/console/", headers={"Authorization": f"Bearer {console.tokens['viewer']}"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe" not in CONTENT_SECURITY_POLICY
    assert '<script src="app.js" defer></script>' in page.text and "<script>" not in page.text  # no inline script
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css")):
        served = console.client.get(f"/babelqueue/console/{name}",
                                    headers={"Authorization": f"Bearer {console.tokens['viewer']}"})
        assert served.status_code == 200 and served.headers["content-type"].startswith(kind)
    script = console.client.get("/babelqueue/console/app.js",
                                headers={"Authorization": f"Bearer {console.tokens['viewer']}"}).text
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "eval(" not in script


def test_the_console_is_in_the_ui_navigation() -> None:
    from airflow_provider_babelqueue.plugins.plugin import BabelQueuePlugin

    assert BabelQueuePlugin.external_views == [{"name": "BabelQueue", "href": "/babelqueue/console/",
                                                "destination": "nav", "url_route": "babelqueue"}]


def test_reading_depths_sends_the_dlq_depth_gauge(console: Console, statsd: StatsdListener) -> None:  # noqa: F811
    assert console.get("/queues", conn_id="bq_console_sqlite", queue_name=[console.queue]).status_code == 200
    name = f"airflow.babelqueue.dlq_depth.bq_console_sqlite.{console.queue.replace('.', '_')}"
    assert f"{name}:4|g" in statsd.collect()


def test_a_framed_dead_letter_shows_its_headers(console: Console) -> None:
    """The Python SDK's dead letter with headers, as it stored it on Redis (its ``.dlq`` list, a header frame)."""
    import redis

    from tests.test_frames import capture

    raw = capture("python-redis-dead-letter-headers")
    prefix = json.loads(os.environ["AIRFLOW_CONN_BQ_CONSOLE_REDIS"])["extra"]["key_prefix"]
    queue = console.queue + "-framed"
    client = redis.Redis(host="127.0.0.1", port=6379)
    client.rpush(f"{prefix}{queue}.dlq", raw)
    one = console.get("/dead-letters/0", conn_id="bq_console_redis", queue_name=queue).json()
    assert one["body_text"].encode() == raw
    assert one["headers"] == {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                              "x-tenant": "acme-eu"}
    assert one["dead_letter"]["error"] == "card declined by issuer" and one["entry"]["reason"] == "failed"
    assert one["entry"]["trace_id"] == "6f3f72e7-8857-40ab-ade4-38c099cb369a"
    plain = console.get("/dead-letters/0", conn_id="bq_console_redis", queue_name=console.queue).json()
    assert plain["headers"] == {}


def test_queues_of_a_connection_are_those_it_names_and_those_the_broker_lists(
        console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    answer = console.get("/queues", conn_id="bq_console_sqlite").json()
    names = [row["queue_name"] for row in answer["queues"]]
    assert answer["configured"] == [] and answer["listed"] == names and names == sorted(names)
    assert {console.queue, console.queue + "-act"} <= set(names)
    [row] = [row for row in answer["queues"] if row["queue_name"] == console.queue]
    [named] = console.get("/queues", conn_id="bq_console_sqlite", queue_name=[console.queue]).json()["queues"]
    assert row == named and (row["depth"], row["dead_letter_depth"]) == (1, 4)

    rabbit = console.get("/queues", conn_id="bq_console_rabbitmq").json()
    assert (rabbit["queues"], rabbit["configured"], rabbit["listed"]) == ([], [], None)  # AMQP lists no queues
    told = {**SPECS["bq_rabbitmq"], "extra": {"console_queues": "console-told, console-empty"}}
    monkeypatch.setenv("AIRFLOW_CONN_BQ_CONSOLE_TOLD", json.dumps(told))
    answer = console.get("/queues", conn_id="bq_console_told").json()
    assert answer["configured"] == ["console-told", "console-empty"] and answer["listed"] is None
    assert [(row["queue_name"], row["depth"], row["dead_letter_depth"]) for row in answer["queues"]] == [
        ("console-told", 0, 0), ("console-empty", 0, 0)]
    monkeypatch.setenv("AIRFLOW_CONN_BQ_CONSOLE_TOLD", json.dumps({**told, "extra": {"console_queues": [1]}}))
    refused = console.get("/queues", conn_id="bq_console_told")
    assert refused.status_code == 422 and "console_queues" in refused.json()["detail"]
