"""Refusing an oversized body without copying it (issue #29 point 6: body limits bound memory).

* ``core.peer.wrap_raw`` writes the poison wrapper a megabyte at a time: its bytes must be exactly those of the
  one-piece encoding (``orjson.dumps`` of the decoded text, or of the base64), at every step size, for every body.
* The SQL table leaves a body over ``decode_limit`` in the database (an unread message: ``stored_size``, empty
  ``body``) and dead-letters it with ``INSERT ... SELECT``: the same verdict, row and exact bytes as the read path;
  a release keeps the stored bytes; a reservation that expired and was taken again is not moved.
* Redis sends a large settle (a big body's dead letter) packed without copies: the DLQ still holds exactly the
  wrapper ``wrap_raw`` gives, after a script flush too, and a gone reservation still changes nothing.

The memory figures themselves are measured by ``tests/reliability/test_body_limit_memory.py``.
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import hiredis
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_babelqueue.bindings.bodies import dead_letter_body, dead_letter_parts
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.core import peer
from airflow_provider_babelqueue.core.envelope import annotate_dead_letter
from airflow_provider_babelqueue.core.peer import poison_wrapper, wrap_raw, wrap_raw_parts
from airflow_provider_babelqueue.engine.consume import Consumer
from airflow_provider_babelqueue.engine.limits import body_limit_error
from tests.bindings.conftest import FACTORIES, kept

URN = "urn:babel:test:oversized"
BLOCK: dict[str, Any] = {"original_queue": "orders", "attempts": 2, "error": 'too big "x"\n', "exception": None,
         "failed_at": 1_700_000_000_000}


def reference_wrap(raw: bytes, reason: str = "poison", **fields: Any) -> bytes:
    """The wrapper as one piece: what ``wrap_raw`` wrote before it worked in steps (the Python SDK's form)."""
    block = annotate_dead_letter({}, reason, **fields)["dead_letter"]
    try:
        return orjson.dumps({"raw": raw.decode("utf-8"), "dead_letter": block})
    except UnicodeDecodeError:
        return orjson.dumps({"raw": base64.b64encode(raw).decode("ascii"), "raw_encoding": "base64",
                             "dead_letter": block})


CASES = [
    b"", b"x", b"not json", b'{"job":"urn:x","data":{}}', b'"\\/\x00\x01\x08\t\n\x0b\x0c\r\x1f\x7f',
    "é€𝄞 \u2028\u2029 ünïcødé".encode(), "€".encode() * 7, "𝄞".encode() * 5 + b"a",
    # not UTF-8: base64
    b"\xff", b"\x80", b"ab\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", ("é" * 40).encode() + b"\xe2\x82",
    bytes(range(256)), b"ok" * 100 + b"\xfe",
]


@pytest.mark.parametrize("step", [1, 2, 3, 4, 5, 6, 7, 64, 1 << 20])
@pytest.mark.parametrize("raw", CASES, ids=range(len(CASES)))
def test_wrap_raw_is_the_one_piece_encoding_at_every_step(raw: bytes, step: int) -> None:
    with mock.patch.object(peer, "_STEP", step):
        wrapped = wrap_raw(raw, "poison", **BLOCK)
    assert wrapped == reference_wrap(raw, **BLOCK)
    wrapper = poison_wrapper(wrapped)
    assert wrapper is not None and wrapper.raw == raw


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=64) | st.text(max_size=40).map(lambda text: text.encode("utf-8", "surrogatepass")),
       step=st.integers(1, 12), reason=st.sampled_from(["poison", "failed"]))
def test_wrap_raw_property(raw: bytes, step: int, reason: str) -> None:
    """Any bytes (valid UTF-8 or not, multi-byte characters cut anywhere by a step) give the one-piece bytes."""
    with mock.patch.object(peer, "_STEP", step):
        assert wrap_raw(raw, reason, **BLOCK) == reference_wrap(raw, reason, **BLOCK)


@pytest.mark.parametrize("step", [1, 4, 5, 64, 1 << 20])
@pytest.mark.parametrize("raw", CASES, ids=range(len(CASES)))
def test_wrapper_parts_join_into_wrap_raw(raw: bytes, step: int) -> None:
    """The length is known before any part is made, and every iteration yields the same parts again."""
    with mock.patch.object(peer, "_STEP", step):
        parts = wrap_raw_parts(raw, "poison", **BLOCK)
        expected = wrap_raw(raw, "poison", **BLOCK)
        assert len(parts) == parts.size == len(expected)
        assert b"".join(parts) == expected and b"".join(parts) == expected  # iterable again
        assert bytes(parts) == expected


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=64) | st.text(max_size=40).map(lambda text: text.encode("utf-8", "surrogatepass")),
       step=st.integers(1, 12))
