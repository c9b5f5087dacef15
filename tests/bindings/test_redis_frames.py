"""Redis header frames: opt-in on the way out (``frames``), unwrapped on the way in, on the real server.

With ``frames`` on, ``publish(headers=...)`` stores exactly what Node's adapter and the Python SDK store
(``core.frames.encode_frame``), and the official Python SDK (the independent peer) consumes it with its headers.
Off (the default, the spec), the bare envelope is stored and the headers are dropped quietly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from babelqueue.redis_transport import RedisTransport

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
from airflow_provider_babelqueue.core.frames import encode_frame
from tests.bindings.conftest import REDIS_URL

HEADERS = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme-eu"}


@pytest.fixture
def framed() -> Iterator[RedisBinding]:
    binding = RedisBinding(RedisConfig.from_url(REDIS_URL, frames=True))
    yield binding
    binding.close()


@pytest.fixture
def bare() -> Iterator[RedisBinding]:
    binding = RedisBinding(RedisConfig.from_url(REDIS_URL))
    yield binding
    binding.close()


def envelope_bytes(queue: str) -> bytes:
    return bq.encode(bq.make_envelope("urn:babel:orders:created", {"order_id": 1042, "note": "Café/☕ <b>"},
                                      queue_name=queue))


def test_with_frames_on_the_stored_bytes_are_the_sdks_frame(framed: RedisBinding, rc: Any, queue: str) -> None:
    body = envelope_bytes(queue)
    framed.publish(body, queue, headers=HEADERS)
    assert rc.lrange(queue, 0, -1) == [encode_frame(body, HEADERS)]
    assert framed.carries_headers


def test_the_python_sdk_consumes_our_frame_with_its_headers(framed: RedisBinding, rc: Any, queue: str) -> None:
    body = envelope_bytes(queue)
    framed.publish(body, queue, headers=HEADERS)
    transport = RedisTransport(REDIS_URL)
    message = transport.pop(queue, timeout=0)
    assert message is not None
    assert message.body.encode("utf-8") == body and dict(message.headers) == HEADERS
    transport.ack(message)
    assert not rc.exists(queue, f"{queue}:processing", f"{queue}:processing:deadlines")


def test_a_delayed_framed_publish_keeps_the_frame(framed: RedisBinding, rc: Any, queue: str) -> None:
    body = envelope_bytes(queue)
    framed.publish(body, queue, headers=HEADERS, delay=0.05)
    import time

    time.sleep(0.1)
    assert framed.depth(queue) == 1 and rc.lrange(queue, 0, -1) == [encode_frame(body, HEADERS)]


def test_a_publish_without_headers_stays_the_bare_envelope(framed: RedisBinding, rc: Any, queue: str) -> None:
    body = envelope_bytes(queue)
    framed.publish(body, queue)
    framed.publish(body, queue, headers={})
    assert rc.lrange(queue, 0, -1) == [body, body]


def test_with_frames_off_the_bare_envelope_is_stored_and_headers_are_dropped_quietly(
        bare: RedisBinding, rc: Any, queue: str, caplog: pytest.LogCaptureFixture) -> None:
    body = envelope_bytes(queue)
    assert not bare.carries_headers
    with caplog.at_level(logging.DEBUG, logger="airflow_provider_babelqueue.bindings.redis.binding"):
        bare.publish(body, queue, headers=HEADERS)
        bare.publish(body, queue, headers=HEADERS)
    assert rc.lrange(queue, 0, -1) == [body, body]
    said = [r for r in caplog.records if "frames are off" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.DEBUG  # once per binding, never above DEBUG
    message = RedisTransport(REDIS_URL).pop(queue, timeout=0)
    assert message is not None and message.body.encode("utf-8") == body and dict(message.headers) == {}


@pytest.mark.parametrize("frames", [True, False])
def test_a_reserved_frame_exposes_its_headers_and_acks_the_stored_bytes(frames: bool, framed: RedisBinding,
                                                                        rc: Any, queue: str) -> None:
    """Reading does not depend on the setting: the frame is unwrapped, the stored value stays the body."""
    body = envelope_bytes(queue)
    framed.publish(body, queue, headers=HEADERS)
    reader = framed if frames else RedisBinding(RedisConfig.from_url(REDIS_URL))
    message = reader.reserve(queue, timeout=1)
    assert message is not None
    assert message.body == encode_frame(body, HEADERS) and dict(message.headers) == HEADERS
    assert message.envelope == bq.decode(body) and message.decode_error is None
    reader.release(message)  # a retry keeps the frame around the bumped envelope
    again = reader.reserve(queue, timeout=1)
    assert again is not None and again.attempts == 1 and dict(again.headers) == HEADERS
    assert again.body == rc.lindex(f"{queue}:processing", 0)
    reader.ack(again)
    assert not rc.exists(queue, f"{queue}:processing", f"{queue}:processing:deadlines")
    if reader is not framed:
        reader.close()


def test_the_url_and_config_take_frames_and_sources() -> None:
    config = RedisConfig.from_url("redis://127.0.0.1/0?frames=true&dead_letter_sources=.dlq,legacy-{queue}")
    assert config.frames and config.dead_letter_sources == (".dlq", "legacy-{queue}")
    assert not RedisConfig().frames and RedisConfig().dead_letter_sources == (":failed", ".dlq")
    binding = RedisBinding(RedisConfig(key_prefix="p:", dead_letter_sources=[".dlq", "legacy-{queue}"]))
    assert binding.dead_letter_sources("q") == ["p:q:failed", "p:q.dlq", "p:legacy-q"]
    binding.close()
