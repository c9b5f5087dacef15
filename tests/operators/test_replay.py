"""Replay operator: drain + replay inside real DAGs on every broker, then the finer behaviour via execute()."""

from __future__ import annotations

import collections
import datetime
import gzip
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis as redis_client
import sqlalchemy
from airflow.sdk import DAG

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding, PublishBatchError
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.core.records import drain_record, record_body
from airflow_provider_babelqueue.engine.replay import copy_digest
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.operators import replay as replay_module
from airflow_provider_babelqueue.operators.drain import BabelQueueDrainDeadLettersOperator
from airflow_provider_babelqueue.operators.replay import BabelQueueReplayOperator
from tests.airflow_harness import run_dag, task_states, xcom
from tests.operators.test_drain import POISON, NoBrowseBinding, dead_letter, envelope_body, read_records, use_bindings

PG = {"conn_type": "babelqueue_sql", "host": "127.0.0.1", "port": 5432, "login": "postgres", "schema": "test"}
REDIS = {"conn_type": "babelqueue_redis", "host": "127.0.0.1", "port": 6379}
BROKERS = ["sqlite-default", "postgresql", "redis"]


def reserve_all(binding: Binding, queue_name: str) -> list[ReceivedMessage]:
    out = []
    while (message := binding.reserve(queue_name)) is not None:
        out.append(message)
        binding.ack(message)
    return out


def expected_reset(stored: bytes) -> bytes:
    return bq.encode(bq.reset_for_replay(bq.decode(stored)))


