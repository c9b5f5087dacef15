"""Dead letters of FIFO queues on SQS: drains and redrives take every message in one run, whatever the groups.

SQS returns no further message of a FIFO message group while one of it is in flight, and both SDKs write every
dead letter of a queue into one group. Live against moto's HTTP server, which applies the same group rule
(tests/bindings/sqs_server.py). Kept small: moto answers in ~38 ms per call.

Drains run ``engine.drain.drain_dead_letters`` into a :class:`LocalFileSink`; redrives run
``engine.replay.Replayer`` fed by ``feed_from_dead_letters``, as the replay operator does, with the ledger in
memory (SQS cannot hold one).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.bindings.sqs import SqsBinding, SqsConfig
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, drain_dead_letters
from airflow_provider_babelqueue.engine.replay import Replayer, feed_from_dead_letters
from tests.bindings.sqs_server import REGION

__all__: list[str] = []

FIFO_ATTRIBUTES = {"FifoQueue": "true", "ContentBasedDeduplication": "false"}

#: A group longer than one receive (10), or a receive that ends inside a group, continues only after the drain or
#: redrive has settled what it holds: the engines do that when ``Binding.dead_letters_hidden_while_held`` says so.
GROUPS = [
    pytest.param({"g": 6}, id="6-in-one-group"),
    pytest.param({"a": 4, "b": 4, "c": 4}, id="3-groups-x-4"),
    pytest.param({"g": 23}, id="23-in-one-group"),
]


@pytest.fixture
def binding(endpoint: str, admin: Any) -> Iterator[SqsBinding]:
    """Default settings but queue creation: dead letters written to ``-failed``, read from the RedrivePolicy
    target, ``-failed`` and ``-dlq``."""
    made = SqsBinding(SqsConfig(region_name=REGION, endpoint_url=endpoint, aws_access_key_id="testing",
                                aws_secret_access_key="testing", create_queues=True))
    yield made
    made.close()


@pytest.fixture
def fifo() -> str:
    return f"fifo-{uuid.uuid4().hex[:10]}.fifo"


def dead_letters(admin: Any, dlq: str, queue_name: str, groups: dict[str, int]) -> list[str]:
    """Put ``count`` annotated dead letters of ``queue_name`` per message group into ``dlq`` (created here, as a
    worker's DLQ exists before it writes), sent one group after the other; returns their meta.ids in order."""
    url = admin.create_queue(QueueName=dlq, Attributes=FIFO_ATTRIBUTES)["QueueUrl"]
    ids: list[str] = []
    for group, count in groups.items():
        for n in range(count):
            env = bq.annotate_dead_letter(
                bq.make_envelope("urn:babel:orders:created", {"group": group, "n": n}, queue_name=queue_name),
                "failed", original_queue=queue_name, attempts=3, error="boom",
            )
            admin.send_message(QueueUrl=url, MessageBody=bq.encode(env).decode(), MessageGroupId=group,
                               MessageDeduplicationId=env["meta"]["id"])
            ids.append(env["meta"]["id"])
    return ids


def drain(binding: SqsBinding, queue_name: str, path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One drain run (move, default settings) into a new file; its result and records."""
    result = drain_dead_letters([DrainSource(binding, queue_name, "sqs")], LocalFileSink(path))
    return result.as_dict(), [orjson.loads(line) for line in path.read_bytes().splitlines()]


def redrive(binding: SqsBinding, queue_name: str) -> dict[str, Any]:
    """One redrive run (default settings), as the replay operator drives it."""
    replayer = Replayer(target=binding, ledger_binding=MemoryBinding(), source=binding)
    try:
        feed_from_dead_letters(replayer, binding, queue_name, 0.0)
        replayer.finish()
    except BaseException:
        replayer.abort()
        raise
    return replayer.result.as_dict()


def take_all(binding: SqsBinding, queue_name: str) -> list[bytes]:
    out = []
    while (message := binding.reserve(queue_name, timeout=0)) is not None:
        out.append(message.body)
        binding.ack(message)
    return out


def ids_of(bodies: list[bytes]) -> list[str]:
    return [bq.decode(body)["meta"]["id"] for body in bodies]


def by_group(ids: list[str], groups: dict[str, int]) -> dict[str, list[str]]:
    out, start = {}, 0
    for group, count in groups.items():
        out[group] = ids[start:start + count]
        start += count
    return out


def in_group_order(got: list[str], expected: dict[str, list[str]]) -> bool:
    """Whether each group's ids appear in ``got`` in their sending order (FIFO order per group)."""
    return all([i for i in got if i in set(ids)] == ids for ids in expected.values())


# ------------------------------------------------------------------------------------------------- drain


@pytest.mark.parametrize("groups", GROUPS)
def test_a_drain_takes_every_fifo_dead_letter_in_one_run(binding: SqsBinding, admin: Any, fifo: str,
                                                         tmp_path: Path, groups: dict[str, int]) -> None:
    base = fifo.removesuffix(".fifo")
    ids = dead_letters(admin, f"{base}-failed.fifo", fifo, groups)
    total = len(ids)
    assert binding.dead_letter_depth(fifo) == total
    result, records = drain(binding, fifo, tmp_path / "dead.jsonl")
    assert result["records"] == total and result["by_source"] == {f"sqs/{fifo}": total}
    got = [record["meta_id"] for record in records]
    assert sorted(got) == sorted(ids) and in_group_order(got, by_group(ids, groups))
    assert binding.dead_letter_depth(fifo) == 0 and binding.reserve_dead_letter(fifo) is None


def test_a_drain_of_a_standard_queue_takes_every_source(binding: SqsBinding, admin: Any, tmp_path: Path) -> None:
    queue = f"std-{uuid.uuid4().hex[:10]}"
    ours, theirs = [], []
    for name, ids in ((f"{queue}-failed", ours), (f"{queue}-dlq", theirs)):
        url = admin.create_queue(QueueName=name)["QueueUrl"]
        for n in range(12):
            env = bq.make_envelope("urn:babel:orders:created", {"n": n}, queue_name=queue)
            admin.send_message(QueueUrl=url, MessageBody=bq.encode(env).decode())
            ids.append(env["meta"]["id"])
    assert binding.dead_letter_sources(queue) == [f"{queue}-failed", f"{queue}-dlq"]
    assert binding.dead_letter_depth(queue) == 24
    result, records = drain(binding, queue, tmp_path / "dead.jsonl")
    assert result["records"] == 24 and sorted(r["meta_id"] for r in records) == sorted(ours + theirs)
    assert binding.dead_letter_depth(queue) == 0


# ----------------------------------------------------------------------------------------------- redrive


@pytest.mark.parametrize("groups", GROUPS)
def test_a_redrive_takes_every_fifo_dead_letter_in_one_run(binding: SqsBinding, admin: Any, fifo: str,
                                                           groups: dict[str, int]) -> None:
    base = fifo.removesuffix(".fifo")
    admin.create_queue(QueueName=fifo, Attributes=FIFO_ATTRIBUTES)
    ids = dead_letters(admin, f"{base}-dlq.fifo", fifo, groups)
    total = len(ids)
    result = redrive(binding, fifo)
    assert (result["replayed"], result["skipped"], result["targets"]) == (total, {}, {fifo: total})
    assert binding.dead_letter_depth(fifo) == 0
    # Sent minutes (here: seconds) after the originals with the same meta.ids, and none was deduplicated away.
    bodies = take_all(binding, fifo)
    assert sorted(ids_of(bodies)) == sorted(ids) and in_group_order(ids_of(bodies), by_group(ids, groups))
    for body in bodies:
        env = bq.decode(body)
        assert env["attempts"] == 0 and "dead_letter" not in env and env["meta"]["queue"] == fifo


def test_a_redrive_of_a_standard_queue(binding: SqsBinding, admin: Any) -> None:
    queue = f"std-{uuid.uuid4().hex[:10]}"
    admin.create_queue(QueueName=queue)
    url = admin.create_queue(QueueName=f"{queue}-failed")["QueueUrl"]
    ids = []
    for n in range(13):
        env = bq.annotate_dead_letter(bq.make_envelope("urn:babel:orders:created", {"n": n}, queue_name=queue),
                                      "failed", original_queue=queue, attempts=2)
        admin.send_message(QueueUrl=url, MessageBody=bq.encode(env).decode())
        ids.append(env["meta"]["id"])
    assert redrive(binding, queue)["replayed"] == 13
    assert binding.dead_letter_depth(queue) == 0 and sorted(ids_of(take_all(binding, queue))) == sorted(ids)
