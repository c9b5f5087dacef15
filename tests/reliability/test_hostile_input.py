"""Hostile input: fuzzed bodies and envelopes through the consumer and the drain on real bindings, and the limits.

Property-based (hypothesis) runs push raw bodies (arbitrary bytes, near-JSON, truncated JSON, invalid UTF-8,
huge numbers, NaN literals, duplicate keys, deep nesting, oversized bodies) and envelopes (valid ones and
mutations: missing fields, wrong types, other schema versions, unknown keys) through
:class:`~airflow_provider_babelqueue.engine.consume.Consumer` on SQLite (the SQL binding) and on the real Redis at
127.0.0.1:6379, then drain the dead-letter queue into a
:class:`~airflow_provider_babelqueue.engine.drain.LocalFileSink`.
Each example checks that

* the consumer never raises, and every message ends handled or dead-lettered with a reason from ``Reason``;
* nothing is left in the queue and nothing is lost: the DLQ holds exactly one entry per dead letter;
* the raw bytes of every poison message are in the DLQ and in the drain record byte for byte;
* every other dead letter is its envelope plus a ``dead_letter`` block carrying the same reason (or, when the
  body cannot be re-encoded, the delivered bytes themselves).

The limit tests pin ``max_body_bytes`` and ``max_nesting_depth`` at their boundaries (at the limit passes, one
over is dead-lettered as ``poison`` with an error naming the limit and the actual figure). Redis must be up:
these tests fail, never skip, when it is not.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage, parse_body
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.core.records import record_body
from airflow_provider_babelqueue.engine.consume import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_NESTING_DEPTH,
    Backoff,
    Consumer,
    ConsumeSummary,
    body_limit_error,
    nesting_depth,
)
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, drain_dead_letters
from tests.strategies import DATA, JSON, TEXT, envelopes

OK_URN = "urn:babel:fuzz:ok"
FAIL_URN = "urn:babel:fuzz:fail"
UNKNOWN_URN = "urn:babel:fuzz:nobody"
URNS = (OK_URN, FAIL_URN, UNKNOWN_URN)
REASONS = frozenset(reason.value for reason in bq.Reason)
NO_WAIT = Backoff("fixed", 0.0)
QUIET = logging.getLogger("tests.reliability.hostile")
#: A small byte limit for the fuzz runs, so oversized bodies are cheap to generate.
FUZZ_LIMITS = {"max_body_bytes": 8192, "max_nesting_depth": DEFAULT_MAX_NESTING_DEPTH}
NO_LIMITS: dict[str, int | None] = {"max_body_bytes": None, "max_nesting_depth": None}
FUZZ = settings(max_examples=100, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class HandlerFailed(Exception):
    pass


def _fail(envelope: dict[str, Any]) -> None:
    raise HandlerFailed(f"handler refused {bq.meta_id_of(envelope)}")


# ------------------------------------------------------------------------------------------ bindings


def _sqlite(tmp: Path, cleanups: list[Callable[[], None]]) -> Binding:
    from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig, sqlite_url

    binding = SqlBinding(SqlConfig(url=sqlite_url(tmp / "hostile.sqlite"), table="hostile_jobs"))
    cleanups.append(binding.close)
    return binding


def _redis(tmp: Path, cleanups: list[Callable[[], None]]) -> Binding:
    from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig

    prefix = f"bqhostile:{uuid.uuid4().hex[:10]}:"
    binding = RedisBinding(RedisConfig(host="127.0.0.1", port=6379, key_prefix=prefix))
    binding.ping()  # Redis down: fail here, loudly (never skip)

    def drop() -> None:
        keys = list(binding.client.scan_iter(match=f"{prefix}*"))
        if keys:
            binding.client.delete(*keys)
        binding.close()

    cleanups.append(drop)
    return binding


FACTORIES = {"sqlite": _sqlite, "redis": _redis}


@pytest.fixture(scope="module", params=list(FACTORIES))
def binding(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Binding]:
    """One binding per module and broker (hypothesis examples share it; each example uses a fresh queue)."""
    cleanups: list[Callable[[], None]] = []
    yield FACTORIES[request.param](tmp_path_factory.mktemp(f"hostile-{request.param}"), cleanups)
    for cleanup in reversed(cleanups):
        cleanup()


@pytest.fixture(scope="module")
def drain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile-drains")


class Spy:
    """Delegates to a real binding and records every ``dead_letter`` call as (delivered body, reason, error)."""

    def __init__(self, binding: Binding) -> None:
        self._binding = binding
        self.dead: list[tuple[bytes, str, str | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._binding, name)

    def dead_letter(self, message: ReceivedMessage, reason: str, *, error: str | None = None,
                    exception: str | None = None) -> None:
        self.dead.append((message.body, str(reason), error))
        self._binding.dead_letter(message, reason, error=error, exception=exception)


# --------------------------------------------------------------------------------------- strategies


def template(urn: str = OK_URN) -> bytes:
    """A valid body with two splice points: ``"v":0`` (any JSON value) and ``"s":"x"`` (string content)."""
    return bq.encode(bq.make_envelope(urn, {"v": 0, "s": "x"}, queue_name="fuzz"))


def splice(body: bytes, value: bytes) -> bytes:
    return body.replace(b'"v":0', b'"v":' + value, 1)


def arrays(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


HOSTILE_LITERALS = [
    b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"nan", b"inf", b"1e400", b"-1e400", b"1E309", b"2e308",
    b"18446744073709551616", b"-9223372036854775809", b"9223372036854775807", b"123456789012345678901234567890",
    b"0." + b"0" * 400 + b"1", b"1" + b"0" * 4400, b"-" + b"9" * 5000, b"1e-400", b"-0", b"01", b"+1", b".5", b"1.",
    b"0x10", b"1_000", b"true", b"null", b"False", b"undefined", b'"\\ud800"', b'"\\udfff\\ud800"', b'"\\u0000"',
    b'"\\x41"', b"'single'", b'"unterminated', b"[1,]", b"{,}", b'{"a" 1}', b"[1 2]", b"\x00", b"1 2",
]
INVALID_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80",
                b"\xe2\x82", b"\xf8\x88\x80\x80\x80"]


@st.composite
def literal_bodies(draw: st.DrawFn) -> bytes:
    """A valid envelope with one hostile literal as ``data.v``: NaN, huge numbers, invalid escapes..."""
    return splice(template(draw(st.sampled_from(URNS))), draw(st.sampled_from(HOSTILE_LITERALS)))


@st.composite
def invalid_utf8_bodies(draw: st.DrawFn) -> bytes:
    body = template(draw(st.sampled_from(URNS)))
    junk = draw(st.sampled_from(INVALID_UTF8)) + draw(st.binary(max_size=3))
    where = draw(st.sampled_from(["data", "urn", "key", "end"]))
    if where == "data":
        return body.replace(b'"s":"x"', b'"s":"' + junk + b'"', 1)
    if where == "urn":
        return body.replace(b'"job":"', b'"job":"' + junk, 1)
    if where == "key":
        return body.replace(b'"s":', b'"' + junk + b'":', 1)
    return body + junk


@st.composite
def duplicate_key_bodies(draw: st.DrawFn) -> bytes:
    """Duplicate keys: JSON parsers keep the last one; the message must still end handled or dead-lettered."""
    urn = draw(st.sampled_from(URNS))
    body = template(urn)
    extra = draw(st.sampled_from([
        b'"job":"' + draw(st.sampled_from(URNS)).encode() + b'"', b'"attempts":-1', b'"attempts":1',
        b'"meta":null', b'"meta":{"schema_version":2}', b'"data":{"v":1}', b'"data":[]', b'"data":"x"',
        b'"trace_id":""', b'"urn":"' + urn.encode() + b'"', b'"dead_letter":{"reason":"poison"}',
    ]))
    if draw(st.booleans()):
        return b"{" + extra + b"," + body[1:]
    return body[:-1] + b"," + extra + b"}"


@st.composite
def nested_bodies(draw: st.DrawFn) -> bytes:
    """Deep nesting in ``data.v``, at the top level, or unbalanced; around the 64 limit and far beyond it."""
    depth = draw(st.integers(1, 3000) | st.integers(58, 70))
    shape = draw(st.sampled_from(["arrays", "objects", "mixed", "top", "unbalanced", "in_string"]))
    if shape == "arrays":
        value = b"[" * depth + b"]" * depth
    elif shape == "objects":
        value = b'{"a":' * depth + b"0" + b"}" * depth
    elif shape == "mixed":
        value = b'[{"a":' * (depth // 2) + b"[]" + b"}]" * (depth // 2)
    elif shape == "top":
        return b"[" * depth + b"]" * depth
    elif shape == "unbalanced":
        value = b"[" * depth
    else:  # brackets inside a string do not nest
        value = b'"' + b"[{" * depth + b'"'
    return splice(template(draw(st.sampled_from(URNS))), value)


@st.composite
def near_json(draw: st.DrawFn) -> bytes:
    """A valid body, truncated, with bytes flipped, inserted or deleted."""
    body = bytearray(template(draw(st.sampled_from(URNS))))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
        index = draw(st.integers(0, max(len(body) - 1, 0)))
        if op == "truncate":
            del body[index:]
        elif op == "flip" and body:
            body[index] ^= draw(st.integers(1, 255))
        elif op == "insert":
            body[index:index] = draw(st.sampled_from([b'"', b"\\", b"{", b"]", b",", b":", b"\x00"])
                                     | st.binary(min_size=1, max_size=4))
        elif op == "delete" and body:
            del body[index]
    return bytes(body)


@st.composite
def oversized_bodies(draw: st.DrawFn) -> bytes:
    """Valid envelopes just under, at and over the fuzz byte limit."""
    body = template(draw(st.sampled_from(URNS)))
    target = FUZZ_LIMITS["max_body_bytes"] + draw(st.integers(-40, 40))
    return body.replace(b'"s":"x"', b'"s":"' + b"x" * max(target - len(body) + 1, 1) + b'"', 1)


ODD_BODIES = [b"", b" ", b"\n", b"null", b"[]", b"{}", b'"x"', b"0", b"true", b"\xef\xbb\xbf{}",
              b"\xef\xbb\xbf" + template(), template() + b" trailing", template() + template(), b"{" * 10,
              b'{"job":"urn:babel:fuzz:ok"}', b"\x00" * 8]

RAW_BODIES = st.one_of(
    st.binary(max_size=300),
    near_json(),
    literal_bodies(),
    invalid_utf8_bodies(),
    duplicate_key_bodies(),
    nested_bodies(),
    oversized_bodies(),
    st.sampled_from(ODD_BODIES),
)

TOP_KEYS = ("job", "trace_id", "data", "meta", "attempts")
WRONG_TYPES = JSON | st.sampled_from([[], {}, "", " ", 0, -1, 1.5, True, None, [1, 2], {"x": 1}])
SCHEMA_VERSIONS = st.sampled_from([0, 2, 3, -1, "1", 1.0, True, None, 2**63 - 1, [1], {"v": 1}]) | st.integers()
ATTEMPTS = st.sampled_from([-1, 0, 1, 7, 2**63 - 1, "1", 1.5, None, True, []]) | st.integers(-5, 5)


@st.composite
def mutated_envelopes(draw: st.DrawFn) -> bytes:
    """Envelopes (ours, or random ones with unknown keys and dead_letter blocks) with 0-3 mutations."""
    if draw(st.booleans()):
        env: dict[str, Any] = bq.make_envelope(draw(st.sampled_from(URNS)), draw(DATA), queue_name="fuzz")
    else:
        env = draw(envelopes())
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["drop", "drop_meta", "wrong_type", "wrong_meta", "schema_version",
                                     "unknown_key", "urn_alias", "php_data", "attempts"]))
        meta = env.get("meta")
        if kind == "drop":
            env.pop(draw(st.sampled_from(TOP_KEYS)), None)
        elif kind == "drop_meta" and isinstance(meta, dict):
            meta.pop(draw(st.sampled_from(bq.META_KEYS)), None)
        elif kind == "wrong_type":
            env[draw(st.sampled_from(TOP_KEYS))] = draw(WRONG_TYPES)
        elif kind == "wrong_meta" and isinstance(meta, dict):
            meta[draw(st.sampled_from(bq.META_KEYS))] = draw(WRONG_TYPES)
        elif kind == "schema_version" and isinstance(meta, dict):
            meta["schema_version"] = draw(SCHEMA_VERSIONS)
        elif kind == "unknown_key":
            env[draw(TEXT)] = draw(JSON)
        elif kind == "urn_alias":
            env["urn"] = env.pop("job", None) or draw(st.sampled_from(URNS))
        elif kind == "php_data":
            env["data"] = []
        elif kind == "attempts":
            env["attempts"] = draw(ATTEMPTS)
    # Other SDKs' encoders: compact or spaced, escaped or raw non-ASCII.
    separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    return json.dumps(env, ensure_ascii=draw(st.booleans()), separators=separators).encode()


# ------------------------------------------------------------------------------------------- checks


def poison_error(body: bytes, limits: dict[str, int | None]) -> str | None:
    """The error a poison body must be dead-lettered with; ``None`` when the body is not poison."""
    limit = body_limit_error(body, limits["max_body_bytes"], limits["max_nesting_depth"])
    return limit if limit is not None else parse_body(body)[1]


def _without_dead_letter(body: bytes) -> Any:
    """The envelope without its ``dead_letter`` block and its top-level ``attempts`` (a dead letter's is the
    block's count of attempts used up, not the delivered body's: checked apart in :func:`is_dead_letter_of`)."""
    value = bq.decode(body, exact=True)
    value.pop("dead_letter", None)
    value.pop("attempts", None)
    return value


def kept(stored: bytes) -> bytes:
    """The exact bytes a stored dead letter keeps: a poison wrapper's ``raw``, else the stored body."""
    wrapper = poison_wrapper(stored)
    return stored if wrapper is None else wrapper.raw


