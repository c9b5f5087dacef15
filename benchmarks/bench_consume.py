"""Consumer throughput (``engine.consume.Consumer``, batches of 100) against each raw client's reliable batched loop.

For each broker (Redis, PostgreSQL, SQLite in a temp file, RabbitMQ), in one process and the same minute, over the
same ``--n`` pre-encoded envelopes (published beforehand, untimed, into a fresh queue or table each time):

1. ours, no-op handler: ``Consumer(binding, queue, handlers, batch_size=100).run(max_messages=...)`` until every
   delivery expected has come (as the raw loops stop: by count; an empty reserve waits up to 5 s, so a broker that
   pushes its next window late cannot end a run early); every message handled.
2. ours, 1 % failing handler: ``order_id % 100 == 0`` raises on its first attempt only, ``Backoff("fixed", 0)``,
   ``max_attempts=3``; every message handled, n/100 retried.
3. raw baseline, written here against the client library: batches of 100 held reserved until settled, each body
   decoded with ``orjson.loads`` (the JSON work a consumer cannot skip), no crash recovery beyond the pattern's:

   * Redis (redis-py): a pipeline of 100 LMOVE ready -> processing, then a pipeline of LREM processing 1 <value>;
   * PostgreSQL (psycopg2): per batch one transaction: ``UPDATE ... SET reserved_at = now WHERE id IN (SELECT id ...
     ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) RETURNING id, payload``, decode, ``DELETE ...
     WHERE id = ANY(ids)`` (the ids sent as one array literal), COMMIT: one commit per batch, as ours (which
     sends a batch's acks with the next reserve, as one query). Run twice: as written, and with the two
     ``SET LOCAL`` planner settings ours uses (no sort, no bitmap scan) sent ahead of the reserve in its round
     trip: on an unanalysed table the plain query sorts every ready row for each batch. The faster of the two is
     the baseline;
   * SQLite (sqlite3, WAL, synchronous=FULL as ours, a new database file per measurement as for ours): ``BEGIN
     IMMEDIATE``, the same ``UPDATE ... RETURNING``, COMMIT, decode, then ``DELETE ... WHERE id IN (...)`` in a second
     transaction;
   * RabbitMQ (pika BlockingConnection): ``basic_qos(prefetch_count=100)``, ``basic_consume``, and
     ``basic_ack(last_tag, multiple=True)`` every 100 deliveries.

   The raw SQL tables have our layout (id, queue, payload, attempts, reserved_at, available_at, created_at, an
   index on (queue, available_at, id)); neither side's table is ANALYZEd. Goals: ours/raw >= 0.7 with the no-op
   handler, >= 0.6 with the failing one (against the same raw number).
4. k = 1, 2, 4 consumers in parallel (spawned processes, each with its own binding and Consumer on one queue of n
   messages, released together by a barrier): total throughput, its ratio to k = 1, and duplicates (a ``meta.id``
   handled by more than one process; 0 expected without a crash). SQLite is included for completeness: its
   writers serialise, so more consumers cannot go faster there.

Steps 1-3 run ``--rounds`` times (default 3) in turn, so every side samples the same minutes of a machine whose
speed drifts; the table takes each side's best round, and each round's own ratio is printed as it runs.
Each detail line also gives the benchmark process's CPU time against the wall time, which says whether the Python
side or the broker dominates. Every key, table and queue made is named with a fresh uuid and removed at the end.
Missed goals are listed but do not fail the run (it is a measurement); a broker error or a wrong count does.

Run: ``.venv/bin/python benchmarks/bench_consume.py --n 100000 [--brokers redis,postgresql,sqlite,rabbitmq]``.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import multiprocessing
import sqlite3
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pika
import psycopg2
import psycopg2.extras
import redis
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402

from airflow_provider_babelqueue import envelope as bq  # noqa: E402
from airflow_provider_babelqueue.bindings.base import Binding  # noqa: E402
from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQBinding, RabbitMQConfig  # noqa: E402
from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig  # noqa: E402
from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig, sqlite_url  # noqa: E402
from airflow_provider_babelqueue.engine.consume import Backoff, Consumer  # noqa: E402

POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
URN = "urn:babel:orders:created"
BATCH = 100
GOALS = {"no-op": 0.7, "1% failing": 0.6}
BROKERS = ("redis", "postgresql", "sqlite", "rabbitmq")
QUIET = logging.getLogger("bench.consume.quiet")
QUIET.setLevel(logging.WARNING)


def bodies(n: int) -> list[bytes]:
    return [bq.encode(bq.make_envelope(URN, {"order_id": i, "amount": 9.9})) for i in range(n)]


def make_binding(kind: str, params: dict[str, Any]) -> Binding:
    """A fresh binding from picklable parameters (the parallel workers build theirs with it)."""
    if kind == "redis":
        return RedisBinding(RedisConfig(**params))
    if kind in ("postgresql", "sqlite"):
        return SqlBinding(SqlConfig(**params))
    if kind == "rabbitmq":
        return RabbitMQBinding(RabbitMQConfig(**params))
    raise ValueError(f"unknown broker {kind!r}")


def noop(envelope: dict[str, Any]) -> None:
    return None


def flaky(envelope: dict[str, Any]) -> None:
    """Fails 1 % of the messages (order_id % 100 == 0), on their first attempt only."""
    if envelope["attempts"] == 0 and envelope["data"]["order_id"] % 100 == 0:
        raise RuntimeError("downstream hiccup")


@dataclass
class Timing:
    wall: float
    cpu: float

    def rate(self, n: int) -> float:
        return n / self.wall


def timed(fn: Callable[[], object]) -> Timing:
    cpu, start = time.process_time(), time.perf_counter()
    fn()
    return Timing(time.perf_counter() - start, time.process_time() - cpu)


def detail(label: str, n: int, timing: Timing, extra: str = "") -> None:
    print(f"  {label:<30} {timing.rate(n):>10,.0f} msg/s  {timing.wall:7.2f} s wall, "
          f"client CPU {timing.cpu:6.2f} s ({timing.cpu / timing.wall:4.0%}){extra}", flush=True)


# ------------------------------------------------------------------------------------------------- brokers


class Broker:
    """One broker's names, raw baseline and clean-up. ``fresh()`` gives binding parameters and a queue name that
    no earlier measurement of this run used (a new table for SQL, a new queue name elsewhere)."""

    kind = ""

    def fresh(self) -> tuple[dict[str, Any], str]:
        raise NotImplementedError

    #: Variants of the raw loop; the fastest is the baseline (each is printed).
    raw_variants: tuple[str, ...] = ("",)

    def raw(self, data: Sequence[bytes], variant: str = "") -> Timing:
        raise NotImplementedError

    def server(self) -> str:
        raise NotImplementedError

    def cleanup(self) -> None:
        raise NotImplementedError


class RedisBroker(Broker):
    kind = "redis"

    def __init__(self) -> None:
        self.client = redis.Redis(host="127.0.0.1", port=6379)
        self.prefix = f"bqconsume:{uuid.uuid4().hex[:8]}:"

    def fresh(self) -> tuple[dict[str, Any], str]:
        return {"key_prefix": self.prefix}, f"q{uuid.uuid4().hex[:8]}"

    def server(self) -> str:
        return f"Redis {self.client.info('server')['redis_version']}"

    def raw(self, data: Sequence[bytes], variant: str = "") -> Timing:
        ready, processing = f"{self.prefix}raw", f"{self.prefix}raw:processing"
        for start in range(0, len(data), 1000):
            self.client.rpush(ready, *data[start:start + 1000])
        consumed = 0

        def consume() -> None:
            nonlocal consumed
            while True:
                pipe = self.client.pipeline(transaction=False)
                for _ in range(BATCH):
                    pipe.lmove(ready, processing, "LEFT", "RIGHT")
                values = [value for value in pipe.execute() if value is not None]
                if not values:
                    return
                for value in values:
                    orjson.loads(value)
                pipe = self.client.pipeline(transaction=False)
                for value in values:
                    pipe.lrem(processing, 1, value)
                pipe.execute()
                consumed += len(values)

        timing = timed(consume)
        assert consumed == len(data) and self.client.llen(processing) == 0, (consumed, len(data))
        return timing

    def cleanup(self) -> None:
        keys = list(self.client.scan_iter(match=f"{self.prefix}*"))
        if keys:
            self.client.delete(*keys)
        self.client.close()


#: What the ordered-scan variant of the PostgreSQL baseline sets in each transaction (as ours does).
_ORDERED_SCAN = "SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off"
_SQL_COLUMNS = ("(id {id}, queue VARCHAR(255) NOT NULL, payload {blob} NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, "
                "reserved_at {float}, available_at {float} NOT NULL, created_at {float} NOT NULL)")
_RESERVE = ("UPDATE {t} SET reserved_at = {p} WHERE id IN (SELECT id FROM {t} WHERE queue = {p} "
            "AND reserved_at IS NULL AND available_at <= {p} ORDER BY available_at, id LIMIT {limit}{lock}) "
            "RETURNING id, payload")


class PostgresBroker(Broker):
    kind = "postgresql"
    #: "": the query exactly as above; "ordered scan": the same transaction opened with the two planner settings ours
    #: uses (``bindings.sql.postgres.ORDERED_SCAN``). Unanalysed, the planner estimates a handful of rows and reads
    #: every ready row with a bitmap scan and a sort to take the first 100 (tens of ms a batch at 100,000 rows),
    #: which would make the plain loop a baseline no one would run.
    raw_variants = ("", "ordered scan")

    def __init__(self) -> None:
        url = sa.make_url(POSTGRES_URL)
        self.conn = psycopg2.connect(host=url.host, port=url.port or 5432, user=url.username,
                                     password=url.password, dbname=url.database)
        self.tables: list[str] = []

    def _table(self) -> str:
        name = f"bqc_{uuid.uuid4().hex[:10]}"
        self.tables += [name, f"{name}_failed"]
        return name

    def fresh(self) -> tuple[dict[str, Any], str]:
        return {"url": POSTGRES_URL, "table": self._table()}, "orders"

    def server(self) -> str:
        with self.conn.cursor() as cur:
            cur.execute("SHOW server_version")
            version = cur.fetchone()[0]
        self.conn.rollback()
        return f"PostgreSQL {version}"

    def raw(self, data: Sequence[bytes], variant: str = "") -> Timing:
        t, queue = self._table(), "orders"
        with self.conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {t} " + _SQL_COLUMNS.format(id="BIGSERIAL PRIMARY KEY", blob="BYTEA",
                                                                   float="DOUBLE PRECISION"))
            cur.execute(f"CREATE INDEX {t}_queue_idx ON {t} (queue, available_at, id)")
            now = time.time()
            psycopg2.extras.execute_values(
                cur, f"INSERT INTO {t} (queue, payload, attempts, available_at, created_at) VALUES %s",
                [(queue, body, 0, now, now) for body in data], page_size=500)
        self.conn.commit()
        reserve = _RESERVE.format(t=t, p="%s", limit=BATCH, lock=" FOR UPDATE SKIP LOCKED")
        if variant:  # in the reserve's round trip
            reserve = f"{_ORDERED_SCAN}; {reserve}"
        # the ids as one array literal: psycopg2 adapts a list element by element (about 0.15 ms per 100 ids)
        delete = f"DELETE FROM {t} WHERE id = ANY(%s::bigint[])"
        consumed = 0

        def consume() -> None:
            nonlocal consumed
            with self.conn.cursor() as cur:
                while True:
                    now = time.time()
                    cur.execute(reserve, (now, queue, now))
                    rows = cur.fetchall()
                    if not rows:
                        self.conn.commit()
                        return
                    for _, payload in rows:
                        orjson.loads(payload)
                    cur.execute(delete, ("{" + ",".join([str(row_id) for row_id, _ in rows]) + "}",))
                    self.conn.commit()
                    consumed += len(rows)

        timing = timed(consume)
        assert consumed == len(data), (consumed, len(data))
        return timing

    def cleanup(self) -> None:
        self.conn.rollback()
        with self.conn.cursor() as cur:
            for name in self.tables:
                cur.execute(f'DROP TABLE IF EXISTS "{name}"')
        self.conn.commit()
        self.conn.close()


class SqliteBroker(Broker):
    kind = "sqlite"

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="bqconsume-")

    def _file(self) -> Path:
        """A new database file for each measurement, raw or ours: a file that earlier measurements grew (their
        tables, their freed pages, a longer WAL history) makes every later commit dearer, and the sides would not
        meet the same file (measured 2026-12-07: ours/raw 0.66 on one shared file, 0.77-0.86 on fresh ones)."""
        return Path(self.tmp.name) / f"{uuid.uuid4().hex[:10]}.sqlite"

    def fresh(self) -> tuple[dict[str, Any], str]:
        return {"url": sqlite_url(self._file()), "table": f"bqc_{uuid.uuid4().hex[:10]}"}, "orders"

    def server(self) -> str:
        return f"SQLite {sqlite3.sqlite_version} (WAL, a new file per measurement in {self.tmp.name})"

    def statements(self, data: Sequence[bytes]) -> Timing:
        """Our binding's own statements (its compiled reserve select and the stamp by id, the gated delete of the
        previous batch, one commit per batch) run on the bare driver with ``orjson.loads`` per body: what the
        consumer's SQL costs without its per-message Python, to tell the two apart."""
        options, queue = self.fresh()
        binding = SqlBinding(SqlConfig(**options))
        binding.decode_limit = 16 * 1024 * 1024  # as a consumer sets it: the reserve reads sizes, as ours does
        binding.publish_batch(list(data), queue)
        sql, names, fixed = binding._reserve_statement(binding._get_engine().dialect, binding._ready, False)
        table = options["table"]
        conn = sqlite3.connect(sa.make_url(options["url"]).database, isolation_level=None, timeout=30.0)
        consumed = 0

        def consume() -> None:
            nonlocal consumed
            previous: tuple[float, list[int]] | None = None
            while True:
                now = time.time()
                values = {**fixed, "bq_queue": queue, "bq_cutoff": now - 300, "bq_now": now, "bq_token": now,
                          "bq_limit": BATCH}
                conn.execute("BEGIN IMMEDIATE")
                if previous is not None:
                    token, ids = previous
                    conn.execute(f"DELETE FROM {table} WHERE reserved_at = ? AND id IN ({','.join('?' * len(ids))})",
                                 (token, *ids))
                rows = conn.execute(sql, tuple(values[name] for name in names or ())).fetchall()
                if rows:  # the binding selects, then stamps by id (SqlBinding._select_first)
                    conn.execute(f"UPDATE {table} SET reserved_at = ? WHERE id IN ({','.join('?' * len(rows))})",
                                 (now, *(row[-1] for row in rows)))
                conn.execute("COMMIT")
                if not rows:
                    return
                for row in rows:
                    orjson.loads(row[0])
                previous = (now, [row[-1] for row in rows])
                consumed += len(rows)

        try:
            timing = timed(consume)
            assert consumed == len(data), (consumed, len(data))
            return timing
        finally:
            conn.close()
            binding.close()

    def raw(self, data: Sequence[bytes], variant: str = "") -> Timing:
        t, queue = f"bqc_{uuid.uuid4().hex[:10]}", "orders"
        conn = sqlite3.connect(self._file(), isolation_level=None, timeout=30.0)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"CREATE TABLE {t} " + _SQL_COLUMNS.format(id="INTEGER PRIMARY KEY AUTOINCREMENT",
                                                                    blob="BLOB", float="FLOAT"))
            conn.execute(f"CREATE INDEX {t}_queue_idx ON {t} (queue, available_at, id)")
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(f"INSERT INTO {t} (queue, payload, attempts, available_at, created_at) "
                             "VALUES (?, ?, 0, ?, ?)", [(queue, body, now, now) for body in data])
            conn.execute("COMMIT")
            reserve = _RESERVE.format(t=t, p="?", limit=BATCH, lock="")
            consumed = 0

            def consume() -> None:
                nonlocal consumed
                while True:
                    now = time.time()
                    conn.execute("BEGIN IMMEDIATE")
                    rows = conn.execute(reserve, (now, queue, now)).fetchall()
                    conn.execute("COMMIT")
                    if not rows:
                        return
                    for _, payload in rows:
                        orjson.loads(payload)
                    ids = [row_id for row_id, _ in rows]
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute(f"DELETE FROM {t} WHERE id IN ({','.join('?' * len(ids))})", ids)
                    conn.execute("COMMIT")
                    consumed += len(rows)

            timing = timed(consume)
            assert consumed == len(data), (consumed, len(data))
            conn.execute(f"DROP TABLE {t}")
            return timing
        finally:
            conn.close()

    def cleanup(self) -> None:
        self.tmp.cleanup()


