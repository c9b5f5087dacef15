"""The console page-latency benchmark at a CI size (``benchmarks/bench_console_browse.py``, ``make bench-console``),
so the benchmark keeps running and its checks keep holding between the runs that give the figures: 2,000 dead letters
on SQLite, Redis and PostgreSQL, 2 pages per measurement, the HTTP route included. Every page is checked by the
benchmark itself against the letters written (a wrong one exits non-zero); here the table must have every row with
the right counts, the rare URN must be found all 10 times, and nothing the run made may be left behind. The latencies
are printed, never asserted (docs/benchmarks.md)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from tests.benchmark_modules import load_benchmark
from tests.bindings.conftest import POSTGRES_URL, REDIS_HOST, REDIS_PORT

pytestmark = pytest.mark.timeout(180)

BROKERS = ("sqlite", "redis", "postgresql")
N = 2000


def _bench() -> Any:
    return load_benchmark("bench_console_browse")


def _leftovers() -> tuple[set[bytes], set[str]]:
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
    try:
        keys = set(client.scan_iter(match="bqbrowse:*", count=1000))
    finally:
        client.close()
    engine = sa.create_engine(POSTGRES_URL)
    try:
        tables = {name for name in sa.inspect(engine).get_table_names() if name.startswith("bqb_")}
    finally:
        engine.dispose()
    return keys, tables


def test_every_page_is_measured_and_right(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    before = _leftovers()
    status = bench.main(["--n", str(N), "--pages", "2", "--brokers", ",".join(BROKERS), "--airflow-home", "current"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "ERROR" not in out, out

    table = out[out.index("measurement ") :]
    rows = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split(" | ")]
        if len(cells) == 7 and cells[0] != "measurement":
            rows[(cells[0], cells[1])] = cells
    labels = ["unfiltered, start 0", "unfiltered, middle (n/2)", "unfiltered, end (n-50)",
              "reason=failed, random start", "reason=unknown_urn, random start",
              f"urn={bench.URN_PATTERN}, random start", f"rare urn={bench.RARE_URN}, start 0",
              f"text={bench.TEXT!r}, start 0", "HTTP GET, unfiltered, middle (n/2)"]
    assert len(rows) == len(BROKERS) * (len(labels) + 1), sorted(rows)
    fingerprint = [label for label, _ in rows if label.startswith("fingerprint=")]
    assert len(fingerprint) == len(BROKERS) and len(set(fingerprint)) == 1, fingerprint
    for broker in BROKERS:
        for label in [*labels, fingerprint[0]]:
            _, _, median, p95, entries, scanned, stopped = rows[(label, broker)]
            assert float(median) > 0 and float(p95) >= float(median), (label, broker)
            if label == f"rare urn={bench.RARE_URN}, start 0":  # 2,000 < max_scan: the whole queue, every one found
                assert (entries, scanned, stopped) == ("10", f"{N:,}", "-"), (broker, entries, scanned, stopped)
            else:
                assert (entries, stopped) == ("50", "-"), (label, broker, entries, stopped)
            if label.startswith(("unfiltered", "HTTP")):
                assert scanned == "50", (label, broker, scanned)
        assert re.search(rf"^goal {broker}: .*: met ", out, re.MULTILINE), out
    assert out.count(f"check: the rare URN found 10 times by a scan without bounds from 0 ({N:,} scanned)") == 3
    jobs = re.findall(rf"^job read: (\w+): the whole queue of {N:,} in [\d.]+ s \([\d,]+ dead letters/s\), "
                      r"([\d,]+) matched$", out, re.MULTILINE)
    unknown = sum(1 for letter in bench.make_letters(N) if letter.reason == "unknown_urn")
    assert sorted(jobs) == sorted((broker, f"{unknown:,}") for broker in BROKERS), out
    assert _leftovers() == before  # every key and table made was removed


def test_the_letters_are_the_documented_mix() -> None:
    bench = _bench()
    letters = bench.make_letters(20_000)
    kinds = {kind: sum(letter.kind == kind for letter in letters) for kind in
             ("poison", "unknown_urn", "rare", *(kind for kind, *_ in bench.FAILURES))}
    assert kinds["rare"] == 10
    assert [p for p, x in enumerate(letters) if x.kind == "rare"] == bench.rare_positions(20_000)
    assert min(bench.rare_positions(20_000)) > 19_000  # near the end
    assert 0.005 < kinds["poison"] / 20_000 < 0.015 and 0.07 < kinds["unknown_urn"] / 20_000 < 0.11
    failed = sum(letter.reason == "failed" for letter in letters)
    assert 0.87 < failed / 20_000 < 0.93
    again = bench.make_letters(20_000)  # the same letters (their meta.id and trace_id aside)
    assert [(x.kind, x.urn, x.reason, x.error, x.failed_at) for x in again] == \
        [(x.kind, x.urn, x.reason, x.error, x.failed_at) for x in letters]
