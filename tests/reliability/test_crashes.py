"""kill -9 the drain and the replay at random points, 20 times each, on real Redis, RabbitMQ and SQL (SQLite).

Each iteration seeds a fresh dead-letter queue with known messages, starts ``crash_child`` (the same drain and
replay code the operators run) armed to SIGKILL itself at a point drawn from a seeded RNG: before or after a
batch reserve, a file sync, a publish, a ledger write or an ack, or after a random delay. Then:

* drain: every ``meta.id`` is in the staging files or still in the DLQ (a second drain moves what is left into
  a second file, and the union must be every id, with identical bytes for any id written twice);
* replay: every ``meta.id`` is at the target or still in the DLQ; two runs to completion follow, the second
  replays nothing, and the target holds each id exactly once, whatever the kill point. On Redis and SQLite the
  ledger lives on the target and is written in the publish's own transaction. On RabbitMQ (ledger in SQLite)
  the publish and the ack of the dead letters are one AMQP transaction, so a kill before the commit leaves the
  batch in the DLQ and a kill after it (ledger not yet written) leaves nothing in the DLQ to replay again.

The iterations are reproducible: the RNG seed is the iteration number.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.sql import sqlite_url
from airflow_provider_babelqueue.core.records import record_body
from airflow_provider_babelqueue.engine import replay as replay_engine
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, drain_dead_letters
from tests.conftest import take_all
from tests.reliability.crash_child import make_binding, start

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 20
MESSAGES = 60
BATCH = 6  # 10 batches per run
VISIBILITY = 0.3  # seconds before a killed process's reservations come back (Redis, SQL)
SIGKILL = -9


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
        # RabbitMQ returns a dead connection's deliveries itself; its ledger lives in SQLite (no seen-sets there).
        "rabbitmq": Broker("rabbitmq", lambda tag: {"host": "127.0.0.1", "port": 5672},
                           ledger=lambda path: {"kind": "sql", "options": {"url": sqlite_url(path / "ledger.sqlite")}}),
    }


def _kill_points(op: str, kind: str) -> list[tuple[str, str, str, int]]:
    """(owner, method, when, how many calls one run makes at most) for each kill point of an operation."""
    batches = MESSAGES // BATCH
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
    if rng.random() < 0.15:
        return {"seconds": round(rng.uniform(0.0, 0.012), 4)}
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