def is_dead_letter_of(stored: bytes, delivered: bytes, reason: str) -> bool:
    """Whether a DLQ body is the dead letter of ``delivered``: a poison wrapper of the same bytes with ``reason``
    (poison, or a body that cannot be re-encoded), or the same envelope plus a ``dead_letter`` block with
    ``reason``, whose ``attempts`` is also the top-level one (a delivered ``attempts`` that is not a non-negative
    integer is kept as evidence instead)."""
    wrapper = poison_wrapper(stored)
    if wrapper is not None:
        return wrapper.raw == delivered and wrapper.reason == reason
    try:
        annotated, original = bq.decode(stored, exact=True), bq.decode(delivered, exact=True)
        block = annotated.get("dead_letter")
        counted = original.get("attempts").__class__ is int and original["attempts"] >= 0
        top = annotated.get("attempts")
        return (isinstance(block, dict) and block.get("reason") == reason
                and (top == block.get("attempts") if counted else top == original.get("attempts"))
                and _without_dead_letter(stored) == _without_dead_letter(delivered))
    except ValueError:
        return False


def drain_bodies(binding: Binding, queue: str, path: Path, mode: str) -> list[bytes]:
    result = drain_dead_letters([DrainSource(binding, queue, "hostile")], LocalFileSink(path), mode=mode)
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert result.records == len(records)
    for record in records:
        assert record["body_encoding"] in ("utf-8", "base64") and record["queue_name"] == queue
    return [record_body(record) for record in records]


