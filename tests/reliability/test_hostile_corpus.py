"""The hostile-input corpus (``hostile_corpus.corpus``) through consume → DLQ → drain → triage → report → redrive on
SQLite, PostgreSQL, Redis and RabbitMQ, all real.

Per case and binding it asserts: the consumer's reason is the core's (:func:`expected_reason`) and the same on
every binding; no run raises and nothing is left on the queue (no message blocks its head); the dead letter keeps
the exact bytes of what could not be annotated (a poison wrapper's ``raw``) or the envelope's identity, with the
reason, the error and the quarantining queue beside it; triage's reason for the row equals the consumer's; the
report's embedded JSON parses back to its summary; a redrive (from the DLQ, dry run, and from the drained file)
and Spark's replay set never pick a poison dead letter nor follow a forged route.

The oversized case is ``BQ_HOSTILE_BIG_MB`` MiB (default 20, over the 16 MiB consumer limit);
``make hostile-corpus`` runs this module alone.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig, sqlite_url
from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.core.records import record_body
from airflow_provider_babelqueue.engine.consume import Consumer
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, drain_dead_letters
from airflow_provider_babelqueue.engine.replay import Replayer
from airflow_provider_babelqueue.engine.replay.feeds import feed_from_dead_letters, feed_from_replay_set
from tests.bindings.conftest import FACTORIES
from tests.reliability.hostile_corpus import FORGED_QUEUE, URN, case_of, corpus, expected_reason
from tests.spark.conftest import submit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

BINDINGS = ["sql-sqlite", "sql-postgresql", "redis", "rabbitmq"]
QUIET = logging.getLogger("tests.reliability.hostile_corpus")
POISON = str(bq.Reason.POISON)
#: Four drain records of ~20 MB each, two read at once: more than the recommended 1 GiB heap holds.
TRIAGE_CONF = {"spark.driver.memory": "2g"}


class _Run:
    """One binding's pass: its queue, its cases, what the consumer said, where the drain wrote."""

    def __init__(self, name: str, binding: Binding, queue: str, cases: list[tuple[str, bytes, str | None]]) -> None:
        self.name, self.binding, self.queue, self.cases = name, binding, queue, cases
        self.expected = {case: expected_reason(body) for case, body, _ in cases}
        self.by_bytes = {body: case for case, body, _ in cases}
        self.bodies = {case: body for case, body, _ in cases}
        #: what a replay may publish: not poison, valid once reset (dead_letter dropped, attempts 0), with an id
        self.replayable = sum(1 for case, body, _ in cases if self.expected[case] != POISON and _replayable(body))


def _replayable(body: bytes) -> bool:
    envelope = bq.reset_for_replay(bq.decode(body))
    return bq.check(envelope) is None and bool(bq.meta_id_of(envelope))


def _consume(run: _Run) -> None:
    errors = {case: error for case, _, error in run.cases}

    def handler(envelope: dict[str, Any]) -> None:
        raise RuntimeError(errors.get(str(envelope["data"].get("case")), None) or "boom")

    for _, body, _ in run.cases:
        run.binding.publish(body, run.queue)
    summary = Consumer(run.binding, run.queue, {URN: handler}, max_attempts=1, log=QUIET).run(reserve_timeout=1.0)
    assert summary.received == len(run.cases) and summary.handled == 0 and summary.broker_errors == 0
    assert dict(summary.dead_lettered) == dict(Counter(run.expected.values())), run.name
    assert run.binding.depth(run.queue) == 0  # nothing left at the head of the queue
    assert run.binding.dead_letter_depth(run.queue) == len(run.cases)


def _check_dead_letter(run: _Run, body: bytes) -> str:
    """The case of one stored dead letter, after checking what it keeps; returns the case name."""
    wrapper = poison_wrapper(body)
    case = case_of(body, wrapper.raw if wrapper is not None else None, run.by_bytes)
    original = run.bodies[case]
    if wrapper is not None:  # not annotatable: the exact bytes, with the reason beside them
        assert wrapper.raw == original, case
        block = wrapper.dead_letter
    else:  # annotated: the envelope's identity kept, the block added
        envelope = orjson.loads(body)
        block = envelope.pop("dead_letter")
        kept = orjson.loads(original)
        kept.pop("dead_letter", None)
        assert {k: v for k, v in envelope.items() if k != "attempts"} == {
            k: v for k, v in kept.items() if k != "attempts"}, case
    assert block["reason"] == run.expected[case], case
    assert block["original_queue"] == run.queue, case  # the consumer's queue, never the body's claim
    assert block["error"], case
    return case


