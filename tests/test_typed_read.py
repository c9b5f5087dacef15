"""``decode``'s fast path (core.typed_read) against its orjson path, and ``check``'s one-test acceptance against
its rules in order: for every input, hostile ones included, the two give the same value or the same error.

The fast path may refuse a body for any reason (the orjson path then decides); what it accepts must come out
exactly as the orjson path reads it: same keys in the same order, same types, same float bits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.core import envelope as core
from airflow_provider_babelqueue.core.errors import EnvelopeDecodeError
from airflow_provider_babelqueue.core.integers import IntegerRangeError
from airflow_provider_babelqueue.core.typed_read import DEPTH, READ_ERRORS, read_checked
from tests.strategies import JSON, TEXT


def shape(value: Any) -> Any:
    """``value`` with every type made visible (``1`` and ``1.0``, ``0.0`` and ``-0.0``, key order differ)."""
    if isinstance(value, dict):
        return ("object", tuple((key, shape(item)) for key, item in value.items()))
    if isinstance(value, list):
        return ("array", tuple(shape(item) for item in value))
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, value)


def outcome(read: Any, body: Any) -> Any:
    try:
        return ("value", shape(read(body)))
    except EnvelopeDecodeError as exc:
        return ("error", type(exc).__name__, str(exc))


def assert_same(body: Any) -> None:
    assert outcome(bq.decode, body) == outcome(core._read_orjson, body), body


#: Inputs where parsers are known to part ways; every one must come out of both paths alike.
HOSTILE = [
    b'{"a":9223372036854775807}', b'{"a":-9223372036854775808}', b'{"a":9223372036854775808}',
    b'{"a":-9223372036854775809}', b'{"a":18446744073709551615}', b'{"a":18446744073709551616}',
    b'{"a":' + b"9" * 400 + b"}", b'{"a":1e400}', b'{"a":-1e400}', b'{"a":1e-400}', b'{"a":2.5e-324}',
    b'{"a":1.7976931348623157e308}', b'{"a":1.7976931348623159e308}', b'{"a":12345678901234567890.5}',
    b'{"a":123456789012345678901234567890e-10}', b'{"a":0.1000000000000000055511151231257827021181583404541015625}',
    b'{"a":-0}', b'{"a":-0.0}', b'{"a":1E2}', b'{"a":0.1e1}', b'{"a":01}', b'{"a":1.}', b'{"a":.5}', b'{"a":+1}',
    b'{"a":-}', b'{"a":NaN}', b'{"a":Infinity}', b'{"a":"\\ud800"}', b'{"a":"\\udc00x"}', b'{"\\ud83d\\ude00":1}',
    b'{"a":"\\u0000"}', b'{"a":"\x01"}', b'{"a":"\xff"}', b'{"a":"\xed\xa0\x80"}', b'{"a":"\xc0\x80"}',
    b'{"a":"\xf4\x90\x80\x80"}', b"\xef\xbb\xbf{}", b'{"a":1,"a":2}', b'{"a":1,"b":2,"a":3}', b' {} ', b"\t{}\r\n",
    b"{}x", b'{"a":[1,]}', b'{"a":1,}', b"[]", b"null", b'"text"', b"12", b"", b"   ", b"{", b'{"a"}',
    b'{"a":true,"b":false,"c":null}', b'{"a":tru}', b"[" * 1100 + b"]" * 1100,
    b'{"a":' + b"[" * 300 + b"]" * 300 + b"}",
    '{"a":"\ud800"}', '{"a":1}', bytearray(b'{"a":1}'), memoryview(b'{"a":[1,2]}'), b'{"a":1}\x00',
]


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_bodies_read_alike_on_both_paths(body: Any) -> None:
    assert_same(body)


def test_bodies_that_are_not_text_get_the_same_error() -> None:
    for body in (None, 12, [b"{}"], object()):
        with pytest.raises(EnvelopeDecodeError, match="must be bytes or str"):
            bq.decode(body)  # type: ignore[arg-type]


def nested(depth: int) -> bytes:
    """An object whose ``data`` is an array ``depth`` levels deep (``data`` itself at level 1), around a 1."""
    return b'{"data":' + b"[" * depth + b"1" + b"]" * depth + b"}"


def test_the_fast_path_reads_to_its_depth_and_deeper_bodies_still_decode() -> None:
    assert read_checked(nested(DEPTH)) == {"data": json.loads(nested(DEPTH))["data"]}
    with pytest.raises(READ_ERRORS):
        read_checked(nested(DEPTH + 1))
    for depth in (DEPTH + 1, 40, 300):
        assert bq.decode(nested(depth)) == json.loads(nested(depth))
    with pytest.raises(EnvelopeDecodeError, match="depth"):
        bq.decode(nested(1100))


@pytest.mark.parametrize(
    ("literal", "accepted"),
    [(2**63 - 1, True), (-(2**63), True), (2**63, False), (-(2**63) - 1, False), (2**64, False), (10**30, False)],
)
def test_the_fast_path_refuses_integers_outside_int64_inside_its_parse(literal: int, accepted: bool) -> None:
    body = b'{"data":{"n":[' + str(literal).encode() + b"]}}"
    if accepted:
        assert read_checked(body)["data"]["n"] == [literal]
        assert bq.decode(body)["data"]["n"][0] == literal
        return
    with pytest.raises(READ_ERRORS):
        read_checked(body)
    with pytest.raises(IntegerRangeError, match=str(literal)[:20]):
        bq.decode(body)


def test_a_conformant_body_never_reaches_the_orjson_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(body: Any) -> dict[str, Any]:
        raise AssertionError("the orjson path ran for a conformant body")

    monkeypatch.setattr(core, "_read_orjson", refuse)
    body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"order_id": 1, "amount": 9.5, "tags": ["x"]}))
    assert bq.check(bq.decode(body)) is None


NUMBER = st.from_regex(r"\A-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,3})?\Z")


@settings(max_examples=500, deadline=None)
@given(literal=NUMBER)
def test_every_json_number_reads_alike_on_both_paths(literal: str) -> None:
    assert_same(('{"data":{"n":' + literal + "}}").encode())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON, spaced=st.booleans())
def test_every_json_value_reads_alike_on_both_paths(value: Any, spaced: bool) -> None:
    text = json.dumps({"data": value}, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":"))
    assert_same(text.encode())
    assert_same(text)


@settings(max_examples=500, deadline=None)
@given(value=JSON, cut=st.integers(0, 400), noise=st.binary(max_size=3))
def test_damaged_bodies_read_alike_on_both_paths(value: Any, cut: int, noise: bytes) -> None:
    body = json.dumps({"data": value, "k": [1, "2", None]}).encode()
    cut %= len(body) + 1
    assert_same(body[:cut] + noise + body[cut:])
    assert_same(body[:cut] + body[cut + 1:])


def test_without_msgspec_every_body_goes_the_orjson_path() -> None:
    code = """