def exercise(binding: Binding, bodies: list[bytes], drain_dir: Path, limits: dict[str, int | None]) -> ConsumeSummary:
    """Publish, consume, check every invariant, then browse- and move-drain the DLQ and check the records."""
    queue = f"fuzz-{uuid.uuid4().hex[:12]}"
    for body in bodies:
        binding.publish(body, queue)
    spy = Spy(binding)
    handled: list[dict[str, Any]] = []
    consumer = Consumer(spy, queue, {OK_URN: handled.append, FAIL_URN: _fail}, max_attempts=2, backoff=NO_WAIT,
                        log=QUIET, **limits)
    # Bounded: at most two deliveries per message, so a message that loops shows up as one left behind.
    summary = consumer.run(max_messages=2 * len(bodies) + 1, reserve_timeout=0)

    # every message ended handled or dead-lettered, with a contract reason
    assert summary.handled + len(spy.dead) == len(bodies), (summary.as_dict(), bodies)
    assert summary.received == summary.handled + len(spy.dead) + summary.retried
    assert len(handled) == summary.handled
    assert {reason for _, reason, _ in spy.dead} <= REASONS
    assert sum(summary.dead_lettered.values()) == len(spy.dead)
    assert binding.depth(queue) == 0, "a message was left in the queue"

    # poison: dead-lettered at first delivery, with its decode or limit error, bytes kept
    pending = Counter((body, reason, error) for body, reason, error in spy.dead)
    for body in bodies:
        error = poison_error(body, limits)
        if error is not None:
            key = (body, bq.Reason.POISON.value, error)
            assert pending[key] > 0, f"poison body {body[:80]!r} was not dead-lettered as poison with {error!r}"
            pending[key] -= 1

    # the DLQ holds one entry per dead letter: the raw bytes of poison, the annotated envelope of the rest
    stored = [message.body for message in binding.browse_dead_letters(queue, limit=10_000)]
    assert len(stored) == len(spy.dead) == binding.dead_letter_depth(queue)
    unmatched = list(stored)
    for delivered, reason, _ in sorted(spy.dead, key=lambda item: item[1] != "poison"):  # exact bytes first
        match = next((i for i, body in enumerate(unmatched) if is_dead_letter_of(body, delivered, reason)), None)
        assert match is not None, f"no DLQ entry for {delivered[:80]!r} ({reason})"
        if reason == bq.Reason.POISON:
            assert kept(unmatched[match]) == delivered, "a poison body was altered in the DLQ"
        unmatched.pop(match)

    # the drain: a browse copy and then a move, both byte-exact, and the move empties the DLQ
    copied = drain_bodies(binding, queue, drain_dir / f"{queue}-browse.jsonl", "browse")
    moved = drain_bodies(binding, queue, drain_dir / f"{queue}-move.jsonl", "move")
    assert Counter(copied) == Counter(moved) == Counter(stored)
    assert binding.dead_letter_depth(queue) == 0 and binding.browse_dead_letters(queue) == []
    return summary


