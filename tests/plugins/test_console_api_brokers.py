"""The dead-letter console's API (read routes and actions) inside Airflow's own API application, against the brokers
``test_console_api.py`` leaves out: Amazon SQS on moto's server, Azure Service Bus on the AMQP test double (it can
peek its dead-letter queue's head) and Apache Pulsar on the fake broker and its admin HTTP server (neither SQS nor
Pulsar can read a dead-letter queue without taking its messages).

Each connection is an ``AIRFLOW_CONN_*`` variable opened by the API through ``get_hook``, as in production; only
Pulsar's client is the fake broker's (no Pulsar broker runs here). Every queue holds two ready messages and four dead
letters: two failed (``TimeoutError``), one unknown URN and one poison body, in that order."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar
import pytest

from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.hooks import get_hook
from tests.bindings.asb_double import shared_double
from tests.bindings.conftest import kept, reserve_all
from tests.bindings.pulsar_fake import fake_pulsar
from tests.connections import spec
from tests.plugins.common import airflow_api_client
from tests.plugins.test_console_api import API, POISON, Console

pytestmark = pytest.mark.timeout(300)

SQS, ASB, PULSAR = "bq_console_sqs", "bq_console_asb", "bq_console_pulsar"
LEDGER = "bq_console_ledger"  # a SQLite queue that holds replay ledgers for Service Bus
CONN_IDS = [SQS, ASB, PULSAR]
CANNOT_BROWSE = [SQS, PULSAR]
BROKER = {SQS: "sqs", ASB: "azure-service-bus", PULSAR: "pulsar"}
CONN_TYPE = {SQS: "babelqueue+sqs", ASB: "babelqueue+servicebus", PULSAR: "babelqueue+pulsar"}
#: Unique secrets of this module's connections, which no answer may contain.
SECRET = uuid.uuid4().hex[:12]
SQS_KEY_ID, SQS_SECRET_KEY = f"AKIACONSOLE{SECRET.upper()}", f"sqs-secret-{SECRET}"
ASB_KEY, PULSAR_TOKEN = f"asb-sas-key-{SECRET}", f"pulsar-token-{SECRET}"
URN = "urn:babel:orders:created"
READY, DEAD = 2, 4
#: Why a broker that cannot browse refuses to page its dead letters (``engine/browse.py``).
CANNOT_READ = "cannot read a dead-letter queue without taking its messages"
ACTIONS = ["/actions/replay", "/actions/export", "/actions/discard"]


@dataclass
class BrokerConsole(Console):
    """The console of ``test_console_api.py`` with what this module's connections hide: their secrets (passwords,
    tokens, connection strings, endpoint URLs)."""

    secrets: list[str] = field(default_factory=list)

    def assert_no_secret(self, text: str) -> None:
        leaked = [secret for secret in self.secrets if secret in text]
        assert not leaked, f"the answer shows {leaked}: {text[:500]}"


def _dead_letters(conn_id: str, queue: str) -> list[bytes]:
    """Four dead letters (two failed, one unknown URN, one poison body, in this order) and then two ready messages on
    ``queue``; the dead letters' stored bytes as the binding peeks them (none where it cannot browse)."""
    hook = get_hook(conn_id)
    try:
        binding = hook.get_binding()
        bodies = [bq.encode(bq.make_envelope(URN, {"n": n}, queue_name=queue)) for n in range(3)] + [POISON]
        verdicts = [(bq.Reason.FAILED, "timeout after 0s", "TimeoutError"),
                    (bq.Reason.FAILED, "timeout after 1s", "TimeoutError"),
                    (bq.Reason.UNKNOWN_URN, "no handler", None), (bq.Reason.POISON, "not JSON", None)]
        for body in bodies:
            binding.publish(body, queue)
        taken = sorted(reserve_all(binding, queue, DEAD), key=lambda m: bodies.index(m.body))
        assert [m.body for m in taken] == bodies, f"{conn_id}: reserved {len(taken)} of {DEAD}"
        for message, (reason, error, exception) in zip(taken, verdicts, strict=True):
            binding.dead_letter(message, reason, error=error, exception=exception)
        for body in bodies[:READY]:
            binding.publish(body, queue)
        return [m.body for m in binding.browse_dead_letters(queue, 10)] if binding.can_browse else []
    finally:
        hook.close()


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerConsole]:
    from airflow.api_fastapi import app as api_app

    from tests.bindings.sqs_server import delete_queues_except, queue_urls, sqs_client

    home = tmp_path_factory.mktemp("console-brokers")
    double = shared_double()
    queue = f"console-{uuid.uuid4().hex[:8]}"
    sqs = sqs_client()
    before = queue_urls(sqs)
    with pytest.MonkeyPatch.context() as patch, contextmanager(fake_pulsar)(token=PULSAR_TOKEN) as (broker, admin):
        patch.setattr(pulsar, "Client", broker.client)  # what the Pulsar hook's binding opens: the fake's client
        sqs_spec = spec("bq_sqs")
        assert sqs_spec is not None
        asb_string = double.connection_string.replace("SAS_KEY_VALUE", ASB_KEY)  # the double checks no key
        specs = {
            SQS: {**sqs_spec, "login": SQS_KEY_ID, "password": SQS_SECRET_KEY},
            # "none": read the written DLQ (the native sub-queue) alone; each read of the SDKs' plain <queue>.dlq,
            # absent here, costs the double's not-found link a second per request
            ASB: {"conn_type": "babelqueue+servicebus", "password": asb_string,
                  "extra": {"connection_verify": double.ca_file, "create_queues": True, "dead_letter_sources": "none"}},
            LEDGER: {"conn_type": "babelqueue+sql", "host": str(home / "ledger.sqlite")},
            PULSAR: {"conn_type": "babelqueue+pulsar", "host": "127.0.0.1", "port": 6650, "password": PULSAR_TOKEN,
                     "extra": {"admin_url": admin.url}},
        }
        for conn_id, value in specs.items():
            patch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(value))
        fills = [(conn_id, "") for conn_id in CONN_IDS] + [(ASB, "-act"), (ASB, "-replay")]  # the actions' queues
        with ThreadPoolExecutor(len(fills)) as pool:  # each fill opens its own hook
            filling = {conn_id + suffix: pool.submit(_dead_letters, conn_id, queue + suffix)
                       for conn_id, suffix in fills}
            stored = {key: future.result() for key, future in filling.items()}
        client, tokens = airflow_api_client(patch)
        secrets = [SQS_KEY_ID, SQS_SECRET_KEY, sqs_spec["extra"]["endpoint_url"], ASB_KEY, asb_string,
                   f"127.0.0.1:{double.port}", double.ca_file, PULSAR_TOKEN, admin.url, "127.0.0.1"]
        try:
            yield BrokerConsole(client, tokens, queue, stored, secrets)
        finally:
            api_app.purge_cached_app()
            delete_queues_except(sqs, before)
            for name in [name for name in list(double.entities) if name.startswith(queue)]:
                double.delete_queue(name)


