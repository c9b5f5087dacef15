"""kill -9 the drain, the replay and the batched consumer at random points, on real Redis, RabbitMQ and SQL.

Each iteration seeds a fresh dead-letter queue with known messages, starts ``crash_child`` (the same drain,
replay and consumer code the operators run) armed to SIGKILL itself at a point drawn from a seeded RNG: before
or after a batch reserve, a file sync, a publish, a ledger write or an ack, or after a random delay. Then:

* drain: every ``meta.id`` is in the staging files or still in the DLQ (a second drain moves what is left into
  a second file, and the union must be every id, with identical bytes for any id written twice);
* replay: every ``meta.id`` is at the target or still in the DLQ; two runs to completion follow, the second
  replays nothing, and the target holds each id exactly once, whatever the kill point. On Redis and SQLite the
  ledger lives on the target and is written in the publish's own transaction. On RabbitMQ (ledger in SQLite)
  the publish and the ack of the dead letters are one AMQP transaction, so a kill before the commit leaves the
  batch in the DLQ and a kill after it (ledger not yet written) leaves nothing in the DLQ to replay again;
* consume: a fresh queue of messages, a batched ``Consumer`` (``settle_and_reserve``: the previous batch's acks
  and the next batch, then each handler) whose handler appends each ``meta.id`` to a file, fsynced before it
  returns. The child dies before or after a ``settle_and_reserve``, before or after a ``settle``, inside a handler
  (its record written, before it returns) or after a random delay; after the visibility timeout a second
  consumer runs the queue to its end. Every ``meta.id`` must be in the files (0 lost), the extra copies of one
  kill at most one batch (the handled-but-unacked messages that come back), and the queue empty with nothing
  left reserved. On SQLite, PostgreSQL, Redis and RabbitMQ.

The drain and the replay are killed 20 times per broker. The consume test runs until ``BQ_CRASH_KILLS`` children
(4 by default, as in CI) died inside the work; ``BQ_CRASH_KILLS=20`` is the full size. The iterations are
reproducible: the RNG seed is the operation, the broker and the iteration number.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.sql import sqlite_url
from airflow_provider_babelqueue.core.records import record_body
from airflow_provider_babelqueue.engine import replay as replay_engine
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, drain_dead_letters
from tests.conftest import take_all
from tests.reliability.crash_child import Recorder, consume, make_binding, start

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 20
#: Kills per broker of the consume test (the full size is 20).
KILLS = int(os.environ.get("BQ_CRASH_KILLS", "4"))
MESSAGES = 60
BATCH = 6  # 10 batches per run
VISIBILITY = 0.3  # seconds before a killed process's reservations come back (Redis, SQL)
SIGKILL = -9
POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
URN = "urn:babel:orders:created"


@dataclass
class Broker:
    """How to reach one broker, and what to clean up."""

    kind: str
    options: Callable[[str], dict[str, Any]]
    ledger: Callable[[Path], dict[str, Any] | None] = lambda _: None
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def spec(self, tag: str) -> dict[str, Any]:
        return {"kind": self.kind, "options": self.options(tag)}


def _brokers(tmp_path: Path) -> dict[str, Broker]:
    db = sqlite_url(tmp_path / "queue.sqlite")
    return {
        "redis": Broker("redis", lambda tag: {"host": "127.0.0.1", "port": 6379, "key_prefix": f"bqcrash{tag}:",
                                              "visibility_timeout": VISIBILITY}),
        "sql": Broker("sql", lambda tag: {"url": db, "table": f"c{tag}", "visibility_timeout": VISIBILITY}),
        "postgresql": Broker("sql", lambda tag: {"url": POSTGRES_URL, "table": f"c{tag}",
                                                 "visibility_timeout": VISIBILITY}),
        # RabbitMQ returns a dead connection's deliveries itself; its ledger lives in SQLite (no seen-sets there).
        "rabbitmq": Broker("rabbitmq", lambda tag: {"host": "127.0.0.1", "port": 5672},
                           ledger=lambda path: {"kind": "sql", "options": {"url": sqlite_url(path / "ledger.sqlite")}}),
    }


def _kill_points(op: str, kind: str) -> list[tuple[str, str, str, int]]:
    """(owner, method, when, how many calls one run makes at most) for each kill point of an operation."""
    batches = MESSAGES // BATCH
    if op == "consume":
        # per batch: one settle_and_reserve (the previous batch's settlement, then the next batch) and a handler per
        # message; settle runs inside it on every broker but SQL (one transaction there), and once after the last
        settles = 1 if kind in ("sql", "postgresql") else batches
        return [("binding", "settle_and_reserve", "after", batches), ("binding", "settle_and_reserve", "before",
                                                                       batches),
                ("binding", "settle", "before", settles), ("binding", "settle", "after", settles),
                ("handler", "record", "after", MESSAGES)]
    reserve = ("binding", "reserve_dead_letters", "after", batches)
    acks = [("binding", "ack_many", "before", batches), ("binding", "ack_many", "after", batches)]
    if op == "drain":
        if kind == "redis":  # the pipelined drain: reservations and acks travel on a RedisDeadLetterPipeline
            reserve = ("pipeline", "receive", "after", batches)
            acks = [("pipeline", "ack", "before", batches), ("pipeline", "ack", "after", batches)]
        return [reserve, *acks, ("sink", "sync", "before", batches), ("sink", "sync", "after", batches)]
    if kind == "rabbitmq":  # publish + DLQ ack in one transaction, then the ledger (SQLite): digests, meta.ids
        return [reserve, ("binding", "publish_acking", "before", batches),
                ("binding", "publish_acking", "after", batches), ("engine", "remember_many", "before", 2 * batches),
                ("engine", "remember_many", "after", 2 * batches)]
    return [reserve, *acks, ("binding", "publish_remembering", "before", batches),  # publish + ledger, one step
            ("binding", "publish_remembering", "after", batches)]


def draw_kill(op: str, kind: str, rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.15:  # a consume's 60 messages take 20 (Redis) to 60 ms (PostgreSQL) after its first reserve
        return {"seconds": round(rng.uniform(0.0, 0.03 if op == "consume" else 0.012), 4)}
    owner, method, when, calls = rng.choice(_kill_points(op, kind))
    return {"owner": owner, "method": method, "when": when, "nth": rng.randint(1, calls)}


def seed_dead_letters(binding: Binding, queue: str) -> dict[str, bytes]:
    """MESSAGES dead letters with reason ``failed``; returns meta.id → the envelope as published."""
    bodies = [bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n, "note": "ü/€"}, queue_name=queue))
              for n in range(MESSAGES)]
    binding.publish_batch(bodies, queue)
    for _ in bodies:
        message = binding.reserve(queue, timeout=5)
        assert message is not None
        binding.dead_letter(message, "failed", error="gateway timeout", exception="TimeoutError")
    assert binding.dead_letter_depth(queue) == MESSAGES and binding.depth(queue) == 0
    return {bq.meta_id_of(bq.decode(body)): body for body in bodies}


def run_child(spec: dict[str, Any], tmp_path: Path) -> tuple[int, str]:
    """(exit code, error text) of one crash child (a process of its own, see ``crash_child.start``)."""
    return start(spec, tmp_path / f"child-{uuid.uuid4().hex[:8]}.err")


def read_staging(path: Path) -> list[bytes]:
    """Bodies of the complete records of a staging file; a torn last line (the kill mid-write) is skipped."""
    if not path.exists():
        return []
    bodies = []
    for line in path.read_bytes().split(b"\n"):
        try:
            bodies.append(record_body(json.loads(line)))
        except ValueError:
            continue
    return bodies


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[dict[str, Broker]]:
    found = _brokers(tmp_path)
    yield found
    for broker in found.values():
        for cleanup in broker.cleanups:
            cleanup()


def _cleanup(broker: Broker, binding: Binding, queues: list[str], tag: str) -> None:
    if broker.kind == "redis":
        keys = list(binding.client.scan_iter(match=f"bqcrash{tag}:*"))
        if keys:
            binding.client.delete(*keys)
    elif broker.kind == "rabbitmq":
        import pika

        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
        channel = connection.channel()
        for name in queues:
            for suffix in ("", ".failed"):
                channel.queue_delete(name + suffix)
        connection.close()
    elif binding.config.url.startswith("postgresql"):  # SQLite's tables go with tmp_path
        with binding._get_engine().begin() as conn:
            for table in (f"c{tag}", f"c{tag}_failed"):
                conn.execute(sa.text(f'DROP TABLE IF EXISTS "{table}"'))
    binding.close()


@pytest.mark.parametrize("kind", ["redis", "rabbitmq", "sql"])
def test_kill_9_during_drain_loses_nothing(brokers: dict[str, Broker], tmp_path: Path, kind: str) -> None:
    broker, outcomes = brokers[kind], Counter()
    for iteration in range(ITERATIONS):
        rng, tag = random.Random(f"drain-{kind}-{iteration}"), uuid.uuid4().hex[:8]
        queue = f"crash-{tag}"
        binding = make_binding(broker.spec(tag))
        try:
            originals = seed_dead_letters(binding, queue)
            staging = tmp_path / f"drain-{tag}.jsonl"
            kill = draw_kill("drain", kind, rng)
            code, error = run_child({"op": "drain", "binding": broker.spec(tag), "queue": queue, "batch": BATCH,
                                     "staging": str(staging), "kill": kill}, tmp_path)
            assert code in (SIGKILL, 0), error[-3000:]
            outcomes["killed" if code == SIGKILL else "finished"] += 1
            first = read_staging(staging)
            time.sleep(VISIBILITY + 0.1)  # reservations expire (Redis, SQL); RabbitMQ requeues on the closed socket
            rest = tmp_path / f"drain-{tag}-rest.jsonl"
            drain_dead_letters([DrainSource(binding, queue, "finisher")], LocalFileSink(rest), batch_records=BATCH)
            second = read_staging(rest)
            ids = Counter(bq.meta_id_of(bq.decode(body)) for body in first + second)
            missing = set(originals) - set(ids)
            assert not missing, f"iteration {iteration} ({kill}): lost {len(missing)} dead letters"
            assert binding.dead_letter_depth(queue) == 0
            by_id: dict[str, bytes] = {}
            for body in first + second:
                envelope = bq.decode(body)
                assert envelope["dead_letter"]["reason"] == "failed"
                assert bq.data_of(envelope) == bq.data_of(bq.decode(originals[bq.meta_id_of(envelope)]))
                assert by_id.setdefault(bq.meta_id_of(envelope), body) == body  # a copy written twice is identical
            outcomes["partial"] += 0 < len(first) < MESSAGES
        finally:
            _cleanup(broker, binding, [queue], tag)
    assert outcomes["killed"] >= ITERATIONS - 3, outcomes  # the kills landed inside the work
    assert outcomes["partial"] >= 5, outcomes


@pytest.mark.parametrize("kind", ["redis", "rabbitmq", "sql"])
def test_kill_9_during_replay_loses_nothing_and_reruns_publish_nothing_twice(
    brokers: dict[str, Broker], tmp_path: Path, kind: str
) -> None:
    broker, outcomes = brokers[kind], Counter()
    for iteration in range(ITERATIONS):
        rng, tag = random.Random(f"replay-{kind}-{iteration}"), uuid.uuid4().hex[:8]
        queue, target, ledger_name = f"crash-{tag}", f"crash-{tag}-target", f"replay:{tag}"
        binding = make_binding(broker.spec(tag))
        ledger_spec = broker.ledger(tmp_path)
        ledger = make_binding(ledger_spec) if ledger_spec else binding
        try:
            originals = seed_dead_letters(binding, queue)
            kill = draw_kill("replay", kind, rng)
            code, error = run_child({"op": "replay", "binding": broker.spec(tag), "ledger": ledger_spec,
                                     "queue": queue, "target": target, "ledger_name": ledger_name, "batch": BATCH,
                                     "kill": kill}, tmp_path)
            assert code in (SIGKILL, 0), error[-3000:]
            outcomes["killed" if code == SIGKILL else "finished"] += 1
            time.sleep(VISIBILITY + 0.1)
            arrived = take_all(binding, target, timeout=0.05)
            outcomes["partial"] += 0 < len(arrived) < MESSAGES
            results = []
            for _ in range(2):  # run to completion, twice
                replayer = replay_engine.Replayer(target=binding, ledger_binding=ledger, ledger_name=ledger_name,
                                                  target_queue_name=target, source=binding, batch_size=BATCH)
                replay_engine.feed_from_dead_letters(replayer, binding, queue, 0.0)
                replayer.finish()
                results.append(replayer.result.as_dict())
                arrived += take_all(binding, target, timeout=0.05)
            assert results[1]["replayed"] == 0, results
            assert binding.dead_letter_depth(queue) == 0
            counts = Counter(bq.meta_id_of(bq.decode(body)) for body in arrived)
            missing = set(originals) - set(counts)
            assert not missing, f"iteration {iteration} ({kill}): lost {len(missing)} messages"
            duplicates = sum(n - 1 for n in counts.values())
            assert duplicates == 0, f"iteration {iteration} ({kill}): {duplicates} duplicates"
            for body in arrived:  # the reset of a dead letter is the envelope as first published, byte for byte
                assert body == originals[bq.meta_id_of(bq.decode(body))]
        finally:
            if ledger is not binding:
                ledger.close()
            _cleanup(broker, binding, [queue, target], tag)
    print(f"replay crashes on {kind}: {dict(outcomes)}")
    assert outcomes["killed"] >= ITERATIONS - 3, outcomes
    assert outcomes["partial"] >= 5, outcomes


def seed_queue(binding: Binding, queue: str) -> set[str]:
    """MESSAGES ready messages on ``queue``; returns their meta.ids."""
    envelopes = [bq.make_envelope(URN, {"n": n, "note": "ü/€"}, queue_name=queue) for n in range(MESSAGES)]
    binding.publish_batch([bq.encode(envelope) for envelope in envelopes], queue)
    assert binding.depth(queue) == MESSAGES
    return {bq.meta_id_of(envelope) for envelope in envelopes}


def read_handled(path: Path) -> list[str]:
    """The meta.ids a consumer's handlers recorded, one per complete line (a torn last line is not a record)."""
    if not path.exists():
        return []
    return path.read_text().split("\n")[:-1]