# ---------------------------------------------------------------------------------------- fuzz runs


@FUZZ
@given(bodies=st.lists(RAW_BODIES, min_size=1, max_size=6))
@example(bodies=[splice(template(FAIL_URN), b"18446744073709551616"), splice(template(OK_URN), b"NaN"),
                 splice(template(FAIL_URN), arrays(63)), splice(template(FAIL_URN), arrays(62)),
                 template(OK_URN).replace(b'"s":"x"', b'"s":"\xff"'), b'{"job":"a","job":"urn:babel:fuzz:ok"}'])
def test_fuzzed_raw_bodies_end_handled_or_dead_lettered_and_drain_byte_exact(
    binding: Binding, drain_dir: Path, bodies: list[bytes]
) -> None:
    exercise(binding, bodies, drain_dir, FUZZ_LIMITS)


@FUZZ
@given(bodies=st.lists(mutated_envelopes(), min_size=1, max_size=6))
@example(bodies=[template(FAIL_URN).replace(b'"attempts":0', b'"attempts":9223372036854775807')])  # found by CI
def test_fuzzed_envelopes_end_handled_or_dead_lettered_with_their_reason(
    binding: Binding, drain_dir: Path, bodies: list[bytes]
) -> None:
    summary = exercise(binding, bodies, drain_dir, FUZZ_LIMITS)
    for body in bodies:  # a JSON object that is not a valid envelope is quarantined with its validation reason
        envelope, _, _ = parse_body(body)
        if envelope is not None and poison_error(body, FUZZ_LIMITS) is None and bq.check(envelope) is not None:
            assert summary.dead_lettered[bq.check(envelope)] > 0


