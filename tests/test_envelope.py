"""The envelope core: exact bytes, exact reasons, clear errors."""

from __future__ import annotations

import copy
import datetime
import math
import os
import threading
import time
import uuid

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.exceptions import (
    BabelQueueError,
    EnvelopeDecodeError,
    EnvelopeEncodeError,
    InvalidEnvelopeError,
)
from tests.conftest import fixture_bytes, fixture_dict

TRACE = "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b"
MSG_ID = "f1e2d3c4-b5a6-4789-90ab-cdef01234567"
ORDER_BYTES = (
    b'{"job":"urn:babel:orders:created","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",'
    b'"data":{"order_id":1042},"meta":{"id":"f1e2d3c4-b5a6-4789-90ab-cdef01234567","queue":"orders",'
    b'"lang":"php","schema_version":1,"created_at":1749132727000},"attempts":0}'
)


# The reason codes in the order check() tests them (the contract's order).
VALIDATION_ORDER = [
    "missing_urn",
    "missing_meta",
    "unsupported_schema_version",
    "invalid_data",
    "missing_trace_id",
    "invalid_attempts",
]


def order() -> dict:
    return fixture_dict("fixtures/order-created.json")


def is_v4(value: str) -> bool:
    parsed = uuid.UUID(value)
    return parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == value


# ------------------------------------------------------------------------------------------ make


def test_make_envelope_follows_the_producer_rules() -> None:
    before = time.time_ns() // 1_000_000
    env = bq.make_envelope("urn:babel:orders:created", {"order_id": 1042}, queue_name="orders")
    after = time.time_ns() // 1_000_000
    assert list(env) == ["job", "trace_id", "data", "meta", "attempts"]
    assert list(env["meta"]) == ["id", "queue", "lang", "schema_version", "created_at"]
    assert env["job"] == "urn:babel:orders:created"
    assert env["data"] == {"order_id": 1042}
    assert env["attempts"] == 0
    assert env["meta"]["queue"] == "orders"
    assert env["meta"]["lang"] == "python"
    assert env["meta"]["schema_version"] == 1 and type(env["meta"]["schema_version"]) is int
    assert type(env["meta"]["created_at"]) is int and before <= env["meta"]["created_at"] <= after
    assert is_v4(env["trace_id"]) and is_v4(env["meta"]["id"])
    assert env["trace_id"] != env["meta"]["id"]
    assert bq.check(env) is None


def test_make_envelope_defaults_and_fresh_ids() -> None:
    first = bq.make_envelope("urn:x", {})
    second = bq.make_envelope("urn:x", {})
    assert first["meta"]["queue"] == "default"
    assert len({first["trace_id"], first["meta"]["id"], second["trace_id"], second["meta"]["id"]}) == 4


def test_uuids_are_v4_across_many_draws() -> None:
    ids = [bq.new_uuid4() for _ in range(2000)]
    assert all(is_v4(i) for i in ids)
    assert len(set(ids)) == 2000
    # every variant digit shows up: the variant bits are not stuck
    assert {i[19] for i in ids} == set("89ab")


