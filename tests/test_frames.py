"""Header frames (``{"__bq_frame":1,"headers":{…},"body":"<envelope>"}``) on the way in, out, to the DLQ and back.

Node's Redis adapter and the Python SDK 1.24 write them (``../shared/interop/peer-captures``: the exact bytes).
A framed message is its inner envelope everywhere a body is read; a release keeps it framed (same headers, inner
attempts bumped); a dead letter is the bare annotated envelope; a replay publishes the reset inner envelope; a
malformed frame is poison with its bytes kept exactly.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import orjson
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.bodies import bumped_body, dead_letter_body
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage, parse_body
from airflow_provider_babelqueue.core.frames import FrameError, encode_frame, frame_headers, open_body
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.core.records import RecordTemplate, drain_record
from airflow_provider_babelqueue.engine.checks import dead_letter_status
from airflow_provider_babelqueue.engine.consume import Backoff, Consumer
from airflow_provider_babelqueue.engine.replay import Item, Replayer, feed_from_dead_letters
from tests.conftest import ROOT

CAPTURES = ROOT.parent / "shared" / "interop" / "peer-captures"
NO_WAIT = Backoff("fixed", 0.0)
QUIET = logging.getLogger("tests.frames")
HEADERS = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme-eu"}


def capture(name: str) -> bytes:
    """The exact bytes a peer SDK stored (``body_b64`` of ``peer-captures/<name>.json``)."""
    return base64.b64decode(json.loads((CAPTURES / f"{name}.json").read_text())["body_b64"])


def inner_of(framed: bytes) -> bytes:
    """The frame's ``body`` string as bytes: the envelope exactly as the peer encoded it."""
    return orjson.loads(framed)["body"].encode()


def received(body: bytes, queue_name: str = "orders", attempts: int | None = None) -> ReceivedMessage:
    envelope, error, body_attempts = parse_body(body)
    return ReceivedMessage(body, queue_name, envelope, error, body_attempts if attempts is None else attempts)


FRAMED = ["node-redis-headers", "python-redis-headers"]


# ------------------------------------------------------------------------------------------ reading


@pytest.mark.parametrize("name", FRAMED)
def test_a_peer_frame_parses_as_its_inner_envelope(name: str) -> None:
    raw = capture(name)
    envelope, error, attempts = parse_body(raw)
    assert error is None and attempts == 0 and envelope is not None
    assert envelope == orjson.loads(inner_of(raw)) and bq.check(envelope) is None
    assert list(envelope) == ["job", "trace_id", "data", "meta", "attempts"]
    assert frame_headers(raw) == HEADERS and list(frame_headers(raw)) == ["traceparent", "x-tenant"]
    inner, frame = open_body(raw)
    assert inner == envelope and frame is not None and frame.body == inner_of(raw) and frame.headers == HEADERS


def test_a_framed_python_dead_letter_parses_as_its_annotated_inner_envelope() -> None:
    raw = capture("python-redis-dead-letter-headers")
    envelope, error, attempts = parse_body(raw)
    assert error is None and envelope is not None and attempts == 3
    assert envelope["dead_letter"]["reason"] == "failed" and envelope["dead_letter"]["attempts"] == 3
    assert frame_headers(raw) == HEADERS


@pytest.mark.parametrize("name", ["python-redis-plain", "node-redis-plain", "php-redis-plain", "node-redis-poison"])
def test_bodies_that_are_not_frames_have_no_frame_headers(name: str) -> None:
    assert frame_headers(capture(name)) == {}


MALFORMED = [
    (b'{"__bq_frame":1,"headers":{}}',
     "header frame has no 'body': it must hold the envelope as a JSON string"),
    (b'{"__bq_frame":1,"headers":{},"body":{"job":"urn:babel:orders:created"}}',
     "header frame 'body' must be the envelope as a JSON string, got a JSON object"),
    (b'{"__bq_frame":1,"headers":{},"body":null}',
     "header frame 'body' must be the envelope as a JSON string, got null"),
    (b'{"__bq_frame":1,"headers":{},"body":42}',
     "header frame 'body' must be the envelope as a JSON string, got a JSON number"),
    (b'{"__bq_frame":1,"headers":{},"body":"not json"}',
     "header frame 'body' does not hold an envelope: the body is not valid JSON: invalid literal, expected 'null': "
     "line 1 column 1 (char 0)."),
    (b'{"__bq_frame":1,"headers":{},"body":""}',
     "header frame 'body' does not hold an envelope: the body is not valid JSON: Input is a zero-length, empty "
     "document: line 1 column 1 (char 0)."),
    (b'{"__bq_frame":1,"headers":{},"body":"[1,2]"}',
     "header frame 'body' does not hold an envelope: the body is JSON but not an object (got a JSON array)."),
    (b'{"__bq_frame":1,"headers":{},"body":"\\"text\\""}',
     "header frame 'body' does not hold an envelope: the body is JSON but not an object (got a JSON string)."),
    (b'{"__bq_frame":1,"headers":[],"body":"{}"}',
     "header frame 'headers' must be an object, got a JSON array"),
    (b'{"__bq_frame":2,"headers":{},"body":"{}"}',
     "header frame version 2 is not supported (this reader knows 1)"),
    (b'{"__bq_frame":1,"headers":{},"body":"{\\"job\\":\\"u\\",\\"data\\":{\\"n\\":9223372036854775808}}"}',
     "header frame 'body' does not hold an envelope: integer 9223372036854775808 is outside the signed 64-bit "
     "range the contract allows (-9223372036854775808 to 9223372036854775807); a producer must carry such a value "
     "as a string"),
]