class RabbitBroker(Broker):
    kind = "rabbitmq"

    def __init__(self) -> None:
        self.config = RabbitMQConfig()
        self.queues: set[str] = set()

    def fresh(self) -> tuple[dict[str, Any], str]:
        name = f"bqconsume.{uuid.uuid4().hex[:10]}"
        self.queues |= {name, f"{name}.failed", f"{name}.dlq"}
        return {}, name

    def server(self) -> str:
        conn = pika.BlockingConnection(self.config.parameters(pika))
        try:
            version = conn._impl.server_properties.get("version", "?")
            return f"RabbitMQ {version.decode() if isinstance(version, bytes) else version}"
        finally:
            conn.close()

    def raw(self, data: Sequence[bytes], variant: str = "") -> Timing:
        params, queue = self.fresh()
        publisher = make_binding(self.kind, params)  # the same messages (properties included) as ours get
        try:
            publisher.publish_batch(data, queue)
        finally:
            publisher.close()
        conn = pika.BlockingConnection(self.config.parameters(pika))
        consumed, last_tag = 0, 0

        def on_message(channel: Any, method: Any, _props: Any, body: bytes) -> None:
            nonlocal consumed, last_tag
            orjson.loads(body)
            consumed, last_tag = consumed + 1, method.delivery_tag
            if consumed % BATCH == 0:
                channel.basic_ack(last_tag, multiple=True)

        def consume() -> None:
            channel = conn.channel()
            channel.basic_qos(prefetch_count=BATCH)
            tag = channel.basic_consume(queue, on_message)
            stalled = time.monotonic() + 30
            while consumed < len(data):
                before = consumed
                conn.process_data_events(time_limit=1)
                if consumed != before:
                    stalled = time.monotonic() + 30
                elif time.monotonic() > stalled:
                    raise RuntimeError(f"raw RabbitMQ consumer stalled at {consumed} of {len(data)}")
            if consumed % BATCH:
                channel.basic_ack(last_tag, multiple=True)
            channel.basic_cancel(tag)
            channel.close()

        try:
            timing = timed(consume)
        finally:
            conn.close()
        assert consumed == len(data), (consumed, len(data))
        return timing

    def cleanup(self) -> None:
        conn = pika.BlockingConnection(self.config.parameters(pika))
        try:
            channel = conn.channel()
            for name in sorted(self.queues):
                try:
                    channel.queue_delete(name)
                except pika.exceptions.ChannelClosedByBroker:  # an older broker refusing a missing queue
                    channel = conn.channel()
        finally:
            conn.close()


