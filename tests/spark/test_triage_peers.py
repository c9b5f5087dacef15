"""Triage of what the other official SDKs leave on their dead-letter queues: header frames and the Python SDK's poison
wrapper, next to their plain dead letters and poison copies.

The bodies are the peers' exact bytes (``shared/interop/peer-captures``) plus frames built to break each rule a
frame must keep. The expected values come from the pure core readers (``core.frames.open_body`` and
``core.peer.poison_wrapper``), so the Spark job and the rest of the provider are held to one reading of a body,
and a few are also stated outright. One ``spark-submit`` (triage with its report) serves the whole module.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.core.errors import EnvelopeDecodeError
from airflow_provider_babelqueue.core.frames import FrameError, open_body
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.core.records import drain_record
from airflow_provider_babelqueue.spark.triage import (
    POISON_INVALID_FRAME,
    POISON_INVALID_JSON,
    POISON_INVALID_UTF8,
)
from tests.conftest import ROOT
from tests.spark.conftest import submit

pytestmark = pytest.mark.timeout(600)

CAPTURES = ROOT.parent / "shared" / "interop" / "peer-captures"
DRAINED = 1_795_700_000_000

#: The Python SDK's Redis frame around its poison wrapper: a poison that came to the DLQ inside a frame.
_HEADERS = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme-eu"}
_ENVELOPE = {"job": "urn:babel:orders:charge-card", "trace_id": "0b7e5b8e-36a4-4a8e-9a49-3f0d0c4d3f10",
             "data": {"order_id": 7}, "meta": {"id": "9d0c2a34-62a5-4f61-8a0e-2b6f7e3f0a11", "queue": "orders",
                                                "lang": "python", "schema_version": 1, "created_at": DRAINED},
             "attempts": 3, "dead_letter": {"reason": "failed", "error": "boom", "exception": "RuntimeError",
                                            "failed_at": DRAINED + 10, "original_queue": "orders", "attempts": 3,
                                            "lang": "python"}}


def _frame(**keys: Any) -> bytes:
    return orjson.dumps({"__bq_frame": 1, "headers": _HEADERS, **keys})


def _synthetic() -> dict[str, bytes]:
    """Frames that break one rule each, and a frame around a poison wrapper (name → body)."""
    inner = orjson.dumps(_ENVELOPE).decode()
    wrapper = json.loads((CAPTURES / "python-redis-poison.json").read_text(encoding="utf-8"))["body_utf8"]
    return {
        "frame-body-missing": orjson.dumps({"__bq_frame": 1, "headers": _HEADERS}),
        "frame-body-number": _frame(body=42),
        "frame-body-not-json": _frame(body="not json"),
        "frame-body-json-array": _frame(body="[1,2,3]"),
        "frame-body-object": _frame(body=_ENVELOPE),  # the envelope itself, not its text
        "frame-version-2": orjson.dumps({"__bq_frame": 2, "headers": _HEADERS, "body": inner}),
        "frame-headers-not-object": orjson.dumps({"__bq_frame": 1, "headers": "x-tenant", "body": inner}),
        "framed-poison-wrapper": _frame(body=wrapper),
        # not wrappers by core.peer's rules (an encoding that is no string; base64 without its padding): objects
        # whose block says poison, but no poison body
        "wrapper-encoding-number": b'{"raw":"x","raw_encoding":5,"dead_letter":{"reason":"poison","attempts":0}}',
        "wrapper-base64-unpadded": b'{"raw":"abc","raw_encoding":"base64","dead_letter":{"reason":"poison",'
                                   b'"attempts":0}}',
    }


@dataclass(frozen=True)
class _Drained:
    """What a binding hands the drain (core.records.DrainedMessage)."""

    body: bytes
    queue_name: str
    meta_id: str
    delivery_count: int | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    name: str  # also the record's source_conn_id, which tells the rows apart
    body: bytes
    broker: str
    queue: str
    dead_letter_queue: str


def _meta_id(raw: bytes) -> str:
    """What a binding reports as the message's meta.id (a frame's inner one), as the drain records it."""
    try:
        return bq.meta_id_of(open_body(raw)[0])
    except EnvelopeDecodeError:
        return ""


def cases() -> list[Case]:
    """Every dead-letter and poison capture of the peers, the Redis frames of fresh messages, then the frames
    above; in this order, which is also their drain order."""
    out = []
    for path in sorted(CAPTURES.glob("*.json")):
        capture = json.loads(path.read_text(encoding="utf-8"))
        if capture["case"].startswith(("dead-letter", "poison")) or path.stem.endswith("-redis-headers"):
            out.append(Case(path.stem, base64.b64decode(capture["body_b64"]), capture["broker"], capture["queue"],
                            capture["key_or_queue"]))
    out += [Case(name, body, "redis", "orders", "orders.dlq") for name, body in _synthetic().items()]
    return out


def expected(case: Case) -> dict[str, Any]:
    """The row the triage must give for a case, read with the core's own functions."""
    error = None
    try:
        value, _ = open_body(case.body)
    except FrameError:
        value, error = None, POISON_INVALID_FRAME
    except EnvelopeDecodeError:
        value = None
        try:
            case.body.decode("utf-8")
            error = POISON_INVALID_JSON
        except UnicodeDecodeError:
            error = POISON_INVALID_UTF8
    wrapper = poison_wrapper(value) if value is not None else None
    if value is None or wrapper is not None:
        block = wrapper.dead_letter if wrapper is not None else {}
        return {"reason": "poison", "poison": True, "meta_id": None, "urn": None,
                "original_queue": block.get("original_queue", case.queue), "attempts": block.get("attempts"),
                "error": block.get("error", error), "exception": block.get("exception"),
                "failed_at": block.get("failed_at"), "created_at": None}
    block, meta = value.get("dead_letter") or {}, value.get("meta") or {}
    return {"reason": block.get("reason", "unannotated"), "poison": False, "meta_id": meta.get("id"),
            "urn": value.get("job"), "original_queue": block.get("original_queue", meta.get("queue", case.queue)),
            "attempts": block.get("attempts", value.get("attempts")), "error": block.get("error"),
            "exception": block.get("exception"), "failed_at": block.get("failed_at"),
            "created_at": meta.get("created_at")}