@settings(FUZZ, max_examples=60)
@given(bodies=st.lists(RAW_BODIES | mutated_envelopes(), min_size=1, max_size=6))
@example(bodies=[splice(template(FAIL_URN), b"18446744073709551616"), splice(template(FAIL_URN), arrays(300)),
                 splice(template(FAIL_URN), arrays(1000)), splice(template(OK_URN), arrays(1023)),
                 splice(template(FAIL_URN), b"-" + b"9" * 5000)])
def test_without_limits_the_consumer_still_never_raises_or_loops(
    binding: Binding, drain_dir: Path, bodies: list[bytes]
) -> None:
    """Limits off: bodies orjson decodes but cannot re-encode (nesting past 254, integers past 64 bits) reach
    the handler; a failing handler must not make them loop (regression: they were released forever)."""
    exercise(binding, bodies, drain_dir, NO_LIMITS)


# ------------------------------------------------------------------------------------ limits: exact


def sized_body(size: int, urn: str = OK_URN) -> bytes:
    """A valid envelope of exactly ``size`` bytes."""
    base = bq.encode(bq.make_envelope(urn, {"pad": ""}, queue_name="limits"))
    assert size >= len(base)
    body = base.replace(b'"pad":""', b'"pad":"' + b"x" * (size - len(base)) + b'"', 1)
    assert len(body) == size
    return body


