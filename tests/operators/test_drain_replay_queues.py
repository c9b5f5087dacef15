"""Drain and replay in real DAGs on brokers that cannot browse their DLQ (RabbitMQ, SQS): move-drain,
replay from the drained file with the ledger on the embedded SQLite, then a replay that publishes nothing."""

from __future__ import annotations

import datetime
import json
import uuid
from pathlib import Path

import pytest
from airflow.sdk import DAG

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.operators.drain import BabelQueueDrainDeadLettersOperator
from airflow_provider_babelqueue.operators.replay import BabelQueueReplayOperator
from tests.airflow_harness import run_dag, task_states, xcom
from tests.connections import define

POISON = b"\xff\xfe not an envelope"


def seed(conn_id: str, queue: str) -> dict[str, str]:
    """Dead letters on ``queue``: two ``failed``, one ``unknown_urn``, one poison. Returns meta.id → reason."""
    hook = get_hook(conn_id)
    binding = hook.get_binding()
    reasons = {}
    try:
        for reason in ("failed", "unknown_urn", "failed"):
            binding.publish(
                bq.encode(bq.make_envelope("urn:babel:orders:created", {"r": reason}, queue_name=queue)), queue
            )
            message = binding.reserve(queue, timeout=5)
            binding.dead_letter(message, reason, error="seeded", exception="SeedError")
            reasons[message.meta_id] = reason
        binding.publish(POISON, queue)
        binding.dead_letter(binding.reserve(queue, timeout=5), "poison")
        assert binding.dead_letter_depth(queue) == 4
    finally:
        hook.close()
    return reasons


@pytest.mark.parametrize("conn_id", ["bq_rabbitmq", "bq_sqs"])
def test_move_drain_then_replay_twice(conn_id: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    define(monkeypatch, conn_id)
    queue = f"dr-{uuid.uuid4().hex[:8]}"
    seeded = seed(conn_id, queue)
    staging = tmp_path / "staging"
    staging.mkdir()
    ledger = f"replay-{queue}"
    with DAG(f"bq_drain_replay_{uuid.uuid4().hex[:6]}", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
        drain = BabelQueueDrainDeadLettersOperator(
            task_id="drain",
            babelqueue_conn_id=conn_id,
            queue_name=queue,
            destination=str(staging),
            reserve_timeout=2.0,
        )
        replay = BabelQueueReplayOperator(
            task_id="replay",
            source_conn_id=conn_id,
            replay_set=str(staging),
            reasons=["failed"],
            ledger_conn_id="babelqueue_default",
            ledger_name=ledger,
        )
        again = BabelQueueReplayOperator(
            task_id="replay_again",
            source_conn_id=conn_id,
            replay_set=str(staging),
            reasons=["failed"],
            ledger_conn_id="babelqueue_default",
            ledger_name=ledger,
        )
        drain >> replay >> again
    run = run_dag(dag)
    assert task_states(run) == {"drain": "success", "replay": "success", "replay_again": "success"}

    drained = xcom(run, "drain")
    assert drained["records"] == 4
    records = [json.loads(line) for line in Path(drained["path"]).read_text().splitlines()]
    assert {r["meta_id"] for r in records} == set(seeded) | {""}
    poison = [r for r in records if r["meta_id"] == ""]
    # the poison body (not UTF-8) is in a poison wrapper that keeps it exactly, with the consumer's reason
    assert [(r["body_encoding"], r["broker"]) for r in poison] == [("utf-8", get_hook(conn_id).get_binding().name)]
    wrapper = poison_wrapper(poison[0]["body"].encode("utf-8"))
    assert wrapper is not None and wrapper.raw_encoding == "base64" and wrapper.reason == "poison"
    assert wrapper.dead_letter["original_queue"] == queue
    for record in records:
        if record["meta_id"]:
            assert bq.decode(record["body"])["dead_letter"]["reason"] == seeded[record["meta_id"]]

    first, second = xcom(run, "replay"), xcom(run, "replay_again")
    assert first["replayed"] == 2 and first["targets"] == {queue: 2} and first["duplicates_avoided"] == 0
    assert second["replayed"] == 0 and second["duplicates_avoided"] == 2

    hook = get_hook(conn_id)
    binding = hook.get_binding()
    try:
        assert binding.dead_letter_depth(queue) == 0  # the move-drain emptied the DLQ
        replayed = []
        while (message := binding.reserve(queue, timeout=2)) is not None:
            replayed.append(message.envelope)
            binding.ack(message)
        assert sorted(e["meta"]["id"] for e in replayed) == sorted(i for i, r in seeded.items() if r == "failed")
        assert all("dead_letter" not in e and e["attempts"] == 0 and e["data"] == {"r": "failed"} for e in replayed)
    finally:
        hook.close()
