"""Dead-letter sources: one DLQ written, every DLQ read, on every binding that reads more than one.

The official SDKs' workers dead-letter to ``<queue>.dlq``; we write the spec's name (``:failed`` / ``.failed`` /
``$DeadLetterQueue`` / ``<table>_failed``). Each test puts one dead letter of ours in the written DLQ and the
exact bytes a Node worker left behind (``interop/peer-captures``) in a peer source, on the real broker, then
checks that counts, browses, drains and redrives take both, each message naming its own source, and that a
source that does not exist is never created by a read.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.core.records import record_body
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, drain_dead_letters
from airflow_provider_babelqueue.engine.replay import Replayer, feed_from_dead_letters
from tests.bindings.conftest import FACTORIES, RABBITMQ_HOST, RABBITMQ_PORT

CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "interop" / "peer-captures"
KINDS = ["memory", "sql-sqlite", "sql-postgresql", "redis", "rabbitmq", "azure-service-bus", "pulsar"]


def capture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CAPTURES / f"{name}.json").read_text(encoding="utf-8"))
    data["raw"] = base64.b64decode(data["body_b64"])
    return data


@dataclass
class Peer:
    """A binding plus what a peer SDK's worker does on its broker: push exact bytes onto its own DLQ.

    :ivar push: ``push(queue) -> source``: stores the peer's dead letter for ``queue``, returns the DLQ's name as
        the binding's ``dead_letter_sources`` lists it.
    :ivar exists: whether the peer's DLQ of a queue exists on the broker (``None``: not observable).
    """

    binding: Binding
    raw: bytes
    push: Callable[[str], str]
    exists: Callable[[str], bool] | None


def _sql_peer(binding: Any, raw: bytes, cleanups: list[Callable[[], None]]) -> Peer:
    import sqlalchemy as sa

    from airflow_provider_babelqueue.bindings.sql.schema import dead_letter_table

    name = f"{binding.config.table}_dlq"
    engine = sa.create_engine(binding.config.url)
    table = dead_letter_table(name, sa.MetaData())

    def push(queue: str) -> str:
        table.create(engine, checkfirst=True)  # what the peer's own migration made
        with engine.begin() as conn:
            conn.execute(sa.insert(table), [{"queue": queue, "urn": "urn:babel:orders:charge-card", "attempts": 2,
                                             "reason": "failed", "failed_at": bq.now_ms(), "payload": raw}])
        return name

    def drop() -> None:
        table.drop(engine, checkfirst=True)
        engine.dispose()

    cleanups.append(drop)
    return Peer(binding, raw, push, lambda _queue: sa.inspect(engine).has_table(name))


def _rabbitmq_peer(binding: Any, cleanups: list[Callable[[], None]]) -> Peer:
    import pika

    data = capture("node-rabbitmq-dead-letter")
    connection = pika.BlockingConnection(pika.ConnectionParameters(RABBITMQ_HOST, RABBITMQ_PORT))
    made: list[str] = []

    def push(queue: str) -> str:
        name = f"{queue}.dlq"
        channel = connection.channel()
        channel.queue_declare(name, durable=True)  # the capture's peer declared it first, as here
        made.append(name)
        channel.basic_publish("", name, data["raw"], pika.BasicProperties(**data["amqp_properties"]))
        channel.close()
        return name

    def exists(queue: str) -> bool:
        channel = connection.channel()
        try:
            channel.queue_declare(f"{queue}.dlq", passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404
            return False
        channel.close()
        return True

    def drop() -> None:
        channel = connection.channel()
        for name in made:
            channel.queue_delete(name)
        connection.close()

    cleanups.append(drop)
    return Peer(binding, data["raw"], push, exists)


@pytest.fixture(params=KINDS)
def peer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Peer]:
    kind: str = request.param
    cleanups: list[Callable[[], None]] = []
    raw = capture("node-redis-dead-letter")["raw"]
    options: dict[str, Any] = {"sql-sqlite": {"dead_letter_sources": "_dlq"},
                               "sql-postgresql": {"dead_letter_sources": ["_dlq"]},
                               "pulsar": {"dead_letter_sources": ".legacy"}}.get(kind, {})
    binding: Any = FACTORIES[kind](tmp_path, cleanups, **options)
    if kind == "memory":
        found = Peer(binding, raw, lambda q: binding.put_dead_letter(raw, f"{q}.dlq") or f"{q}.dlq",
                     lambda q: f"{q}.dlq" in binding._dead)
    elif kind.startswith("sql"):
        found = _sql_peer(binding, raw, cleanups)
    elif kind == "redis":
        def redis_push(queue: str) -> str:
            binding.client.rpush(f"{binding.config.key_prefix}{queue}.dlq", raw)
            return f"{binding.config.key_prefix}{queue}.dlq"

        found = Peer(binding, raw, redis_push, lambda q: bool(binding.client.exists(
            *(f"{binding.config.key_prefix}{q}.dlq{tail}" for tail in ("", ":processing", ":processing:deadlines")))))
    elif kind == "rabbitmq":
        found = _rabbitmq_peer(binding, cleanups)
    elif kind == "azure-service-bus":
        from tests.bindings.asb_double import shared_double

        def asb_push(queue: str) -> str:
            binding.publish(raw, f"{queue}.dlq")  # creates the plain queue, as the peer's provisioning did
            return f"{queue}.dlq"

        found = Peer(binding, raw, asb_push, lambda q: f"{q}.dlq".lower() in shared_double().entities)
    else:  # pulsar: every SDK writes <queue>.dlq there, which is what we write; an extra topic is configured
        def pulsar_push(queue: str) -> str:
            binding.publish(raw, f"{queue}.legacy")
            return f"persistent://public/default/{queue}.legacy"

        found = Peer(binding, raw, pulsar_push, None)
    yield found
    for cleanup in reversed(cleanups):
        cleanup()


@pytest.fixture
def queue_name() -> str:
    return f"dls-{uuid.uuid4().hex[:10]}"


def dead_letter_ours(binding: Binding, queue_name: str) -> bytes:
    """Publish, reserve and dead-letter one message of ours; returns what was published."""
    body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": 1}, queue_name=queue_name))
    binding.publish(body, queue_name)
    message = binding.reserve(queue_name, timeout=3)
    assert message is not None
    binding.dead_letter(message, bq.Reason.FAILED, error="boom", exception="RuntimeError")
    return body


def both(peer: Peer, queue_name: str) -> tuple[str, str]:
    """Ours in the written DLQ, the peer's in its own: ``(written name, peer source name)``."""
    dead_letter_ours(peer.binding, queue_name)
    source = peer.push(queue_name)
    written = peer.binding.dead_letter_name(queue_name)
    assert source != written
    assert peer.binding.dead_letter_sources(queue_name)[0] == written
    assert source in peer.binding.dead_letter_sources(queue_name)
    return written, source


