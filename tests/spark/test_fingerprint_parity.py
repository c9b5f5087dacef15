"""The error fingerprint has one definition: ``core.fingerprint`` in plain Python gives, for every dead letter, the
``error_pattern``, ``fingerprint`` (and ``exception``, ``exception_type``, ``reason``, ``poison``) that the real
triage job writes for the same stored bytes.

One ``spark-submit`` run of triage over a corpus: error texts with unicode, empty and missing errors, numbers,
UUIDs, hex ids (next to ASCII and non-ASCII letters, where Java 17's ``\\b`` and Python's differ), quotes,
whitespace of every kind, texts longer than the 2,000 characters that count (cut inside a multi-byte character or a
UUID), non-string values; exceptions blank, padded, namespaced; poison bodies, frames and poison wrappers; and the
hostile corpus the other triage tests use.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.core.fingerprint import (
    MASKS,
    error_fingerprint,
    error_pattern,
    exception_type,
    read_dead_letter,
)
from airflow_provider_babelqueue.core.frames import encode_frame
from airflow_provider_babelqueue.core.peer import wrap_raw
from airflow_provider_babelqueue.core.records import drain_record
from tests.spark.conftest import submit
from tests.spark.hostile_bodies import BODIES, SPARK_DISAGREES

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

DRAINED = 1_795_800_000_000
MISSING = object()

UUID = "123e4567-e89b-12d3-a456-426614174000"
ERRORS: list[Any] = [
    MISSING, None, "", " ", "   ",
    "timeout after 30s for order 1042", "timeout after 45s for order 77",
    "Order 'A-17' not found", 'key "x" missing', "it's broken", 'say "hi" twice "x"', "'unclosed",
    f"user {UUID} failed", f"user {UUID.upper()} failed", f"id={UUID}x", f"é{UUID}", f"_{UUID}", f"{UUID}é",
    f"ids {UUID},{UUID}", "123e4567-e89b-12d3-a456-42661417400",  # one hex digit short
    "ptr 0xDEADBEEF", "0X1f end", "0x", "0xg1", "hash deadbeef12 ok", "abcdefab letters", "12345678 digits",
    "a1b2c3d4e5", "deadbeef12\u0301 y", "é0123456789abcdef x", "\u00b2deadbeef12", "café 0xDEADbeef", "_deadbeef12",
    "ABCDEF12 up", "x deadbeef12_ y", "deadbeef12é",
    "1,234.56 EUR", "v1.2.3", "-5 degrees", "1e10", "3.14159", "port 5432:5433", "1.", ".5", "1,,2",
    "line1\nline2\tcol\r\n  end", "  padded  ", "\x0bvt\x0cff", " \u00a0nbsp ", "a\u2028b", "\t lead", "trail\t",
    "\n", "a  b", "a\u3000b 1",
    "订单 1042 处理失败：超时 30 秒", "Zahlung für Bestellung 17 fehlgeschlagen", "emoji 🚀 launch 3 failed 🔥",
    "مرحبا ٣ ١٢", "１２３ fullwidth", "𝟙𝟚 math digits", "RTL \u202e override 5", "combining e\u0301 12",
    "Kelvin \u212a ſ 0x1F", "a\u0000b 5",
    "body is not valid UTF-8", "body is not a JSON object",
    "x" * 1999 + "é" + "y" * 500, "error 42 " * 500, "a" * 1990 + f" {UUID}", "é" * 1500 + " 77 " + "ü" * 1000,
    "🚀" * 2100, "'" + "q" * 2500 + "'",
    42, True, False, {"code": 7, "msg": "x y"}, [1, "a b"], {"nested": {"k": [True, None]}},
]
EXCEPTIONS: list[Any] = [
    MISSING, None, "", "   ", "\t", " Foo ", "App\\Exceptions\\GatewayTimeout", "java.lang.RuntimeException",
    "Outer$Inner", "ns/mod:Err", "TimeoutError", "ValueError\n", "例外.エラー", "Trailing.", 42, True,
]


def _meta_id(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fingerprint-parity/{name}"))


def _annotated(name: str, error: Any, exception: Any, reason: Any = "failed") -> bytes:
    block: dict[str, Any] = {"reason": reason}
    if error is not MISSING:
        block["error"] = error
    if exception is not MISSING:
        block["exception"] = exception
    block |= {"failed_at": 1749132730000, "original_queue": "orders", "attempts": 3, "lang": "php"}
    env = {"job": "urn:babel:orders:created", "trace_id": "0b7e5b8e-36a4-4a8e-9a49-3f0d0c4d3f10",
           "data": {"order_id": 1042}, "meta": {"id": _meta_id(name), "queue": "orders", "lang": "php",
                                                "schema_version": 1, "created_at": 1749132727000},
           "attempts": 3, "dead_letter": block}
    return json.dumps(env, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _cases() -> list[tuple[str, bytes]]:
    cases: list[tuple[str, bytes]] = []
    for i, error in enumerate(ERRORS):
        cases.append((f"error-{i}", _annotated(f"error-{i}", error, EXCEPTIONS[i % len(EXCEPTIONS)])))
    for i, exception in enumerate(EXCEPTIONS):
        cases.append((f"exception-{i}", _annotated(f"exception-{i}", "timeout after 30s", exception)))
    # the same error kind with different numbers, under one exception: one fingerprint
    for i in range(3):
        cases.append((f"group-{i}", _annotated(f"group-{i}", f"timeout after {i * 7}s for order {1000 + i}",
                                               "App\\Exceptions\\GatewayTimeout")))
    for reason in ("", "  ", None, 5, "poison", "unknown_urn"):
        name = f"reason-{reason!r}"
        cases.append((name, _annotated(name, "bad 1", "E", reason)))
    no_block = json.loads(_annotated("no-block", "x", "y"))
    del no_block["dead_letter"]
    cases.append(("no-block", json.dumps(no_block).encode()))
    not_object = json.loads(_annotated("block-not-object", "x", "y"))
    not_object["dead_letter"] = "failed 7 times"
    cases.append(("block-not-object", json.dumps(not_object).encode()))
    alias = json.loads(_annotated("urn-alias", "oops 9", "E"))
    alias["urn"] = alias.pop("job")
    cases.append(("urn-alias", json.dumps(alias).encode()))
    # what other SDKs and our own consumer store besides annotated envelopes
    cases += [
        ("poison-bytes", b"\xff\xfe not utf-8 \x80"),
        ("poison-text", b"not json at all 42"),
        ("poison-array", b"[1,2,3]"),
        ("frame-ok", encode_frame(_annotated("frame-ok", "inner timeout 5s", "Inner.Error"), {"traceparent": "t"})),
        ("frame-bad-body", b'{"__bq_frame":1,"headers":{},"body":"not json"}'),
        ("frame-bad-version", b'{"__bq_frame":2,"headers":{},"body":"{}"}'),
        ("frame-body-object", b'{"__bq_frame":1,"body":{"job":"x"}}'),
        ("wrapper-poison", wrap_raw(b"\xff raw", "poison", original_queue="orders", attempts=1,
                                    error="Undecodable body at offset 17", exception="BabelQueueError")),
        ("wrapper-poison-no-error", wrap_raw(b"raw 1", "poison", original_queue="orders", attempts=0)),
        ("wrapper-failed", wrap_raw(b'{"job":"x"}', "failed", original_queue="orders", attempts=2,
                                    error="cannot re-encode: integer 18446744073709551616 too wide",
                                    exception="EncodeError")),
        ("wrapper-blank-reason", json.dumps({"raw": "abc", "dead_letter": {"reason": " ", "error": "e 1"}}).encode()),
    ]
    cases += [(f"hostile-{name}", body) for name, body in BODIES if name not in SPARK_DISAGREES]
    return cases


CASES = _cases()


@dataclass(frozen=True)
class _Drained:
    body: bytes
    queue_name: str = "orders"
    meta_id: str = ""
    delivery_count: int | None = None
    headers: Any = None


@pytest.fixture(scope="module")
def triaged(tmp_path_factory: pytest.TempPathFactory, spark_archive: Path) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("fingerprint-parity")
    drained, out = root / "drained", root / "triage"
    drained.mkdir()
    names = [name for name, _ in CASES]
    assert len(set(names)) == len(names)
    lines = [drain_record(_Drained(body, headers={}), broker="redis", dead_letter_queue="orders:failed",
                          source_conn_id=name, drained_at=DRAINED + i) for i, (name, body) in enumerate(CASES)]
    (drained / "dlq-parity.jsonl").write_bytes(b"".join(lines))
    summary = submit("triage", "--input", str(drained), "--output", str(out))
    assert summary["rows"] == len(CASES), summary  # no two cases merged
    table = pq.read_table(out, columns=["source_conn_id", "meta_id", "urn", "reason", "poison", "exception",
                                        "exception_type", "error", "error_pattern", "fingerprint"])
    return {row["source_conn_id"]: row for row in table.to_pylist()}


def test_the_masks_are_written_for_both_regex_engines() -> None:
    # \b, \d, \s, \w and inline flags mean different things in java.util.regex and Python's re
    for pattern, _, _ in MASKS:
        assert not re.search(r"\\[bBdDsSwW]|\(\?[a-z]", pattern), pattern


def test_known_patterns_and_fingerprints() -> None:
    assert error_pattern("timeout after 30s for order 1042") == "timeout after <n>s for order <n>"
    assert error_pattern(f"  user '{UUID}' {UUID} at 0xFF1 id deadbeef12 of 1,234.5\t\n x ") == (
        "user <str> <uuid> at <hex> id <hex> of <n> x")
    assert error_pattern(f"é{UUID}") == "é<uuid>"  # ASCII word boundaries, on any JVM
    assert error_pattern("٣ ١٢ ２") == "٣ ١٢ ２"  # only ASCII digits are numbers
    assert error_pattern("body is not valid UTF-8") == "body is not valid UTF-<n>"
    assert error_pattern("body is not valid UTF-8", poison=True) == "body is not valid UTF-8"
    assert error_pattern(None) is None and error_pattern("") == ""
    assert error_pattern("x" * 2500) == "x" * 2000
    same = error_fingerprint("E", error_pattern("timeout after 30s")), error_fingerprint("E", error_pattern("timeout "
                                                                                                           "after 5s"))
    assert same[0] == same[1] and re.fullmatch("[0-9a-f]{16}", same[0])
    assert error_fingerprint("E", "p") != error_fingerprint("Ep", "") != error_fingerprint(None, "Ep")
    assert error_fingerprint("   ", "p") == error_fingerprint(None, "p") == error_fingerprint("", "p")
    assert exception_type("App\\Exceptions\\GatewayTimeout") == "GatewayTimeout"
    assert exception_type("Outer$Inner") == "Inner" and exception_type(" ") is None


def test_the_corpus_covers_what_it_claims(triaged: dict[str, dict[str, Any]]) -> None:
    rows = triaged.values()
    patterns = [row["error_pattern"] or "" for row in rows]
    assert any("<uuid>" in p for p in patterns) and any("<hex>" in p for p in patterns)
    assert any("<str>" in p for p in patterns) and any("<n>" in p for p in patterns)
    assert any(row["poison"] for row in rows) and any(row["error"] is None for row in rows)
    assert any(row["error"] is not None and len(row["error"]) > 2000 for row in rows)
    assert len({row["fingerprint"] for row in rows}) > len(ERRORS)  # the corpus is not one big group


@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_python_reads_each_dead_letter_as_the_triage_job(triaged: dict[str, dict[str, Any]], name: str) -> None:
    body = dict(CASES)[name]
    row = triaged[name]
    facts = read_dead_letter(body)
    assert (facts.poison, facts.reason, facts.exception, facts.error) == (
        row["poison"], row["reason"], row["exception"], row["error"])
    assert facts.exception_type == row["exception_type"]
    assert facts.error_pattern == row["error_pattern"]
    assert facts.fingerprint == row["fingerprint"]
    if not row["poison"]:
        assert (facts.meta_id, facts.urn) == (row["meta_id"], row["urn"])
    # the functions alone, from the row's own fields
    assert error_pattern(row["error"], poison=row["poison"]) == row["error_pattern"]
    assert error_fingerprint(row["exception"], row["error_pattern"]) == row["fingerprint"]
    # and from the envelope a binding has already decoded
    try:
        decoded = bq.decode(body)
    except Exception:  # noqa: BLE001 - poison: nothing decoded to pass
        return
    assert read_dead_letter(body, decoded).fingerprint == row["fingerprint"]