def open_broker(kind: str) -> Broker:
    factories: dict[str, Callable[[], Broker]] = {"redis": RedisBroker, "postgresql": PostgresBroker,
                                                  "sqlite": SqliteBroker, "rabbitmq": RabbitBroker}
    return factories[kind]()


# ---------------------------------------------------------------------------------------------- measurements


def ours(broker: Broker, data: Sequence[bytes], failing: bool) -> Timing:
    params, queue = broker.fresh()
    binding = make_binding(broker.kind, params)
    try:
        binding.publish_batch(data, queue)
        consumer = Consumer(binding, queue, {URN: flaky if failing else noop}, batch_size=BATCH, max_attempts=3,
                            backoff=Backoff("fixed", 0), log=QUIET)
        summary = None
        n = len(data)
        retried = len(range(0, n, 100)) if failing else 0

        def run() -> None:
            nonlocal summary
            summary = consumer.run(max_messages=n + retried, reserve_timeout=5.0)  # a retry is a delivery too

        timing = timed(run)
        assert summary is not None
        assert summary.handled == n and summary.retried == retried and not summary.dead_lettered, summary.as_dict()
        assert binding.depth(queue) == 0
        return timing
    finally:
        binding.close()


def _worker(kind: str, params: dict[str, Any], queue: str, barrier: Any, results: Any) -> None:
    """One parallel consumer: connect, wait for the others, consume until empty, report the ids it handled."""
    binding = None
    try:
        binding = make_binding(kind, params)
        binding.depth(queue)  # connected (and the SQL tables known) before the start
        ids: list[str] = []
        consumer = Consumer(binding, queue, {URN: lambda envelope: ids.append(envelope["meta"]["id"])},
                            batch_size=BATCH, log=QUIET)
        barrier.wait(timeout=300)
        start = time.monotonic()
        summary = consumer.run(reserve_timeout=0)
        end = time.monotonic()
        results.put(("ok", start, end, summary.handled, ids))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the measurement
        barrier.abort()
        results.put(("error", traceback.format_exc()))
    finally:
        if binding is not None:
            binding.close()