@dataclass(frozen=True)
class PeerRun:
    cases: list[Case]
    rows: dict[str, dict[str, Any]]  # source_conn_id (the case name) → its triage row
    triage: dict[str, Any]
    report: dict[str, Any]


@pytest.fixture(scope="module")
def peer_run(tmp_path_factory: pytest.TempPathFactory, spark_archive: Path) -> PeerRun:
    root = tmp_path_factory.mktemp("peer-triage")
    drain_file, triage_dir, report_dir = root / "dlq-peers.jsonl", root / "triage", root / "report"
    all_cases = cases()
    drain_file.write_bytes(b"".join(
        drain_record(_Drained(case.body, case.queue, _meta_id(case.body)), broker=case.broker,
                     dead_letter_queue=case.dead_letter_queue, source_conn_id=case.name, drained_at=DRAINED + i)
        for i, case in enumerate(all_cases)))
    triage = submit("triage", "--input", str(drain_file), "--output", str(triage_dir), "--report-output",
                    str(report_dir))
    rows = {row["source_conn_id"]: row for row in pq.read_table(triage_dir).to_pylist()}
    report = json.loads((report_dir / "summary.json").read_text(encoding="utf-8"))
    return PeerRun(all_cases, rows, triage, report)


def test_the_captures_are_there() -> None:
    names = {case.name for case in cases()}
    # the SDKs' dead letters (framed ones too), Node's raw copies and the Python wrapper
    assert {"python-redis-dead-letter-headers", "node-redis-dead-letter-headers", "node-redis-poison",
            "node-redis-poison-binary", "python-redis-poison", "python-redis-poison-binary",
            "python-rabbitmq-poison", "php-redis-dead-letter"} <= names
    assert len([name for name in names if "-dead-letter" in name]) == 10


def test_every_row_reads_as_the_core_reads_its_body(peer_run: PeerRun) -> None:
    # Node's two raw copies of "not json" are one body: one row, the earlier drained copy (RabbitMQ's) kept
    assert "node-redis-poison" not in peer_run.rows
    assert peer_run.rows["node-rabbitmq-poison"]["copies"] == 2
    for case in peer_run.cases:
        if case.name == "node-redis-poison":
            continue
        row = peer_run.rows[case.name]
        assert {key: row[key] for key in expected(case)} == expected(case), case.name
        assert (row["body"], row["body_encoding"]) == (case.body.decode("utf-8"), "utf-8"), case.name
        assert row["queue_name"] == case.queue and row["dead_letter_queue"] == case.dead_letter_queue


