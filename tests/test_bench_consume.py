"""The batched-consumption benchmark at a CI size (``benchmarks/bench_consume.py``, ``make bench-consume``), so
its code keeps running and its checks keep holding between the runs that give the figures: on every broker, two
rounds of the raw loop and ours taken in turn over 400 messages (every message handled, the failing handler's
four retried, the queue empty afterwards: the benchmark itself fails otherwise), then k = 1 and 2 consumers with
no duplicate. The rates are printed, never asserted (docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.benchmark_modules import load_benchmark


def _bench() -> Any:
    return load_benchmark("bench_consume")


def test_each_broker_is_measured_in_rounds_and_every_message_is_handled_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    report = bench.Report()
    data = bench.bodies(400)
    for kind in bench.BROKERS:
        bench.bench_broker(kind, data, [1, 2], report, rounds=2)
    assert not report.errors
    out = capsys.readouterr().out
    for kind in bench.BROKERS:
        section = out.split(f"== {kind}:", 1)[1].split("\n== ", 1)[0]
        # two rounds in turn, each with the raw loop(s) first, then both handlers
        for turn in ("[1]", "[2]"):
            steps = [line.strip()[4:].split(" msg/s")[0].rsplit(" ", 1)[0].strip()
                     for line in section.splitlines() if line.strip().startswith(turn)]
            assert steps[-2:] == ["ours, no-op handler", "ours, 1% failing handler"], steps
            assert steps[:-2] and all(step.startswith("raw baseline") for step in steps[:-2]), steps
    rows = {(row.broker, row.measurement): row for row in report.rows}
    for kind in bench.BROKERS:
        for label in ("no-op", "1% failing"):
            row = rows[(kind, f"consume, {label} handler")]
            assert row.ours and row.base and row.goal == bench.GOALS[label]
        assert rows[(kind, "k=1 consumers, total (dups 0)")].ours
        assert rows[(kind, "k=2 consumers, total (dups 0)")].base  # against k = 1


def test_each_sqlite_measurement_gets_a_database_file_of_its_own() -> None:
    """Raw and ours meet the same conditions: a new file each, not one that earlier measurements grew."""
    bench = _bench()
    broker = bench.SqliteBroker()
    try:
        data = bench.bodies(50)
        before = set()
        for measure in (lambda: broker.raw(data), lambda: bench.ours(broker, data, False),
                        lambda: broker.raw(data)):
            measure()
            files = {path.name for path in Path(broker.tmp.name).glob("*.sqlite")}
            assert len(files - before) == 1, (before, files)
            before = files
        first, second = broker.fresh()[0]["url"], broker.fresh()[0]["url"]
        assert first != second
    finally:
        broker.cleanup()