def test_forked_children_never_repeat_the_parents_ids() -> None:
    bq.new_uuid4()  # the parent now holds a stock of ids a careless child would share
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        os.write(write_end, "\n".join(bq.new_uuid4() for _ in range(50)).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child_ids = set(pipe.read().split())
    os.waitpid(pid, 0)
    parent_ids = {bq.new_uuid4() for _ in range(50)}
    assert len(child_ids) == 50 and not child_ids & parent_ids


def test_threads_never_share_ids() -> None:
    results: list[list[str]] = [[] for _ in range(4)]

    def draw(slot: list[str]) -> None:
        slot.extend(bq.new_uuid4() for _ in range(3000))

    threads = [threading.Thread(target=draw, args=(slot,)) for slot in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({i for slot in results for i in slot}) == 12000


def test_trace_id_is_continued_verbatim() -> None:
    assert bq.make_envelope("urn:x", {}, trace_id=TRACE)["trace_id"] == TRACE
    assert bq.make_envelope("urn:x", {}, trace_id="legacy-trace 42")["trace_id"] == "legacy-trace 42"
    for blank in ("", " \t"):
        assert is_v4(bq.make_envelope("urn:x", {}, trace_id=blank)["trace_id"])


def test_make_envelope_trims_the_urn_and_copies_data() -> None:
    data = {"a": 1}
    env = bq.make_envelope("  urn:x\n", data)
    data["a"] = 2
    assert env["job"] == "urn:x"
    assert env["data"] == {"a": 1}


@pytest.mark.parametrize("urn", ["", "   ", "\t\n", None, 42, b"urn:x"])
def test_make_envelope_rejects_a_blank_urn(urn: object) -> None:
    with pytest.raises(InvalidEnvelopeError, match="URN must be a non-empty string"):
        bq.make_envelope(urn, {})  # type: ignore[arg-type]


@pytest.mark.parametrize("data", [[], [1], "x", None, 3])
def test_make_envelope_rejects_non_object_data(data: object) -> None:
    with pytest.raises(InvalidEnvelopeError, match="data must be a JSON object") as info:
        bq.make_envelope("urn:x", data)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError) and isinstance(info.value, BabelQueueError)


def test_make_envelope_rejects_bad_queue_and_trace() -> None:
    with pytest.raises(InvalidEnvelopeError, match="queue_name"):
        bq.make_envelope("urn:x", {}, queue_name=" ")
    with pytest.raises(InvalidEnvelopeError, match="trace_id must be a string"):
        bq.make_envelope("urn:x", {}, trace_id=123)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- encode


def test_encode_exact_bytes() -> None:
    assert bq.encode(order()) == ORDER_BYTES


def test_encode_leaves_non_ascii_and_slashes_unescaped() -> None:
    env = order()
    env["data"] = {"url": "https://shop.example/a/b", "title": "Café — naïve ☕", "emoji": "😀", "nl": "a\nb"}
    body = bq.encode(env)
    assert (
        b'"data":{"url":"https://shop.example/a/b","title":"Caf\xc3\xa9 \xe2\x80\x94 na\xc3\xafve \xe2\x98\x95",'
        in body
    )
    assert b'"emoji":"\xf0\x9f\x98\x80","nl":"a\\nb"}' in body


def test_encode_writes_canonical_order_and_keeps_unknown_keys() -> None:
    env = {
        "x-custom": {"k": 1},
        "attempts": 2,
        "dead_letter": {
            "lang": "go",
            "attempts": 2,
            "reason": "failed",
            "original_queue": "q",
            "failed_at": 5,
            "exception": None,
            "error": "boom",
            "extra": True,
        },
        "meta": {"created_at": 7, "ext": "v", "schema_version": 1, "lang": "go", "queue": "q", "id": "m"},
        "data": {"z": 1, "a": 2},
        "trace_id": "t",
        "job": "urn:x",
    }
    assert bq.encode(env) == (
        b'{"job":"urn:x","trace_id":"t","data":{"z":1,"a":2},'
        b'"meta":{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":7,"ext":"v"},'
        b'"attempts":2,"x-custom":{"k":1},'
        b'"dead_letter":{"reason":"failed","error":"boom","exception":null,"failed_at":5,'
        b'"original_queue":"q","attempts":2,"lang":"go","extra":true}}'
    )


def test_encode_keeps_the_urn_alias_where_job_would_be() -> None:
    env = fixture_dict("fixtures/urn-alias.json")
    env = {k: env[k] for k in ["trace_id", "data", "meta", "attempts", "urn"]}
    assert bq.encode(env).startswith(b'{"urn":"urn:babel:orders:created","trace_id":')


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1e-07, b"1e-07"),
        (2e-05, b"2e-05"),
        (-1.5e-10, b"-1.5e-10"),
        (0.0001, b"0.0001"),
        (1e16, b"1e+16"),
        (99.9, b"99.9"),
        (1.0, b"1.0"),
        (0.0, b"0.0"),
        (2**63 - 1, b"9223372036854775807"),
        (-(2**63), b"-9223372036854775808"),
        (2**53 + 1, b"9007199254740993"),
    ],
)
def test_encode_numbers_like_python_repr(value: float, expected: bytes) -> None:
    env = order()
    env["data"] = {"v": value, "n": None}
    assert bq.encode(env).endswith(
        b'"data":{"v":' + expected + b',"n":null},' + ORDER_BYTES[ORDER_BYTES.index(b'"meta"') :]
    )


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_encode_rejects_nan_and_infinity_with_the_path(bad: float) -> None:
    env = order()
    env["data"] = {"prices": [1.0, {"p": bad}]}
    with pytest.raises(EnvelopeEncodeError, match=r"at /data/prices/1/p .*no NaN/Infinity"):
        bq.encode(env)