@dataclass
class Parallel:
    k: int
    rate: float
    handled: int
    duplicates: int


def parallel(broker: Broker, data: Sequence[bytes], k: int) -> Parallel:
    params, queue = broker.fresh()
    binding = make_binding(broker.kind, params)
    try:
        binding.publish_batch(data, queue)
    finally:
        binding.close()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(k + 1), ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(broker.kind, params, queue, barrier, results)) for _ in range(k)]
    for worker in workers:
        worker.start()
    try:
        try:
            barrier.wait(timeout=300)
        except Exception:  # noqa: BLE001 - a worker failed before the start; its report says why
            pass
        reports = [results.get(timeout=1800) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.terminate()
    errors = [report[1] for report in reports if report[0] != "ok"]
    if errors:
        raise RuntimeError(f"{len(errors)} of {k} {broker.kind} consumers failed:\n" + "\n".join(errors))
    start, end = min(r[1] for r in reports), max(r[2] for r in reports)
    handled = sum(r[3] for r in reports)
    ids = [meta_id for r in reports for meta_id in r[4]]
    unique = set(ids)
    n = len(data)
    assert len(unique) == n and handled == len(ids) and handled == n + (len(ids) - len(unique)), \
        (n, handled, len(unique))
    return Parallel(k, n / (end - start), handled, len(ids) - len(unique))


# ------------------------------------------------------------------------------------------------------ main


@dataclass
class Row:
    measurement: str
    broker: str
    ours: float | None
    base: float | None
    goal: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.ours / self.base if self.ours and self.base else None

    @property
    def met(self) -> str:
        if self.goal is None or self.ratio is None:
            return "-"
        return "yes" if self.ratio >= self.goal else "NO"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def bench_broker(kind: str, data: Sequence[bytes], ks: Sequence[int], report: Report, rounds: int = 3) -> None:
    """Measure one broker: ``rounds`` rounds of the raw loop(s) and ours (no-op, then 1 % failing) taken in turn,
    so both sides sample the same minutes of a machine whose speed drifts; each side's best round counts (as
    ``timeit`` takes the best), and each round's own ratios are printed beside it."""
    n = len(data)
    broker = open_broker(kind)
    try:
        print(f"\n== {kind}: {broker.server()}", flush=True)
        raws: list[Timing] = []
        best: dict[str, list[Timing]] = {"no-op": [], "1% failing": []}
        for turn in range(1, rounds + 1):
            this_round = []
            for variant in broker.raw_variants:
                this_round.append(broker.raw(data, variant))
                detail(f"[{turn}] raw baseline{f', {variant}' if variant else ''}", n, this_round[-1])
            raws.extend(this_round)
            raw_now = min(this_round, key=lambda timing: timing.wall)
            if isinstance(broker, SqliteBroker) and turn == 1:
                alone = broker.statements(data)
                detail("our statements, bare driver", n, alone, f"  x{alone.rate(n) / raw_now.rate(n):.2f} of raw")
            for label, failing in (("no-op", False), ("1% failing", True)):
                timing = ours(broker, data, failing)
                best[label].append(timing)
                detail(f"[{turn}] ours, {label} handler", n, timing,
                       f"  ours/raw {timing.rate(n) / raw_now.rate(n):.2f} (this round)")
        raw = min(raws, key=lambda timing: timing.wall)
        if isinstance(broker, SqliteBroker):
            report.rows.append(Row("our SQL alone (bare driver)", kind, alone.rate(n), raw.rate(n)))
        for label, timings in best.items():
            timing = min(timings, key=lambda t: t.wall)
            report.rows.append(Row(f"consume, {label} handler", kind, timing.rate(n), raw.rate(n), GOALS[label]))
        note = " (SQLite serialises writers)" if kind == "sqlite" else ""
        one = None
        for k in ks:
            result = parallel(broker, data, k)
            one = one or (result if k == 1 else None)
            base = one.rate if one is not None and k != 1 else None
            print(f"  {f'{k} consumer(s) in parallel':<30} {result.rate:>10,.0f} msg/s  handled {result.handled:,}, "
                  f"duplicates {result.duplicates}" + (f", x{result.rate / base:.2f} of k=1" if base else "") + note,
                  flush=True)
            report.rows.append(Row(f"k={k} consumers, total (dups {result.duplicates})", kind, result.rate, base))
    except Exception:  # noqa: BLE001 - the other brokers still run; the exit status says it failed
        text = traceback.format_exc()
        print(text, flush=True)
        report.errors.append(f"{kind}: {text.strip().splitlines()[-1]}")
    finally:
        try:
            broker.cleanup()
        except Exception:  # noqa: BLE001
            print(f"  clean-up of {kind} failed:\n{traceback.format_exc()}", flush=True)
            report.errors.append(f"{kind}: clean-up failed")


def print_table(rows: Sequence[Row]) -> None:
    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    print(f"\n{'measurement':<34} | {'broker':<10} | {'ours msg/s':>10} | {'baseline msg/s':>14} | {'ratio':>5} | "
          f"{'goal':>5} | met")
    print("-" * 100)
    for row in rows:
        goal = f">={row.goal:.1f}" if row.goal is not None else "-"
        print(f"{row.measurement:<34} | {row.broker:<10} | {num(row.ours, ',.0f'):>10} | {num(row.base, ',.0f'):>14} | "
              f"{num(row.ratio, '.2f'):>5} | {goal:>5} | {row.met}")
    print("(baseline: the raw client's loop for the consume rows, k=1 of the same broker for the k rows; the consume "
          "rows are each side's best round)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="messages per measurement")
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma list of: " + ", ".join(BROKERS))
    parser.add_argument("--ks", default="1,2,4", help="parallel consumer counts; empty to skip")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of raw and ours taken in turn per broker; the best of each counts")
    args = parser.parse_args(argv)
    kinds = [kind.strip() for kind in args.brokers.split(",") if kind.strip()]
    if unknown := [kind for kind in kinds if kind not in BROKERS]:
        parser.error(f"unknown broker(s) {unknown}; choose from {', '.join(BROKERS)}")
    ks = [int(k) for k in args.ks.split(",") if k.strip()]
    if ks and ks[0] != 1:
        ks = [1, *(k for k in ks if k != 1)]  # the ratios need k=1 first
    print(describe())
    print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; n={args.n:,}, batch {BATCH}, "
          f"best of {max(1, args.rounds)} rounds")
    data = bodies(args.n)
    print(f"bodies: {sum(map(len, data)) / len(data):.0f} B each, pre-encoded once for every measurement")
    report = Report()
    for kind in kinds:
        bench_broker(kind, data, ks, report, max(1, args.rounds))
    print_table(report.rows)
    missed = [row for row in report.rows if row.met == "NO"]
    for row in missed:
        print(f"MISSED: {row.measurement} on {row.broker}: ratio {row.ratio:.2f} < goal {row.goal}")
    if not missed and not report.errors:
        print("all goals met")
    for error in report.errors:
        print(f"ERROR: {error}")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