def _row(console: BrokerConsole, conn_id: str, queue: str, expected: tuple[int, int]) -> dict[str, Any]:
    """``GET /queues``'s row for ``queue``, read again for up to 5 s until its depths are ``expected`` (SQS's
    counts are approximate attributes, eventually consistent on AWS)."""
    deadline = time.monotonic() + 5
    while True:
        answer = console.get("/queues", conn_id=conn_id, queue_name=[queue])
        assert answer.status_code == 200, answer.text
        console.assert_no_secret(answer.text)
        [row] = answer.json()["queues"]
        if (row["depth"], row["dead_letter_depth"]) == expected or time.monotonic() > deadline:
            assert answer.json()["broker"] == BROKER[conn_id]
            return row
        time.sleep(0.2)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ------------------------------------------------------------------------------------------------------ who may call


GET_ROUTES = [(None, "/connections"), (None, "/actions")] + [
    (conn_id, route) for conn_id in CONN_IDS for route in ("/queues", "/dead-letters", "/dead-letters/0")]


@pytest.mark.parametrize(("conn_id", "route"), GET_ROUTES)
def test_every_route_refuses_anonymous_and_role_less_callers(console: BrokerConsole, conn_id: str | None,
                                                             route: str) -> None:
    params = {"conn_id": conn_id, "queue_name": console.queue} if conn_id else {}
    assert console.client.get(API + route, params=params).status_code == 401
    assert console.client.get(API + route, params=params, headers=_bearer("not.a.jwt")).status_code == 403
    assert console.client.get(API + route, params=params, headers=_bearer(console.tokens["norole"])).status_code == 403


