"""Binding throughput against the raw clients, same run, same pre-encoded bodies.

* Redis batch publish: ``RedisBinding.publish_batch`` vs raw redis-py pipelined RPUSH (one command per
  body, flushed every 1000) — goal: ours ≥ 0.8× raw.
* Redis reserve+ack: ours (reaper sweep + LMOVE + deadline member, gated ack) vs the bare reliable-queue
  pattern (LMOVE into a processing list, LREM to ack) with no crash recovery.
* SQL on SQLite (file) and PostgreSQL: ``publish_batch`` vs a raw SQLAlchemy executemany INSERT of the
  same rows; reserve+ack throughput (no raw baseline: the reservation *is* the binding's logic).

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_bindings.py [--n 100000]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis
import sqlalchemy as sa

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig, sqlite_url

POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


def bodies(n: int) -> list[bytes]:
    return [bq.encode(bq.make_envelope("urn:babel:orders:created", {"order_id": i, "amount": 9.9})) for i in range(n)]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def row(label: str, n: int, ours: float, base: float | None) -> None:
    ratio = f"{base / ours:>7.2f}x" if base else "      -"
    base_rate = f"{n / base:>14,.0f}" if base else f"{'-':>14}"
    print(f"{label:<34} {n / ours:>14,.0f} {base_rate} {ratio}")


def bench_redis(n: int, reserve_n: int) -> None:
    client = redis.Redis(host="127.0.0.1", port=6379)
    prefix = f"bqbench:{uuid.uuid4().hex[:8]}:"
    binding = RedisBinding(RedisConfig(key_prefix=prefix))
    data = bodies(n)
    try:
        def raw_publish() -> None:
            pipe = client.pipeline(transaction=False)
            for i, body in enumerate(data, 1):
                pipe.rpush(f"{prefix}raw", body)
                if i % 1000 == 0:
                    pipe.execute()
            pipe.execute()

        best_ours = best_raw = float("inf")
        for _ in range(3):
            client.delete(f"{prefix}raw", f"{prefix}ours")
            best_raw = min(best_raw, timed(raw_publish))
            best_ours = min(best_ours, timed(lambda: binding.publish_batch(data, "ours")))
        assert client.llen(f"{prefix}ours") == client.llen(f"{prefix}raw") == n
        row("redis publish_batch", n, best_ours, best_raw)

        def ours_consume() -> None:
            for _ in range(reserve_n):
                binding.ack(binding.reserve("ours", timeout=0))

        def raw_consume() -> None:
            for _ in range(reserve_n):
                value = client.lmove(f"{prefix}raw", f"{prefix}raw:processing", "LEFT", "RIGHT")
                client.lrem(f"{prefix}raw:processing", 1, value)

        row("redis reserve+ack", reserve_n, timed(ours_consume), timed(raw_consume))
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        binding.close()
        client.close()


def bench_sql(label: str, url: str, n: int, reserve_n: int) -> None:
    table = f"bench_{uuid.uuid4().hex[:8]}"
    binding = SqlBinding(SqlConfig(url=url, table=table))
    data = bodies(n)
    binding.depth("warm-up")  # creates the tables
    engine = sa.create_engine(url)
    raw_table = sa.Table(table, sa.MetaData(), autoload_with=engine)
    try:
        def raw_insert() -> None:
            now = time.time()
            rows = [{"queue": "raw", "payload": b, "attempts": 0, "available_at": now, "created_at": now} for b in data]
            with engine.begin() as conn:
                conn.execute(raw_table.insert(), rows)

        t_raw = timed(raw_insert)
        t_ours = timed(lambda: binding.publish_batch(data, "ours"))
        assert binding.depth("ours") == n
        row(f"{label} publish_batch", n, t_ours, t_raw)

        def consume() -> None:
            for _ in range(reserve_n):
                binding.ack(binding.reserve("ours", timeout=0))

        row(f"{label} reserve+ack", reserve_n, timed(consume), None)
    finally:
        binding.close()
        with engine.begin() as conn:
            for name in (table, f"{table}_failed"):
                conn.execute(sa.text(f'DROP TABLE IF EXISTS "{name}"'))
        engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="bodies per batch-publish measurement")
    parser.add_argument("--reserve", type=int, default=5_000, help="messages per reserve+ack measurement")
    args = parser.parse_args(argv)
    print(f"{'measurement':<34} {'ours msg/s':>14} {'raw msg/s':>14} {'ratio':>8}")
    bench_redis(args.n, args.reserve)
    with tempfile.TemporaryDirectory() as tmp:
        bench_sql("sqlite", sqlite_url(Path(tmp) / "bench.sqlite"), args.n // 5, args.reserve)
    bench_sql("postgresql", POSTGRES_URL, args.n // 5, args.reserve)


if __name__ == "__main__":
    main()
