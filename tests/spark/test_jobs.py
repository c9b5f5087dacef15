"""Known answers for the triage, report and replay-set jobs, run once with the real spark-submit (conftest)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_babelqueue.spark.triage import COLUMNS, PLAIN_COLUMNS
from tests.spark.conftest import SparkRun
from tests.spark.dead_letters import (
    CREATED,
    DECLINED,
    DRAINED,
    DUPLICATES,
    GATEWAY,
    SMTP,
    by_name,
    drained_at_of,
    letters,
)

pytestmark = pytest.mark.timeout(600)

BY_REASON = {"failed": 8, "poison": 3, "unknown_urn": 2, "unsupported_schema_version": 2}


def meta_id(index: int) -> str:
    return f"11111111-0000-4000-8000-{index:012d}"


def rows_by_name(run: SparkRun) -> dict[str, dict]:
    table = pq.read_table(run.triage_dir).to_pylist()
    letter_ids = {meta_id(int(name[1:]) if name[0] == "F" else {"U": 8, "S": 10}[name[0]] + int(name[1:])): name
                  for name in by_name() if name[0] != "P"}
    out: dict[str, dict] = {}
    for row in table:
        if row["meta_id"] in letter_ids:
            out[letter_ids[row["meta_id"]]] = row
        else:
            out.setdefault("poison", []).append(row)  # type: ignore[attr-defined]
    return out


def test_triage_summary_line_is_exact(spark_run: SparkRun) -> None:
    assert spark_run.triage == {
        # the second file's torn last line is counted, not triaged
        "job": "triage", "output": str(spark_run.triage_dir), "records": 20, "rows": 15, "duplicates_removed": 4,
        "unreadable": 1, "unreadable_by_cause": {"torn": 1, "too_large": 0, "unknown_version": 0},
        "poison": 3, "by_reason": BY_REASON, "carried_over": {"files": 0, "records": 0},
        "report": str(spark_run.combined_report_dir / "report.html"),
    }
    written = json.loads((spark_run.triage_dir / "_triage_summary.json").read_text())
    assert written == spark_run.triage


def test_triage_partitions_by_reason_and_counts(spark_run: SparkRun) -> None:
    folders = sorted(p.name for p in spark_run.triage_dir.iterdir() if p.is_dir())
    assert folders == [f"reason={reason}" for reason in sorted(BY_REASON)]
    rows = pq.read_table(spark_run.triage_dir).to_pylist()
    assert len(rows) == 15
    assert Counter(row["reason"] for row in rows) == BY_REASON
    assert sum(row["copies"] for row in rows) == 19


def test_triage_writes_unique_valued_columns_plain_and_the_rest_with_dictionaries(spark_run: SparkRun) -> None:
    with_dictionary = set()
    for path in spark_run.triage_dir.rglob("*.parquet"):
        metadata = pq.ParquetFile(path).metadata
        for group in range(metadata.num_row_groups):
            for index in range(metadata.num_columns):
                column = metadata.row_group(group).column(index)
                if "PLAIN_DICTIONARY" in column.encodings:
                    with_dictionary.add(column.path_in_schema)
    # every other column has one wherever it holds values: not the boolean poison (never dictionary-encoded),
    # the reason (the folder name) or delivery_count and native_reason (null in every record of these drains)
    assert with_dictionary == set(COLUMNS) - set(PLAIN_COLUMNS) - {"poison", "reason", "delivery_count",
                                                                   "native_reason"}


def test_outputs_hold_no_checksum_files_under_the_local_settings(spark_run: SparkRun) -> None:
    # LOCAL_CONF turns off Hadoop's local checksum files (spark.babelqueue.localChecksums=false): every folder
    # the three jobs wrote holds its data and markers only (Hadoop's default adds a .NAME.crc per file)
    folders = (spark_run.triage_dir, spark_run.combined_report_dir, spark_run.report_dir, spark_run.replay_dir)
    written = [path for folder in folders for path in folder.rglob("*") if path.is_file()]
    assert [path for path in written if path.name.endswith(".crc")] == []
    names = {path.name for path in written}
    assert {"_SUCCESS", "_triage_summary.json", "summary.json", "report.html", "_replay_summary.json"} <= names
    # a Parquet file in every reason's folder (one task writes the same file name into each)
    assert {path.parent.name for path in written if path.suffix == ".parquet"} >= {f"reason={r}" for r in BY_REASON}


def test_triage_columns_are_exact(spark_run: SparkRun) -> None:
    rows = rows_by_name(spark_run)
    f1, f3, u1, s1 = rows["F1"], rows["F3"], rows["U1"], rows["S1"]
    # duplicates: the earliest drained copy wins, the copy count is kept
    assert (f1["drained_at"], f1["copies"]) == (drained_at_of("F1"), 2)
    assert all(rows[name]["copies"] == 2 and rows[name]["drained_at"] == drained_at_of(name)
               for name in DUPLICATES if name != "P1")
    assert rows["F2"]["copies"] == 1
    assert {k: f1[k] for k in ("reason", "urn", "original_queue", "queue_name", "lang", "attempts", "exception",
                               "exception_type", "error", "created_at", "failed_at", "age_ms", "source_broker",
                               "dead_letter_queue", "trace_id", "schema_version", "poison", "body_encoding")} == {
        "reason": "failed", "urn": "urn:babel:orders:created", "original_queue": "orders", "queue_name": "orders",
        "lang": "php", "attempts": 3, "exception": GATEWAY, "exception_type": "GatewayTimeout",
        "error": "timeout after 30s for order 1042", "created_at": CREATED + 60_000,
        "failed_at": CREATED + 90_000, "age_ms": 30_000, "source_broker": "redis",
        "dead_letter_queue": "orders:failed", "trace_id": "00000000-0000-4000-8000-000000000001",
        "schema_version": 1, "poison": False, "body_encoding": "utf-8",
    }
    assert f1["body"] == by_name()["F1"].body.decode()  # the raw body, untouched
    assert f3["original_queue"] == "orders-priority"  # dead_letter.original_queue beats meta.queue
    assert u1["urn"] == "urn:babel:orders:archived" and u1["reason"] == "unknown_urn"  # the urn alias
    assert (s1["reason"], s1["schema_version"], s1["lang"]) == ("unsupported_schema_version", 2, "go")
    assert rows["F6"]["data"] == "[]" and rows["F6"]["lang"] == "php"
    assert {r["meta_id"] for r in rows["poison"]} == {None}
    poison = sorted((r["original_queue"], r["body_encoding"], r["error"], r["copies"], r["drained_at"])
                    for r in rows["poison"])
    assert poison == [
        ("emails", "utf-8", "body is not a JSON object", 1, drained_at_of("P3")),
        ("orders", "utf-8", "body is not a JSON object", 2, drained_at_of("P1")),
        ("payments", "base64", "body is not valid UTF-8", 1, drained_at_of("P2")),
    ]
    assert all(r["reason"] == "poison" and r["poison"] for r in rows["poison"])


def test_fingerprints_group_similar_errors(spark_run: SparkRun) -> None:
    rows = pq.read_table(spark_run.triage_dir).to_pylist()
    groups = Counter((row["exception"], row["error_pattern"]) for row in rows)
    assert groups == {
        (GATEWAY, "timeout after <n>s for order <n>"): 3,
        (DECLINED, "card <str> declined for customer <hex>"): 2,
        (DECLINED, "card declined: insufficient funds"): 1,
        (SMTP, "connection to <n>:<n> refused (id <uuid>)"): 2,
        (None, "no handler for urn:babel:orders:archived"): 2,
        (None, "schema_version <n> is not supported"): 2,
        (None, "body is not a JSON object"): 2,
        (None, "body is not valid UTF-8"): 1,
    }
    # one fingerprint per (exception, pattern) group, and the same one for every member
    by_group: dict[tuple, set] = {}
    for row in rows:
        by_group.setdefault((row["exception"], row["error_pattern"]), set()).add(row["fingerprint"])
    assert all(len(prints) == 1 for prints in by_group.values())
    assert len({next(iter(p)) for p in by_group.values()}) == 8


def test_report_summary_is_exact(spark_run: SparkRun) -> None:
    summary = json.loads((spark_run.report_dir / "summary.json").read_text())
    assert spark_run.report["dead_letters"] == 15 and spark_run.report["by_reason"] == BY_REASON
    assert summary["totals"] == {
        "dead_letters": 15, "records": 20, "duplicates_removed": 4, "poison": 3, "urns": 4, "queues": 4,
        "fingerprints": 8, "first_failed_at": CREATED + 90_000, "last_failed_at": CREATED + 480_000 + 7_200_000,
        "without_failed_at": 3, "unreadable": 1,
    }
    assert summary["by_reason"] == BY_REASON
    assert summary["by_lang"] == {"go": 2, "node": 2, "php": 6, "python": 2, "unknown": 3}
    # created 14:01..14:12, failed after 1 s .. 2 h: hours 14:00 (10), 15:00 (1), 16:00 (1); 3 poison have none
    assert [(h["hour"], h["count"]) for h in summary["hourly"]] == [
        ("2025-06-05T14:00:00Z", 10), ("2025-06-05T15:00:00Z", 1), ("2025-06-05T16:00:00Z", 1)]
    assert {b["bucket"]: b["count"] for b in summary["age_buckets"]} == {
        "< 1 s": 2, "1–10 s": 3, "10 s–1 min": 2, "1–10 min": 3, "10 min–1 h": 0, "1 h–1 day": 2, "≥ 1 day": 0,
        "unknown": 3}
    top = {(f["exception_type"], f["error_pattern"]): f["count"] for f in summary["top_fingerprints"]}
    assert top[("GatewayTimeout", "timeout after <n>s for order <n>")] == 3
    assert [f["count"] for f in summary["top_fingerprints"]] == [3, 2, 2, 2, 2, 2, 1, 1]
    gateway = summary["top_fingerprints"][0]
    assert gateway["example_error"] == "timeout after 30s for order 1042" and gateway["reasons"] == ["failed"]
    assert summary["by_reason_urn_queue"][0] == {"reason": "failed", "urn": "urn:babel:payments:capture",
                                                 "original_queue": "payments", "count": 3}
    assert sum(g["count"] for g in summary["by_reason_urn_queue"]) == 15
    # triage --report-output writes the same report from the same Spark application
    combined = json.loads((spark_run.combined_report_dir / "summary.json").read_text())
    assert combined == summary
    assert (spark_run.combined_report_dir / "report.html").read_text() == (
        spark_run.report_dir / "report.html").read_text()


def test_letters_are_the_documented_set() -> None:
    assert [letter.name for letter in letters()] == [
        "F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8", "U1", "U2", "S1", "S2", "P1", "P2", "P3"]
    assert DRAINED - CREATED == 7_200_000


#: Bodies with fields of unexpected types (numbers as strings, a number beyond the long range, a fraction, meta
#: not an object): classified with their numbers cast leniently, never poison (meta not an object takes the
#: two-level parse).
ODD_BODIES = {
    "string-numbers": b'{"job":"urn:babel:orders:created","data":{"id":1},"meta":{"id":"odd-1","queue":"orders",'
                      b'"lang":"go","schema_version":"1","created_at":"1749132000000"},"attempts":"4",'
                      b'"dead_letter":{"reason":"failed","error":"timeout after 30s","exception":"Timeout",'
                      b'"failed_at":"1749132060000","original_queue":"orders","attempts":"4"}}',
    "huge-number": b'{"job":"urn:babel:orders:created","data":{},"meta":{"id":"odd-2","queue":"orders","lang":"go",'
                   b'"schema_version":1,"created_at":1749132000000},"attempts":99999999999999999999,'
                   b'"dead_letter":{"reason":"failed","failed_at":1749132000500}}',
    "meta-not-object": b'{"job":"urn:babel:orders:created","data":[],"meta":"odd",'
                       b'"dead_letter":{"reason":"unknown_urn","failed_at":1749132000000,"attempts":2.5}}',
}


def _write_drain(folder: Path, bodies: dict[str, bytes]) -> None:
    """One drain file in ``folder`` holding ``bodies``, each drained from Redis with its name as the record's
    ``source_conn_id`` (so a test can tell the rows apart)."""
    from airflow_provider_babelqueue.bindings.message import ReceivedMessage
    from airflow_provider_babelqueue.core.records import drain_record

    folder.mkdir()
    (folder / "drain.jsonl").write_bytes(b"".join(
        drain_record(ReceivedMessage(body, "orders", None, None, 0), broker="redis",
                     dead_letter_queue="orders:failed", source_conn_id=name, drained_at=DRAINED)
        for name, body in bodies.items()))


@pytest.mark.slow
@pytest.mark.usefixtures("spark_archive")
def test_fields_of_unexpected_types_are_read_not_poisoned(tmp_path: Path) -> None:
    from tests.spark.conftest import submit

    _write_drain(tmp_path / "in", ODD_BODIES)
    # a broker name with quotes is recorded as given (it is a value, never SQL text)
    broker = "o'brien \"primary\""
    summary = submit("triage", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                     "--source-broker", broker)
    # (an integer beyond signed 64-bit makes a body poison, as core.integers says)
    assert summary["by_reason"] == {"failed": 1, "unknown_urn": 1, "poison": 1}
    assert {row["source_broker"] for row in pq.read_table(tmp_path / "out").to_pylist()} == {broker}
    columns = ("meta_id", "reason", "poison", "lang", "schema_version", "created_at", "failed_at", "age_ms",
               "attempts", "exception_type", "original_queue")
    rows = {row["source_conn_id"]: {c: row[c] for c in columns} for row in pq.read_table(tmp_path / "out").to_pylist()}
    assert rows == {
        "string-numbers": {"meta_id": "odd-1", "reason": "failed", "poison": False, "lang": "go", "schema_version": 1,
                           "created_at": 1749132000000, "failed_at": 1749132060000, "age_ms": 60000, "attempts": 4,
                           "exception_type": "Timeout", "original_queue": "orders"},
        # attempts beyond a long: poison (the core refuses the body), its columns unknown
        "huge-number": {"meta_id": None, "reason": "poison", "poison": True, "lang": None, "schema_version": None,
                        "created_at": None, "failed_at": None, "age_ms": None, "attempts": None,
                        "exception_type": None, "original_queue": "orders"},
        # meta is not an object: no meta fields (the queue falls back to the record's); 2.5 attempts is no count
        "meta-not-object": {"meta_id": None, "reason": "unknown_urn", "poison": False, "lang": None,
                            "schema_version": None, "created_at": None, "failed_at": 1749132000000, "age_ms": None,
                            "attempts": None, "exception_type": None, "original_queue": "orders"},
    }


@pytest.mark.slow
@pytest.mark.usefixtures("spark_archive")
def test_a_drain_of_torn_lines_only_gives_an_empty_triage_and_a_zero_report(tmp_path: Path) -> None:
    from tests.spark.conftest import submit

    (tmp_path / "in").mkdir()
    # two torn lines, then a whole record with a byte that is not UTF-8 (a corrupted file, never a drain's)
    (tmp_path / "in" / "torn.jsonl").write_bytes(b'{"v":1,"body":"{\\"job\\":\n{"v":1,"bo\n'
                                                 b'{"v":1,"body":"{}","body_encoding":"utf-8","meta_id":"\xff"}\n')
    summary = submit("triage", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                     "--report-output", str(tmp_path / "report"))
    # none triaged, every line counted (the one with a byte that is not UTF-8 is no JSON text either)
    assert (summary["records"], summary["rows"], summary["by_reason"]) == (3, 0, {})
    assert (summary["unreadable"], summary["unreadable_by_cause"]) == (3, {"torn": 3, "too_large": 0,
                                                                           "unknown_version": 0})
    report = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert report["totals"] == {
        "dead_letters": 0, "records": 3, "poison": 0, "urns": 0, "queues": 0, "fingerprints": 0,
        "first_failed_at": None, "last_failed_at": None, "without_failed_at": 0, "duplicates_removed": 0,
        "unreadable": 3,
    }
    assert (report["by_reason"], report["by_reason_urn_queue"], report["top_fingerprints"], report["hourly"],
            report["by_lang"]) == ({}, [], [], [], {})
    assert [b["count"] for b in report["age_buckets"]] == [0] * 7


@pytest.mark.slow
@pytest.mark.usefixtures("spark_archive")
def test_eight_reasons_written_at_once_log_no_parquet_memory_warnings(tmp_path: Path) -> None:
    from tests.spark.conftest import submit

    reasons = [f"reason_{index}" for index in range(8)]
    _write_drain(tmp_path / "in", {reason: json.dumps({
        "job": "urn:babel:orders:created", "data": {}, "meta": {"id": f"id-{index}", "queue": "orders"},
        "dead_letter": {"reason": reason, "failed_at": DRAINED}}).encode() for index, reason in enumerate(reasons)})
    log: list[str] = []
    summary = submit("triage", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), log=log)
    assert summary["by_reason"] == dict.fromkeys(reasons, 1)
    # one task writes all eight reasons at once (one file each). With Parquet's 128 MiB row groups eight open
    # files claim more than its 95 % share of the 1 GiB heap, and it logs a WARN for every file opened or
    # closed; LOCAL_CONF's row group size fits them
    assert "MemoryManager" not in log[0]
    assert "Scaling row group sizes" not in log[0]