@pytest.mark.parametrize(("raw", "error"), MALFORMED, ids=[
    "body-missing", "body-object", "body-null", "body-number", "body-not-json", "body-empty", "inner-array",
    "inner-string", "headers-array", "version-2", "inner-wide-integer"])
def test_a_malformed_frame_is_poison_and_says_what_is_wrong(raw: bytes, error: str) -> None:
    assert parse_body(raw) == (None, error, 0)
    with pytest.raises(FrameError) as caught:
        open_body(raw)
    assert str(caught.value) == error
    assert frame_headers(raw) == {}


@pytest.mark.parametrize(("raw", "error"), MALFORMED[:3] + MALFORMED[4:5], ids=["missing", "object", "null", "json"])
def test_the_consumer_quarantines_a_malformed_frame_with_its_bytes_kept(raw: bytes, error: str) -> None:
    binding = MemoryBinding()
    binding.publish(raw, "orders")
    handled: list[dict[str, Any]] = []
    summary = Consumer(binding, "orders", {"urn:babel:orders:created": handled.append}, log=QUIET).run(
        reserve_timeout=0)
    assert handled == [] and dict(summary.dead_lettered) == {"poison": 1}
    [dead] = binding.browse_dead_letters("orders")
    wrapper = poison_wrapper(dead.body)  # the exact bytes, with the reason and error beside them
    assert wrapper is not None and wrapper.raw == raw and wrapper.dead_letter["error"] == error
    assert wrapper.reason == "poison" and wrapper.dead_letter["original_queue"] == "orders"


# ------------------------------------------------------------------------------------ release and DLQ


@pytest.mark.parametrize("name", FRAMED)
def test_a_release_keeps_the_frame_and_bumps_the_inner_attempts(name: str) -> None:
    raw = capture(name)
    bumped = bumped_body(received(raw))
    # byte for byte what the peer would store for the retry: its frame, its headers, attempts 1 inside
    assert bumped == raw.replace(b'\\"attempts\\":0}', b'\\"attempts\\":1}')
    assert bumped == encode_frame(inner_of(raw).replace(b'"attempts":0}', b'"attempts":1}'), HEADERS)
    assert parse_body(bumped)[2] == 1 and frame_headers(bumped) == HEADERS


@pytest.mark.parametrize("name", FRAMED)
def test_a_framed_message_is_dead_lettered_as_its_bare_annotated_envelope(name: str) -> None:
    raw = capture(name)
    stored = dead_letter_body(received(raw, attempts=3), "failed", error="card declined", exception="RuntimeError")
    block = orjson.loads(stored)["dead_letter"]
    assert stored == inner_of(raw).replace(b'"attempts":0}', b'"attempts":3,') + (
        b'"dead_letter":{"reason":"failed","error":"card declined","exception":"RuntimeError","failed_at":'
        + str(block["failed_at"]).encode() + b',"original_queue":"orders","attempts":3,"lang":"python"}}')
    assert b"__bq_frame" not in stored


def test_a_framed_message_through_the_consumer_end_to_end() -> None:
    """Handlers see the inner envelope with the delivery's attempts; retries stay framed; the dead letter after
    three failed runs is the bare envelope with attempts 3 at the top level and in the block."""
    raw = capture("python-redis-headers")
    binding = MemoryBinding()
    binding.publish(raw, "orders")
    seen: list[dict[str, Any]] = []

    def handler(envelope: dict[str, Any]) -> None:
        seen.append(envelope)
        raise RuntimeError("card declined")

    summary = Consumer(binding, "orders", {"urn:babel:orders:created": handler}, max_attempts=3, backoff=NO_WAIT,
                       log=QUIET).run(reserve_timeout=0)
    assert summary.retried == 2 and dict(summary.dead_lettered) == {"failed": 1}
    assert [envelope["attempts"] for envelope in seen] == [0, 1, 2]
    assert all("__bq_frame" not in envelope and envelope["meta"] == seen[0]["meta"] for envelope in seen)
    [dead] = binding.browse_dead_letters("orders")
    stored = orjson.loads(dead.body)
    assert "__bq_frame" not in stored and stored["attempts"] == stored["dead_letter"]["attempts"] == 3
    assert dead.body.startswith(inner_of(raw).split(b',"attempts":0}')[0] + b',"attempts":3,"dead_letter":')


