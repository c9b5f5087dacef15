"""Triage against the core: hostile bodies, peer wrappers of every reason, a body over Jackson's default string
limit, and the accounting of every input line (issue #29).

Two ``spark-submit`` runs serve the module: one triage of the hostile corpus (``hostile_bodies.BODIES``), the
wrappers and a 25,000,000-character body; one of a small file of good, duplicate and unreadable lines.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.core.records import drain_record
from airflow_provider_babelqueue.spark.triage import POISON_WRAPPED, UNREADABLE_CAUSES
from tests.spark.conftest import submit
from tests.spark.hostile_bodies import BODIES, SPARK_DISAGREES, core_refuses, envelope

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

DRAINED = 1_795_700_000_000
BIG_CHARS = 25_000_000
BIG_ID = "5a0b7c1e-9d2f-4e3a-8b6c-000000000025"


@dataclass(frozen=True)
class _Drained:
    """What a binding hands the drain (core.records.DrainedMessage)."""

    body: bytes
    queue_name: str = "orders"
    meta_id: str = ""
    delivery_count: int | None = None
    headers: Mapping[str, Any] | None = None


def _record(name: str, body: bytes, drained_at: int = DRAINED) -> bytes:
    return drain_record(_Drained(body, headers={}), broker="redis", dead_letter_queue="orders:failed",
                        source_conn_id=name, drained_at=drained_at)


def _wrapper(raw: bytes, block: dict[str, Any], base64_raw: bool = False) -> bytes:
    if base64_raw:
        return orjson.dumps({"raw": base64.b64encode(raw).decode(), "raw_encoding": "base64", "dead_letter": block})
    return orjson.dumps({"raw": raw.decode("utf-8"), "dead_letter": block})


def _block(reason: str | None, **keys: Any) -> dict[str, Any]:
    block = {"reason": reason} if reason is not None else {}
    return {**block, **keys, "failed_at": DRAINED - 5, "lang": "python"}


#: Poison wrappers our consumer writes for every dead letter it cannot annotate: name → (body, expected row).
WRAPPERS: dict[str, tuple[bytes, dict[str, Any]]] = {
    # a valid envelope that could not be re-encoded: failed, not poison
    "wrapper-utf8-failed": (
        _wrapper(envelope(), _block("failed", error="cannot re-encode: integer too wide", exception="EncodeError",
                                    original_queue="orders-eu", attempts=4)),
        {"reason": "failed", "poison": False, "error": "cannot re-encode: integer too wide",
         "exception": "EncodeError", "original_queue": "orders-eu", "attempts": 4}),
    # a body over the size limit whose raw text is a perfectly valid envelope: poison by its block
    "wrapper-utf8-poison-too-big": (
        _wrapper(envelope(), _block("poison", error="body over 1 MiB", exception="BodyTooLarge",
                                    original_queue="orders", attempts=0)),
        {"reason": "poison", "poison": True, "error": "body over 1 MiB", "exception": "BodyTooLarge",
         "original_queue": "orders", "attempts": 0}),
    # bytes that are not UTF-8
    "wrapper-base64-poison": (
        _wrapper(b"\xff\xfe not utf-8", _block("poison", error="Undecodable BabelQueue body",
                                                exception="BabelQueueError", original_queue="payments",
                                                attempts=1), base64_raw=True),
        {"reason": "poison", "poison": True, "error": "Undecodable BabelQueue body",
         "exception": "BabelQueueError", "original_queue": "payments", "attempts": 1}),
    # base64 raw of a valid envelope, dead-lettered for another reason
    "wrapper-base64-timeout": (
        _wrapper(envelope(), _block("timeout", error="handler timed out", exception="TimeoutError",
                                    original_queue="orders", attempts=2), base64_raw=True),
        {"reason": "timeout", "poison": False, "error": "handler timed out", "exception": "TimeoutError",
         "original_queue": "orders", "attempts": 2}),
    # a block without a reason or error: poison, with the job's own error
    "wrapper-base64-no-reason": (
        _wrapper(b"\x80", _block(None), base64_raw=True),
        {"reason": "poison", "poison": True, "error": POISON_WRAPPED, "exception": None,
         "original_queue": "orders", "attempts": None}),
}


def _write_big_record(path: Path) -> None:
    """A drain record whose body is an annotated envelope with a 25,000,000-character string in ``data``, written
    in pieces (the whole line is never held in memory)."""
    marker = "@@BLOB@@"
    body = envelope(data=f'{{"blob":"{marker}"}}', meta_id=BIG_ID)
    head, tail = _record("big-body", body, DRAINED).split(marker.encode())
    chunk = b"x" * 1_000_000
    with path.open("wb") as out:
        out.write(head)
        for _ in range(BIG_CHARS // len(chunk)):
            out.write(chunk)
        out.write(tail)


@dataclass(frozen=True)
class HostileRun:
    rows: dict[str, dict[str, Any]]  # source_conn_id → row
    triage: dict[str, Any]


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory, spark_archive: Path) -> HostileRun:
    root = tmp_path_factory.mktemp("hostile-triage")
    drained, out = root / "drained", root / "triage"
    drained.mkdir()
    # each body drained once (distinct drain times), so no two rows merge: duplicates are another test's
    lines = [_record(name, body, DRAINED + i) for i, (name, body) in enumerate(BODIES)]
    lines += [_record(name, body, DRAINED + 1000 + i) for i, (name, (body, _)) in enumerate(WRAPPERS.items())]
    (drained / "dlq-hostile.jsonl").write_bytes(b"".join(lines))
    _write_big_record(drained / "dlq-big.jsonl")
    triage = submit("triage", "--input", str(drained), "--output", str(out))
    table = pq.read_table(out, columns=["source_conn_id", "reason", "poison", "meta_id", "error", "exception",
                                        "original_queue", "attempts", "urn", "data", "body"])
    rows = {}
    for row in table.to_pylist():
        # (the big row's 25 MB columns are only measured)
        if row["source_conn_id"] == "big-body":
            row["data_chars"], row["body_chars"] = len(row.pop("data")), len(row.pop("body"))
        rows[row["source_conn_id"]] = row
    return HostileRun(rows, triage)


def test_every_input_line_is_a_row(hostile_run: HostileRun) -> None:
    expected = len(BODIES) + len(WRAPPERS) + 1
    assert len(hostile_run.rows) == expected
    assert (hostile_run.triage["records"], hostile_run.triage["rows"], hostile_run.triage["duplicates_removed"],
            hostile_run.triage["unreadable"]) == (expected, expected, 0, 0)


def test_a_body_over_jacksons_default_string_limit_is_a_normal_row(hostile_run: HostileRun) -> None:
    big = hostile_run.rows["big-body"]
    assert (big["reason"], big["poison"], big["meta_id"], big["urn"], big["error"], big["attempts"]) == (
        "failed", False, BIG_ID, "urn:babel:orders:created", "timeout", 3)
    assert big["data_chars"] == len('{"blob":""}') + BIG_CHARS
    assert big["body_chars"] == len(envelope(data='{"blob":""}', meta_id=BIG_ID)) + BIG_CHARS


def test_poison_is_what_the_core_refuses(hostile_run: HostileRun) -> None:
    got = {name: hostile_run.rows[name]["poison"] for name, _ in BODIES}
    core = {name: core_refuses(body) for name, body in BODIES}
    # both verdicts occur, and they differ exactly on the cases Spark's parser cannot read as the core does
    assert set(core.values()) == {True, False}
    assert {name for name in got if got[name] != core[name]} == set(SPARK_DISAGREES)
    assert all(got[name] and not core[name] for name in SPARK_DISAGREES)
    for name, _ in BODIES:
        row = hostile_run.rows[name]
        if row["poison"]:
            assert (row["reason"], row["meta_id"]) == ("poison", None), name
        else:
            assert (row["reason"], row["meta_id"]) == ("failed", f"hostile-{name}"), name


def test_a_wrapper_gives_its_blocks_reason_and_is_poison_only_for_poison(hostile_run: HostileRun) -> None:
    keys = ("reason", "poison", "error", "exception", "original_queue", "attempts")
    for name, (body, expected) in WRAPPERS.items():
        row = hostile_run.rows[name]
        assert {key: row[key] for key in keys} == expected, name
        # the core's reading of the same wrapper
        wrapper = poison_wrapper(body)
        assert wrapper is not None and wrapper.reason == expected["reason"], name
        assert (row["meta_id"], row["urn"]) == (None, None), name
    assert hostile_run.triage["by_reason"]["timeout"] == 1


def _too_large_line() -> bytes:
    return b'{"v":1,"body":"{}","body_encoding":"utf-8","' + b"k" * 60_000 + b'":1}\n'


def test_every_input_line_is_counted_once(tmp_path: Path, spark_archive: Path) -> None:
    good = [envelope(meta_id=f"acc-{i}") for i in (1, 2)]
    lines = [
        _record("good-1", good[0], DRAINED), b"\n",  # a blank line: no record
        _record("good-2", good[1], DRAINED + 1),
        _record("good-1-again", good[0], DRAINED + 2),  # the same message drained twice
        _record("version-2", good[1], DRAINED + 3).replace(b'{"v":1,', b'{"v":2,', 1),
        b'{"v":1,"broker":"redis"}\n',  # no body
        b"   \n",  # whitespace only: no record either
        _too_large_line(),
        b'{"v":1,"body":"{\\"job\\":\\"urn:babel:orders:cre',  # the torn last line of a crashed drain
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "dlq-crashed.jsonl").write_bytes(b"".join(lines))
    log: list[str] = []
    summary = submit("triage", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                     "--report-output", str(tmp_path / "report"), log=log)
    # 7 records (two blank lines are none): 2 rows + 1 duplicate + 4 unreadable
    assert {key: summary[key] for key in ("records", "rows", "duplicates_removed", "unreadable",
                                          "unreadable_by_cause", "poison", "by_reason")} == {
        "records": 7, "rows": 2, "duplicates_removed": 1, "unreadable": 4,
        "unreadable_by_cause": {"torn": 1, "too_large": 1, "unknown_version": 2}, "poison": 0,
        "by_reason": {"failed": 2}}
    assert tuple(summary["unreadable_by_cause"]) == UNREADABLE_CAUSES
    assert json.loads((tmp_path / "out" / "_triage_summary.json").read_text()) == summary
    assert "4 of 7 input lines were not triaged (torn 1, too_large 1, unknown_version 2)" in log[0]
    report = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert {key: report["totals"][key] for key in ("records", "dead_letters", "duplicates_removed",
                                                   "unreadable")} == {
        "records": 7, "dead_letters": 2, "duplicates_removed": 1, "unreadable": 4}
    assert report["unreadable_by_cause"] == summary["unreadable_by_cause"]
    # the report job run on its own reads the same numbers from the triage folder's summary
    alone = submit("report", "--input", str(tmp_path / "out"), "--output", str(tmp_path / "report-alone"))
    assert alone["unreadable"] == 4
    assert json.loads((tmp_path / "report-alone" / "summary.json").read_text())["totals"] == report["totals"]