@pytest.mark.parametrize("path", ACTIONS)
@pytest.mark.parametrize("conn_id", CONN_IDS)
def test_actions_refuse_anonymous_role_less_and_read_only_callers(console: BrokerConsole, conn_id: str,
                                                                  path: str) -> None:
    body = {"conn_id": conn_id, "queue_name": console.queue, "filter": {}}
    assert console.post(path, body, user=None).status_code == 401
    assert console.client.post(API + path, json=body, headers=_bearer("not.a.jwt")).status_code == 403
    assert console.post(path, body, user="norole").status_code == 403
    assert console.post(path, body, user="viewer").status_code == 403
    assert console.post(path, body, user="user").status_code == 403  # changing an asset is for op and admin


# ------------------------------------------------------------------------------------------------------ reading


def test_connections_are_listed_by_id_and_type_without_secrets(console: BrokerConsole) -> None:
    answer = console.get("/connections")
    assert answer.status_code == 200
    listed = answer.json()["connections"]
    for conn_id in CONN_IDS:
        assert {"conn_id": conn_id, "conn_type": CONN_TYPE[conn_id]} in listed
    assert all(set(entry) == {"conn_id", "conn_type"} for entry in listed)
    console.assert_no_secret(answer.text)
    assert "SharedAccessKey" not in answer.text and "endpoint" not in answer.text.lower()


@pytest.mark.parametrize("conn_id", CONN_IDS)
def test_queue_depths_are_the_ready_and_dead_letter_counts(console: BrokerConsole, conn_id: str) -> None:
    row = _row(console, conn_id, console.queue, (READY, DEAD))
    assert (row["queue_name"], row["depth"], row["dead_letter_depth"]) == (console.queue, READY, DEAD)
    assert row["can_browse"] is (conn_id == ASB) and row["can_discard"] is False
    assert row["dead_letter_sources"] == {
        SQS: [f"{console.queue}-failed", f"{console.queue}-dlq"],
        ASB: [f"{console.queue}/$DeadLetterQueue"],
        PULSAR: [f"persistent://public/default/{console.queue}.dlq"],
    }[conn_id]
    if conn_id == ASB:  # the oldest dead letter's failed_at, read from the peeked head
        first = json.loads(console.bodies[ASB][0])
        assert isinstance(row["oldest_failed_at"], int)
        assert row["oldest_failed_at"] == first["dead_letter"]["failed_at"]
    else:  # not readable without taking it
        assert row["oldest_failed_at"] is None
    empty = _row(console, conn_id, console.queue + "-none", (0, 0))
    assert (empty["depth"], empty["dead_letter_depth"], empty["oldest_failed_at"]) == (0, 0, None)


def _asb_page(console: BrokerConsole, queue: str, **params: Any) -> dict[str, Any]:
    answer = console.get("/dead-letters", conn_id=ASB, queue_name=queue, **params)
    assert answer.status_code == 200, answer.text
    console.assert_no_secret(answer.text)
    return answer.json()