def nested_body(depth: int, urn: str = OK_URN, *, objects: bool = False) -> bytes:
    """A valid envelope nested exactly ``depth`` levels deep (the envelope is 1, ``data`` is 2)."""
    inner = depth - 2
    value = b'{"a":' * inner + b"0" + b"}" * inner if objects else b"[" * inner + b"0" + b"]" * inner
    body = splice(bq.encode(bq.make_envelope(urn, {"v": 0}, queue_name="limits")), value)
    assert json.loads(body) and nesting_depth(body) == depth
    return body


def consume(binding: Binding, bodies: list[bytes], **options: Any) -> tuple[str, Spy, list[dict[str, Any]], dict]:
    queue = f"limits-{uuid.uuid4().hex[:12]}"
    for body in bodies:
        binding.publish(body, queue)
    spy, handled = Spy(binding), []
    summary = Consumer(spy, queue, {OK_URN: handled.append}, log=QUIET, **options).run(reserve_timeout=0)
    assert binding.depth(queue) == 0
    return queue, spy, handled, summary.as_dict()


def dlq_and_drain(binding: Binding, queue: str, tmp_path: Path) -> tuple[list[bytes], list[bytes]]:
    """The exact bytes each dead letter keeps, as browsed and as move-drained (the stored bodies, poison wrappers
    included, are the same on both paths)."""
    stored = [message.body for message in binding.browse_dead_letters(queue, limit=100)]
    drained = drain_bodies(binding, queue, tmp_path / f"{queue}.jsonl", "move")
    assert drained == stored
    return [kept(body) for body in stored], [kept(body) for body in drained]


def test_body_size_limit_at_and_one_over_the_limit(binding: Binding, tmp_path: Path) -> None:
    at, over = sized_body(2000), sized_body(2001)
    queue, spy, handled, summary = consume(binding, [at, over], max_body_bytes=2000)
    assert [bq.meta_id_of(env) for env in handled] == [bq.meta_id_of(bq.decode(at))]
    assert summary["handled"] == 1 and summary["dead_lettered"] == {"poison": 1}
    assert spy.dead == [(over, "poison", "body is 2,001 bytes; this consumer accepts at most 2,000 (max_body_bytes)")]
    assert dlq_and_drain(binding, queue, tmp_path) == ([over], [over])  # bytes kept, not annotated


def test_default_body_size_limit_is_16_mib(binding: Binding, tmp_path: Path) -> None:
    assert DEFAULT_MAX_BODY_BYTES == 16 * 1024 * 1024 == 16_777_216
    at, over = sized_body(DEFAULT_MAX_BODY_BYTES), sized_body(DEFAULT_MAX_BODY_BYTES + 1)
    queue, spy, handled, summary = consume(binding, [at, over])
    assert len(handled) == 1 and summary["dead_lettered"] == {"poison": 1}
    assert [(body == over, reason, error) for body, reason, error in spy.dead] == [
        (True, "poison", "body is 16,777,217 bytes; this consumer accepts at most 16,777,216 (max_body_bytes)")]
    stored, drained = dlq_and_drain(binding, queue, tmp_path)
    assert stored == [over] and drained == [over]


def test_body_size_error_text() -> None:
    body = b" " * 20_000_123
    assert body_limit_error(body, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_NESTING_DEPTH) == (
        "body is 20,000,123 bytes; this consumer accepts at most 16,777,216 (max_body_bytes)")
    assert body_limit_error(body, None, DEFAULT_MAX_NESTING_DEPTH) is None