def left_in_queue(broker: Broker, binding: Binding, queue: str) -> int:
    """Messages of ``queue`` the broker still holds in any state: ready, delayed or reserved (RabbitMQ: ready,
    once the connections that held deliveries are closed)."""
    if broker.kind == "redis":
        key = binding._key(queue)
        return sum(binding.client.llen(name) for name in (key, f"{key}:processing")) + binding.client.zcard(
            f"{key}:delayed")
    if broker.kind == "sql":
        table = binding._ready
        with binding._read() as conn:
            return int(conn.execute(sa.select(sa.func.count()).where(table.c.queue == queue)).scalar_one())
    return binding.depth(queue)


@pytest.mark.parametrize("kind", ["redis", "rabbitmq", "sql", "postgresql"])
def test_kill_9_during_batched_consume_loses_nothing_and_repeats_at_most_a_batch(
    brokers: dict[str, Broker], tmp_path: Path, kind: str
) -> None:
    broker, outcomes = brokers[kind], Counter()
    for iteration in range(3 * KILLS):  # until KILLS children died inside the work (a timer may fire too late)
        if outcomes["kills"] == KILLS:
            break
        rng, tag = random.Random(f"consume-{kind}-{iteration}"), uuid.uuid4().hex[:8]
        queue = f"crash-{tag}"
        binding = make_binding(broker.spec(tag))
        try:
            seeded = seed_queue(binding, queue)
            first, rest = tmp_path / f"consume-{tag}.ids", tmp_path / f"consume-{tag}-rest.ids"
            kill = draw_kill("consume", kind, rng)
            code, error = run_child({"op": "consume", "binding": broker.spec(tag), "queue": queue, "urn": URN,
                                     "batch": BATCH, "handled": str(first), "kill": kill}, tmp_path)
            assert code in (SIGKILL, 0), error[-3000:]
            killed = code == SIGKILL
            outcomes["kills" if killed else "finished"] += 1
            handled_first = read_handled(first)
            outcomes["partial"] += 0 < len(set(handled_first)) < MESSAGES
            time.sleep(VISIBILITY + 0.1)  # reservations expire (Redis, SQL); RabbitMQ requeues on the closed socket
            finisher, recorder = make_binding(broker.spec(tag)), Recorder(rest)
            try:
                consume(finisher, {"queue": queue, "urn": URN, "batch": BATCH, "reserve_timeout": 0.1}, recorder)
            finally:
                recorder.close()
                finisher.close()  # RabbitMQ: a delivery it still held would be ready again now
            counts = Counter(handled_first + read_handled(rest))
            where = f"{kind}, iteration {iteration} (seed consume-{kind}-{iteration}), kill {kill}"
            lost, strange = seeded - set(counts), set(counts) - seeded
            duplicates = sum(n - 1 for n in counts.values())
            outcomes["lost"] += len(lost)
            outcomes["duplicates"] += duplicates
            outcomes["most_in_one_kill"] = max(outcomes["most_in_one_kill"], duplicates)
            assert not lost, f"{where}: lost {len(lost)} messages, e.g. {sorted(lost)[:3]}; {dict(outcomes)}"
            assert not strange, f"{where}: handled ids never published: {sorted(strange)[:3]}"
            repeated = {meta_id: n for meta_id, n in counts.items() if n > 1}
            assert duplicates <= (BATCH if killed else 0), f"{where}: {duplicates} extra copies of {repeated}"
            ready, left = binding.depth(queue), left_in_queue(broker, binding, queue)
            assert ready == left == 0, f"{where}: {ready} ready, {left} ready, delayed or reserved at the end"
        finally:
            _cleanup(broker, binding, [queue], tag)
    summary = f"consume crashes on {kind}: {dict(outcomes)}"
    print(summary)
    assert outcomes["kills"] == KILLS, summary  # the kills landed inside the work
    assert outcomes["partial"] >= KILLS // 2, summary
