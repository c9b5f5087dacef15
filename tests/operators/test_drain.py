"""Drain operator and drain logic: record format, browse/move, bounds, destinations, at-least-once.

The end-to-end DAG runs (seed → drain → replay on SQLite, PostgreSQL and Redis) are in test_replay.py;
this module calls ``execute`` and the pure drain function directly, which is much faster.
"""

from __future__ import annotations

import base64
import io
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding, NotSupportedError
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage, parse_body
from airflow_provider_babelqueue.core import records
from airflow_provider_babelqueue.core.records import drain_record, parse_replay_line, record_body
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, StreamSink, drain_dead_letters
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


#: Bodies the fast record path must write exactly as drain_record does: envelopes, escapes, poison of every kind.
ODD_BODIES = [
    envelope_body("orders", 1),
    bq.encode(bq.make_envelope("urn:x", {"s": 'quote " backslash \\ slash / tab \t nl \n \u2028 \x7f \x01 é ☕ 😀'},
                               queue_name="orders")),
    POISON,
    b"",
    b"not json at all",
    b'{"meta": {"id": "truncated"',
    b"[1, 2, 3]",
    b'"a json string"',
    b"null",
    b'{"meta": "not an object"}',
    b'{"meta": {"id": 42}}',
    b'{"meta": {"id": null}}',
    b'{"meta": {"id": "dup-1"}, "meta": {"id": "dup-2"}}',
    b'{"meta": {"id": "caf\\u00e9 \\ud83d\\ude00"}, "lone": "\\ud800"}',
    b'\xef\xbb\xbf{"meta": {"id": "bom"}}',
    b'{"meta": {"id": "x"}, "n": NaN}',
    b'{"meta": {"id": "x"}, "big": 123456789012345678901234567890}',
    b'  {"meta": {"id": "spaces"}}  \n',
    b'{"meta": {"id": "bad utf8 \xc3\x28"}}',
]


def redis_like(body: bytes, queue_name: str = "orders", **fields: Any) -> ReceivedMessage:
    """The message a binding without headers builds (what RedisBinding._parsed makes of the bytes)."""
    envelope, error, attempts = parse_body(body)
    return ReceivedMessage(body=body, queue_name=queue_name, envelope=envelope, decode_error=error,
                           attempts=attempts, **fields)


def reference(message: ReceivedMessage, drained_at: int = 1749132730123) -> bytes:
    return drain_record(message, broker="redis", dead_letter_queue="orders:failed", source_conn_id="bq_redis",
                        drained_at=drained_at)


TEMPLATE = records.RecordTemplate(broker="redis", queue_name="orders", dead_letter_queue="orders:failed",
                                      source_conn_id="bq_redis")


def test_the_fast_record_path_writes_drain_record_bytes_exactly() -> None:
    stamp = TEMPLATE.stamp(1749132730123)
    assert TEMPLATE.of_raws(ODD_BODIES, stamp) == [reference(redis_like(body)) for body in ODD_BODIES]
    for body in ODD_BODIES:
        for count in (None, 0, 7):
            message = redis_like(body, delivery_count=count)
            assert TEMPLATE.of_message(message, 1749132730123) == reference(message)
    # Anything whose other keys are not the source's constants goes to drain_record.
    assert TEMPLATE.of_message(redis_like(ODD_BODIES[0], headers={"x-first-death-reason": "rejected"}), 1) is None
    assert TEMPLATE.of_message(redis_like(ODD_BODIES[0], queue_name="other"), 1) is None
    assert TEMPLATE.of_message(redis_like(ODD_BODIES[0], delivery_count=True), 1) is None


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=64),
                 st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(),
                              lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                          max_size=3),
                              max_leaves=8).map(lambda value: orjson.dumps({"meta": value, "x": value})),
                 st.text().map(lambda text: orjson.dumps({"meta": {"id": text}}))))
def test_the_fast_record_path_matches_drain_record_for_any_bytes(body: bytes) -> None:
    assert TEMPLATE.of_raws([body], TEMPLATE.stamp(5)) == [reference(redis_like(body), 5)]
    assert TEMPLATE.of_message(redis_like(body), 5) == reference(redis_like(body), 5)


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