@pytest.mark.parametrize("objects", [False, True], ids=["arrays", "objects"])
def test_default_nesting_limit_at_and_one_over(binding: Binding, tmp_path: Path, objects: bool) -> None:
    assert DEFAULT_MAX_NESTING_DEPTH == 64
    at, over = nested_body(64, objects=objects), nested_body(65, objects=objects)
    queue, spy, handled, summary = consume(binding, [at, over])
    assert [bq.meta_id_of(env) for env in handled] == [bq.meta_id_of(bq.decode(at))]
    assert summary["dead_lettered"] == {"poison": 1}
    assert spy.dead == [
        (over, "poison", "body is nested 65 levels deep; this consumer accepts at most 64 (max_nesting_depth)")]
    assert dlq_and_drain(binding, queue, tmp_path) == ([over], [over])


def test_custom_nesting_limit_and_brackets_inside_strings(binding: Binding) -> None:
    in_strings = splice(bq.encode(bq.make_envelope(OK_URN, {"v": 0}, queue_name="limits")),
                        b'"' + b"[{\\\"" * 5000 + b'"')  # escaped quotes too: still one string
    _, spy, handled, summary = consume(binding, [nested_body(5), nested_body(6), in_strings], max_nesting_depth=5)
    assert summary["handled"] == 2 and len(handled) == 2
    assert [error for _, _, error in spy.dead] == [
        "body is nested 6 levels deep; this consumer accepts at most 5 (max_nesting_depth)"]


def test_a_body_too_deep_for_the_decoder_names_its_depth(binding: Binding, tmp_path: Path) -> None:
    deep = splice(template(), b"[" * 99_998 + b"]" * 99_998)  # orjson refuses past 1,024 levels
    queue, spy, _, summary = consume(binding, [deep])
    assert summary["dead_lettered"] == {"poison": 1}
    assert spy.dead == [
        (deep, "poison", "body is nested 100,000 levels deep; this consumer accepts at most 64 (max_nesting_depth)")]
    assert dlq_and_drain(binding, queue, tmp_path) == ([deep], [deep])


def test_limits_can_be_turned_off(binding: Binding) -> None:
    _, spy, handled, summary = consume(binding, [nested_body(200), sized_body(5000)], max_body_bytes=None,
                                       max_nesting_depth=None)
    assert len(handled) == 2 and spy.dead == [] and summary["dead_lettered"] == {}
    # the size limit is checked first: a body over both limits names its size
    _, spy, _, _ = consume(binding, [nested_body(80)], max_body_bytes=100)
    assert spy.dead[0][2].startswith("body is ") and spy.dead[0][2].endswith("(max_body_bytes)")


@pytest.mark.parametrize("name", ["max_body_bytes", "max_nesting_depth"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "64"])
def test_unusable_limits_are_refused(name: str, value: Any) -> None:
    from airflow_provider_babelqueue.bindings.memory import MemoryBinding
    from airflow_provider_babelqueue.operators.consume import BabelQueueConsumeOperator

    with pytest.raises(ValueError, match=name):
        Consumer(MemoryBinding(), "q", {}, **{name: value})
    with pytest.raises(ValueError, match=name):
        BabelQueueConsumeOperator(task_id="c", queue_name="q", handlers={}, **{name: value})


def test_a_failing_body_that_cannot_be_re_encoded_is_dead_lettered_not_retried_forever(binding: Binding) -> None:
    """Regression: a body that decodes but cannot be re-encoded (with the limits off, nesting past the encoder's
    254 levels) made a release keep ``attempts`` at 0, and the message came back as a first attempt for ever.
    (An integer beyond 64 bits was the first such body; it is poison now, see the next test.)"""
    body = splice(template(FAIL_URN), arrays(300))
    queue = f"limits-{uuid.uuid4().hex[:12]}"
    binding.publish(body, queue)
    spy = Spy(binding)
    summary = Consumer(spy, queue, {FAIL_URN: _fail}, max_attempts=5, backoff=NO_WAIT, log=QUIET,
                       max_nesting_depth=None).run(max_messages=20, reserve_timeout=0)
    assert summary.received == 1 and summary.retried == 0 and dict(summary.dead_lettered) == {"failed": 1}
    [(delivered, reason, error)] = spy.dead
    assert delivered == body and reason == "failed"
    [dead] = binding.browse_dead_letters(queue)
    wrapper = poison_wrapper(dead.body)  # not re-encodable: the bytes in a wrapper that keeps the reason
    assert wrapper is not None and wrapper.raw == body and wrapper.reason == "failed"
    assert error.startswith("handler refused") and "cannot be re-encoded with a higher attempts count" in error
    assert binding.depth(queue) == 0 and binding.dead_letter_depth(queue) == 1