def _redrive_dry_run(run: _Run, ledger: Binding) -> None:
    """From the DLQ: a dry run plans only the failed ones, for the queue they failed on, and gives all back."""
    replayer = Replayer(target=run.binding, ledger_binding=ledger, source=run.binding, dry_run=True, log=QUIET)
    try:
        feed_from_dead_letters(replayer, run.binding, run.queue, reserve_timeout=0.5)
    finally:
        replayer.finish()
    result = replayer.result.as_dict()
    assert result["targets"] == {run.queue: run.replayable}, result
    assert result["skipped"].get(POISON, 0) == Counter(run.expected.values())[POISON], result
    assert run.binding.dead_letter_depth(run.queue) == len(run.cases)  # all given back unchanged


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[_Run]]:
    cleanups: list[Callable[[], None]] = []
    out = []
    for name in BINDINGS:
        tag = f"{name}-{uuid.uuid4().hex[:6]}"
        (tmp_path / name).mkdir()
        out.append(_Run(name, FACTORIES[name](tmp_path / name, cleanups), f"hostile-{tag}", corpus(tag)))
    yield out
    for cleanup in reversed(cleanups):
        cleanup()


def test_the_corpus_keeps_bytes_and_reasons_from_consume_to_redrive(runs: list[_Run], tmp_path: Path,
                                                                      spark_class_archive: Path | None) -> None:
    if spark_class_archive is None:
        pytest.skip("spark-submit (pyspark) or java is not installed")
    ledger = SqlBinding(SqlConfig(sqlite_url(tmp_path / "ledger.sqlite"), table="ledger"))
    drained = tmp_path / "drained"
    drained.mkdir()
    verdicts: dict[str, dict[str, str]] = {}
    for run in runs:
        _consume(run)
        _redrive_dry_run(run, ledger)
        path = drained / f"{run.name}.jsonl"
        result = drain_dead_letters([DrainSource(run.binding, run.queue, f"bq_{run.name}")], LocalFileSink(path),
                                    mode="move", reserve_timeout=0.5, log=QUIET)
        assert result.records == len(run.cases) and run.binding.dead_letter_depth(run.queue) == 0
        seen = [_check_dead_letter(run, record_body(orjson.loads(line))) for line in path.read_bytes().splitlines()]
        assert sorted(seen) == sorted(run.expected)
        verdicts[run.name] = run.expected
    # the same verdict on every binding
    assert all(v == verdicts[BINDINGS[0]] for v in verdicts.values())

    # triage and report: every line a row, each row's reason the consumer's
    triage_dir, report_dir = tmp_path / "triage", tmp_path / "report"
    summary = submit("triage", "--input", str(drained), "--output", str(triage_dir), "--report-output",
                     str(report_dir), conf=TRIAGE_CONF)
    total = sum(len(run.cases) for run in runs)
    assert (summary["records"], summary["rows"], summary.get("unreadable", 0)) == (total, total, 0), summary
    rows = pq.read_table(triage_dir, columns=["source_conn_id", "reason", "poison", "body", "original_queue",
                                              "error"]).to_pylist()
    by_conn = {f"bq_{run.name}": run for run in runs}
    triaged: dict[str, dict[str, str]] = {run.name: {} for run in runs}
    for row in rows:
        run = by_conn[row["source_conn_id"]]
        body = row["body"].encode("utf-8") if row["body"] is not None else b""
        wrapper = poison_wrapper(body)
        case = case_of(body, wrapper.raw if wrapper is not None else None, run.by_bytes) if body else "?"
        triaged[run.name][case] = row["reason"]
        assert row["poison"] == (row["reason"] == POISON), (run.name, case)
        assert row["original_queue"] == run.queue, (run.name, case)
    for run in runs:
        assert triaged[run.name] == run.expected, run.name
    report = json.loads((report_dir / "summary.json").read_text())
    html = (report_dir / "report.html").read_text(encoding="utf-8")
    embedded = re.search(r'<script type="application/json" id="summary-data">(.*?)</script>', html, re.S)
    assert embedded is not None and json.loads(embedded.group(1)) == report
    assert html.count("</script") == 1 and "\x00" not in html

    # Spark's replay set: no poison row, and every route the consumer's queue
    replay_dir = tmp_path / "replay"
    submit("replay_set", "--input", str(triage_dir), "--output", str(replay_dir))
    chosen = [line for part in sorted(replay_dir.glob("part-*")) for line in part.read_bytes().splitlines()]
    assert len(chosen) == sum(run.replayable for run in runs)
    queues = {run.queue for run in runs}
    for line in chosen:
        envelope = orjson.loads(record_body(orjson.loads(line)))
        assert envelope["dead_letter"]["reason"] != POISON and envelope["dead_letter"]["original_queue"] in queues

    # redrive from the drained file: the failed ones go back to their own queue; nothing to the forged one
    for run in runs:
        replayer = Replayer(target=run.binding, ledger_binding=ledger, log=QUIET)
        feed_from_replay_set(replayer, str(drained / f"{run.name}.jsonl"))
        replayer.finish()
        result = replayer.result.as_dict()
        assert result["replayed"] == run.replayable and result["targets"] == {run.queue: run.replayable}, result
        assert result["skipped"].get(POISON, 0) == Counter(run.expected.values())[POISON], result
        assert run.binding.depth(run.queue) == run.replayable and run.binding.depth(FORGED_QUEUE) == 0
