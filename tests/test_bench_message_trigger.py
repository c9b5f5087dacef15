"""The message-trigger benchmark's in-process part at a CI size (``benchmarks/bench_message_trigger.py``,
``make bench-trigger``), so the benchmark keeps running and its checks keep holding between the runs that give the
figures: on SQLite and Redis, 200 messages read by the consumer baseline and by the trigger with ``batch_size`` 1
and 100, each message in exactly one event (handled once by the consumer) and nothing of the queue left on the
broker afterwards. The rates are printed, never asserted (docs/benchmarks.md)."""

from __future__ import annotations

from typing import Any

from tests.benchmark_modules import load_benchmark


def _bench() -> Any:
    return load_benchmark("bench_message_trigger")


def test_every_message_makes_an_event_and_the_queue_ends_empty() -> None:
    bench = _bench()
    errors: list[str] = []
    results = bench.bench_in_process(["sqlite", "redis"], 200, batch_sizes=(1, 100), errors=errors)
    assert not errors
    assert [(r.broker, r.batch_size) for r in results] == [(kind, size) for kind in ("sqlite", "redis")
                                                           for size in (0, 1, 100)]
    for result in results:
        assert result.taken == result.unique == 200, result  # every message once, in an event (or handled)
        assert result.left == 0, result  # settled: nothing ready, reserved or dead-lettered
        if result.batch_size:  # at most batch_size messages per event
            assert -(-200 // result.batch_size) <= result.events <= 200, result