@pytest.mark.parametrize("rendered", [json.dumps, str], ids=["json_text", "python_text"])
def test_move_with_several_sources_into_one_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 rendered: Callable[[Any], str]) -> None:
    """``sources`` as a template renders it: JSON text (``| tojson``) or Python's text of the list."""
    first, second = MemoryBinding(), MemoryBinding()
    ids_a, ids_b = seed(first, "a", 3), seed(second, "b", 2)
    use_bindings(monkeypatch, drain_module, {"one": first, "two": second})
    operator = BabelQueueDrainDeadLettersOperator(
        task_id="move", destination=str(tmp_path / "all.jsonl"), batch_records=2,
        sources=rendered([{"babelqueue_conn_id": "one", "queue_name": "a"},
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


# ------------------------------------------------------------------------------- pipelined (Redis) drains


@pytest.fixture
def redis_binding(tmp_path: Path) -> Iterator[Binding]:
    cleanups: list[Callable[[], None]] = []
    yield _redis_factory(tmp_path, cleanups)
    for cleanup in reversed(cleanups):
        cleanup()


def seed_redis_dlq(binding: Any, queue_name: str, count: int) -> list[bytes]:
    """``count`` dead letters pushed straight onto the DLQ list (as any SDK leaves them), oldest first."""
    bodies = [bq.encode(bq.annotate_dead_letter(bq.make_envelope("urn:babel:orders:created", {"n": n, "s": "Zoë/★"},
                                                                 queue_name=queue_name),
                                                "failed", original_queue=queue_name, attempts=3))
              for n in range(count)]
    bodies[7] = POISON  # a poison body travels through the fast path too
    for start in range(0, count, 1000):
        binding.client.rpush(binding.dead_letter_name(queue_name), *bodies[start:start + 1000])
    return bodies


def record_requests(monkeypatch: pytest.MonkeyPatch, binding: Any) -> list[tuple[int, int]]:
    """(limit asked, reservations already in flight) of every pipelined reservation the drain sends."""
    calls: list[tuple[int, int]] = []
    opener = binding.open_dead_letter_pipeline

    def open_recording(queue_name: str, **options: Any) -> Any:  # options: which DLQ source (one per pipeline)
        pipeline = opener(queue_name, **options)
        request = pipeline.request

        def recording(limit: int) -> int:
            calls.append((limit, pipeline.reservations_in_flight))
            return request(limit)

        pipeline.request = recording
        return pipeline

    monkeypatch.setattr(binding, "open_dead_letter_pipeline", open_recording)
    return calls


def assert_settled(binding: Any, queue_name: str) -> None:
    """No reservation left behind: nothing to wait a visibility timeout for."""
    dlq = binding.dead_letter_name(queue_name)
    assert binding.client.llen(f"{dlq}:processing") == 0 and binding.client.zcard(f"{dlq}:processing:deadlines") == 0


def test_a_pipelined_drain_writes_every_record_exactly_and_reserves_one_batch_ahead(
        monkeypatch: pytest.MonkeyPatch, redis_binding: Any, tmp_path: Path, queue_name: str) -> None:
    bodies = seed_redis_dlq(redis_binding, queue_name, 2500)
    calls = record_requests(monkeypatch, redis_binding)

    def no_slow_path(*args: Any) -> None:
        raise AssertionError("every ack of an undisturbed drain is the head of processing: the fast script")

    monkeypatch.setattr(redis_binding, "_settle_many", no_slow_path)
    path = tmp_path / "d.jsonl"
    result = drain_dead_letters([DrainSource(redis_binding, queue_name, "bq_redis")], LocalFileSink(path),
                                batch_records=1000)
    lines = path.read_bytes().splitlines(keepends=True)
    assert result.records == 2500 == len(lines) and result.bytes == path.stat().st_size
    assert result.by_source == {f"bq_redis/{queue_name}": 2500}
    dlq = redis_binding.dead_letter_name(queue_name)
    for line, body in zip(lines, bodies, strict=True):  # byte for byte what drain_record writes
        drained_at = orjson.loads(line)["drained_at"]
        assert line == drain_record(redis_like(body, queue_name, from_dead_letter=True), broker="redis",
                                    dead_letter_queue=dlq, source_conn_id="bq_redis", drained_at=drained_at)
    # The next batch is asked for while this one is written (one in flight); the short batch ends the run. The
    # last request is the pipeline of the second dead-letter source, <queue>.dlq (empty here).
    assert calls == [(1000, 0), (1000, 0), (1000, 0), (1000, 0)]
    assert redis_binding.dead_letter_depth(queue_name) == 0
    assert_settled(redis_binding, queue_name)


@pytest.mark.parametrize(("max_messages", "expected"), [(2500, [1000, 1000, 500]), (1000, [1000]), (1, [1]),
                                                        (1999, [1000, 999])])
def test_a_pipelined_drain_never_reserves_past_max_messages(monkeypatch: pytest.MonkeyPatch, redis_binding: Any,
                                                             tmp_path: Path, queue_name: str, max_messages: int,
                                                             expected: list[int]) -> None:
    bodies = seed_redis_dlq(redis_binding, queue_name, 3000)
    calls = record_requests(monkeypatch, redis_binding)
    result = drain_dead_letters([DrainSource(redis_binding, queue_name, "c")], LocalFileSink(tmp_path / "d.jsonl"),
                                batch_records=1000, max_messages=max_messages)
    assert result.records == max_messages and [limit for limit, _ in calls] == expected
    assert [record_body(r) for r in read_records(tmp_path / "d.jsonl")] == bodies[:max_messages]
    assert redis_binding.client.lrange(redis_binding.dead_letter_name(queue_name), 0, -1) == bodies[max_messages:]
    assert_settled(redis_binding, queue_name)


def test_a_pipelined_drain_with_max_bytes_does_not_reserve_ahead(monkeypatch: pytest.MonkeyPatch,
                                                                  redis_binding: Any, tmp_path: Path,
                                                                  queue_name: str) -> None:
    bodies = seed_redis_dlq(redis_binding, queue_name, 100)
    calls = record_requests(monkeypatch, redis_binding)
    size = len(TEMPLATE.of_raws(bodies[:1], TEMPLATE.stamp(1749132730123))[0])
    result = drain_dead_letters([DrainSource(redis_binding, queue_name, "c")], LocalFileSink(tmp_path / "d.jsonl"),
                                batch_records=10, max_bytes=size * 25)
    assert 20 <= result.records < 26 and result.bytes <= size * 25 + 100
    assert all(in_flight == 0 for _, in_flight in calls)  # how many fit depends on the batch in hand
    written = [record_body(r) for r in read_records(tmp_path / "d.jsonl")]
    assert written == bodies[:result.records]
    # The reserved records that did not fit went back at once, in the DLQ with the never-reserved rest.
    assert sorted(redis_binding.client.lrange(redis_binding.dead_letter_name(queue_name), 0, -1)) == sorted(
        bodies[result.records:])
    assert_settled(redis_binding, queue_name)


def test_a_pipelined_drain_acks_partial_batches_when_batch_bytes_flushes(redis_binding: Any, tmp_path: Path,
                                                                         queue_name: str) -> None:
    bodies = seed_redis_dlq(redis_binding, queue_name, 95)
    size = len(TEMPLATE.of_raws(bodies[:1], TEMPLATE.stamp(1749132730123))[0])
    sink = FaultySink(tmp_path / "d.jsonl", fail_on_write=0)  # counts writes, never fails
    result = drain_dead_letters([DrainSource(redis_binding, queue_name, "c")], sink, batch_records=40,
                                batch_bytes=size * 7)  # a flush every ~7 records: ranges of a batch are acked
    assert result.records == 95 and sink.writes >= 95 // 8
    assert [record_body(r) for r in read_records(tmp_path / "d.jsonl")] == bodies
    assert redis_binding.dead_letter_depth(queue_name) == 0
    assert_settled(redis_binding, queue_name)


@pytest.mark.parametrize("fail_on_write", [1, 2, 3])
def test_a_failed_pipelined_drain_releases_the_batch_reserved_ahead_at_once(redis_binding: Any, tmp_path: Path,
                                                                             queue_name: str,
                                                                             fail_on_write: int) -> None:
    bodies = seed_redis_dlq(redis_binding, queue_name, 35)
    sink = FaultySink(tmp_path / "d.jsonl", fail_on_write=fail_on_write)
    with pytest.raises(OSError, match="simulated fault"):
        drain_dead_letters([DrainSource(redis_binding, queue_name, "c")], sink, batch_records=10)
    in_file = [record_body(r) for r in read_records(tmp_path / "d.jsonl")]
    assert in_file == bodies[:10 * (fail_on_write - 1)]  # the durable, acked batches; the torn one was cut
    in_dlq = redis_binding.client.lrange(redis_binding.dead_letter_name(queue_name), 0, -1)
    assert sorted(in_file + in_dlq) == sorted(bodies)  # each one in exactly one place: no duplicate, no loss
    assert_settled(redis_binding, queue_name)  # the batch in hand and the one reserved ahead: released at once


def test_a_pipelined_sync_failure_cuts_the_file_and_releases_everything_not_acked(
        monkeypatch: pytest.MonkeyPatch, redis_binding: Any, tmp_path: Path, queue_name: str) -> None:
    bodies = seed_redis_dlq(redis_binding, queue_name, 30)
    sink = LocalFileSink(tmp_path / "d.jsonl")
    syncs = [0]
    real_sync = sink.sync

    def failing_sync() -> None:  # runs on the sync thread: the error reaches the drain at the next flush
        syncs[0] += 1
        if syncs[0] == 2:
            raise OSError(5, "Input/output error (simulated fault)")
        real_sync()

    monkeypatch.setattr(sink, "sync", failing_sync)
    with pytest.raises(OSError, match="simulated fault"):
        drain_dead_letters([DrainSource(redis_binding, queue_name, "c")], sink, batch_records=10)
    in_file = [record_body(r) for r in read_records(tmp_path / "d.jsonl")]
    assert in_file == bodies[:10]  # only the first batch was durable
    in_dlq = redis_binding.client.lrange(redis_binding.dead_letter_name(queue_name), 0, -1)
    assert sorted(in_file + in_dlq) == sorted(bodies)
    assert_settled(redis_binding, queue_name)


def test_pipelined_and_plain_sources_share_one_file(redis_binding: Any, tmp_path: Path, queue_name: str) -> None:
    memory = MemoryBinding()
    ids = seed(memory, "mem", 7)
    first = seed_redis_dlq(redis_binding, queue_name, 1200)
    second = seed_redis_dlq(redis_binding, f"{queue_name}-b", 30)
    sources = [DrainSource(redis_binding, queue_name, "r"), DrainSource(memory, "mem", "m"),
               DrainSource(redis_binding, f"{queue_name}-b", "r")]
    result = drain_dead_letters(sources, LocalFileSink(tmp_path / "d.jsonl"), batch_records=500)
    records = read_records(tmp_path / "d.jsonl")
    bodies = [record_body(r) for r in records]
    assert len(records) == 1237 and bodies[:1200] == first and bodies[1207:] == second
    assert [r["meta_id"] for r in records[1200:1207]] == ids
    assert result.by_source == {f"r/{queue_name}": 1200, "m/mem": 7, f"r/{queue_name}-b": 30}
    assert {r["broker"] for r in records[:1200]} == {"redis"} and records[1203]["broker"] == "memory"
    for name in (queue_name, f"{queue_name}-b"):
        assert redis_binding.dead_letter_depth(name) == 0
        assert_settled(redis_binding, name)


def test_a_redis_browse_copies_the_stored_bytes_exactly_and_removes_nothing(redis_binding: Any, tmp_path: Path,
                                                                            queue_name: str) -> None:
    bodies = seed_redis_dlq(redis_binding, queue_name, 1500)
    dlq = redis_binding.dead_letter_name(queue_name)
    path = tmp_path / "all.jsonl"
    result = drain_dead_letters([DrainSource(redis_binding, queue_name, "b")], LocalFileSink(path), mode="browse",
                                batch_records=100)
    lines = path.read_bytes().splitlines(keepends=True)
    assert result.records == 1500 == len(lines) and result.bytes == path.stat().st_size
    for line, body in zip(lines, bodies, strict=True):
        drained_at = orjson.loads(line)["drained_at"]
        assert line == drain_record(redis_like(body, queue_name), broker="redis", dead_letter_queue=dlq,
                                    source_conn_id="b", drained_at=drained_at)
    assert redis_binding.client.lrange(dlq, 0, -1) == bodies  # untouched
    some = drain_dead_letters([DrainSource(redis_binding, queue_name, "b")], LocalFileSink(tmp_path / "7.jsonl"),
                              mode="browse", max_messages=7)
    assert some.records == 7 and [record_body(r) for r in read_records(tmp_path / "7.jsonl")] == bodies[:7]
    cap = sum(map(len, lines[:10])) + len(lines[10]) // 2
    bounded = drain_dead_letters([DrainSource(redis_binding, queue_name, "b")], LocalFileSink(tmp_path / "b.jsonl"),
                                 mode="browse", max_bytes=cap)
    assert bounded.records == 10 and bounded.bytes == sum(map(len, lines[:10])) <= cap  # the 11th would not fit
    assert redis_binding.dead_letter_depth(queue_name) == 1500
    assert_settled(redis_binding, queue_name)


def test_a_redis_drain_without_a_pipeline_or_with_a_wait_uses_the_plain_protocol(redis_binding: Any, tmp_path: Path,
                                                                                  queue_name: str) -> None:
    from airflow_provider_babelqueue.bindings.redis import RedisBinding

    class NoPool:
        """A client without a connection pool (as a cluster client): the binding offers no pipeline."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "connection_pool":
                raise AttributeError(name)
            return getattr(self._inner, name)

    plain = RedisBinding(redis_binding.config, client=NoPool(redis_binding.client))
    assert plain.open_dead_letter_pipeline(queue_name) is None
    bodies = seed_redis_dlq(redis_binding, queue_name, 25)
    result = drain_dead_letters([DrainSource(plain, queue_name, "c")], LocalFileSink(tmp_path / "a.jsonl"),
                                batch_records=10)
    assert result.records == 25 and [record_body(r) for r in read_records(tmp_path / "a.jsonl")] == bodies
    assert_settled(redis_binding, queue_name)

    # With a reserve_timeout, an empty DLQ is waited for after the pipelined part (BLMOVE, the single path).
    late = bodies[:3]
    timer = threading.Timer(0.3, lambda: redis_binding.client.rpush(redis_binding.dead_letter_name(queue_name),
                                                                      *late))
    timer.start()
    try:
        waited = drain_dead_letters([DrainSource(redis_binding, queue_name, "c")], LocalFileSink(tmp_path / "b.jsonl"),
                                    batch_records=10, reserve_timeout=2.0)
    finally:
        timer.join()
    assert waited.records == 3 and [record_body(r) for r in read_records(tmp_path / "b.jsonl")] == late
    assert redis_binding.dead_letter_depth(queue_name) == 0
    assert_settled(redis_binding, queue_name)


def test_pipelined_sources_into_object_storage_are_acked_only_after_the_close(redis_binding: Any, tmp_path: Path,
                                                                              queue_name: str) -> None:
    first = seed_redis_dlq(redis_binding, queue_name, 45)
    second = seed_redis_dlq(redis_binding, f"{queue_name}-b", 12)
    dlq = redis_binding.dead_letter_name(queue_name)
    target = tmp_path / "object.jsonl"
    seen_at_close: list[int] = []

    class Upload(io.BytesIO):
        """An object-storage stream: the object exists only once close() returned."""

        def close(self) -> None:
            seen_at_close.append(redis_binding.client.llen(f"{dlq}:processing"))  # still reserved, not acked
            target.write_bytes(self.getvalue())
            super().close()

    sink = StreamSink(Upload, "s3://bucket/object.jsonl")
    result = drain_dead_letters([DrainSource(redis_binding, queue_name, "r"),
                                 DrainSource(redis_binding, f"{queue_name}-b", "r")], sink, batch_records=10)
    assert result.records == 57 and [record_body(r) for r in read_records(target)] == first + second
    assert seen_at_close == [45]  # every reservation was held until the object was complete
    for name in (queue_name, f"{queue_name}-b"):
        assert redis_binding.dead_letter_depth(name) == 0
        assert_settled(redis_binding, name)


def test_sources_text_that_cannot_be_read_names_the_fix() -> None:
    operator = BabelQueueDrainDeadLettersOperator(task_id="d", destination="/tmp/unused.jsonl",
                                                  sources="[{'queue_name': orders}]")
    with pytest.raises(ValueError, match=r"sources must be a list of dicts; .*neither JSON nor a Python literal"):
        operator.execute(context={})


@pytest.mark.parametrize(
    ("destination", "message"),
    [
        ("dlq/", r"destination 'dlq/' is a relative path; give an absolute path .* working directory"),
        ("out.jsonl", r"destination 'out.jsonl' is a relative path"),
        ("None", r"destination must be a local path or an object storage URL, got 'None'"),
        (" ", r"destination must be a local path or an object storage URL"),
    ],
)
def test_a_move_drain_never_writes_where_nobody_looks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      queue_name: str, destination: str, message: str) -> None:
    """A moved dead letter is out of the broker: a relative path (the task's working directory, which differs
    between workers) or a template rendered as unset is refused before anything is taken."""
    binding = MemoryBinding()
    seed(binding, queue_name, 2)
    use_bindings(monkeypatch, drain_module, {"mem": binding})
    monkeypatch.chdir(tmp_path)
    operator = BabelQueueDrainDeadLettersOperator(task_id="d", babelqueue_conn_id="mem", queue_name=queue_name,
                                                  destination=destination)
    with pytest.raises(ValueError, match=message):
        operator.execute(context={})
    assert binding.dead_letter_depth(queue_name) == 2 and list(tmp_path.iterdir()) == []