def test_service_bus_pages_its_head_filtered_by_reason_and_urn(console: BrokerConsole) -> None:
    stored = console.bodies[ASB]
    whole = _asb_page(console, console.queue)
    assert [(e["position"], e["reason"], e["error"]) for e in whole["entries"]] == [
        (0, "failed", "timeout after 0s"), (1, "failed", "timeout after 1s"), (2, "unknown_urn", "no handler"),
        (3, "poison", "not JSON")]
    assert (whole["depth"], whole["scanned"], whole["next_position"], whole["head_only"]) == (DEAD, DEAD, None, True)
    assert [e["size"] for e in whole["entries"]] == [len(raw) for raw in stored]
    assert [e["meta_id"] for e in whole["entries"]] == [json.loads(raw)["meta"]["id"] for raw in stored[:3]] + [None]
    assert [e["poison"] for e in whole["entries"]] == [False, False, False, True]
    failed = _asb_page(console, console.queue, reason=["failed"])
    assert [e["position"] for e in failed["entries"]] == [0, 1] and failed["next_position"] is None
    assert {e["exception_type"] for e in failed["entries"]} == {"TimeoutError"}
    assert failed["entries"][0]["fingerprint"] == failed["entries"][1]["fingerprint"]  # "timeout after <n>s"
    assert failed["entries"] == whole["entries"][:2]
    # two reasons, from position 1, two at most: the page stops after the poison one and says where to go on
    paged = _asb_page(console, console.queue, reason=["failed", "poison"], start=1, limit=2)
    assert [e["position"] for e in paged["entries"]] == [1, 3] and paged["next_position"] == 4
    by_urn = _asb_page(console, console.queue, urn=["urn:babel:orders:*"], reason=["unknown_urn"])
    assert by_urn["entries"] == [whole["entries"][2]]


def test_service_bus_gives_one_dead_letter_as_its_exact_bytes(console: BrokerConsole) -> None:
    stored = console.bodies[ASB]
    first = console.get("/dead-letters/0", conn_id=ASB, queue_name=console.queue)
    assert first.status_code == 200, first.text
    console.assert_no_secret(first.text)
    one = first.json()
    assert one["body_text"].encode() == stored[0] and one["body_hex"] is None and one["size"] == len(stored[0])
    assert one["envelope"]["data"] == {"n": 0} and one["envelope"]["job"] == URN
    assert (one["dead_letter"]["reason"], one["dead_letter"]["error"], one["dead_letter"]["exception"]) == (
        "failed", "timeout after 0s", "TimeoutError")
    assert one["entry"]["position"] == 0 and one["entry"]["trace_id"] == one["envelope"]["trace_id"]
    poison = console.get("/dead-letters/3", conn_id=ASB, queue_name=console.queue).json()
    assert poison["body_text"].encode() == stored[3] and poison["size"] == len(stored[3])
    assert poison["entry"]["poison"] and kept(stored[3]) == POISON  # Service Bus keeps the bytes in the SDKs' wrapper
    assert poison["dead_letter"]["reason"] == "poison"
    missing = console.get("/dead-letters/9", conn_id=ASB, queue_name=console.queue)
    assert missing.status_code == 404 and "no dead letter at position 9" in missing.json()["detail"]


@pytest.mark.parametrize("conn_id", CANNOT_BROWSE)
def test_a_broker_that_cannot_browse_refuses_pages_with_the_reason_and_keeps_its_depth(console: BrokerConsole,
                                                                                       conn_id: str) -> None:
    for params in ({}, {"reason": ["failed"]}, {"start": 2, "limit": 1}):
        refused = console.get("/dead-letters", conn_id=conn_id, queue_name=console.queue, **params)
        assert refused.status_code == 409, refused.text
        detail = refused.json()["detail"]
        assert f"the {BROKER[conn_id]} binding {CANNOT_READ}" in detail and f"its depth ({DEAD})" in detail
        console.assert_no_secret(refused.text)
    row = _row(console, conn_id, console.queue, (READY, DEAD))
    assert (row["depth"], row["dead_letter_depth"], row["can_browse"]) == (READY, DEAD, False)