def test_wrapper_parts_property(raw: bytes, step: int) -> None:
    with mock.patch.object(peer, "_STEP", step):
        parts = wrap_raw_parts(raw, "failed", **BLOCK)
        assert parts.size == len(b"".join(parts)) and bytes(parts) == reference_wrap(raw, "failed", **BLOCK)


def test_dead_letter_parts_are_dead_letter_body() -> None:
    """The Redis binding sends a large dead letter as its parts: the bytes are dead_letter_body's, the texts made
    storable (a lone surrogate becomes U+FFFD) and the attempts clamped the same way."""
    body = b"\xffnot an envelope \xe2\x82"
    for attempts in (0, 3, 2**70):
        message = ReceivedMessage(body=body, queue_name="orders", envelope=None, decode_error="bad", attempts=attempts)
        with mock.patch.object(bq, "now_ms", return_value=1_700_000_000_123):
            parts = dead_letter_parts(message, bq.Reason.POISON, error="bad \ud800", exception="X")
            assert bytes(parts) == dead_letter_body(message, bq.Reason.POISON, error="bad \ud800", exception="X")
    text = ReceivedMessage(body=b"plain text", queue_name="q", envelope=None, decode_error="bad", attempts=1)
    with mock.patch.object(bq, "now_ms", return_value=5):
        assert bytes(dead_letter_parts(text, "poison")) == dead_letter_body(text, "poison")


def test_body_limit_error_takes_the_stored_size_of_an_unread_body() -> None:
    assert body_limit_error(b"", 1000, 64, size=5000) == limit_error(5000, 1000)
    assert body_limit_error(b"", 1000, 64, size=1000) is None
    unread = ReceivedMessage(body=b"", queue_name="q", envelope=None, decode_error="not read", attempts=0,
                             stored_size=5000)
    assert unread.size == 5000 and ReceivedMessage(b"abc", "q", None, None, 0).size == 3


def test_command_parts_are_the_redis_protocol() -> None:
    """Each value framed by its length; a wrapper by its known length, its parts in between; the same bytes as
    redis-py's own packer for the plain arguments."""
    from redis.connection import Encoder, PythonRespSerializer  # type: ignore[attr-defined]

    from airflow_provider_babelqueue.bindings.redis.binding import command_parts

    encode = Encoder("utf-8", "strict", False).encode
    args: tuple[Any, ...] = ("EVALSHA", "f" * 40, 2, "q:processing", "q:processing:deadlines", "t" * 32, b"\x00raw\r\n",
                             "", "0.0", 1.5)
    assert b"".join(command_parts(encode, *args)) == b"".join(PythonRespSerializer(6000, encode).pack(*args))
    parts = wrap_raw_parts("héllo".encode(), "poison", **BLOCK)
    joined = b"".join(command_parts(encode, "RPUSH", "k", parts))
    wrapped = wrap_raw("héllo".encode(), "poison", **BLOCK)
    assert joined == b"*3\r\n$5\r\nRPUSH\r\n$1\r\nk\r\n$%d\r\n%s\r\n" % (len(wrapped), wrapped)


def test_wrap_raw_of_a_large_body_at_the_default_step() -> None:
    text = ("é€𝄞\"\\\n" * 50_000).encode()  # several steps, characters and escapes cut at step boundaries
    assert wrap_raw(text, "poison", **BLOCK) == reference_wrap(text, **BLOCK)
    binary = text + b"\xff"  # invalid only at the very end: the text part is dropped for the base64 form
    assert wrap_raw(binary, "poison", **BLOCK) == reference_wrap(binary, **BLOCK)


# ------------------------------------------------------------------------------------------------- shared


def envelope_of(size: int) -> bytes:
    """A valid envelope of exactly ``size`` bytes: ``data.pad`` is ASCII."""
    base = bq.encode(bq.make_envelope(URN, {"pad": ""}, queue_name="limits"))
    return base.replace(b'"pad":""', b'"pad":"' + b"x" * (size - len(base)) + b'"', 1)


def limit_error(size: int, limit: int) -> str:
    return f"body is {size:,} bytes; this consumer accepts at most {limit:,} (max_body_bytes)"


# ------------------------------------------------------------------------------------------------ SQL


