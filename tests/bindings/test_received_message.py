"""``received_message``: the reserve's hot-path constructor builds the same frozen message as the dataclass."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.message import ReceivedMessage, parse_body, received_message
from airflow_provider_babelqueue.core.frames import encode_frame


def test_it_equals_the_dataclass_field_for_field_and_stays_frozen() -> None:
    body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"order_id": 7}, queue_name="orders"))
    envelope, error, attempts = parse_body(body)
    headers = MappingProxyType({"x-tenant": "acme"})
    fast = received_message(body, "orders", envelope, error, attempts, headers, ("row", 1), delivery_count=3)
    slow = ReceivedMessage(body, "orders", envelope, error, attempts, 3, headers, ("row", 1))
    assert fast == slow
    assert [getattr(fast, f.name) for f in dataclasses.fields(ReceivedMessage)] == [
        body, "orders", envelope, None, 0, 3, headers, ("row", 1), False, None, None]
    assert (fast.from_dead_letter, fast.dead_letter_source, fast.stored_size, fast.size) == (False, None, None,
                                                                                            len(body))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.attempts = 9  # type: ignore[misc]
    assert dataclasses.replace(fast, attempts=9).attempts == 9


def test_parse_body_opens_a_frame_from_the_value_it_decoded() -> None:
    inner = bq.encode(bq.make_envelope("urn:babel:orders:created", {"order_id": 7}, queue_name="orders"))
    framed = encode_frame(inner, {"traceparent": "00-abc-def-01"})
    assert parse_body(framed) == (bq.decode(inner), None, 0)
    envelope, error, attempts = parse_body(encode_frame(b'{"job": 1', {}))
    assert envelope is None and attempts == 0 and error is not None
    assert error.startswith("header frame 'body' does not hold an envelope: the body is not valid JSON")