@pytest.mark.parametrize("conn_id", CANNOT_BROWSE)
def test_one_dead_letter_of_a_broker_that_cannot_browse_is_refused_with_the_reason(console: BrokerConsole,
                                                                                  conn_id: str) -> None:
    # The queue holds four dead letters: "no dead letter at position 0" (404) would be false; the page route's
    # answer (409: the broker cannot read them without taking them) is the true one.
    refused = console.get("/dead-letters/0", conn_id=conn_id, queue_name=console.queue)
    assert refused.status_code == 409, refused.text
    assert f"the {BROKER[conn_id]} binding {CANNOT_READ}" in refused.json()["detail"], refused.text
    console.assert_no_secret(refused.text)


# ------------------------------------------------------------------------------------------------------ actions


def _audited(console: BrokerConsole, conn_id: str, queue: str) -> list[dict[str, Any]]:
    """``GET /actions``'s entries for one queue, newest first."""
    answer = console.get("/actions", limit=500)
    assert answer.status_code == 200, answer.text
    return [a for a in answer.json()["actions"]
            if a["details"].get("conn_id") == conn_id and a["details"].get("queue_name") == queue]


def _cannot_discard(conn_id: str) -> str:
    return f"the {BROKER[conn_id]} binding cannot remove chosen dead letters; drain the queue instead"


@pytest.mark.parametrize("conn_id", CANNOT_BROWSE)
def test_actions_on_a_broker_that_cannot_browse_are_refused_with_the_reason(
        console: BrokerConsole, conn_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__OUTPUT_ROOT", str(tmp_path / "runs"))
    everything = {"conn_id": conn_id, "queue_name": console.queue, "filter": {}}
    failed = {**everything, "filter": {"reason": ["failed"]}}
    reads = f"the {BROKER[conn_id]} binding {CANNOT_READ}"
    cases: list[tuple[str, dict[str, Any], str]] = [
            ("/actions/replay", everything, reads),
            ("/actions/replay", {**failed, "dry_run": False, "ledger_conn_id": LEDGER}, reads),
            ("/actions/export", everything, reads), ("/actions/export", failed, reads),
            ("/actions/discard", everything, _cannot_discard(conn_id)),
            ("/actions/discard", failed, _cannot_discard(conn_id))]
    for path, body, reason in cases:
        refused = console.post(path, body)
        assert refused.status_code == 409, (path, refused.text)
        assert reason in refused.json()["detail"], (path, refused.text)
        console.assert_no_secret(refused.text)
    row = _row(console, conn_id, console.queue, (READY, DEAD))
    assert (row["depth"], row["dead_letter_depth"]) == (READY, DEAD)  # nothing replayed, nothing removed
    assert not (tmp_path / "runs").exists()  # no discard archive
    assert _audited(console, conn_id, console.queue) == []  # a refused action is not an action taken


@pytest.mark.parametrize("conn_id", CANNOT_BROWSE)
def test_a_selection_on_a_broker_that_cannot_browse_is_refused_with_the_reason(console: BrokerConsole,
                                                                              conn_id: str) -> None:
    # Positions name dead letters the broker cannot read: the reason is that, not "the queue changed, reload the
    # page and select again" (no page of this queue can be loaded at all).
    body = {"conn_id": conn_id, "queue_name": console.queue, "positions": [0], "meta_ids": ["any"]}
    for path, reason in [("/actions/discard", _cannot_discard(conn_id)),
                         ("/actions/replay", f"the {BROKER[conn_id]} binding {CANNOT_READ}"),
                         ("/actions/export", f"the {BROKER[conn_id]} binding {CANNOT_READ}")]:
        refused = console.post(path, body)
        assert refused.status_code == 409, (path, refused.text)
        assert reason in refused.json()["detail"], (path, refused.text)


def _asb_selection(console: BrokerConsole, suffix: str, *positions: int) -> dict[str, Any]:
    """A selection of the dead letters at ``positions`` of ``console.queue + suffix``, as a page shows them: each
    position with its ``meta.id`` (``None`` for the poison body, the last one)."""
    stored = console.bodies[ASB + suffix]
    return {"conn_id": ASB, "queue_name": console.queue + suffix, "positions": list(positions),
            "meta_ids": [json.loads(stored[p])["meta"]["id"] if p < 3 else None for p in positions]}


def test_service_bus_previews_a_replay_that_needs_no_ledger(console: BrokerConsole) -> None:
    queue = console.queue + "-act"
    poison = _asb_selection(console, "-act", 3)
    answer = console.post("/actions/replay", poison)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"selected": 1, "ledgers": [], "replayed": 0, "skipped": {"poison": 1},
                             "duplicates_avoided": 0, "duplicates_kept": 0, "dry_run": True, "targets": {}}
    latest = _audited(console, ASB, queue)[0]
    assert (latest["action"], latest["who"], latest["details"]["selected"]) == ("replay_preview", "op", 1)
    row = _row(console, ASB, queue, (READY, DEAD))
    assert (row["depth"], row["dead_letter_depth"]) == (READY, DEAD)  # a preview publishes nothing