@pytest.fixture(params=["sql-sqlite", "sql-postgresql"])
def make_sql(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    cleanups: list[Callable[[], None]] = []
    yield lambda **options: FACTORIES[request.param](tmp_path, cleanups, **options)
    for cleanup in reversed(cleanups):
        cleanup()


def failed_rows(binding: Any) -> list[dict[str, Any]]:
    import sqlalchemy as sa

    with binding._read() as conn:
        rows = conn.execute(sa.select(binding._failed).order_by(binding._failed.c.id)).mappings().all()
    return [{**row, "payload": bytes(row["payload"])} for row in rows]


def test_sql_a_body_over_the_decode_limit_is_reserved_unread(make_sql: Callable[..., Any]) -> None:
    binding = make_sql()
    queue, small, big = f"q-{uuid.uuid4().hex[:8]}", envelope_of(600), envelope_of(5000)
    binding.publish(small, queue)
    binding.publish(big, queue)
    binding.decode_limit = 1000
    first, second = binding.reserve(queue), binding.reserve(queue)
    assert first.body == small and first.stored_size is None and first.size == 600 and first.envelope is not None
    assert second.body == b"" and second.stored_size == 5000 and second.size == 5000
    assert second.envelope is None and second.attempts == 0
    assert second.decode_error == "body is 5,000 bytes; not read (over the decode limit of 1,000)"
    binding.decode_limit = None  # without a limit the same row is read whole
    binding.release(second)
    again = binding.reserve(queue)
    assert again.body == big and again.stored_size is None


def test_sql_an_unread_body_is_refused_with_the_same_verdict_row_and_bytes(make_sql: Callable[..., Any]) -> None:
    """One consumer whose binding leaves the body unread, one whose binding reads it: same summary, same error,
    the same dead-letter row but for its id and time, the exact bytes in ``payload``."""
    rows, summaries, queue, body = [], [], "oversized", envelope_of(5000)
    for unread in (True, False):
        binding = make_sql()
        binding.publish(body, queue)
        consumer = Consumer(binding, queue, {URN: lambda env: None}, max_body_bytes=1000)
        if not unread:
            binding.decode_limit = None  # the consumer set it: without it the binding reads (and wraps) the body
        summaries.append(consumer.run(max_messages=1, reserve_timeout=0).as_dict())
        assert binding.depth(queue) == 0
        (row,) = failed_rows(binding)
        assert row["payload"] == body
        rows.append({key: value for key, value in row.items() if key not in ("id", "failed_at")})
        (stored,) = binding.browse_dead_letters(queue)
        wrapper = poison_wrapper(stored.body)
        assert kept(stored) == body and wrapper is not None and wrapper.dead_letter["error"] == limit_error(5000, 1000)
    assert summaries[0] == summaries[1] and summaries[0]["dead_lettered"] == {"poison": 1}
    assert rows[0] == rows[1]
    assert rows[0] == {"queue": "oversized", "urn": "", "attempts": 0, "reason": "poison",
                       "error": limit_error(5000, 1000), "exception": None, "payload": body,
                       "reserved_at": None}


def test_sql_release_and_ack_of_an_unread_body(make_sql: Callable[..., Any]) -> None:
    binding = make_sql()
    queue, big, other = "q", envelope_of(3000), envelope_of(4000)
    binding.publish_batch([big, other], queue)
    binding.decode_limit = 1000
    first = binding.reserve(queue)
    binding.release(first)  # the stored bytes stay; attempts + 1 in the column
    second, third = binding.reserve(queue), binding.reserve(queue)
    assert (second.stored_size, third.stored_size) == (4000, 3000)
    binding.release_many([second, third])
    binding.decode_limit = None
    read = [binding.reserve(queue), binding.reserve(queue)]
    assert sorted(message.body for message in read) == sorted([big, other])
    import sqlalchemy as sa

    with binding._read() as conn:
        attempts = dict(conn.execute(sa.select(binding._ready.c.payload, binding._ready.c.attempts)).all())
    assert {bytes(payload): count for payload, count in attempts.items()} == {big: 2, other: 1}
    binding.decode_limit = 1000
    binding.release_many(read)
    unread = binding.reserve(queue)
    binding.ack(unread)
    assert binding.depth(queue) == 1 and failed_rows(binding) == []


def test_sql_an_expired_unread_reservation_is_not_moved(make_sql: Callable[..., Any]) -> None:
    binding = make_sql(visibility_timeout=0.2)
    queue, big = "q", envelope_of(3000)
    binding.publish(big, queue)
    binding.decode_limit = 1000
    stale = binding.reserve(queue)
    time.sleep(0.3)
    fresh = binding.reserve(queue)  # reclaimed: the row carries the new reservation's mark
    assert fresh is not None and fresh.stored_size == 3000
    binding.dead_letter(stale, "poison", error="late")
    assert failed_rows(binding) == []
    binding.dead_letter(fresh, "poison", error="on time")
    (row,) = failed_rows(binding)
    assert (row["payload"], row["error"], row["reason"]) == (big, "on time", "poison")
    binding.dead_letter(fresh, "poison", error="twice")  # settled already: nothing more
    assert len(failed_rows(binding)) == 1 and binding.depth(queue) == 0


def test_sqlite_text_payload_counts_its_bytes(tmp_path: Path) -> None:
    """A producer that bound a string stored TEXT in SQLite's payload column: its size is its UTF-8 bytes."""
    import sqlalchemy as sa

    cleanups: list[Callable[[], None]] = []
    binding: Any = FACTORIES["sql-sqlite"](tmp_path, cleanups)
    try:
        binding.depth("q")  # creates the tables
        text = "é" * 800  # 800 characters, 1600 bytes
        with binding._write() as conn:
            conn.execute(sa.text(f"INSERT INTO {binding.config.table} (queue, payload, attempts, available_at, "
                                 "created_at) VALUES ('q', CAST(:text AS TEXT), 0, 0, 0)"), {"text": text})
        binding.decode_limit = 1000
        message = binding.reserve("q")
        assert message is not None and message.stored_size == 1600 and message.body == b""
    finally:
        for cleanup in reversed(cleanups):
            cleanup()


# ---------------------------------------------------------------------------------------------- Redis


@pytest.fixture
def redis_binding(tmp_path: Path) -> Iterator[Any]:
    cleanups: list[Callable[[], None]] = []
    yield FACTORIES["redis"](tmp_path, cleanups)
    for cleanup in reversed(cleanups):
        cleanup()


def stored_dead_letter(binding: Any, queue: str) -> bytes:
    (item,) = binding.client.lrange(binding.dead_letter_name(queue), 0, -1)
    return bytes(item)


@pytest.mark.parametrize("kind", ["text", "binary"])
def test_redis_a_large_dead_letter_is_the_wrapper_byte_for_byte(redis_binding: Any, kind: str) -> None:
    from airflow_provider_babelqueue.bindings.redis.binding import LARGE_VALUE

    queue = "big"
    body = envelope_of(LARGE_VALUE + 4096) if kind == "text" else envelope_of(LARGE_VALUE + 4096) + b"\xff"
    redis_binding.publish(body, queue)
    packed: list[int] = []  # sizes of the commands the hiredis packer built (it copies the whole command)
    pack = hiredis.pack_command

    def spy(args: Any) -> bytes:
        packed.append(sum(len(arg) for arg in args if isinstance(arg, bytes | str)))
        return pack(args)

    with mock.patch.object(hiredis, "pack_command", spy):
        summary = Consumer(redis_binding, queue, {URN: lambda env: None}, max_body_bytes=LARGE_VALUE).run(
            max_messages=1, reserve_timeout=0)
    assert packed and max(packed) < LARGE_VALUE  # the settle with the body went through the copy-free packer
    assert summary.as_dict()["dead_lettered"] == {"poison": 1}
    stored = stored_dead_letter(redis_binding, queue)
    wrapper = poison_wrapper(stored)
    assert wrapper is not None and wrapper.raw == body
    block = wrapper.dead_letter
    assert block["error"] == limit_error(len(body), LARGE_VALUE)
    assert stored == wrap_raw(body, "poison", original_queue=queue, attempts=0, error=block["error"],
                              failed_at=block["failed_at"])
    keys = redis_binding._keys(redis_binding._key(queue), dead=False)
    assert [redis_binding.client.exists(key) for key in keys] == [0, 0, 0, 0]  # ready, processing, deadlines


def test_redis_a_large_settle_loads_its_script_after_a_flush(redis_binding: Any) -> None:
    from airflow_provider_babelqueue.bindings.redis.binding import LARGE_VALUE

    queue, body = "big", envelope_of(LARGE_VALUE + 10)
    redis_binding.publish(body, queue)
    redis_binding.decode_limit = LARGE_VALUE  # not decoded: dead-lettered as its wrapper, as a consumer does
    message = redis_binding.reserve(queue)
    redis_binding.client.script_flush()
    redis_binding.dead_letter(message, "poison", error="flushed")
    wrapper = poison_wrapper(stored_dead_letter(redis_binding, queue))
    assert wrapper is not None and wrapper.raw == body


def test_redis_a_large_settle_of_a_gone_reservation_changes_nothing(redis_binding: Any,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    from airflow_provider_babelqueue.bindings.redis.binding import LARGE_VALUE

    queue, body = "big", envelope_of(LARGE_VALUE + 10)
    redis_binding.publish(body, queue)
    message = redis_binding.reserve(queue)
    redis_binding.ack(message)
    redis_binding.dead_letter(message, "poison", error="after the ack")
    assert redis_binding.client.llen(redis_binding.dead_letter_name(queue)) == 0
    assert "is gone" in caplog.text


def test_redis_a_large_body_that_arrives_while_waiting_is_claimed(redis_binding: Any) -> None:
    """The BLMOVE path: the claim sends the large value back to register its deadline member."""
    from airflow_provider_babelqueue.bindings.redis.binding import LARGE_VALUE

    queue, body = "big", envelope_of(LARGE_VALUE + 10)
    timer = threading.Timer(0.3, redis_binding.publish, (body, queue))
    timer.start()
    try:
        message = redis_binding.reserve(queue, timeout=5)
    finally:
        timer.join()
    assert message is not None and message.body == body
    processing = redis_binding._key(queue) + ":processing"
    assert redis_binding.client.zcard(processing + ":deadlines") == 1
    redis_binding.ack(message)
    assert redis_binding.client.llen(processing) == 0 and redis_binding.client.zcard(processing + ":deadlines") == 0


def test_redis_a_value_over_the_decode_limit_is_spilled_and_read_in_slices(redis_binding: Any) -> None:
    """Over both the decode limit and 1 MiB, the reserve script copies the value to a spill key (expiring with the
    reservation) and returns its length; the binding reads it in slices, exact, and deletes the key. The
    reservation itself is the usual one: the element in processing, its deadline member."""
    from airflow_provider_babelqueue.bindings.redis.binding import _SLICE, LARGE_VALUE

    queue = "big"
    body = envelope_of(2 * _SLICE + 12345)  # three slices, the last one short
    at_limit = envelope_of(LARGE_VALUE + 100)
    redis_binding.publish(body, queue)
    redis_binding.publish(at_limit, queue)
    redis_binding.decode_limit = LARGE_VALUE + 100
    client, processing = redis_binding.client, redis_binding._key(queue) + ":processing"
    spills: list[int] = []
    getrange = client.getrange

    def spy(key: str, start: int, end: int) -> bytes:
        spills.append(client.pttl(key))
        return bytes(getrange(key, start, end))

    with mock.patch.object(client, "getrange", spy):
        message = redis_binding.reserve(queue)
        assert message is not None and message.body == body and len(spills) == 3
        assert all(0 < ttl <= redis_binding.config.visibility_timeout * 1000 for ttl in spills)
        whole = redis_binding.reserve(queue)  # at the limit: not spilled
        assert whole is not None and whole.body == at_limit and len(spills) == 3
    assert list(client.scan_iter(match=f"{processing}:spill:*")) == []
    assert client.lrange(processing, 0, -1) == [body, at_limit] and client.zcard(processing + ":deadlines") == 2
    redis_binding.ack(message)
    redis_binding.ack(whole)
    assert client.llen(processing) == 0 and client.zcard(processing + ":deadlines") == 0


def test_redis_a_spill_that_expired_fails_the_reserve_and_the_reservation_comes_back(redis_binding: Any) -> None:
    from airflow_provider_babelqueue.bindings.base import BindingError
    from airflow_provider_babelqueue.bindings.redis.binding import LARGE_VALUE

    queue, body = "big", envelope_of(LARGE_VALUE + 10)
    redis_binding.publish(body, queue)
    redis_binding.decode_limit = LARGE_VALUE
    with mock.patch.object(redis_binding.client, "getrange", return_value=b""), pytest.raises(
            BindingError, match="expired"):
        redis_binding.reserve(queue)
    processing = redis_binding._key(queue) + ":processing"
    assert redis_binding.client.lrange(processing, 0, -1) == [body]  # still reserved: swept back after its timeout


def test_redis_a_large_reply_is_followed_by_a_ping(redis_binding: Any) -> None:
    """The PING that makes hiredis drop its copy of a large reply is sent for large bodies only."""
    from airflow_provider_babelqueue.bindings.redis.binding import LARGE_VALUE

    queue = "q"
    redis_binding.publish(envelope_of(1000), queue)
    redis_binding.publish(envelope_of(LARGE_VALUE + 1), queue)
    with mock.patch.object(redis_binding.client, "ping", wraps=redis_binding.client.ping) as ping:
        redis_binding.reserve(queue)
        assert ping.call_count == 0
        redis_binding.reserve(queue)
        assert ping.call_count == 1