@pytest.mark.parametrize("bad", [2**63, 2**64, -(2**63) - 1, 10**30])
def test_encode_rejects_integers_outside_int64(bad: int) -> None:
    env = order()
    env["data"] = {"n": [bad]}
    with pytest.raises(EnvelopeEncodeError, match=rf"integer {bad} at /data/n/0 is outside signed 64-bit"):
        bq.encode(env)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [(datetime.datetime(2026, 1, 1), "datetime"), ({1, 2}, "set"), (b"raw", "bytes"), (object(), "object")],
)
def test_encode_rejects_values_json_cannot_carry(value: object, fragment: str) -> None:
    env = order()
    env["data"] = {"v": value}
    with pytest.raises(EnvelopeEncodeError, match=f"not JSON serializable: {fragment}.*plain JSON"):
        bq.encode(env)


def test_encode_rejects_non_string_keys_and_non_objects() -> None:
    env = order()
    env["data"] = {1: "a"}
    with pytest.raises(EnvelopeEncodeError, match="string keys"):
        bq.encode(env)
    with pytest.raises(EnvelopeEncodeError, match="must be a JSON object"):
        bq.encode([1, 2])  # type: ignore[arg-type]


def test_encode_does_not_mutate_its_input() -> None:
    env = {"attempts": 1, "job": "urn:x", "meta": {"queue": "q", "id": "i"}}
    snapshot = copy.deepcopy(env)
    bq.encode(env)
    assert env == snapshot and list(env) == list(snapshot)


# ---------------------------------------------------------------------------------------- decode


def test_decode_accepts_bytes_str_bytearray_memoryview() -> None:
    expected = order()
    for body in (ORDER_BYTES, ORDER_BYTES.decode(), bytearray(ORDER_BYTES), memoryview(ORDER_BYTES)):
        assert bq.decode(body) == expected


def test_decode_keeps_unknown_keys_and_order() -> None:
    env = bq.decode(b'{"zeta":1,"job":"u","meta":{"b":1,"a":2},"alpha":{"y":1,"x":2}}')
    assert list(env) == ["zeta", "job", "meta", "alpha"]
    assert list(env["meta"]) == ["b", "a"] and list(env["alpha"]) == ["y", "x"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"job":"\xff"}', "not valid JSON.*UTF-8"),
        (b'{"job":', "not valid JSON"),
        (b'{"a":NaN}', "not valid JSON"),
        (b'{"a":Infinity}', "not valid JSON"),
        (b"\xef\xbb\xbf{}", "not valid JSON.*BOM"),
        (b"", "not valid JSON"),
        (b"[1,2]", "not an object \\(got a JSON array\\)"),
        (b'"text"', "not an object \\(got a JSON string\\)"),
        (b"12", "not an object \\(got a JSON number\\)"),
        (b"null", "not an object \\(got a JSON null\\)"),
        (b"true", "not an object \\(got a JSON boolean\\)"),
    ],
)
def test_decode_rejects_what_is_not_an_envelope(body: bytes, message: str) -> None:
    with pytest.raises(EnvelopeDecodeError, match=message):
        bq.decode(body)
    with pytest.raises(EnvelopeDecodeError):
        bq.decode(body, exact=True)


def test_decode_rejects_lone_surrogates_and_wrong_types() -> None:
    with pytest.raises(EnvelopeDecodeError):
        bq.decode('{"job":"\ud800"}')
    with pytest.raises(EnvelopeDecodeError, match="bytes or str, got int"):
        bq.decode(42)  # type: ignore[arg-type]