def test_dead_letters_are_failed_with_the_inner_envelope_of_a_frame(peer_run: PeerRun) -> None:
    dead = {case.name: peer_run.rows[case.name] for case in peer_run.cases if "-dead-letter" in case.name}
    assert len(dead) == 10 and {row["reason"] for row in dead.values()} == {"failed"}
    assert not any(row["poison"] for row in dead.values())
    framed = dead["python-redis-dead-letter-headers"]
    assert framed["body"].startswith('{"__bq_frame":1,')  # the stored frame, byte for byte
    inner = json.loads(json.loads(framed["body"])["body"])
    assert (framed["meta_id"], framed["trace_id"], framed["lang"], framed["dead_letter_lang"]) == (
        inner["meta"]["id"], inner["trace_id"], "python", "python")
    assert (framed["urn"], framed["original_queue"], framed["attempts"]) == (
        "urn:babel:orders:charge-card", "cap_orders_python_red_dlh", 3)
    assert (framed["exception"], framed["exception_type"], framed["error"]) == (
        "RuntimeError", "RuntimeError", "card declined by issuer")
    assert framed["age_ms"] == inner["dead_letter"]["failed_at"] - inner["meta"]["created_at"]
    # Node and PHP give up after three runs with attempts 2, Python with 3: the block's value is kept
    assert {name: row["attempts"] for name, row in dead.items() if name.startswith(("node", "php"))} == {
        name: 2 for name in dead if name.startswith(("node", "php"))}
    # Node's fresh frames carry their envelope too
    assert peer_run.rows["node-redis-headers"]["urn"] == "urn:babel:orders:created"
    assert peer_run.rows["node-redis-headers"]["reason"] == "unannotated"


def test_poison_wrapper_is_poison_with_the_sdks_error(peer_run: PeerRun) -> None:
    redis, rabbit = peer_run.rows["python-redis-poison"], peer_run.rows["python-rabbitmq-poison"]
    binary = peer_run.rows["python-redis-poison-binary"]
    for row in (redis, rabbit, binary):
        assert (row["reason"], row["poison"], row["meta_id"], row["urn"], row["attempts"]) == (
            "poison", True, None, None, 0)
        assert (row["exception"], row["dead_letter_lang"]) == ("BabelQueueError", "python")
    assert redis["error"] == binary["error"] == "Undecodable BabelQueue body"
    assert rabbit["error"].startswith("Undecodable BabelQueue body: invalid JSON: ")
    # a peer's error text is masked like any other (its character offsets do not split a group)
    assert rabbit["error_pattern"] == ("Undecodable BabelQueue body: invalid JSON: Expecting value: "
                                       "line <n> column <n> (char <n>)")
    assert binary["original_queue"] == "cap_orders_python_red_poisonbin"
    framed = peer_run.rows["framed-poison-wrapper"]
    assert (framed["reason"], framed["poison"], framed["error"]) == ("poison", True, "Undecodable BabelQueue body")


def test_malformed_frames_are_poison_with_their_bytes_kept(peer_run: PeerRun) -> None:
    malformed = [name for name in _synthetic() if name.startswith("frame-")]
    assert len(malformed) == 7
    for name in malformed:
        row = peer_run.rows[name]
        assert (row["reason"], row["poison"], row["meta_id"], row["error"], row["error_pattern"]) == (
            "poison", True, None, POISON_INVALID_FRAME, POISON_INVALID_FRAME), name
        assert row["body"].encode("utf-8") == _synthetic()[name]
    # Node's copy of bytes that were not UTF-8 is text with U+FFFD: poison because it is not JSON
    assert peer_run.rows["node-redis-poison-binary"]["error"] == POISON_INVALID_JSON


def test_wrapper_look_alikes_are_not_poison(peer_run: PeerRun) -> None:
    for name in ("wrapper-encoding-number", "wrapper-base64-unpadded"):
        row = peer_run.rows[name]
        # the block's reason, as for any object with one; not flagged poison, as core.peer does not unwrap it
        assert (row["reason"], row["poison"], row["error"], row["attempts"]) == ("poison", False, None, 0), name


def test_report_and_summary_count_the_rows(peer_run: PeerRun) -> None:
    rows = list(peer_run.rows.values())
    by_reason = dict(Counter(row["reason"] for row in rows))
    poison = sum(row["poison"] for row in rows)
    assert poison == 13  # 6 poison captures in 5 rows, 7 broken frames, 1 framed wrapper
    assert by_reason == {"failed": 10, "unannotated": 2, "poison": poison + 2}  # + the 2 look-alikes
    assert peer_run.report["by_reason"] == by_reason
    assert peer_run.triage["by_reason"] == by_reason
    totals = peer_run.report["totals"]
    assert (totals["dead_letters"], totals["records"], totals["poison"]) == (
        len(rows), len(peer_run.cases), by_reason["poison"])
    assert (peer_run.triage["rows"], peer_run.triage["records"], peer_run.triage["poison"]) == (
        len(rows), len(peer_run.cases), by_reason["poison"])