def test_service_bus_replay_without_a_ledger_connection(console: BrokerConsole) -> None:
    queue = console.queue + "-act"
    chosen = _asb_selection(console, "-act", 0, 1)
    audited = _audited(console, ASB, queue)
    for body in (chosen, {**chosen, "dry_run": False}):
        answer = console.post("/actions/replay", body)
        # with no ledger_conn_id the ledger would live on the queue's own connection, and a Service Bus queue
        # cannot hold one: the preview (which reads the ledger to count duplicates) and the replay are refused,
        # 409, naming ledger_conn_id.
        assert answer.status_code == 409, (body, answer.text)
        detail = answer.json()["detail"]
        assert "the azure-service-bus binding cannot hold an idempotency store" in detail, detail
        assert "set ledger_conn_id to a connection that can hold the replay ledger" in detail, detail
        console.assert_no_secret(answer.text)
    row = _row(console, ASB, queue, (READY, DEAD))
    assert (row["depth"], row["dead_letter_depth"]) == (READY, DEAD)  # nothing published
    assert _audited(console, ASB, queue) == audited  # a refused action is not an action taken


def test_service_bus_replays_once_with_a_ledger_on_another_connection(console: BrokerConsole) -> None:
    queue = console.queue + "-replay"
    chosen = {**_asb_selection(console, "-replay", 0, 1), "ledger_conn_id": LEDGER}
    preview = console.post("/actions/replay", chosen)
    assert preview.status_code == 200, preview.text
    assert preview.json() == {"selected": 2, "ledgers": [], "replayed": 2, "skipped": {}, "duplicates_avoided": 0,
                              "duplicates_kept": 0, "dry_run": True, "targets": {queue: 2}}
    done = console.post("/actions/replay", {**chosen, "dry_run": False})
    assert done.status_code == 200, done.text
    assert done.json() == {"selected": 2, "ledgers": [f"replay:{queue}"], "replayed": 2, "skipped": {},
                           "duplicates_avoided": 0, "duplicates_kept": 0, "dry_run": False, "targets": {queue: 2}}
    again = console.post("/actions/replay", {**chosen, "dry_run": False})  # the ledger: a second click replays none
    assert again.status_code == 200, again.text
    assert (again.json()["replayed"], again.json()["duplicates_avoided"]) == (0, 2)
    row = _row(console, ASB, queue, (READY + 2, DEAD))
    assert (row["depth"], row["dead_letter_depth"]) == (READY + 2, DEAD)  # published once; the dead letters stay
    assert [(a["action"], a["details"]["replayed"], a["details"]["ledger_conn_id"])
            for a in _audited(console, ASB, queue)] == [
        ("replay", 0, LEDGER), ("replay", 2, LEDGER), ("replay_preview", 2, LEDGER)]
    hook = get_hook(ASB)
    try:  # the queue: the two ready messages as published, then the two dead letters back without their block
        binding = hook.get_binding()
        taken = reserve_all(binding, queue, READY + 2)
        binding.ack_many(taken)
    finally:
        hook.close()
    stored = [json.loads(raw) for raw in console.bodies[ASB + "-replay"][:2]]
    envelopes = [m.envelope or {} for m in taken]
    assert [e["meta"]["id"] for e in envelopes[:READY]] == [e["meta"]["id"] for e in stored]
    assert [(e["meta"]["id"], e["data"], "dead_letter" in e) for e in envelopes[READY:]] == [
        (e["meta"]["id"], e["data"], False) for e in stored]