def test_decode_refuses_integers_beyond_64_bit_with_or_without_exact() -> None:
    """The contract's integers are signed 64-bit: a body holding a wider one is refused (poison), never read as a
    rounded float (orjson's reading of 2**64 and beyond) or kept as an int no other SDK can hold. ``exact`` is
    kept for old callers and changes nothing."""
    body = b'{"job":"u","data":{"n":1180591620717411303424,"m":-9223372036854775809}}'
    for exact in (False, True):
        with pytest.raises(EnvelopeDecodeError, match="integer 1180591620717411303424 is outside the signed 64-bit"):
            bq.decode(body, exact=exact)
    assert bq.decode(b'{"n":9223372036854775807,"m":-9223372036854775808}', exact=True) == {
        "n": 2**63 - 1, "m": -(2**63)}


def test_annotate_dead_letter_leaves_the_top_level_attempts_to_the_caller() -> None:
    """As the Python SDK's ``annotate``: only the block is added; a worker sets the top-level count itself
    (``bindings.bodies.dead_letter_body`` writes the block's count there, 3 and 3 after three failed runs)."""
    env = order()
    env["attempts"] = 2
    dead = bq.annotate_dead_letter(env, "failed", original_queue="orders", attempts=3, failed_at=1749132730000)
    assert (dead["attempts"], dead["dead_letter"]["attempts"]) == (2, 3)


# ----------------------------------------------------------------------------------------- check


def with_changes(**changes: object) -> dict:
    env = order()
    for key, value in changes.items():
        if value is KeyError:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def test_check_reason_order() -> None:
    empty: dict = {}
    assert bq.check(empty) == "missing_urn"
    assert bq.check({"job": "u"}) == "missing_meta"
    assert bq.check({"job": "u", "meta": {}}) == "unsupported_schema_version"
    assert bq.check({"job": "u", "meta": {"schema_version": 1}}) == "invalid_data"
    assert bq.check({"job": "u", "meta": {"schema_version": 1}, "data": {}}) == "missing_trace_id"
    assert bq.check({"job": "u", "meta": {"schema_version": 1}, "data": {}, "trace_id": "t"}) == "invalid_attempts"
    assert bq.check({"job": "u", "meta": {"schema_version": 1}, "data": {}, "trace_id": "t", "attempts": 0}) is None
    assert list(bq.VALIDATION_REASONS) == VALIDATION_ORDER


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"job": KeyError}, "missing_urn"),
        ({"job": ""}, "missing_urn"),
        ({"job": " \t"}, "missing_urn"),
        ({"job": 5}, "missing_urn"),
        ({"job": None}, "missing_urn"),
        ({"meta": KeyError}, "missing_meta"),
        ({"meta": []}, "missing_meta"),
        ({"meta": "m"}, "missing_meta"),
        ({"data": [1]}, "invalid_data"),
        ({"data": "x"}, "invalid_data"),
        ({"data": None}, "invalid_data"),
        ({"data": KeyError}, "invalid_data"),
        ({"trace_id": ""}, "missing_trace_id"),
        ({"trace_id": "  "}, "missing_trace_id"),
        ({"trace_id": 7}, "missing_trace_id"),
        ({"trace_id": KeyError}, "missing_trace_id"),
        ({"attempts": -1}, "invalid_attempts"),
        ({"attempts": True}, "invalid_attempts"),
        ({"attempts": "0"}, "invalid_attempts"),
        ({"attempts": 1.0}, "invalid_attempts"),
        ({"attempts": None}, "invalid_attempts"),
        ({"attempts": KeyError}, "invalid_attempts"),
        ({"data": []}, None),
        ({"attempts": 7}, None),
        ({"extra": {"any": "thing"}}, None),
    ],
)
def test_check_reasons(changes: dict, reason: str | None) -> None:
    assert bq.check(with_changes(**changes)) == reason


@pytest.mark.parametrize("version", [2, 0, "1", 1.0, True, None])
def test_check_unsupported_schema_versions(version: object) -> None:
    env = order()
    env["meta"]["schema_version"] = version
    assert bq.check(env) == bq.Reason.UNSUPPORTED_SCHEMA_VERSION
    del env["meta"]["schema_version"]
    assert bq.check(env) == bq.Reason.UNSUPPORTED_SCHEMA_VERSION