@pytest.fixture(params=BROKERS)
def conn_id(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A connection id per broker, with its own tables / key prefix, cleaned up afterwards."""
    tag = uuid.uuid4().hex[:8]
    if request.param == "sqlite-default":
        monkeypatch.delenv("AIRFLOW_CONN_BABELQUEUE_DEFAULT", raising=False)
        yield "babelqueue_default"  # the embedded SQLite file in $AIRFLOW_HOME; queue names are unique
        return
    if request.param == "postgresql":
        table = f"rp_{tag}"
        monkeypatch.setenv("AIRFLOW_CONN_BQ_REPLAY_PG", json.dumps(PG | {"extra": {"dialect": "postgresql",
                                                                                   "table": table}}))
        yield "bq_replay_pg"
        engine = sqlalchemy.create_engine("postgresql+psycopg2://postgres@127.0.0.1:5432/test")
        with engine.begin() as conn:
            for name in (table, f"{table}_failed", f"{table}_seen"):
                conn.execute(sqlalchemy.text(f'DROP TABLE IF EXISTS "{name}"'))
        engine.dispose()
        return
    prefix = f"bqreplay:{tag}:"
    monkeypatch.setenv("AIRFLOW_CONN_BQ_REPLAY_REDIS", json.dumps(REDIS | {"extra": {"key_prefix": prefix}}))
    yield "bq_replay_redis"
    client = redis_client.Redis(host="127.0.0.1", port=6379)
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


def seed_mixed(binding: Binding, queue_name: str, other_queue: str) -> dict[str, list[bytes]]:
    """Queue: 3 failed (GatewayTimeout), 2 unknown_urn, a poison body, an unsupported schema version;
    other queue: 2 failed. Returns the DLQ bytes as stored, per queue, in DLQ order."""
    for index in range(3):
        dead_letter(binding, queue_name, envelope_body(queue_name, index))
    for index in range(3, 5):
        dead_letter(binding, queue_name, envelope_body(queue_name, index, "urn:babel:orders:mystery"),
                    "unknown_urn", exception=None, error=None)
    dead_letter(binding, queue_name, POISON, "poison", exception=None)
    newer = bq.make_envelope("urn:babel:orders:created", {"order_id": 9}, queue_name=queue_name)
    newer["meta"]["schema_version"] = 2
    dead_letter(binding, queue_name, bq.encode(newer), "unsupported_schema_version", exception=None)
    for index in range(2):
        dead_letter(binding, other_queue, envelope_body(other_queue, 10 + index))
    return {q: [m.body for m in binding.browse_dead_letters(q, limit=100)] for q in (queue_name, other_queue)}


def test_drain_and_replay_in_a_dag(conn_id: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    queue_name, other_queue = f"orders-{tag}", f"refunds-{tag}"
    hook = get_hook(conn_id)
    binding = hook.get_binding()
    try:
        stored = seed_mixed(binding, queue_name, other_queue)
        good = stored[queue_name][:5] + stored[other_queue]
        sources = [{"babelqueue_conn_id": conn_id, "queue_name": q} for q in (queue_name, other_queue)]
        copy_path = "{{ ti.xcom_pull(task_ids='copy')['path'] }}"
        with DAG(f"bq_drain_replay_{tag}", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
            copy = BabelQueueDrainDeadLettersOperator(task_id="copy", sources=sources, mode="browse",
                                                      destination=str(tmp_path / "copy"))
            replay_file = BabelQueueReplayOperator(task_id="replay_file", source_conn_id=conn_id,
                                                   replay_set=copy_path)
            redrive = BabelQueueReplayOperator(task_id="redrive", source_conn_id=conn_id, queue_name=queue_name)
            move = BabelQueueDrainDeadLettersOperator(task_id="move", sources=sources,
                                                      destination=str(tmp_path / "moved"))
            again = BabelQueueReplayOperator(task_id="again", source_conn_id=conn_id, replay_set=copy_path)
            copy >> replay_file >> redrive >> move >> again
        run = run_dag(dag)
        assert task_states(run) == {t: "success" for t in ("copy", "replay_file", "redrive", "move", "again")}

        copied = xcom(run, "copy")
        assert copied["records"] == 9 and Path(copied["path"]).stat().st_size == copied["bytes"]
        assert copied["by_source"] == {f"{conn_id}/{queue_name}": 7, f"{conn_id}/{other_queue}": 2}
        records = read_records(copied["path"])
        assert [record_body(r) for r in records] == stored[queue_name] + stored[other_queue]  # byte for byte
        # the poison body (not UTF-8) sits in its DLQ as a poison wrapper: a UTF-8 record holding it exactly
        assert [r["body_encoding"] for r in records].count("base64") == 0
        assert [w.raw for w in map(poison_wrapper, (record_body(r) for r in records)) if w is not None] == [POISON]
        assert {r["broker"] for r in records} == {binding.name}
        assert [r["dead_letter_queue"] for r in records] == [binding.dead_letter_name(queue_name)] * 7 + [
            binding.dead_letter_name(other_queue)] * 2

        skipped = {"poison": 1, "unsupported_schema_version": 1}
        assert xcom(run, "replay_file") == {"replayed": 7, "skipped": skipped, "duplicates_avoided": 0,
                                            "duplicates_kept": 0, "dry_run": False,
                                            "targets": {queue_name: 5, other_queue: 2}}
        assert xcom(run, "redrive") == {"replayed": 0, "skipped": skipped, "duplicates_avoided": 5,
                                        "duplicates_kept": 0, "dry_run": False, "targets": {}}
        moved = xcom(run, "move")
        assert moved["records"] == 4 and moved["by_source"] == {f"{conn_id}/{queue_name}": 2,
                                                                f"{conn_id}/{other_queue}": 2}
        assert sorted(record_body(r) for r in read_records(moved["path"])) == sorted(
            stored[queue_name][5:] + stored[other_queue])
        assert xcom(run, "again") == {"replayed": 0, "skipped": skipped, "duplicates_avoided": 7,
                                      "duplicates_kept": 0, "dry_run": False, "targets": {}}

        assert binding.dead_letter_depth(queue_name) == 0 and binding.dead_letter_depth(other_queue) == 0
        replayed = reserve_all(binding, queue_name) + reserve_all(binding, other_queue)
        assert [m.body for m in replayed] == [expected_reset(body) for body in good]
        for message, original in zip(replayed, good, strict=True):
            env, before = message.envelope, bq.decode(original)
            assert env["attempts"] == 0 and "dead_letter" not in env
            assert env["meta"] == before["meta"] and env["trace_id"] == before["trace_id"]
            assert env["data"] == before["data"]
        assert len(binding.seen_store(f"replay:{queue_name}")) == 5
        assert len(binding.seen_store(f"replay:{other_queue}")) == 2
    finally:
        hook.close()


# ------------------------------------------------------------------------------- direct execute() tests


def run_replay(**kwargs: Any) -> dict[str, Any]:
    return BabelQueueReplayOperator(task_id="replay", **kwargs).execute(context={})


def seed_good(binding: Binding, queue_name: str, count: int) -> list[bytes]:
    for index in range(count):
        dead_letter(binding, queue_name, envelope_body(queue_name, index))
    return [m.body for m in binding.browse_dead_letters(queue_name, limit=1000)]


def write_lines(path: Path, lines: Sequence[bytes]) -> str:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


@pytest.mark.parametrize("broker", [MemoryBinding, NoBrowseBinding], ids=["browsable", "not-browsable"])
def test_dry_run_touches_nothing(monkeypatch: pytest.MonkeyPatch, broker: type[MemoryBinding]) -> None:
    binding = broker()
    for index in range(3):
        dead_letter(binding, "orders", envelope_body("orders", index))
    dead_letter(binding, "orders", POISON, "poison")
    before = [(m.body, m.meta_id) for m in MemoryBinding.browse_dead_letters(binding, "orders", 100)]
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    result = run_replay(source_conn_id="bq", queue_name="orders", dry_run="True")
    assert result == {"replayed": 3, "skipped": {"poison": 1}, "duplicates_avoided": 0, "duplicates_kept": 0,
                      "dry_run": True, "targets": {"orders": 3}}
    after = [(m.body, m.meta_id) for m in MemoryBinding.browse_dead_letters(binding, "orders", 100)]
    assert after == before  # same bytes, same order; nothing reserved any more
    assert binding.depth("orders") == 0 and len(binding.seen_store("replay:orders")) == 0
    real = run_replay(source_conn_id="bq", queue_name="orders")
    assert real == result | {"dry_run": False}
    assert binding.dead_letter_depth("orders") == 1 and binding.depth("orders") == 3


def test_rate_limit_is_a_lower_bound_on_the_run_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    binding = MemoryBinding()
    lines = [envelope_body("orders", i) for i in range(6)]
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    started = time.monotonic()
    result = run_replay(source_conn_id="bq", replay_set=write_lines(tmp_path / "set.jsonl", lines),
                        max_messages_per_second=20)
    elapsed = time.monotonic() - started
    assert result["replayed"] == 6 and elapsed >= 5 / 20
    assert [m.body for m in reserve_all(binding, "orders")] == [expected_reset(b) for b in lines]


def annotated(index: int, *, queue_name: str = "orders", urn: str = "urn:babel:orders:created",
              reason: str = "failed", exception: str | None = "App\\Exceptions\\GatewayTimeout",
              age_seconds: float = 60) -> bytes:
    env = bq.make_envelope(urn, {"i": index}, queue_name=queue_name)
    return bq.encode(bq.annotate_dead_letter(env, reason, original_queue=queue_name, attempts=3,
                                             exception=exception, failed_at=bq.now_ms() - int(age_seconds * 1000)))


def selection_set() -> list[bytes]:
    """Built when the test runs: ages are relative to now."""
    return [
        annotated(0),
        annotated(1, reason="unknown_urn", urn="urn:babel:orders:mystery", exception=None),
        annotated(2, exception="app.errors.Timeout", age_seconds=7200),
        annotated(3, queue_name="refunds", age_seconds=3600),
        annotated(4, reason="invalid_data", exception="ValueError", age_seconds=30),
    ]


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        ({}, [0, 1, 2, 3, 4]),
        ({"reasons": ["unknown_urn", "invalid_data"]}, [1, 4]),
        ({"reasons": "unknown_urn, invalid_data"}, [1, 4]),  # templated text
        ({"urns": ["urn:babel:orders:mystery"]}, [1]),
        ({"exception_types": ["GatewayTimeout"]}, [0, 3]),
        ({"exception_types": '["app.errors.Timeout", "ValueError"]'}, [2, 4]),
        ({"original_queues": ["refunds"]}, [3]),
        ({"min_age_seconds": 600}, [2, 3]),
        ({"max_age_seconds": "45"}, [4]),
        ({"min_age_seconds": 45, "max_age_seconds": 5000, "reasons": ["failed"]}, [0, 3]),
    ],
)
def test_selection_filters(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, selection: dict[str, Any],
                           expected: list[int]) -> None:
    binding = MemoryBinding()
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    result = run_replay(source_conn_id="bq", replay_set=write_lines(tmp_path / "s.jsonl", selection_set()),
                        target_queue_name="replayed", **selection)
    assert result["replayed"] == len(expected) and result["targets"] == ({"replayed": len(expected)}
                                                                         if expected else {})
    assert result["skipped"] == ({"not_selected": 5 - len(expected)} if len(expected) < 5 else {})
    got = [m.envelope["data"]["i"] for m in reserve_all(binding, "replayed")]
    assert got == expected


@pytest.mark.parametrize("as_url", [False, True], ids=["local-path", "file-url"])
def test_replay_set_lines_folders_and_unusable_lines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     as_url: bool) -> None:
    binding = MemoryBinding()
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    first, second, third = (annotated(i) for i in range(3))
    record = drain_record(ReceivedMessage(second, "orders", bq.decode(second), None, 0), broker="redis",
                          dead_letter_queue="orders:failed", source_conn_id="x", drained_at=1).rstrip(b"\n")
    poison = drain_record(ReceivedMessage(POISON, "orders", None, "bad", 0), broker="redis",
                          dead_letter_queue="orders:failed", source_conn_id="x", drained_at=1).rstrip(b"\n")
    no_id = bq.decode(annotated(5))
    del no_id["meta"]["id"]
    folder = tmp_path / "set"
    (folder / "reason=failed").mkdir(parents=True)
    write_lines(folder / "part-00000.jsonl", [first, record, record, poison])  # a staging duplicate
    (folder / "reason=failed" / "part-00001.json.gz").write_bytes(gzip.compress(third + b"\n"))
    write_lines(folder / "part-00002.jsonl", [orjson.dumps(no_id), b'{"job":"urn:x","trace'])  # torn last line
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / ".part-00000.jsonl.crc").write_bytes(b"\x00crc")
    result = run_replay(source_conn_id="bq", replay_set=f"file://{folder}" if as_url else str(folder))
    assert result == {"replayed": 3, "skipped": {"poison": 1, "missing_meta_id": 1, "unreadable_line": 1},
                      "duplicates_avoided": 1, "duplicates_kept": 0, "dry_run": False, "targets": {"orders": 3}}
    assert sorted(m.body for m in reserve_all(binding, "orders")) == sorted(
        expected_reset(b) for b in (first, second, third))


def test_target_on_another_broker_sql_to_redis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"bqreplay:{uuid.uuid4().hex[:8]}:"
    monkeypatch.setenv("AIRFLOW_CONN_BQ_SRC_SQLITE",
                       json.dumps({"conn_type": "babelqueue_sql", "host": str(tmp_path / "src.sqlite")}))
    monkeypatch.setenv("AIRFLOW_CONN_BQ_DST_REDIS", json.dumps(REDIS | {"extra": {"key_prefix": prefix}}))
    source_hook, target_hook = get_hook("bq_src_sqlite"), get_hook("bq_dst_redis")
    source, target = source_hook.get_binding(), target_hook.get_binding()
    try:
        stored = seed_good(source, "orders", 3)
        dead_letter(source, "orders", POISON, "poison")
        result = run_replay(source_conn_id="bq_src_sqlite", queue_name="orders", target_conn_id="bq_dst_redis",
                            target_queue_name="orders-v2", replay_bypass_header=True)
        logged = capsys.readouterr().out  # the task logger writes structured lines to stdout outside a task
        assert logged.count("replay_bypass_header is ignored: the redis binding of 'bq_dst_redis' cannot carry "
                            "headers") == 1
        assert result == {"replayed": 3, "skipped": {"poison": 1}, "duplicates_avoided": 0, "duplicates_kept": 0,
                          "dry_run": False, "targets": {"orders-v2": 3}}
        assert target.client.lrange(f"{prefix}orders-v2", 0, -1) == [expected_reset(b) for b in stored]
        assert source.dead_letter_depth("orders") == 1  # the poison body stays
        assert len(target.seen_store("replay:orders-v2")) == 3  # the ledger defaults to the target connection
    finally:
        source_hook.close()
        keys = list(target.client.scan_iter(match=f"{prefix}*"))
        if keys:
            target.client.delete(*keys)
        target_hook.close()


def test_bypass_header_where_the_broker_carries_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    binding = MemoryBinding()
    seed_good(binding, "orders", 2)
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    assert run_replay(source_conn_id="bq", queue_name="orders", replay_bypass_header=True)["replayed"] == 2
    assert [dict(m.headers) for m in reserve_all(binding, "orders")] == [{"bq-replay-bypass": 1}] * 2


def test_a_message_that_failed_again_after_its_replay_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    binding = MemoryBinding()
    seed_good(binding, "orders", 1)
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    assert run_replay(source_conn_id="bq", queue_name="orders")["replayed"] == 1
    consumer = binding.reserve("orders")
    binding.dead_letter(consumer, "failed", error="failed again after the replay", exception="X")
    result = run_replay(source_conn_id="bq", queue_name="orders")
    assert (result["replayed"], result["duplicates_avoided"], result["duplicates_kept"]) == (0, 1, 1)
    assert binding.dead_letter_depth("orders") == 1  # never deleted as a "duplicate"
    binding.seen_store("replay:orders").forget(consumer.meta_id)  # an operator decides to replay it again
    assert run_replay(source_conn_id="bq", queue_name="orders")["replayed"] == 1


def test_ledger_order_publish_remember_ack(monkeypatch: pytest.MonkeyPatch) -> None:
    """Crash after remember, before ack: the DLQ copy is acked next run, nothing re-published. Crash after
    publish, before remember (simulated fault): published once more next run, then never again."""
    binding = MemoryBinding()
    stored = seed_good(binding, "orders", 2)
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    ids, digests = binding.seen_store("replay:orders"), binding.seen_store("replay:orders:copies")
    ids.remember(bq.meta_id_of(bq.decode(stored[0])))
    digests.remember(copy_digest(stored[0]))
    store_class = type(ids)
    real_remember_many = store_class.remember_many
    calls = {"n": 0}

    def remember_many_fails_once(self: Any, keys: list[str]) -> None:  # the engine remembers a batch at once
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("ledger unreachable (simulated fault)")
        real_remember_many(self, keys)

    monkeypatch.setattr(store_class, "remember_many", remember_many_fails_once)
    with pytest.raises(ConnectionError, match="simulated fault"):
        run_replay(source_conn_id="bq", queue_name="orders")
    # stored[1] was published but not remembered: its DLQ copy was released; so was the copy of stored[0],
    # whose ack (a duplicate's ack waits for the batch) had not happened yet.
    assert binding.depth("orders") == 1 and binding.dead_letter_depth("orders") == 2
    result = run_replay(source_conn_id="bq", queue_name="orders")
    assert (result["replayed"], result["duplicates_avoided"]) == (1, 1)
    assert binding.depth("orders") == 2 and binding.dead_letter_depth("orders") == 0  # one extra copy, at most
    assert run_replay(source_conn_id="bq", queue_name="orders")["replayed"] == 0
    assert [m.body for m in reserve_all(binding, "orders")] == [expected_reset(stored[1])] * 2


def test_partial_batch_failure_settles_what_was_delivered(monkeypatch: pytest.MonkeyPatch) -> None:
    class Flaky(MemoryBinding):
        def publish_batch(self, bodies: Sequence[bytes], queue_name: str) -> None:
            super().publish_batch([b for i, b in enumerate(bodies) if i != 1], queue_name)
            raise PublishBatchError("body 1 refused (simulated fault)", [1])

    source, target = MemoryBinding(), Flaky()
    stored = seed_good(source, "orders", 3)
    use_bindings(monkeypatch, replay_module, {"src": source, "dst": target})
    with pytest.raises(PublishBatchError):
        run_replay(source_conn_id="src", queue_name="orders", target_conn_id="dst", batch_size=3)
    assert [m.body for m in source.browse_dead_letters("orders")] == [stored[1]]
    assert target.depth("orders") == 2 and len(target.seen_store("replay:orders")) == 2


def test_explicit_ledger_and_max_messages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    binding = MemoryBinding()
    seed_good(binding, "orders", 5)
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    first = run_replay(source_conn_id="bq", queue_name="orders", max_messages="2", ledger_name="incident-42")
    assert first["replayed"] == 2 and binding.dead_letter_depth("orders") == 3
    assert len(binding.seen_store("incident-42")) == 2 and len(binding.seen_store("replay:orders")) == 0
    rest = run_replay(source_conn_id="bq", queue_name="orders", ledger_name="incident-42")
    assert rest["replayed"] == 3 and binding.dead_letter_depth("orders") == 0


def test_optional_names_rendered_as_unset_are_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """``{{ params.target_queue }}`` for an unset param renders ``None``: the dead letters go back to their own
    queue on the source connection, with the default ledger, never to a queue called "None"."""
    binding = MemoryBinding()
    seed_good(binding, "orders", 3)
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    result = run_replay(source_conn_id="bq", queue_name="orders", target_queue_name="None", target_conn_id="None",
                        ledger_conn_id=" ", ledger_name="None")
    assert result["replayed"] == 3 and result["targets"] == {"orders": 3}
    assert binding.depth("orders") == 3 and binding.depth("None") == 0
    assert len(binding.seen_store("replay:orders")) == 3 and len(binding.seen_store("None")) == 0


def test_validation_errors() -> None:
    with pytest.raises(ValueError, match="either queue_name"):
        BabelQueueReplayOperator(task_id="r")
    with pytest.raises(ValueError, match="either queue_name"):
        BabelQueueReplayOperator(task_id="r", queue_name="a", replay_set="/tmp/x.jsonl")
    with pytest.raises(ValueError, match="max_messages_per_second"):
        BabelQueueReplayOperator(task_id="r", queue_name="a", max_messages_per_second=0)
    operator = BabelQueueReplayOperator(task_id="r", queue_name="a", min_age_seconds=10, max_age_seconds=5)
    with pytest.raises(ValueError, match="nothing could match"):
        operator.execute(context={})


# ------------------------------------------------------------------------------------------- batching


class Recording(MemoryBinding):
    """Logs the batch calls of a replay, in order, on one memory broker (source, target and ledger)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int]] = []

    def publish_batch(self, bodies: Sequence[bytes], queue_name: str) -> None:
        self.events.append(("publish_batch", len(bodies)))
        super().publish_batch(bodies, queue_name)

    def ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        self.events.append(("ack_many", len(messages)))
        super().ack_many(messages)

    def reserve_dead_letters(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        taken = super().reserve_dead_letters(queue_name, limit, timeout)
        self.events.append(("reserve_dead_letters", len(taken)))
        return taken

    def seen_store(self, name: str) -> Any:
        store, events = super().seen_store(name), self.events
        kind = "digests" if name.endswith(":copies") else "ids"

        class Logged:
            def seen(self, key: str) -> bool:
                events.append((f"seen {kind}", 1))
                return store.seen(key)

            def seen_many(self, keys: Sequence[str]) -> set[str]:
                events.append((f"seen_many {kind}", len(keys)))
                return store.seen_many(keys)

            def remember(self, key: str) -> None:
                events.append((f"remember {kind}", 1))
                store.remember(key)

            def remember_many(self, keys: Sequence[str]) -> None:
                events.append((f"remember_many {kind}", len(keys)))
                store.remember_many(keys)

            def forget(self, key: str) -> None:
                store.forget(key)

            def __len__(self) -> int:
                return len(store)

        return Logged()


def test_a_redrive_works_a_batch_at_a_time_in_ledger_order(monkeypatch: pytest.MonkeyPatch) -> None:
    binding = Recording()
    stored = seed_good(binding, "orders", 7)
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    binding.events.clear()
    result = run_replay(source_conn_id="bq", queue_name="orders", batch_size=3)
    assert result["replayed"] == 7 and binding.dead_letter_depth("orders") == 0
    batch = [("seen_many ids", 3), ("publish_batch", 3), ("remember_many digests", 3), ("remember_many ids", 3),
             ("ack_many", 3)]
    assert binding.events == [
        ("reserve_dead_letters", 3), *batch, ("reserve_dead_letters", 3), *batch,
        ("reserve_dead_letters", 1), ("reserve_dead_letters", 0),  # the DLQ is empty: the last one is flushed
        ("seen_many ids", 1), ("remember_many digests", 1), ("remember_many ids", 1), ("ack_many", 1),
    ]  # (a batch of one is published with publish()); no per-message ledger lookups or acks anywhere
    assert [m.body for m in reserve_all(binding, "orders")] == [expected_reset(b) for b in stored]


def test_duplicates_within_one_batch_follow_the_digest_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_babelqueue.bindings.memory import _Stored

    binding = MemoryBinding()
    first, second = annotated(0), annotated(1)
    failed_again = bq.decode(first)
    failed_again["dead_letter"]["error"] = "failed again after the replay"
    changed = bq.encode(failed_again)  # same meta.id as `first`, other bytes
    for body in (first, second, first, changed):  # exact DLQ bytes: a staging duplicate and a changed copy
        binding._dead.setdefault(binding.dead_letter_name("orders"), collections.deque()).append(_Stored(body, {}))
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    result = run_replay(source_conn_id="bq", queue_name="orders", batch_size=10)  # all four in one lookup batch
    assert (result["replayed"], result["duplicates_avoided"], result["duplicates_kept"]) == (2, 2, 1)
    assert [m.body for m in binding.browse_dead_letters("orders")] == [changed]  # the identical copy was acked
    assert [m.body for m in reserve_all(binding, "orders")] == [expected_reset(first), expected_reset(second)]
    again = run_replay(source_conn_id="bq", queue_name="orders")
    assert (again["replayed"], again["duplicates_avoided"], again["duplicates_kept"]) == (0, 1, 1)
    assert [m.body for m in binding.browse_dead_letters("orders")] == [changed]


def test_a_crash_between_the_two_remembers_republishes_instead_of_keeping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Digests are remembered before meta.ids: a crash in between leaves the meta.id unknown, so the next run
    publishes the message once more (allowed) instead of keeping its DLQ copy as if it had failed again."""
    binding = MemoryBinding()
    stored = seed_good(binding, "orders", 2)
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    store_class = type(binding.seen_store("replay:orders"))
    real_remember_many = store_class.remember_many
    calls = {"n": 0}

    def second_remember_fails(self: Any, keys: list[str]) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the meta.id remember of the first batch, after its digests
            raise ConnectionError("ledger unreachable (simulated fault)")
        real_remember_many(self, keys)

    monkeypatch.setattr(store_class, "remember_many", second_remember_fails)
    with pytest.raises(ConnectionError, match="simulated fault"):
        run_replay(source_conn_id="bq", queue_name="orders")
    assert binding.depth("orders") == 2 and binding.dead_letter_depth("orders") == 2
    result = run_replay(source_conn_id="bq", queue_name="orders")
    assert (result["replayed"], result["duplicates_kept"]) == (2, 0) and binding.dead_letter_depth("orders") == 0
    assert [m.body for m in reserve_all(binding, "orders")] == [expected_reset(b) for b in stored] * 2


def test_max_messages_never_reserves_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    binding = Recording()
    seed_good(binding, "orders", 9)
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    binding.events.clear()
    assert run_replay(source_conn_id="bq", queue_name="orders", max_messages=4, batch_size=3)["replayed"] == 4
    assert [n for event, n in binding.events if event == "reserve_dead_letters"] == [3, 1]
    assert binding.dead_letter_depth("orders") == 5 and not [e for e in binding.events if e[0] == "release"]


def test_the_engine_module_imports_no_airflow_and_no_broker_client() -> None:
    code = ("import sys, airflow_provider_babelqueue.engine.replay; "
            "print(sorted({m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out.replace("'", '"')))
    forbidden = {"airflow", "redis", "pika", "boto3", "botocore", "sqlalchemy", "psycopg2", "pyspark", "jsonschema"}
    assert "orjson" in loaded and not loaded & forbidden, sorted(loaded & forbidden)


def test_a_failure_mid_batch_gives_every_reservation_back_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    class LedgerDown(MemoryBinding):
        def __init__(self) -> None:
            super().__init__()
            self.lookups = 0

        def seen_store(self, name: str) -> Any:
            store, owner = super().seen_store(name), self

            class Failing:
                def seen_many(self, keys: Sequence[str]) -> set[str]:
                    owner.lookups += 1
                    if owner.lookups == 2:  # the second batch's lookup
                        raise ConnectionError("ledger unreachable (simulated fault)")
                    return store.seen_many(keys)

                def __getattr__(self, name: str) -> Any:
                    return getattr(store, name)

            return Failing()

    binding = LedgerDown()
    stored = seed_good(binding, "orders", 8)
    dead_letter(binding, "orders", POISON, "poison")  # skipped: held until the end
    wrapped = binding.browse_dead_letters("orders")[-1].body  # the poison wrapper holding POISON
    use_bindings(monkeypatch, replay_module, {"bq": binding})
    with pytest.raises(ConnectionError, match="simulated fault"):
        run_replay(source_conn_id="bq", queue_name="orders", batch_size=3)
    assert binding.depth("orders") == 3  # the first batch was published, remembered and acked
    assert binding.dead_letter_depth("orders") == 6  # everything else is back now, not after a timeout
    assert sorted(m.body for m in binding.browse_dead_letters("orders")) == sorted([*stored[3:], wrapped])


def test_an_unusable_ledger_gives_the_reserved_batch_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_babelqueue.bindings.base import NotSupportedError

    class NoLedger(MemoryBinding):
        def seen_store(self, name: str) -> Any:
            raise NotSupportedError("the noledger binding cannot hold an idempotency store")

    source = MemoryBinding()
    seed_good(source, "orders", 5)
    use_bindings(monkeypatch, replay_module, {"src": source, "dst": NoLedger()})
    with pytest.raises(NotSupportedError, match="ledger_conn_id"):
        run_replay(source_conn_id="src", queue_name="orders", target_conn_id="dst", batch_size=3)
    assert source.dead_letter_depth("orders") == 5  # the three reserved ones are back at once