def drained(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_counts_browses_and_drains_take_every_source(peer: Peer, queue_name: str, tmp_path: Path) -> None:
    binding = peer.binding
    written, source = both(peer, queue_name)
    assert binding.dead_letter_depth(queue_name) == 2

    if binding.can_browse:
        browsed = binding.browse_dead_letters(queue_name)
        assert [m.dead_letter_source for m in browsed] == [written, source]
        assert browsed[1].body == peer.raw and all(m.from_dead_letter for m in browsed)
        copy = drain_dead_letters([DrainSource(binding, queue_name, "c")], LocalFileSink(tmp_path / "copy.jsonl"),
                                  mode="browse")
        assert copy.records == 2 and binding.dead_letter_depth(queue_name) == 2
        records = drained(tmp_path / "copy.jsonl")
        assert [r["dead_letter_queue"] for r in records] == [written, source]
        assert record_body(records[1]) == peer.raw

    result = drain_dead_letters([DrainSource(binding, queue_name, "c")], LocalFileSink(tmp_path / "move.jsonl"))
    assert result.records == 2 and result.by_source == {f"c/{queue_name}": 2}
    records = drained(tmp_path / "move.jsonl")
    assert {r["dead_letter_queue"]: record_body(r) == peer.raw for r in records} == {written: False, source: True}
    assert all(r["queue_name"] == queue_name for r in records)
    assert binding.dead_letter_depth(queue_name) == 0
    assert binding.reserve_dead_letter(queue_name, timeout=0) is None


def test_reservations_settle_on_the_source_they_came_from(peer: Peer, queue_name: str) -> None:
    binding = peer.binding
    written, source = both(peer, queue_name)
    taken = binding.reserve_dead_letters(queue_name, 5, timeout=2)
    if len(taken) < 2:  # brokers whose receives hand out one source at a time
        taken += binding.reserve_dead_letters(queue_name, 5, timeout=2)
    assert sorted(m.dead_letter_source or "" for m in taken) == sorted([written, source])
    binding.release_many(taken)  # each goes back to its own DLQ, unchanged
    deadline = time.monotonic() + 5  # Pulsar counts a negatively acknowledged message after redelivery_delay
    while binding.dead_letter_depth(queue_name) != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert binding.dead_letter_depth(queue_name) == 2
    again = [binding.reserve_dead_letter(queue_name, timeout=3) for _ in range(2)]
    assert sorted(m.dead_letter_source or "" for m in again if m is not None) == sorted([written, source])
    assert next(m for m in again if m is not None and m.dead_letter_source == source).body == peer.raw
    binding.ack_many([m for m in again if m is not None])
    assert binding.dead_letter_depth(queue_name) == 0


def test_a_redrive_moves_the_dead_letters_of_every_source(peer: Peer, queue_name: str) -> None:
    binding = peer.binding
    both(peer, queue_name)
    target = f"{queue_name}-again"
    replayer = Replayer(target=binding, ledger_binding=MemoryBinding(), ledger_name=f"dls:{queue_name}",
                        target_queue_name=target, source=binding)
    feed_from_dead_letters(replayer, binding, queue_name, 0)
    replayer.finish()
    assert replayer.result.replayed == 2, replayer.result.as_dict()
    assert binding.dead_letter_depth(queue_name) == 0
    replayed = [binding.reserve(target, timeout=3) for _ in range(2)]
    ids = sorted(m.meta_id for m in replayed if m is not None)
    assert len(ids) == 2 and bq.decode(peer.raw)["meta"]["id"] in ids
    assert all(m is not None and "dead_letter" not in (m.envelope or {}) for m in replayed)


def test_a_missing_source_is_read_as_empty_and_never_created(peer: Peer, queue_name: str, tmp_path: Path) -> None:
    binding = peer.binding
    dead_letter_ours(binding, queue_name)
    assert binding.dead_letter_depth(queue_name) == 1
    if binding.can_browse:
        assert len(binding.browse_dead_letters(queue_name)) == 1
    result = drain_dead_letters([DrainSource(binding, queue_name, "c")], LocalFileSink(tmp_path / "d.jsonl"))
    assert result.records == 1 and binding.dead_letter_depth(queue_name) == 0
    assert binding.reserve_dead_letters(queue_name, 5, timeout=0) == []
    if peer.exists is not None:
        assert not peer.exists(queue_name), "a read created the peer's dead-letter queue"


def test_the_sources_follow_the_configuration() -> None:
    from airflow_provider_babelqueue.bindings.memory import MemoryConfig

    assert MemoryBinding().dead_letter_sources("q") == ["q:failed", "q.dlq"]
    written_dlq = MemoryBinding(MemoryConfig(dead_letter_suffix=".dlq"))
    assert written_dlq.dead_letter_sources("q") == ["q.dlq", "q:failed"]  # the written one first, no repeat
    custom = MemoryBinding(MemoryConfig(dead_letter_sources="legacy-{queue}, shared-dead ,.dlq"))
    assert custom.dead_letter_sources("q") == ["q:failed", "legacy-q", "shared-dead", "q.dlq"]
    for nothing in ("none", "", [], None):
        assert MemoryBinding(MemoryConfig(dead_letter_sources=nothing)).dead_letter_sources("q") == ["q:failed"]
    with pytest.raises(ValueError, match="names or suffixes"):
        MemoryConfig(dead_letter_sources=[".dlq", 3])  # type: ignore[arg-type]


@pytest.mark.parametrize(("extra", "expected"), [
    ({}, ["q:failed", "q.dlq"]),
    ({"dead_letter_sources": [".dlq", "legacy-{queue}"]}, ["q:failed", "q.dlq", "legacy-q"]),  # a JSON list
    ({"dead_letter_sources": ":old, .dlq"}, ["q:failed", "q:old", "q.dlq"]),  # the form's comma text
    ({"dead_letter_sources": "none"}, ["q:failed"]),
    ({"dead_letter_suffix": ".dlq"}, ["q.dlq", "q:failed"]),
])
def test_the_connection_extra_configures_the_sources(extra: dict[str, Any], expected: list[str]) -> None:
    from airflow.sdk import Connection

    from airflow_provider_babelqueue.hooks.redis import BabelQueueRedisHook

    connection = Connection(conn_id="dls", conn_type="babelqueue+redis", host="127.0.0.1", extra=json.dumps(extra))
    binding = BabelQueueRedisHook(connection=connection).get_binding()
    assert binding.dead_letter_sources("q") == expected
    binding.close()


def test_a_bad_entry_names_the_connection() -> None:
    from airflow.sdk import Connection

    from airflow_provider_babelqueue.core.errors import ConnectionConfigError
    from airflow_provider_babelqueue.hooks.sql import BabelQueueSqlHook

    connection = Connection(conn_id="dls", conn_type="babelqueue+sql", host="/tmp/unused.sqlite",
                            extra=json.dumps({"dead_letter_sources": "bad name"}))
    with pytest.raises(ConnectionConfigError, match="connection 'dls'.*'bad name' is not a table name"):
        BabelQueueSqlHook(connection=connection).get_binding()
