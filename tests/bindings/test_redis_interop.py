"""Live interop with the official SDK's Redis transport (legacy layout) on the real server, byte for byte.

Compatibility facts verified here (babelqueue 1.24 ``RedisTransport``, ``laravel_compat=False``):

* Ready list = the bare queue name, RPUSH of the envelope text; reserve = LMOVE LEFT->RIGHT into
  ``<queue>:processing`` plus a member ``<32-hex token>:<raw>`` in ``<queue>:processing:deadlines``.
  Same keys and member format as ours, so each side's sweep returns the other's abandoned reservation
  and each side's gated settle leaves the other's reservation alone.
* Scores differ only in resolution and clock: the SDK writes ``floor(client time) + retry_after`` (whole
  seconds); we write server ``TIME`` + visibility timeout (fractional). Both are epoch seconds, so a sweep
  on either side compares like with like (on one host, or with synced clocks).
* The SDK has no delayed set in this layout; our ``:delayed`` items reach the ready list only when one of
  our binding's calls (reserve / depth) promotes them, so an SDK-only consumer fleet never sees them early
  (and does not see them at all until an Airflow-side call runs).
* ``publish_with_headers`` with headers stores a transport frame ``{"__bq_frame":1,...}``, not a bare
  envelope; our binding unwraps it on reserve (the inner envelope, the frame's headers) and keeps the stored
  bytes as the message's body, so the ack removes exactly them (``tests/bindings/test_redis_frames.py`` covers
  the other direction).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from babelqueue import EnvelopeCodec  # noqa: E402
from babelqueue.redis_transport import RedisTransport  # noqa: E402

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
from tests.conftest import compact, fixture_dict

pytestmark = pytest.mark.interop

from tests.bindings.conftest import REDIS_URL  # noqa: E402

MEMBER = re.compile(rb"^[0-9a-f]{32}:", re.ASCII)


@pytest.fixture
def ours() -> Iterator[RedisBinding]:
    binding = RedisBinding(RedisConfig.from_url(REDIS_URL))
    yield binding
    binding.close()


def sdk(**options: Any) -> RedisTransport:
    return RedisTransport(REDIS_URL, **options)


def envelope_bytes(queue: str, n: int = 0) -> bytes:
    data = {"n": n, "title": "Café ☕ / naïve", "big": 2**53 + 1, "ratio": 0.1, "nested": {"list": [1, None]}}
    return bq.encode(bq.make_envelope("urn:babel:orders:created", data, queue_name=queue))


def must(message: ReceivedMessage | None) -> ReceivedMessage:
    assert message is not None, "expected a message"
    return message


def test_what_we_publish_the_sdk_pops_byte_for_byte(ours: RedisBinding, rc: Any, queue: str) -> None:
    bodies = [compact(fixture_dict("fixtures/order-created.json")), envelope_bytes(queue)]
    ours.publish(bodies[0], queue)
    ours.publish_batch(bodies[1:], queue)
    transport = sdk()
    for body in bodies:
        message = transport.pop(queue, timeout=0)
        assert message is not None and message.body.encode("utf-8") == body
        assert message.route_urn == "" and message.headers == {}  # not poison: the SDK accepts it
        assert EnvelopeCodec.accepts(EnvelopeCodec.decode(message.body))
        transport.ack(message)
    assert not rc.exists(queue, f"{queue}:processing", f"{queue}:processing:deadlines")


def test_what_the_sdk_publishes_we_reserve_byte_for_byte(ours: RedisBinding, rc: Any, queue: str) -> None:
    envelope = EnvelopeCodec.make("urn:babel:orders:created", {"order_id": 1042, "note": "ünïcödé"}, queue=queue)
    raw = EnvelopeCodec.encode(envelope)
    transport = sdk()
    transport.publish(queue, raw)
    assert rc.lindex(queue, 0) == raw.encode("utf-8")
    message = must(ours.reserve(queue))
    assert message.body == raw.encode("utf-8") and message.decode_error is None
    assert bq.check(message.envelope) is None and message.envelope == bq.decode(raw.encode())
    assert message.urn == "urn:babel:orders:created" and message.attempts == 0
    ours.ack(message)
    assert not rc.exists(queue, f"{queue}:processing", f"{queue}:processing:deadlines")


def test_sdk_reservation_abandoned_is_requeued_by_our_reaper(ours: RedisBinding, rc: Any, queue: str) -> None:
    body = envelope_bytes(queue)
    ours.publish(body, queue)
    # retry_after=0: the SDK's deadline is floor(now), already passed, as if its worker died long ago.
    transport = sdk(retry_after=0)
    abandoned = transport.pop(queue, timeout=0)
    assert abandoned is not None
    [member] = rc.zrange(f"{queue}:processing:deadlines", 0, -1)
    assert MEMBER.match(member) and member[33:] == body  # the SDK writes our member format
    recovered = must(ours.reserve(queue))  # our sweep moved it back, then we reserved it
    assert recovered.body == body
    transport.ack(abandoned)  # the SDK's late, gated ack leaves our reservation alone
    assert rc.lrange(f"{queue}:processing", 0, -1) == [body]
    assert rc.zrange(f"{queue}:processing:deadlines", 0, -1) == [f"{recovered.receipt.token}:".encode() + body]
    ours.ack(recovered)
    assert not rc.exists(queue, f"{queue}:processing", f"{queue}:processing:deadlines")


def test_our_reservation_abandoned_is_requeued_by_the_sdk_sweep(rc: Any, queue: str) -> None:
    ours = RedisBinding(RedisConfig.from_url(REDIS_URL, visibility_timeout=0.2))
    body = envelope_bytes(queue)
    ours.publish(body, queue)
    abandoned = must(ours.reserve(queue))
    # The SDK compares whole seconds of its own clock; run it a few seconds ahead instead of sleeping.
    transport = sdk(clock=lambda: time.time() + 5)
    message = transport.pop(queue, timeout=0)
    assert message is not None and message.body.encode("utf-8") == body
    ours.ack(abandoned)  # gated: the SDK's new reservation survives our late ack
    assert rc.lrange(f"{queue}:processing", 0, -1) == [body]
    transport.ack(message)
    assert not rc.exists(queue, f"{queue}:processing", f"{queue}:processing:deadlines")
    ours.close()


def test_release_round_trips_attempts_both_ways(ours: RedisBinding, rc: Any, queue: str) -> None:
    ours.publish(envelope_bytes(queue), queue)
    ours.release(must(ours.reserve(queue)))
    transport = sdk()
    popped = transport.pop(queue, timeout=0)
    assert popped is not None and EnvelopeCodec.decode(popped.body)["attempts"] == 1
    transport.release(popped)  # the SDK rebuilds the body with attempts + 1 and RPUSHes it back
    [stored] = rc.lrange(queue, 0, -1)
    message = must(ours.reserve(queue))
    assert message.body == stored and message.attempts == 2 and bq.check(message.envelope) is None
    ours.ack(message)


def test_dead_letters_are_shared_with_the_sdk_dlq_convention(rc: Any, queue: str) -> None:
    ours = RedisBinding(RedisConfig.from_url(REDIS_URL, dead_letter_suffix=".dlq"))
    transport = sdk()
    ours.publish(envelope_bytes(queue), queue)
    ours.dead_letter(must(ours.reserve(queue)), "failed", error="boom")
    popped = transport.pop(f"{queue}.dlq", timeout=0)  # an SDK app drains "<queue>.dlq" like any queue
    assert popped is not None and EnvelopeCodec.decode(popped.body)["dead_letter"]["reason"] == "failed"
    transport.ack(popped)
    raw = EnvelopeCodec.encode(EnvelopeCodec.make("urn:babel:orders:created", {"order_id": 7}, queue=queue))
    transport.publish(queue, raw)
    taken = transport.pop(queue, timeout=0)
    assert taken is not None
    transport.dead_letter(taken, f"{queue}.dlq", raw)  # the SDK's gated dead-letter write
    assert [m.body for m in ours.browse_dead_letters(queue)] == [raw.encode()]
    drained = must(ours.reserve_dead_letter(queue))
    assert drained.body == raw.encode() and drained.from_dead_letter
    ours.ack(drained)
    assert ours.dead_letter_depth(queue) == 0 and not rc.exists(queue, f"{queue}:processing")
    ours.close()


def test_our_delayed_items_are_invisible_to_the_sdk_until_promoted(ours: RedisBinding, queue: str) -> None:
    body = envelope_bytes(queue)
    ours.publish(body, queue, delay=0.5)
    transport = sdk()
    assert transport.pop(queue, timeout=0) is None
    time.sleep(0.7)
    assert transport.pop(queue, timeout=0) is None  # due, but only our calls promote it
    assert ours.depth(queue) == 1
    message = transport.pop(queue, timeout=0)
    assert message is not None and message.body.encode("utf-8") == body
    transport.ack(message)


def test_sdk_header_frames_arrive_as_stored(ours: RedisBinding, rc: Any, queue: str) -> None:
    raw = EnvelopeCodec.encode(EnvelopeCodec.make("urn:babel:orders:created", {"order_id": 9}, queue=queue))
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sdk().publish_with_headers(queue, raw, {"traceparent": traceparent})
    [stored] = rc.lrange(queue, 0, -1)
    assert stored != raw.encode() and b'"__bq_frame"' in stored
    message = must(ours.reserve(queue))
    # The stored bytes stay the body (the ack removes exactly them); envelope and headers are the frame's.
    assert message.body == stored and message.headers == {"traceparent": traceparent}
    assert message.envelope == bq.decode(raw.encode()) and bq.check(message.envelope) is None
    ours.ack(message)
    assert not rc.exists(queue, f"{queue}:processing", f"{queue}:processing:deadlines")
