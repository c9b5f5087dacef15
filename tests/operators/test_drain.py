"""Drain operator and drain logic: record format, browse/move, bounds, destinations, at-least-once.

The end-to-end DAG runs (seed → drain → replay on SQLite, PostgreSQL and Redis) are in test_replay.py;
this module calls ``execute`` and the pure drain function directly, which is much faster.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding, NotSupportedError, ReceivedMessage
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.drain import (
    DrainSource,
    LocalFileSink,
    StreamSink,
    drain_dead_letters,
    drain_record,
    parse_replay_line,
    record_body,
)
from airflow_provider_babelqueue.operators import drain as drain_module
from airflow_provider_babelqueue.operators.drain import BabelQueueDrainDeadLettersOperator

RECORD_KEYS = ["v", "body", "body_encoding", "broker", "queue_name", "dead_letter_queue", "source_conn_id",
               "meta_id", "delivery_count", "native_reason", "headers", "drained_at"]
POISON = b'\xff\xfe{"not": json'


# ------------------------------------------------------------------------------------------- helpers


class FakeHook:
    """What get_hook returns, around a ready binding (the operators only call these two methods)."""

    def __init__(self, binding: Binding) -> None:
        self.binding, self.closed = binding, 0

    def get_binding(self) -> Binding:
        return self.binding

    def close(self) -> None:
        self.closed += 1


class NoBrowseBinding(MemoryBinding):
    """A broker that cannot read its DLQ without removing (as RabbitMQ): the memory binding, browse off."""

    name = "nobrowse"
    can_browse = False

    def browse_dead_letters(self, queue_name: str, limit: int = 100) -> list[ReceivedMessage]:
        raise NotSupportedError("the nobrowse binding cannot browse")


def use_bindings(monkeypatch: pytest.MonkeyPatch, module: Any, bindings: dict[str, Binding]) -> dict[str, FakeHook]:
    hooks = {conn_id: FakeHook(binding) for conn_id, binding in bindings.items()}
    monkeypatch.setattr(module, "get_hook", lambda conn_id: hooks[conn_id])
    return hooks


def dead_letter(binding: Binding, queue_name: str, body: bytes, reason: str = "failed", *,
                exception: str | None = "App\\Exceptions\\GatewayTimeout", error: str | None = "boom") -> None:
    """Publish, reserve and dead-letter one body: exactly what a consumer does when it gives up."""
    binding.publish(body, queue_name)
    message = binding.reserve(queue_name, timeout=2)
    assert message is not None and message.body == body
    binding.dead_letter(message, reason, error=error, exception=exception)


def envelope_body(queue_name: str, index: int, urn: str = "urn:babel:orders:created") -> bytes:
    return bq.encode(bq.make_envelope(urn, {"order_id": index, "note": "Zoë/★ 1.5", "f": 1.25},
                                      queue_name=queue_name))


def seed(binding: Binding, queue_name: str, count: int) -> list[str]:
    """``count`` dead letters (reason failed); returns their meta.ids."""
    ids = []
    for index in range(count):
        body = envelope_body(queue_name, index)
        ids.append(bq.meta_id_of(bq.decode(body)))
        dead_letter(binding, queue_name, body)
    return ids


def read_records(path: str | Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in Path(path).read_bytes().splitlines()]


def dlq_ids(binding: Binding, queue_name: str) -> list[str]:
    return [m.meta_id for m in binding.browse_dead_letters(queue_name, limit=100_000)]


def _memory_factory(tmp_path: Path, cleanups: list[Callable[[], None]]) -> Binding:
    return MemoryBinding()


def _sqlite_factory(tmp_path: Path, cleanups: list[Callable[[], None]]) -> Binding:
    from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig, sqlite_url

    binding = SqlBinding(SqlConfig(url=sqlite_url(tmp_path / "drain.sqlite"), table="drain_jobs"))
    cleanups.append(binding.close)
    return binding


def _redis_factory(tmp_path: Path, cleanups: list[Callable[[], None]]) -> Binding:
    from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig

    prefix = f"bqdrain:{uuid.uuid4().hex[:10]}:"
    binding = RedisBinding(RedisConfig(host="127.0.0.1", port=6379, key_prefix=prefix))

    def drop() -> None:
        keys = list(binding.client.scan_iter(match=f"{prefix}*"))
        if keys:
            binding.client.delete(*keys)
        binding.close()

    cleanups.append(drop)
    return binding


FACTORIES = {"memory": _memory_factory, "sqlite": _sqlite_factory, "redis": _redis_factory}


@pytest.fixture(params=list(FACTORIES))
def any_binding(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Binding]:
    cleanups: list[Callable[[], None]] = []
    yield FACTORIES[request.param](tmp_path, cleanups)
    for cleanup in reversed(cleanups):
        cleanup()


@pytest.fixture
def queue_name() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}"


# -------------------------------------------------------------------------------------- record format


def test_drain_record_keys_order_and_exact_body() -> None:
    body = envelope_body("orders", 1)
    message = ReceivedMessage(body=body, queue_name="orders", envelope=bq.decode(body), decode_error=None,
                              attempts=0, delivery_count=3, headers={"x-first-death-reason": "rejected",
                                                                     "raw": b"\x00\xff", "n": 1})
    line = drain_record(message, broker="rabbitmq", dead_letter_queue="orders.failed", source_conn_id="bq",
                        drained_at=1749132730000)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    record = orjson.loads(line)
    assert list(record) == RECORD_KEYS
    assert record["body"].encode("utf-8") == body and record["body_encoding"] == "utf-8"
    assert record_body(record) == body
    assert record["meta_id"] == bq.meta_id_of(bq.decode(body))
    assert (record["broker"], record["queue_name"], record["dead_letter_queue"]) == ("rabbitmq", "orders",
                                                                                     "orders.failed")
    assert (record["delivery_count"], record["native_reason"], record["drained_at"]) == (3, "rejected",
                                                                                         1749132730000)
    assert record["headers"] == {"x-first-death-reason": "rejected", "raw": "base64:AP8=", "n": 1}


def test_drain_record_of_a_poison_body_is_base64_of_the_bytes() -> None:
    message = ReceivedMessage(body=POISON, queue_name="q", envelope=None, decode_error="bad", attempts=0)
    record = orjson.loads(drain_record(message, broker="sql", dead_letter_queue="jobs_failed",
                                       source_conn_id="c", drained_at=1))
    assert record["body_encoding"] == "base64" and base64.b64decode(record["body"]) == POISON
    assert record["meta_id"] == "" and record["delivery_count"] is None and record["native_reason"] is None
    assert record["headers"] == {} and record_body(record) == POISON


def test_replay_lines_are_drain_records_or_envelopes() -> None:
    body = envelope_body("orders", 2)
    message = ReceivedMessage(body=body, queue_name="orders", envelope=bq.decode(body), decode_error=None,
                              attempts=0)
    parsed = parse_replay_line(drain_record(message, broker="redis", dead_letter_queue="orders:failed",
                                            source_conn_id="c", drained_at=1))
    assert (parsed.body, parsed.queue_name, parsed.is_record) == (body, "orders", True)
    parsed = parse_replay_line(b"  " + body + b"\r\n")
    assert (parsed.body, parsed.queue_name, parsed.is_record) == (body, None, False)
    assert parse_replay_line(b"\n") is None
    for bad in (b'{"v":1,"body":"{\\"jo', b"[1,2]", b'{"v":2,"body":"x"}', b'{"v":1,"body":"x","body_encoding":"hex"}'):
        with pytest.raises(ValueError):
            parse_replay_line(bad)


# ------------------------------------------------------------------------------------------ operator


def test_browse_copies_without_removing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, queue_name: str) -> None:
    binding = MemoryBinding()
    ids = seed(binding, queue_name, 5)
    dead_letter(binding, queue_name, POISON, "poison")
    stored = [m.body for m in binding.browse_dead_letters(queue_name)]
    hooks = use_bindings(monkeypatch, drain_module, {"mem": binding})
    operator = BabelQueueDrainDeadLettersOperator(task_id="copy", babelqueue_conn_id="mem", queue_name=queue_name,
                                                  destination=str(tmp_path / "staging"), mode="browse")
    result = operator.execute(context={"run_id": "manual__2026-01-01T00:00:00+00:00"})
    path = Path(result["path"])
    assert path.parent == tmp_path / "staging" and path.name.startswith("dlq-manual__2026-01-01T00_00_00_00_00-")
    assert result["records"] == 6 and result["bytes"] == path.stat().st_size
    assert result["by_source"] == {f"mem/{queue_name}": 6}
    records = read_records(path)
    assert [record_body(r) for r in records] == stored
    assert [r["meta_id"] for r in records] == [*ids, ""]
    assert {r["source_conn_id"] for r in records} == {"mem"} and {r["broker"] for r in records} == {"memory"}
    assert binding.dead_letter_depth(queue_name) == 6 and dlq_ids(binding, queue_name) == [*ids, ""]
    assert hooks["mem"].closed == 1


def test_browse_on_a_broker_that_cannot_is_refused_up_front(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                            queue_name: str) -> None:
    binding = NoBrowseBinding()
    seed(binding, queue_name, 2)
    use_bindings(monkeypatch, drain_module, {"rmq": binding})
    operator = BabelQueueDrainDeadLettersOperator(task_id="copy", babelqueue_conn_id="rmq", queue_name=queue_name,
                                                  destination=str(tmp_path), mode="browse")
    with pytest.raises(NotSupportedError, match=r"nobrowse binding of connection 'rmq' cannot.*mode='move'"):
        operator.execute(context={})
    assert binding.dead_letter_depth(queue_name) == 2 and list(tmp_path.iterdir()) == []


def test_move_with_several_sources_into_one_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first, second = MemoryBinding(), MemoryBinding()
    ids_a, ids_b = seed(first, "a", 3), seed(second, "b", 2)
    use_bindings(monkeypatch, drain_module, {"one": first, "two": second})
    operator = BabelQueueDrainDeadLettersOperator(
        task_id="move", destination=str(tmp_path / "all.jsonl"), batch_records=2,
        sources=json.dumps([{"babelqueue_conn_id": "one", "queue_name": "a"},
                            {"babelqueue_conn_id": "two", "queue_name": "b"}]),
    )
    result = operator.execute(context={})
    assert result == {"path": str(tmp_path / "all.jsonl"), "records": 5,
                      "bytes": (tmp_path / "all.jsonl").stat().st_size, "by_source": {"one/a": 3, "two/b": 2}}
    assert [r["meta_id"] for r in read_records(tmp_path / "all.jsonl")] == ids_a + ids_b
    assert first.dead_letter_depth("a") == 0 and second.dead_letter_depth("b") == 0
    again = BabelQueueDrainDeadLettersOperator(task_id="again", babelqueue_conn_id="one", queue_name="a",
                                               destination=str(tmp_path / "all.jsonl"))
    with pytest.raises(FileExistsError, match="never overwrites"):
        again.execute(context={})
    assert len(read_records(tmp_path / "all.jsonl")) == 5


def test_max_messages_and_max_bytes_bound_a_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                queue_name: str) -> None:
    binding = MemoryBinding()
    ids = seed(binding, queue_name, 6)
    use_bindings(monkeypatch, drain_module, {"mem": binding})

    def run(**bounds: Any) -> dict[str, Any]:
        operator = BabelQueueDrainDeadLettersOperator(task_id="d", babelqueue_conn_id="mem", queue_name=queue_name,
                                                      destination=str(tmp_path), **bounds)
        return operator.execute(context={})

    first = run(max_messages="2")  # templated values arrive as text
    assert first["records"] == 2 and [r["meta_id"] for r in read_records(first["path"])] == ids[:2]
    record_size = first["bytes"] // 2
    second = run(max_bytes=int(record_size * 2.5))
    assert second["records"] == 2 and second["bytes"] <= record_size * 2.5
    assert binding.dead_letter_depth(queue_name) == 2  # the one that did not fit went back
    third = run(max_bytes=1)  # the first record is always written, so a drain always progresses
    assert third["records"] == 1
    browse = BabelQueueDrainDeadLettersOperator(task_id="b", babelqueue_conn_id="mem", queue_name=queue_name,
                                                destination=str(tmp_path), mode="browse", max_messages=0)
    assert browse.execute(context={})["records"] == 0
    assert sorted(dlq_ids(binding, queue_name)) == sorted(set(ids) - {r["meta_id"] for p in (
        first["path"], second["path"], third["path"]) for r in read_records(p)})


def test_file_url_and_object_storage_destinations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  queue_name: str) -> None:
    from airflow.sdk import ObjectStoragePath

    binding = MemoryBinding()
    ids = seed(binding, queue_name, 3)
    use_bindings(monkeypatch, drain_module, {"mem": binding})
    operator = BabelQueueDrainDeadLettersOperator(task_id="d", babelqueue_conn_id="mem", queue_name=queue_name,
                                                  destination=f"file://{tmp_path}/by-url/", mode="browse")
    result = operator.execute(context={})
    assert Path(result["path"]).parent == tmp_path / "by-url" and result["records"] == 3
    # The generic object-storage sink (what s3:// or gs:// use): a file:// ObjectStoragePath stands in for it.
    target = ObjectStoragePath(f"file://{tmp_path}/object/dlq.jsonl")
    target.parent.mkdir(parents=True, exist_ok=True)
    sink = StreamSink(lambda: target.open("wb"), str(target))
    assert not sink.durable_batches
    moved = drain_dead_letters([DrainSource(binding, queue_name, "mem")], sink, batch_records=2)
    assert moved.records == 3 and moved.path == str(target)
    assert [r["meta_id"] for r in read_records(tmp_path / "object" / "dlq.jsonl")] == ids
    assert binding.dead_letter_depth(queue_name) == 0


def test_validation_errors() -> None:
    with pytest.raises(ValueError, match="either sources or queue_name"):
        BabelQueueDrainDeadLettersOperator(task_id="x", destination="/tmp/x")
    with pytest.raises(ValueError, match="either sources or queue_name"):
        BabelQueueDrainDeadLettersOperator(task_id="x", destination="/tmp/x", queue_name="a",
                                           sources=[{"queue_name": "b"}])
    with pytest.raises(ValueError, match="mode must be"):
        BabelQueueDrainDeadLettersOperator(task_id="x", destination="/tmp/x", queue_name="a", mode="peek")
    operator = BabelQueueDrainDeadLettersOperator(task_id="x", destination="/tmp/x", sources=[{"queue": "a"}])
    with pytest.raises(ValueError, match=r"sources\[0\]"):
        operator.execute(context={})


# ------------------------------------------------------------------------------------- at-least-once


class FaultySink(LocalFileSink):
    """Simulated fault: the Nth batch write raises before anything of it reaches the file."""

    def __init__(self, path: Path, fail_on_write: int) -> None:
        super().__init__(path)
        self.writes, self.fail_on_write = 0, fail_on_write

    def write(self, data: bytes) -> None:
        self.writes += 1
        if self.writes == self.fail_on_write:
            raise OSError(28, "No space left on device (simulated fault)")
        super().write(data)


def test_a_failed_write_leaves_every_message_in_the_file_or_the_dlq(any_binding: Binding, tmp_path: Path,
                                                                    queue_name: str) -> None:
    ids = seed(any_binding, queue_name, 25)
    sink = FaultySink(tmp_path / "dlq.jsonl", fail_on_write=3)
    with pytest.raises(OSError, match="simulated fault"):
        drain_dead_letters([DrainSource(any_binding, queue_name, "c")], sink, batch_records=10)
    in_file = [r["meta_id"] for r in read_records(tmp_path / "dlq.jsonl")]
    in_dlq = dlq_ids(any_binding, queue_name)
    assert in_file == ids[:20]  # two durable, acked batches
    assert len(in_file) + len(in_dlq) == len(ids) and sorted(in_file + in_dlq) == sorted(ids)
    assert any_binding.dead_letter_depth(queue_name) == 5  # released at once, not after a visibility timeout


def test_a_crash_before_the_ack_leaves_duplicates_never_losses(tmp_path: Path, queue_name: str) -> None:
    class AckFails(MemoryBinding):
        acks = 0

        def ack(self, message: ReceivedMessage) -> None:
            self.acks += 1
            if self.acks == 13:
                raise ConnectionError("broker went away (simulated fault)")
            super().ack(message)

    binding = AckFails()
    ids = seed(binding, queue_name, 25)
    with pytest.raises(ConnectionError, match="simulated fault"):
        drain_dead_letters([DrainSource(binding, queue_name, "c")], LocalFileSink(tmp_path / "d.jsonl"),
                           batch_records=10)
    in_file = [r["meta_id"] for r in read_records(tmp_path / "d.jsonl")]
    in_dlq = dlq_ids(binding, queue_name)
    assert in_file == ids[:20]  # the second batch was durable before its acks failed
    assert set(in_file) | set(in_dlq) == set(ids)
    assert sorted(set(in_file) & set(in_dlq)) == sorted(ids[12:20])  # duplicates, deduplicated by meta.id


def test_local_sink_fsyncs_each_batch_before_acking(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    queue_name: str) -> None:
    binding = MemoryBinding()
    seed(binding, queue_name, 5)
    events: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    original_ack = binding.ack
    monkeypatch.setattr(binding, "ack", lambda m: (events.append("ack"), original_ack(m))[1])
    drain_dead_letters([DrainSource(binding, queue_name, "c")], LocalFileSink(tmp_path / "d.jsonl"), batch_records=2)
    # directory fsync at creation, then per batch: data fsync before its acks; the close fsyncs again.
    assert events == ["fsync", "fsync", "ack", "ack", "fsync", "ack", "ack", "fsync", "ack", "fsync"]


# ------------------------------------------------------------------------------------------- batching


class CountingBinding(MemoryBinding):
    """Records the batch calls the drain makes (the memory binding's own batch methods do the work)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def reserve_dead_letters(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        taken = super().reserve_dead_letters(queue_name, limit, timeout)
        self.calls.append(("reserve", limit))
        return taken

    def ack_many(self, messages: Any) -> None:
        self.calls.append(("ack", len(messages)))
        super().ack_many(messages)

    def release_many(self, messages: Any, delay: float = 0) -> None:
        self.calls.append(("release", len(messages)))
        super().release_many(messages, delay)


def test_move_reserves_and_acks_a_batch_at_a_time(tmp_path: Path, queue_name: str) -> None:
    binding = CountingBinding()
    ids = seed(binding, queue_name, 25)
    result = drain_dead_letters([DrainSource(binding, queue_name, "c")], LocalFileSink(tmp_path / "d.jsonl"),
                                batch_records=10)
    assert result.records == 25 and [r["meta_id"] for r in read_records(tmp_path / "d.jsonl")] == ids
    assert binding.calls == [("reserve", 10), ("ack", 10), ("reserve", 10), ("ack", 10), ("reserve", 10),
                             ("reserve", 5), ("ack", 5)]  # the last batch is acked by the final flush
    assert binding.dead_letter_depth(queue_name) == 0


def test_bounds_limit_what_is_reserved(tmp_path: Path, queue_name: str) -> None:
    binding = CountingBinding()
    ids = seed(binding, queue_name, 30)
    first = drain_dead_letters([DrainSource(binding, queue_name, "c")], LocalFileSink(tmp_path / "a.jsonl"),
                               batch_records=10, max_messages=13)
    assert first.records == 13 and not [call for call in binding.calls if call[0] == "release"]
    assert [limit for call, limit in binding.calls if call == "reserve"] == [10, 3]  # never past max_messages
    record_size = first.bytes // 13
    binding.calls.clear()
    second = drain_dead_letters([DrainSource(binding, queue_name, "c")], LocalFileSink(tmp_path / "b.jsonl"),
                                batch_records=10, max_bytes=int(record_size * 4.5))
    assert second.records == 4
    released = sum(n for call, n in binding.calls if call == "release")
    assert released >= 1 and binding.dead_letter_depth(queue_name) == 30 - 13 - 4  # the rest went back at once
    assert sorted(dlq_ids(binding, queue_name)) == sorted(ids[17:])


class SingleOnlyBinding(Binding):
    """A binding written before the batch methods existed: only the single-message protocol."""

    name = "single-only"
    can_browse = False

    def __init__(self) -> None:
        self.inner = MemoryBinding()

    def publish(self, body, queue_name, *, headers=None, delay=0):  # type: ignore[no-untyped-def]
        self.inner.publish(body, queue_name, headers=headers, delay=delay)

    def publish_batch(self, bodies, queue_name):  # type: ignore[no-untyped-def]
        self.inner.publish_batch(bodies, queue_name)

    def reserve(self, queue_name, timeout=0):  # type: ignore[no-untyped-def]
        return self.inner.reserve(queue_name, timeout)

    def ack(self, message):  # type: ignore[no-untyped-def]
        self.inner.ack(message)

    def release(self, message, delay=0):  # type: ignore[no-untyped-def]
        self.inner.release(message, delay)

    def dead_letter(self, message, reason, *, error=None, exception=None):  # type: ignore[no-untyped-def]
        self.inner.dead_letter(message, reason, error=error, exception=exception)

    def depth(self, queue_name):  # type: ignore[no-untyped-def]
        return self.inner.depth(queue_name)

    def dead_letter_depth(self, queue_name):  # type: ignore[no-untyped-def]
        return self.inner.dead_letter_depth(queue_name)

    def reserve_dead_letter(self, queue_name, timeout=0):  # type: ignore[no-untyped-def]
        return self.inner.reserve_dead_letter(queue_name, timeout)


def test_a_binding_with_only_single_message_methods_still_drains(tmp_path: Path, queue_name: str) -> None:
    binding = SingleOnlyBinding()
    ids = seed(binding, queue_name, 12)
    result = drain_dead_letters([DrainSource(binding, queue_name, "c")], LocalFileSink(tmp_path / "d.jsonl"),
                                batch_records=5)
    assert result.records == 12 and [r["meta_id"] for r in read_records(tmp_path / "d.jsonl")] == ids
    assert binding.dead_letter_depth(queue_name) == 0


def test_a_failure_mid_batch_releases_the_rest_of_the_reservation_at_once(tmp_path: Path, queue_name: str) -> None:
    binding = MemoryBinding()
    ids = seed(binding, queue_name, 30)
    record_size = len(drain_record(binding.browse_dead_letters(queue_name, 1)[0], broker="memory",
                                   dead_letter_queue="x", source_conn_id="c", drained_at=1))
    sink = FaultySink(tmp_path / "d.jsonl", fail_on_write=2)  # flushes every ~3 records (batch_bytes), not per 10
    with pytest.raises(OSError, match="simulated fault"):
        drain_dead_letters([DrainSource(binding, queue_name, "c")], sink, batch_records=10,
                           batch_bytes=record_size * 3)
    in_file = [r["meta_id"] for r in read_records(tmp_path / "d.jsonl")]
    assert 0 < len(in_file) < 10 and in_file == ids[:len(in_file)]
    assert binding.dead_letter_depth(queue_name) == 30 - len(in_file)  # nothing left reserved until a timeout
    assert sorted(dlq_ids(binding, queue_name)) == sorted(ids[len(in_file):])