def test_an_integer_beyond_64_bits_is_poison_with_its_bytes_kept(binding: Binding, tmp_path: Path) -> None:
    """The contract's integers are signed 64-bit: such a body never reaches a handler (it would get a float)."""
    body = splice(template(FAIL_URN), b"18446744073709551616")
    queue, spy, handled, summary = consume(binding, [body])
    assert handled == [] and summary["dead_lettered"] == {"poison": 1}
    assert spy.dead == [(body, "poison", "integer 18446744073709551616 is outside the signed 64-bit range the "
                         "contract allows (-9223372036854775808 to 9223372036854775807); a producer must carry such "
                         "a value as a string")]
    assert dlq_and_drain(binding, queue, tmp_path) == ([body], [body])


def test_the_operator_passes_its_limits_to_the_consumer(monkeypatch: pytest.MonkeyPatch, binding: Binding) -> None:
    from airflow_provider_babelqueue.operators import consume as consume_module
    from airflow_provider_babelqueue.operators.consume import BabelQueueConsumeOperator

    class Hook:
        def get_binding(self) -> Binding:
            return binding

        def close(self) -> None:
            pass

    monkeypatch.setattr(consume_module, "get_hook", lambda conn_id: Hook())
    queue = f"limits-{uuid.uuid4().hex[:12]}"
    for body in (sized_body(400), sized_body(401), nested_body(4), nested_body(5)):
        binding.publish(body, queue)
    default = BabelQueueConsumeOperator(task_id="d", queue_name=queue, handlers={})
    assert (default.max_body_bytes, default.max_nesting_depth) == (16_777_216, 64)
    op = BabelQueueConsumeOperator(task_id="c", queue_name=queue, handlers={OK_URN: lambda env: None},
                                   max_body_bytes=400, max_nesting_depth=4, reserve_timeout=0)
    summary = op.execute({})
    assert summary["handled"] == 2 and summary["dead_lettered"] == {"poison": 2}
    drained = binding.reserve_dead_letters(queue, limit=10)
    assert sorted(len(kept(m.body)) for m in drained) == sorted([401, len(nested_body(5))])
    binding.ack_many(drained)


# --------------------------------------------------------------------------------- the depth scanner


def reference_depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value, by an explicit stack (no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


TRICKY_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\\n\t/ aé★\x00'), max_size=12)
TRICKY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TRICKY_TEXT, children, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None, database=None)
@given(value=TRICKY_JSON, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]))
def test_nesting_depth_equals_the_decoded_depth(value: Any, ascii_only: bool, indent: int | None) -> None:
    """Brackets, braces, quotes and backslashes inside strings never count, whatever the encoder's style."""
    body = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode()
    assert nesting_depth(body) == reference_depth(value)


def test_nesting_depth_does_not_recurse_and_stays_cheap() -> None:
    bodies = {
        "a million levels": b"[" * 1_000_000 + b"]" * 1_000_000,
        "an unterminated string of escaped quotes": b'"' + b'\\"' * 4_000_000,
        "many small objects": b"[" + b'{"k":"v"},' * 400_000 + b"1]",
        "brackets in many strings": b"[" + b'"[[{",' * 500_000 + b"1]",
    }
    expected = {"a million levels": 1_000_000, "an unterminated string of escaped quotes": 0,
                "many small objects": 2, "brackets in many strings": 1}
    for name, body in bodies.items():
        started = time.perf_counter()
        assert nesting_depth(body) == expected[name], name
        assert time.perf_counter() - started < 2.0, f"{name} took too long"