def test_drain_records_name_the_inner_meta_id_of_a_framed_dead_letter() -> None:
    raw = capture("python-redis-dead-letter-headers")
    meta_id = orjson.loads(inner_of(raw))["meta"]["id"]
    template = RecordTemplate(broker="redis", queue_name="orders", dead_letter_queue="orders.dlq",
                              source_conn_id="bq")
    [record] = template.of_raws([raw], template.stamp(1))
    message = received(raw)
    assert message.meta_id == meta_id and orjson.loads(record)["meta_id"] == meta_id
    assert record == drain_record(message, broker="redis", dead_letter_queue="orders.dlq", source_conn_id="bq",
                                  drained_at=1)
    assert orjson.loads(record)["body"].encode() == raw  # the stored frame, byte for byte


# ------------------------------------------------------------------------------------------- replay


def reset_bytes(annotated_inner: bytes) -> bytes:
    """A peer's annotated envelope bytes with the block removed and attempts 0, without re-encoding."""
    head, _, _ = annotated_inner.partition(b',"dead_letter":')
    prefix, _, _ = head.rpartition(b',"attempts":')
    return prefix + b',"attempts":0}'


def replay(binding: MemoryBinding, items: list[Item]) -> dict[str, Any]:
    replayer = Replayer(target=binding, ledger_binding=binding, source=binding)
    for item in items:
        replayer.feed(item)
    replayer.finish()
    return replayer.result.as_dict()


def take(binding: MemoryBinding, queue_name: str) -> list[bytes]:
    out = []
    while (message := binding.reserve(queue_name)) is not None:
        out.append(message.body)
        binding.ack(message)
    return out


def test_a_python_framed_dead_letter_replays_as_its_bare_reset_envelope() -> None:
    raw = capture("python-redis-dead-letter-headers")
    queue = orjson.loads(inner_of(raw))["dead_letter"]["original_queue"]
    binding = MemoryBinding()
    result = replay(binding, [Item(raw, "fallback")])
    assert result["replayed"] == 1 and result["skipped"] == {} and result["targets"] == {queue: 1}
    [published] = take(binding, queue)
    assert published == reset_bytes(inner_of(raw))  # the peer's own bytes, block gone, attempts 0: bare
    assert b"__bq_frame" not in published and bq.check(bq.decode(published)) is None


def test_a_framed_dead_letter_is_redriven_from_the_dlq_and_acked() -> None:
    raw = capture("python-redis-dead-letter-headers")
    binding = MemoryBinding()
    binding.put_dead_letter(raw, binding.dead_letter_name("orders"))
    replayer = Replayer(target=binding, ledger_binding=binding, target_queue_name="orders", source=binding)
    feed_from_dead_letters(replayer, binding, "orders", 0)
    replayer.finish()
    assert replayer.result.replayed == 1 and binding.dead_letter_depth("orders") == 0
    assert take(binding, "orders") == [reset_bytes(inner_of(raw))]


def test_an_old_annotated_frame_replays_as_its_inner_envelope() -> None:
    """What earlier versions of this provider wrote: the frame, with a ``missing_urn`` block on the outside."""
    inner = inner_of(capture("node-redis-headers"))
    old = orjson.loads(capture("node-redis-headers"))
    old["dead_letter"] = {"reason": "missing_urn", "error": "the envelope failed validation: missing_urn",
                          "exception": None, "failed_at": 1795621146117, "original_queue": "orders", "attempts": 0,
                          "lang": "python"}
    binding = MemoryBinding()
    result = replay(binding, [Item(orjson.dumps(old), "orders")])
    assert result["replayed"] == 1
    [published] = take(binding, orjson.loads(inner)["meta"]["queue"])
    assert published == inner


def test_sensor_samples_read_a_framed_dead_letter_as_its_inner_envelope() -> None:
    raw = capture("python-redis-dead-letter-headers")
    inner = orjson.loads(inner_of(raw))
    binding = MemoryBinding()
    binding.put_dead_letter(raw, binding.dead_letter_name("orders"))
    status = dead_letter_status(binding, "orders", reasons=["failed"], urns=["urn:babel:orders:charge-card"])
    assert status.matched and status.matching == 1
    assert status.sample == [{"meta_id": inner["meta"]["id"], "urn": "urn:babel:orders:charge-card",
                              "reason": "failed"}]