import sys
sys.modules["msgspec"] = None  # an import of it now raises ImportError
from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.core import typed_read
from airflow_provider_babelqueue.core.integers import IntegerRangeError
assert typed_read.read_checked.__name__ == "_unavailable"
body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"order_id": 7}))
assert bq.check(bq.decode(body)) is None and bq.decode(body)["data"] == {"order_id": 7}
try:
    bq.decode(b'{"n":9223372036854775808}')
except IntegerRangeError as exc:
    print("refused:", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("refused: integer 9223372036854775808 is outside the signed 64-bit range"), out


# ------------------------------------------------------------------------------------------------ check

#: Values on the edges of check's rules (blank and near-blank text, the other JSON types, numbers that look
#: like the right one), drawn far more often than arbitrary text.
EDGE_VALUES = st.sampled_from(["", " ", "  ", "\t\n", "\r", "\u3000", "\u00a0x", " x", "x", "!", "\x00", "\x1f",
                               "urn:a", None, True, False, 0, 1, -1, 1.0, -0.5, [], [1], {}, {"a": 1}])
ODD_VALUES = EDGE_VALUES | EDGE_VALUES | EDGE_VALUES | TEXT | st.integers(-3, 3) | st.floats(-2, 2)
FIELDS = ("job", "urn", "trace_id", "data", "meta", "attempts")


@st.composite
def odd_envelopes(draw: st.DrawFn) -> Any:
    """Conformant envelopes with one or two fields missing or of an odd value (now and then a dead-letter
    block), and a mapping that is no dict or no mapping at all."""
    env: dict[str, Any] = bq.make_envelope("urn:babel:orders:created", {"n": 1})
    if draw(st.booleans()):
        env = bq.annotate_dead_letter(env, "failed", original_queue="orders", attempts=3)
    for key in draw(st.lists(st.sampled_from(FIELDS), min_size=0, max_size=2, unique=True)):
        if draw(st.integers(0, 3)) == 0:
            env.pop(key, None)
        else:
            env[key] = draw(ODD_VALUES)
    meta = env.get("meta")
    if isinstance(meta, dict) and draw(st.integers(0, 3)) == 0:
        meta["schema_version"] = draw(st.sampled_from([1, 2, 0, True, 1.0, "1", None]))
    return draw(st.sampled_from([env, env, env, env, _Mapping(env), list(env)]))


class _Mapping(dict):  # a dict subclass: goes the rules in order, never the one-test acceptance
    pass


@settings(max_examples=2000, deadline=None)
@given(env=odd_envelopes())
def test_check_gives_the_rules_in_order_answer_for_every_envelope(env: Any) -> None:
    try:
        expected = core._first_broken_rule(env)
    except TypeError as exc:
        with pytest.raises(TypeError, match="takes a decoded envelope"):
            bq.check(env)
        assert "takes a decoded envelope" in str(exc)
        return
    assert bq.check(env) == expected


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [("job", " ", "missing_urn"), ("job", "\t", "missing_urn"), ("trace_id", "", "missing_trace_id"),
     ("trace_id", " \r\n", "missing_trace_id"), ("attempts", -1, "invalid_attempts"),
     ("attempts", True, "invalid_attempts"), ("data", [1], "invalid_data"), ("data", [], None),
     ("job", "\u3000", None), ("job", " x", None), ("trace_id", "\x00", None)],
)
def test_check_on_the_edges_of_its_one_test_acceptance(field: str, value: Any, reason: str | None) -> None:
    env = bq.make_envelope("urn:babel:orders:created", {"n": 1})
    env[field] = value
    assert bq.check(env) == reason