def test_urn_alias_rules() -> None:
    assert bq.urn_of({"job": "a", "urn": "b"}) == "a"
    assert bq.urn_of({"urn": "b"}) == "b"
    assert bq.urn_of({"job": "", "urn": "b"}) == "b"
    assert bq.urn_of({"job": 3, "urn": "b"}) == "b"
    assert bq.urn_of({"job": " ", "urn": " "}) == ""
    assert bq.urn_of({}) == ""
    assert bq.urn_of({"job": "\u00a0"}) == "\u00a0"  # only ASCII whitespace counts as blank, as in every SDK
    assert bq.check(with_changes(job=KeyError, urn="urn:babel:orders:created")) is None


def test_check_needs_a_mapping() -> None:
    with pytest.raises(TypeError, match="decoded envelope"):
        bq.check([1])  # type: ignore[arg-type]


def test_accepts_and_helpers() -> None:
    assert bq.accepts(order()) is True
    assert bq.accepts(with_changes(meta=KeyError)) is False
    assert bq.data_of({"data": []}) == {}
    assert bq.meta_id_of(order()) == MSG_ID
    assert bq.meta_id_of({"meta": {"id": 5}}) == "" and bq.meta_id_of({}) == ""


def test_reason_members_are_plain_strings() -> None:
    assert bq.Reason.FAILED == "failed" and bq.Reason.UNKNOWN_URN == "unknown_urn" and bq.Reason.POISON == "poison"
    assert [r.value for r in bq.Reason] == [*VALIDATION_ORDER, "failed", "unknown_urn", "poison"]


# ------------------------------------------------------------------------------ dead letter / replay


def test_annotate_dead_letter_exact_bytes_and_no_mutation() -> None:
    env = order()
    env["attempts"] = 3
    snapshot = copy.deepcopy(env)
    dead = bq.annotate_dead_letter(
        env,
        bq.Reason.FAILED,
        original_queue="orders",
        attempts=3,
        error="Payment gateway timeout",
        exception="GatewayTimeout",
        failed_at=1749132730000,
    )
    assert env == snapshot
    assert bq.encode(dead) == ORDER_BYTES.replace(b'"attempts":0}', b'"attempts":3,') + (
        b'"dead_letter":{"reason":"failed","error":"Payment gateway timeout","exception":"GatewayTimeout",'
        b'"failed_at":1749132730000,"original_queue":"orders","attempts":3,"lang":"python"}}'
    )
    assert type(dead["dead_letter"]["reason"]) is str


def test_annotate_dead_letter_defaults_and_replaces_an_old_block() -> None:
    old = fixture_dict("fixtures/dead-lettered.json")
    old["x-extra"] = 1
    before = bq.now_ms()
    dead = bq.annotate_dead_letter(old, "unknown_urn", original_queue="billing", attempts=0)
    assert list(dead) == ["job", "trace_id", "data", "meta", "attempts", "x-extra", "dead_letter"]
    block = dead["dead_letter"]
    assert list(block) == list(bq.DEAD_LETTER_KEYS)
    assert block["reason"] == "unknown_urn" and block["original_queue"] == "billing"
    assert block["error"] is None and block["exception"] is None and block["lang"] == "python"
    assert before <= block["failed_at"] <= bq.now_ms()
    assert dead["trace_id"] == old["trace_id"] and dead["meta"] == old["meta"] and dead["data"] == old["data"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reason": ""}, "reason must be a non-empty string"),
        ({"reason": None}, "reason must be a non-empty string"),
        ({"attempts": -1}, "attempts must be a non-negative integer"),
        ({"attempts": True}, "attempts must be a non-negative integer"),
        ({"original_queue": None}, "original_queue must be a string"),
    ],
)
def test_annotate_dead_letter_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    args = {"reason": "failed", "original_queue": "q", "attempts": 1} | kwargs
    reason = args.pop("reason")
    with pytest.raises(InvalidEnvelopeError, match=message):
        bq.annotate_dead_letter(order(), reason, **args)


def test_reset_for_replay_restores_the_original_message() -> None:
    dead = bq.decode(fixture_bytes("fixtures/dead-lettered.json"))
    dead["x-extra"] = "kept"
    snapshot = copy.deepcopy(dead)
    replay = bq.reset_for_replay(dead)
    assert dead == snapshot
    assert "dead_letter" not in replay and replay["attempts"] == 0 and replay["x-extra"] == "kept"
    assert replay["meta"]["id"] == MSG_ID and replay["trace_id"] == TRACE
    del replay["x-extra"]
    assert bq.encode(replay) == ORDER_BYTES