def test_service_bus_exports_drain_records_of_the_exact_bytes(console: BrokerConsole) -> None:
    from airflow_provider_babelqueue.core.records import record_body

    stored = console.bodies[ASB]
    answer = console.post("/actions/export", {"conn_id": ASB, "queue_name": console.queue,
                                              "filter": {"reason": ["failed", "poison"]}})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-ndjson"
    assert answer.headers["content-disposition"] == (
        f'attachment; filename="{ASB}-{console.queue}-dead-letters.jsonl"')
    console.assert_no_secret(answer.text)
    records = [json.loads(line) for line in answer.content.splitlines()]
    assert [record_body(r) for r in records] == [stored[0], stored[1], stored[3]]
    assert [(r["body"].encode(), r["body_encoding"]) for r in records] == [
        (stored[0], "utf-8"), (stored[1], "utf-8"), (stored[3], "utf-8")]
    assert {(r["broker"], r["queue_name"], r["dead_letter_queue"], r["source_conn_id"]) for r in records} == {
        ("azure-service-bus", console.queue, f"{console.queue}/$DeadLetterQueue", ASB)}
    assert [r["meta_id"] for r in records] == [json.loads(stored[0])["meta"]["id"],
                                               json.loads(stored[1])["meta"]["id"], ""]  # "": poison has none
    assert kept(record_body(records[2])) == POISON
    one = console.post("/actions/export", _asb_selection(console, "", 2))
    assert one.status_code == 200, one.text
    assert [record_body(json.loads(line)) for line in one.content.splitlines()] == [stored[2]]
    audited = _audited(console, ASB, console.queue)
    assert [(a["action"], a["who"], a["details"]["exported"]) for a in audited[:2]] == [
        ("export", "op", 1), ("export", "op", 3)]
    assert audited[1]["details"]["selection"] == {"filter": {"reason": ["failed", "poison"]}}
    row = _row(console, ASB, console.queue, (READY, DEAD))
    assert row["dead_letter_depth"] == DEAD  # an export removes nothing


def test_service_bus_refuses_a_selection_that_changed(console: BrokerConsole) -> None:
    body = {"conn_id": ASB, "queue_name": console.queue, "positions": [0], "meta_ids": ["another-meta-id"]}
    refused = console.post("/actions/export", body)
    assert refused.status_code == 409, refused.text
    assert "position 0" in refused.json()["detail"] and "reload the page" in refused.json()["detail"]
    gone = console.post("/actions/replay", {**body, "positions": [7], "meta_ids": [None]})
    assert gone.status_code == 409 and "position 7" in gone.json()["detail"], gone.text
    assert console.post("/actions/export", {**body, "filter": {}}).status_code == 422  # positions or a filter


def test_service_bus_refuses_to_discard_chosen_dead_letters(console: BrokerConsole, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__OUTPUT_ROOT", str(tmp_path / "runs"))
    queue = console.queue + "-act"
    chosen = _asb_selection(console, "-act", 1, 3)
    for body in (chosen, {"conn_id": ASB, "queue_name": queue, "filter": {}}):
        refused = console.post("/actions/discard", body)
        assert refused.status_code == 409, refused.text
        assert refused.json()["detail"] == _cannot_discard(ASB)
    row = _row(console, ASB, queue, (READY, DEAD))
    assert (row["depth"], row["dead_letter_depth"]) == (READY, DEAD)
    assert [a for a in _audited(console, ASB, queue) if a["action"] == "discard"] == []
    assert not (tmp_path / "runs").exists()  # refused before anything was archived
