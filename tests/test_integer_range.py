"""Integers outside signed 64-bit: refused by the core's decode, quarantined as poison with their bytes kept.

Node writes ``2**63 - 1`` as ``9223372036854776000`` (``peer-captures/node-redis-bigint.json``); orjson keeps
``2**63`` .. ``2**64 - 1`` as ints and turns ``2**64`` and beyond into floats. None of these may reach a
handler. Digits inside JSON strings never count.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.bindings.message import parse_body
from airflow_provider_babelqueue.core.errors import EnvelopeDecodeError
from airflow_provider_babelqueue.core.integers import (
    INT64_MAX,
    INT64_MIN,
    IntegerRangeError,
    check_integer_range,
    may_hold_wide_integer,
    out_of_range_integer,
)
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.engine.consume import Consumer
from airflow_provider_babelqueue.engine.replay import Item, Replayer
from tests.conftest import ROOT

CAPTURES = ROOT.parent / "shared" / "interop" / "peer-captures"
QUIET = logging.getLogger("tests.integer_range")
URN = "urn:babel:orders:created"
RANGE = "(-9223372036854775808 to 9223372036854775807); a producer must carry such a value as a string"


def capture(name: str) -> bytes:
    return base64.b64decode(json.loads((CAPTURES / f"{name}.json").read_text())["body_b64"])


def body_with(literal: bytes) -> bytes:
    """A valid envelope whose ``data.n`` is ``literal`` as written."""
    body = bq.encode(bq.make_envelope(URN, {"n": 0, "s": "x"}, queue_name="orders"))
    return body.replace(b'"n":0', b'"n":' + literal, 1)


@pytest.mark.parametrize(("literal", "shown"), [
    (b"9223372036854775808", "9223372036854775808"),  # 2**63: orjson keeps it as an int
    (b"-9223372036854775809", "-9223372036854775809"),  # -2**63 - 1: orjson makes it a float
    (b"18446744073709551615", "18446744073709551615"),  # 2**64 - 1: still an int for orjson
    (b"18446744073709551616", "18446744073709551616"),  # 2**64: a float for orjson
    (b"9223372036854776000", "9223372036854776000"),  # Node's 2**63 - 1
    (b"1" + b"0" * 400, "10000000000000000000... (401 digits)"),  # overflows a double: 1e400 written out
    (b"-" + b"9" * 5000, "-9999999999999999999... (5,000 digits)"),  # past Python's int-from-text limit
    (b"[1,{\"k\":[123456789012345678901]}]", "123456789012345678901"),  # nested
])
def test_an_integer_outside_int64_is_refused_with_a_clear_error(literal: bytes, shown: str) -> None:
    body = body_with(literal)
    error = f"integer {shown} is outside the signed 64-bit range the contract allows {RANGE}"
    with pytest.raises(IntegerRangeError) as caught:
        bq.decode(body)
    assert str(caught.value) == error and isinstance(caught.value, EnvelopeDecodeError)
    assert parse_body(body) == (None, error, 0)
    for form in (body.decode(), bytearray(body), memoryview(body)):
        with pytest.raises(IntegerRangeError):
            bq.decode(form)


@pytest.mark.parametrize("literal", [b"9223372036854775807", b"-9223372036854775808", b"1000000000000000000",
                                     b"-1000000000000000000", b"0", b"9007199254740993"])
def test_integers_within_int64_are_read_exactly(literal: bytes) -> None:
    envelope, error, _ = parse_body(body_with(literal))
    assert error is None and envelope is not None
    assert envelope["data"]["n"] == int(literal) and envelope["data"]["n"].__class__ is int
    assert bq.check(envelope) is None


@pytest.mark.parametrize("literal", [
    b'"18446744073709551616"',  # carried as a string, as the contract asks
    b'"-99999999999999999999999"',
    b'"x\\"12345678901234567890\\\\"',  # escaped quote and backslash around the digits
    b'["\\\\",  "12345678901234567890123"]',
    b"12345678901234567890.5",  # the integer part of a float
    b"0.12345678901234567890123",  # a float's fraction
    b"1.5e-12345678901234567890",  # a float's exponent (underflows to 0.0)
    b"123456789012345678E2",
])
def test_digits_in_strings_and_floats_do_not_count(literal: bytes) -> None:
    body = body_with(literal)
    envelope, error, _ = parse_body(body)
    assert error is None and envelope is not None and envelope["data"]["n"] == orjson.loads(literal)
    assert out_of_range_integer(body) is None


def test_a_float_beyond_a_double_stays_a_json_error() -> None:
    body = body_with(b"1e400")
    assert parse_body(body)[1] == ("The body is not valid JSON: number is infinity when parsed as double: line 1 "
                                   f"column {body.index(b'1e400') + 1} (char {body.index(b'1e400')}).")


def test_the_pre_check_is_a_run_of_19_digits() -> None:
    assert not may_hold_wide_integer(body_with(b"922337203685477580"))  # 18 digits: cannot be out of range
    assert may_hold_wide_integer(body_with(b"1000000000000000000"))
    assert may_hold_wide_integer(body_with(b'"1000000000000000000"'))  # in a string: the exact step decides
    assert out_of_range_integer(body_with(b'"1000000000000000000"')) is None
    check_integer_range(body_with(b"9223372036854775807"))


def test_nodes_rounded_int64_max_is_poison_for_the_consumer_with_its_bytes_kept() -> None:
    raw = capture("node-redis-bigint")
    assert b'"ledger":9223372036854776000' in raw
    binding = MemoryBinding()
    binding.publish(raw, "orders")
    handled: list[dict[str, Any]] = []
    summary = Consumer(binding, "orders", {URN: handled.append}, log=QUIET).run(reserve_timeout=0)
    assert handled == [] and dict(summary.dead_lettered) == {"poison": 1}
    [dead] = binding.browse_dead_letters("orders")
    wrapper = poison_wrapper(dead.body)  # the exact bytes, with the reason and the decode error beside them
    assert wrapper is not None and wrapper.raw == raw and wrapper.reason == "poison"
    assert wrapper.dead_letter["error"] == (
        f"integer 9223372036854776000 is outside the signed 64-bit range the contract allows {RANGE}")


def test_a_dead_letter_holding_a_wide_integer_is_never_replayed() -> None:
    annotated = bq.annotate_dead_letter(bq.decode(body_with(b"1")), "failed", original_queue="orders", attempts=3)
    wide = bq.encode(annotated).replace(b'"n":1', b'"n":18446744073709551616')
    binding = MemoryBinding()
    replayer = Replayer(target=binding, ledger_binding=binding)
    replayer.feed(Item(wide, "orders"))
    replayer.finish()
    assert replayer.result.as_dict()["skipped"] == {"poison": 1} and binding.depth("orders") == 0


# ------------------------------------------------------------------------------------- against a model


def wide(value: Any) -> bool:
    """Reference: whether a decoded JSON value holds an int outside signed 64-bit."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, int) and not isinstance(item, bool) and not INT64_MIN <= item <= INT64_MAX:
            return True
    return False


INTEGERS = st.integers(-(2**70), 2**70) | st.sampled_from([2**63, 2**63 - 1, -(2**63), -(2**63) - 1, 2**64])
DIGIT_TEXT = st.text(alphabet=st.sampled_from('0123456789"\\-.e '), max_size=30)
VALUES = st.recursive(
    st.none() | st.booleans() | INTEGERS | st.floats(allow_nan=False, allow_infinity=False) | DIGIT_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(DIGIT_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(value=VALUES, spaced=st.booleans())
def test_the_byte_check_agrees_with_the_decoded_values(value: Any, spaced: bool) -> None:
    body = json.dumps({"v": value}, separators=(", ", ": ") if spaced else (",", ":")).encode()
    assert (out_of_range_integer(body) is not None) == wide(value)
    if wide(value):
        with pytest.raises(IntegerRangeError):
            bq.decode(body)
    else:
        assert bq.decode(body) == json.loads(body)
