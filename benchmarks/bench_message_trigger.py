"""Events per second from one ``BabelQueueMessageTrigger``, and publish → DAG run start on a real local Airflow.

**Part 1, in process** (SQLite in a temp file, PostgreSQL, Redis, RabbitMQ; SQS on moto for its semantics only):
``--n`` envelopes (5,000 by default; SQS ``--sqs-n``, 200) are published, untimed, into a fresh queue (SQL: a
fresh table; Redis: a fresh key prefix). One trigger then reads them on Airflow's own ``SharedStreamManager`` in
ack mode, driven as the triggerer drives it (tests/bindings/test_message_trigger.py): ``subscribe``,
``filter_shared_stream``, ``bind_pending_event`` for each event and ``confirm_persisted`` at once, so an event
counts as stored the moment it is taken (no metadata database in the loop: this is the trigger's own ceiling).
The clock runs from the subscription until the events of all n messages are taken and the stream has stopped,
i.e. the last broker advance (the settle of the last messages) has returned; it includes the trigger's
connection set-up. ``reserve_timeout=0.01``: the trigger's reader thread is also the one that settles, so the
last settle can wait behind one empty read of that length (with the default 5 s, up to 5 s). Then, untimed,
every published ``meta.id`` must be in exactly one event and the broker must hold nothing of the queue, ready,
reserved, delayed or dead-lettered (SQL: rows in the table and ``<table>_failed``; Redis: elements in any key of
the prefix; RabbitMQ: ready messages once the trigger's connection is gone, which returns anything unacked; SQS:
the three approximate counts). Measured with ``batch_size=1`` (one event per message: events/s) and
``batch_size=100`` (up to 100 messages per event: messages/s, and events/s beside it).

Baseline in the same run, same broker, same bodies, a fresh queue: ``Consumer(binding, queue_name, {URN: noop},
batch_size=100).run(reserve_timeout=0)`` (bench_consume.py's no-op row), timed from resolving its own
connection (as the trigger's is resolved on the clock) to the end of ``run``, then the same checks. The table
gives trigger messages/s ÷ consumer messages/s. The connection lookup is the real one: each measurement defines
an ``AIRFLOW_CONN_*`` variable (``babelqueue+sql`` etc., as tests/connections.py does), the trigger's
``BrokerThread`` resolves it through ``get_hook`` as a triggerer does, and the publisher and the checks use a
binding from the same connection.

**Part 2, Airflow** (``--airflow``, the default; ``--no-airflow`` skips it: it takes a few minutes): a real local
Airflow (tests/local_airflow.py: api-server, scheduler, dag-processor, triggerer; LocalExecutor; SQLite metadata
DB) with one DAG per broker, scheduled on an asset whose ``AssetWatcher`` runs the trigger with its defaults (one
message per event, ``reserve_timeout=5``) and holding one ``EmptyOperator`` (the scheduler marks it done itself,
so no task process competes for the two cores). Once each watcher has started a run for a warm-up message,
``--m`` messages per broker (50 by default) are published ``--spacing`` seconds apart on average (1 s; each
broker's intervals drawn between 0.5 and 1.5 times that, seeded, so that publishes fall at every phase of
Airflow's loops: see ``schedule``), the time each publish call returned recorded by ``meta.id``. Spacing matters:
Airflow starts one run for the events queued when it creates the run, so faster events share runs
(docs/events.md, "What Airflow does with many events"). From the metadata DB (``asset_event``, ``dag_run`` and
their association table, found by its columns): per message, publish → its event stored (the first
``asset_event.timestamp`` holding its ``meta.id``) and publish → run start (the ``start_date`` of the first run
that consumed such an event); median and p95 (nearest rank) per broker, and the number of runs the messages
started. A message whose event was stored just after Airflow created a run waits for the next event on the
asset; the last one of a series has none, so from 10 s after the last publish a tick message (not measured) is
published to each broker still waiting, every 5 s: messages a tick's run took are counted and left out of the
delays (their wait is the tick's spacing, not Airflow's).

Every table, key and queue made is named with a fresh uuid and removed at the end (the Airflow home and the SQLite
files are in temporary directories). A wrong count or something left on a broker fails the run (exit 1); the
figures are measurements, with no goals.

Run: ``.venv/bin/python benchmarks/bench_message_trigger.py --n 5000 --m 50 [--brokers sqlite,postgresql,redis,
rabbitmq,sqs] [--no-airflow]`` (``make bench-trigger``).
"""

from __future__ import annotations

import os
import tempfile

# Airflow reads its home when first imported: without one set, a run of this script leaves nothing in ~/airflow.
_HOME = None if "AIRFLOW_HOME" in os.environ else tempfile.TemporaryDirectory(prefix="bq-bench-trigger-home-")
if _HOME is not None:
    os.environ["AIRFLOW_HOME"] = _HOME.name

import argparse  # noqa: E402
import asyncio  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sqlite3  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from contextlib import closing  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pika  # noqa: E402
import redis  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from airflow.triggers.shared_stream import SharedStreamManager  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))  # tests.local_airflow, tests.bindings.sqs_server
from machine import describe  # noqa: E402

from airflow_provider_babelqueue import envelope as bq  # noqa: E402
from airflow_provider_babelqueue.bindings.sql import sqlite_url  # noqa: E402
from airflow_provider_babelqueue.engine.consume import Consumer  # noqa: E402
from airflow_provider_babelqueue.hooks import get_hook  # noqa: E402
from airflow_provider_babelqueue.triggers.messages import BabelQueueMessageTrigger  # noqa: E402

__all__ = ["BROKERS", "AirflowDelays", "Throughput", "airflow_delays", "bench_in_process", "main"]

POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
URN = "urn:babel:orders:created"
BROKERS = ("sqlite", "postgresql", "redis", "rabbitmq", "sqs")
#: Not a throughput figure: moto is an HTTP emulator in one Python process; SQS is here for the semantics.
MOTO = "moto: not a throughput figure"
#: The trigger's broker read in part 1 (seconds): see the module docstring.
RESERVE_TIMEOUT = 0.01
CONSUMER_BATCH = 100
QUIET = logging.getLogger("bench.message_trigger.quiet")
QUIET.setLevel(logging.WARNING)
#: The trigger's INFO line per stream start would interleave with the figures; its warnings still show.
logging.getLogger("airflow_provider_babelqueue.triggers").setLevel(logging.WARNING)


def bodies(n: int) -> list[bytes]:
    return [bq.encode(bq.make_envelope(URN, {"order_id": i, "amount": 9.9})) for i in range(n)]


def meta_id(body: bytes) -> str:
    return str(bq.meta_id_of(bq.decode(body)))


def noop(envelope: dict[str, Any]) -> None:
    return None


def define_connection(spec: dict[str, Any]) -> str:
    """A fresh ``AIRFLOW_CONN_*`` for ``spec`` in this process (what the trigger's ``get_hook`` resolves)."""
    conn_id = f"bqbench_{uuid.uuid4().hex[:10]}"
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(spec)
    return conn_id


def forget_connection(conn_id: str) -> None:
    os.environ.pop(f"AIRFLOW_CONN_{conn_id.upper()}", None)


# ------------------------------------------------------------------------------------------------- brokers


class Broker:
    """One broker's connections, emptiness check and clean-up. ``spec()`` is a connection (Airflow's JSON form)
    that no earlier measurement of this run used: a new table for SQL, a new key prefix for Redis."""

    kind = ""
    note = ""

    def spec(self) -> dict[str, Any]:
        raise NotImplementedError

    def queue_name(self) -> str:
        return f"bqbench-{uuid.uuid4().hex[:10]}"

    def left(self, spec: dict[str, Any], queue_name: str) -> int:
        """Messages of ``queue_name`` still on the broker in any state (ready, reserved, delayed, dead)."""
        raise NotImplementedError

    def server(self) -> str:
        raise NotImplementedError

    def cleanup(self) -> None:
        raise NotImplementedError


class SqlBroker(Broker):
    """SQLite (a file in a temporary directory) or PostgreSQL: one table (and its ``_failed``) per spec."""

    def __init__(self, kind: str, workdir: Path | None = None) -> None:
        self.kind = kind
        self.tables: list[str] = []
        self.tmp = tempfile.TemporaryDirectory(prefix="bq-bench-trigger-") if workdir is None else None
        self.path = Path(self.tmp.name if self.tmp is not None else str(workdir)) / "queue.sqlite"
        self.engine = sa.create_engine(sqlite_url(self.path) if kind == "sqlite" else POSTGRES_URL)

    def spec(self) -> dict[str, Any]:
        table = f"bqt_{uuid.uuid4().hex[:10]}"
        self.tables += [table, f"{table}_failed"]
        if self.kind == "sqlite":
            return {"conn_type": "babelqueue+sql", "host": str(self.path), "extra": {"table": table}}
        url = sa.make_url(POSTGRES_URL)
        return {"conn_type": "babelqueue+sql", "host": url.host, "port": url.port or 5432, "login": url.username,
                "schema": url.database, "extra": {"dialect": "postgresql", "table": table}}

    def left(self, spec: dict[str, Any], queue_name: str) -> int:
        table = spec["extra"]["table"]
        names = set(sa.inspect(self.engine).get_table_names())
        with self.engine.connect() as conn:
            return sum(int(conn.execute(sa.text(f'SELECT count(*) FROM "{name}"')).scalar_one())
                       for name in (table, f"{table}_failed") if name in names)

    def server(self) -> str:
        if self.kind == "sqlite":
            return f"SQLite {sqlite3.sqlite_version} (file, WAL)"
        with self.engine.connect() as conn:
            return f"PostgreSQL {conn.execute(sa.text('SHOW server_version')).scalar_one()}"

    def cleanup(self) -> None:
        with self.engine.begin() as conn:
            for name in self.tables:
                conn.execute(sa.text(f'DROP TABLE IF EXISTS "{name}"'))
        self.engine.dispose()
        if self.tmp is not None:
            self.tmp.cleanup()


class RedisBroker(Broker):
    kind = "redis"

    def __init__(self) -> None:
        self.client = redis.Redis(host="127.0.0.1", port=6379)
        self.prefixes: list[str] = []

    def spec(self) -> dict[str, Any]:
        prefix = f"bqbench:{uuid.uuid4().hex[:10]}:"
        self.prefixes.append(prefix)
        return {"conn_type": "babelqueue+redis", "host": "127.0.0.1", "port": 6379, "extra": {"key_prefix": prefix}}

    def left(self, spec: dict[str, Any], queue_name: str) -> int:
        sizes = {b"list": self.client.llen, b"zset": self.client.zcard, b"hash": self.client.hlen,
                 b"set": self.client.scard, b"stream": self.client.xlen}
        total = 0
        for key in self.client.scan_iter(match=f"{spec['extra']['key_prefix']}*"):
            kind = self.client.type(key)
            total += int(sizes[kind](key)) if kind in sizes else 1
        return total

    def server(self) -> str:
        return f"Redis {self.client.info('server')['redis_version']}"

    def cleanup(self) -> None:
        for prefix in self.prefixes:
            keys = list(self.client.scan_iter(match=f"{prefix}*"))
            if keys:
                self.client.delete(*keys)
        self.client.close()


class RabbitBroker(Broker):
    kind = "rabbitmq"
    PARAMS = pika.ConnectionParameters("127.0.0.1", 5672, credentials=pika.PlainCredentials("guest", "guest"))

    def __init__(self) -> None:
        self.queues: set[str] = set()
        # pika logs every connection step at INFO and a warning for each passive declare of a dead-letter queue
        # that was never made (the emptiness check probes them): noise between the figures
        logging.getLogger("pika").setLevel(logging.ERROR)

    def spec(self) -> dict[str, Any]:
        return {"conn_type": "babelqueue+rabbitmq", "host": "127.0.0.1", "port": 5672, "login": "guest",
                "password": "guest"}

    def queue_name(self) -> str:
        name = super().queue_name()
        self.queues |= {name, f"{name}.failed", f"{name}.dlq"}
        return name

    def _declare(self, conn: pika.BlockingConnection, name: str) -> tuple[int, int]:
        """(ready messages, consumers) of a queue; (0, 0) when it does not exist."""
        channel = conn.channel()
        try:
            ok = channel.queue_declare(name, passive=True).method
            return int(ok.message_count), int(ok.consumer_count)
        except pika.exceptions.ChannelClosedByBroker:
            return 0, 0
        finally:
            if channel.is_open:
                channel.close()

    def left(self, spec: dict[str, Any], queue_name: str) -> int:
        """Ready counts once no consumer is left on the queue: a closed connection returns its unacked deliveries,
        so with the reader gone the ready count is everything the queue still holds."""
        conn = pika.BlockingConnection(self.PARAMS)
        try:
            deadline = time.monotonic() + 30
            while self._declare(conn, queue_name)[1] and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._declare(conn, queue_name)[1]:
                raise RuntimeError(f"the trigger's consumer on {queue_name} is still there after 30 s")
            return sum(self._declare(conn, name)[0] for name in (queue_name, f"{queue_name}.failed",
                                                                   f"{queue_name}.dlq"))
        finally:
            conn.close()

    def server(self) -> str:
        conn = pika.BlockingConnection(self.PARAMS)
        try:
            version = conn._impl.server_properties.get("version", "?")
            return f"RabbitMQ {version.decode() if isinstance(version, bytes) else version}"
        finally:
            conn.close()

    def cleanup(self) -> None:
        conn = pika.BlockingConnection(self.PARAMS)
        try:
            channel = conn.channel()
            for name in sorted(self.queues):
                try:
                    channel.queue_delete(name)
                except pika.exceptions.ChannelClosedByBroker:
                    channel = conn.channel()
        finally:
            conn.close()


class SqsBroker(Broker):
    """SQS on this process's moto server (tests.bindings.sqs_server), which stops when the process exits."""

    kind = "sqs"
    note = MOTO

    def __init__(self) -> None:
        from tests.bindings.sqs_server import REGION, moto_endpoint, sqs_client

        self.region, self.endpoint = REGION, moto_endpoint()
        self.client = sqs_client(self.endpoint)
        self.names: list[str] = []

    def spec(self) -> dict[str, Any]:
        return {"conn_type": "babelqueue+sqs", "login": "testing", "password": "testing",
                "extra": {"region_name": self.region, "endpoint_url": self.endpoint, "create_queues": True}}

    def queue_name(self) -> str:
        name = super().queue_name()
        self.names.append(name)
        return name

    def _urls(self, queue_name: str) -> list[str]:
        return list(self.client.list_queues(QueueNamePrefix=queue_name).get("QueueUrls", []))

    def left(self, spec: dict[str, Any], queue_name: str) -> int:
        names = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                 "ApproximateNumberOfMessagesDelayed")
        total = 0
        for url in self._urls(queue_name):
            attributes = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=list(names))["Attributes"]
            total += sum(int(attributes.get(name, 0)) for name in names)
        return total

    def server(self) -> str:
        import moto

        return f"SQS on moto {moto.__version__} ({MOTO})"

    def cleanup(self) -> None:
        for name in self.names:
            for url in self._urls(name):
                try:
                    self.client.delete_queue(QueueUrl=url)
                except self.client.exceptions.QueueDoesNotExist:
                    pass


def open_broker(kind: str, workdir: Path | None = None) -> Broker:
    factories: dict[str, Callable[[], Broker]] = {
        "sqlite": lambda: SqlBroker("sqlite", workdir), "postgresql": lambda: SqlBroker("postgresql"),
        "redis": RedisBroker, "rabbitmq": RabbitBroker, "sqs": SqsBroker}
    return factories[kind]()


# --------------------------------------------------------------------------------- part 1: in process


@dataclass
class Throughput:
    """One timed read of n messages, by the consumer (``batch_size`` 0 here) or by the trigger: ``taken`` messages
    handled or in events, ``unique`` of the published ``meta.id`` among them, ``left`` on the broker after."""

    broker: str
    label: str
    batch_size: int
    n: int
    wall: float
    cpu: float
    events: int
    taken: int
    unique: int
    left: int

    @property
    def complete(self) -> bool:
        """Every message taken exactly once, and nothing of the queue left on the broker."""
        return self.taken == self.unique == self.n and self.left == 0

    @property
    def rate(self) -> float:
        return self.n / self.wall

    @property
    def event_rate(self) -> float:
        return self.events / self.wall


async def drive(trigger: BabelQueueMessageTrigger, n: int, within: float) -> tuple[list[str], int, float]:
    """Take events as the triggerer does until they hold ``n`` messages, each confirmed stored at once; then leave
    the stream, which settles the last messages. Returns the ``meta.id`` of every message taken, the number of
    events and the wall time from the subscription until the stream has stopped."""
    manager = SharedStreamManager(ack_timeout=300.0)
    key = trigger.shared_stream_key()
    ids: list[str] = []
    events = 0
    start = time.perf_counter()
    stream = trigger.filter_shared_stream(manager.subscribe(trigger_id=1, trigger=trigger, key=key))

    async def take() -> None:
        nonlocal events
        async for event in stream:
            seq = manager.bind_pending_event(trigger_id=1, key=key)
            if seq is None:
                raise RuntimeError("ack mode: every event must be bound to its messages")
            manager.confirm_persisted([seq])
            events += 1
            ids.extend(entry["meta_id"] for entry in event.payload["messages"])
            if len(ids) >= n:
                return

    try:
        await asyncio.wait_for(take(), within)
    finally:
        await manager.unsubscribe(1, key)
        await stream.aclose()  # type: ignore[attr-defined]
    return ids, events, time.perf_counter() - start


def read_by_trigger(broker: Broker, data: Sequence[bytes], batch_size: int) -> Throughput:
    spec, queue_name = broker.spec(), broker.queue_name()
    conn_id = define_connection(spec)
    hook = get_hook(conn_id)
    try:
        hook.get_binding().publish_batch(data, queue_name)
        trigger = BabelQueueMessageTrigger(queue_name=queue_name, babelqueue_conn_id=conn_id, batch_size=batch_size,
                                           reserve_timeout=RESERVE_TIMEOUT)
        cpu = time.process_time()
        ids, events, wall = asyncio.run(drive(trigger, len(data), within=60 + 0.05 * len(data)))
        cpu = time.process_time() - cpu
        return Throughput(broker.kind, f"trigger, batch_size={batch_size}", batch_size, len(data), wall, cpu, events,
                          len(ids), len(set(ids) & {meta_id(body) for body in data}), broker.left(spec, queue_name))
    finally:
        hook.close()
        forget_connection(conn_id)


def read_by_consumer(broker: Broker, data: Sequence[bytes]) -> Throughput:
    spec, queue_name = broker.spec(), broker.queue_name()
    conn_id = define_connection(spec)
    publisher = get_hook(conn_id)
    hook = None
    try:
        publisher.get_binding().publish_batch(data, queue_name)
        seen: list[str] = []
        cpu, start = time.process_time(), time.perf_counter()
        hook = get_hook(conn_id)  # its own connection, resolved and opened on the clock as the trigger's is
        consumer = Consumer(hook.get_binding(), queue_name,
                            {URN: lambda envelope: seen.append(envelope["meta"]["id"])},
                            batch_size=CONSUMER_BATCH, log=QUIET)
        summary = consumer.run(reserve_timeout=0)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        hook.close()  # a RabbitMQ reservation lives on the connection: anything unacked goes back to the queue
        return Throughput(broker.kind, f"consumer, batch_size={CONSUMER_BATCH}", 0, len(data), wall, cpu,
                          summary.handled, len(seen), len(set(seen) & {meta_id(body) for body in data}),
                          broker.left(spec, queue_name))
    finally:
        if hook is not None:
            hook.close()
        publisher.close()
        forget_connection(conn_id)


def detail(result: Throughput, base: Throughput | None) -> str:
    events = f", {result.event_rate:,.0f} events/s" if result.batch_size > 1 else ""
    ratio = f", x{result.rate / base.rate:.2f} of the consumer" if base is not None else ""
    return (f"  {result.label:<28} {result.rate:>9,.0f} msg/s{events}  {result.wall:6.2f} s wall, CPU "
            f"{result.cpu:6.2f} s ({result.cpu / result.wall:4.0%}); {result.events:,} events of {result.taken:,} "
            f"messages ({result.unique:,} distinct), {result.left} left{ratio}")


def bench_in_process(kinds: Sequence[str], n: int, *, sqs_n: int | None = None, batch_sizes: Sequence[int] = (1, 100),
                     consumer: bool = True, errors: list[str] | None = None) -> list[Throughput]:
    """Part 1 for each broker: the consumer baseline (``consumer``), then one trigger per batch size. A wrong count
    or anything left on the broker is added to ``errors`` (and raised when ``errors`` is None)."""
    results: list[Throughput] = []
    own_errors: list[str] = [] if errors is None else errors
    data = bodies(n)
    for kind in kinds:
        sample = data[:min(n, sqs_n or n)] if kind == "sqs" else data
        broker = None
        try:
            broker = open_broker(kind)
            print(f"\n== {kind}: {broker.server()}; n={len(sample):,}", flush=True)
            base = None
            if consumer:
                base = read_by_consumer(broker, sample)
                print(detail(base, None), flush=True)
                results.append(base)
            for batch_size in batch_sizes:
                result = read_by_trigger(broker, sample, batch_size)
                print(detail(result, base), flush=True)
                results.append(result)
            for result in results:
                if result.broker == kind and not result.complete:
                    own_errors.append(f"{kind}, {result.label}: {result.taken} messages taken, {result.unique} of "
                                      f"the {result.n} published, {result.left} left on the broker")
        except Exception:  # noqa: BLE001 - the other brokers still run; the exit status says it failed
            text = traceback.format_exc()
            print(text, flush=True)
            own_errors.append(f"{kind}: {text.strip().splitlines()[-1]}")
        finally:
            if broker is not None:
                try:
                    broker.cleanup()
                except Exception:  # noqa: BLE001
                    print(f"  clean-up of {kind} failed:\n{traceback.format_exc()}", flush=True)
                    own_errors.append(f"{kind}: clean-up failed")
    if errors is None and own_errors:
        raise AssertionError("; ".join(own_errors))
    return results


def _ratio(row: Throughput | None, base: Throughput | None) -> str:
    return f"{row.rate / base.rate:.2f}" if row and base else "-"


def print_throughput(results: Sequence[Throughput]) -> None:
    print(f"\n{'broker':<10} | {'n':>6} | {'consumer msg/s':>14} | {'trigger bs=1 events/s':>21} | {'ratio':>5} | "
          f"{'trigger bs=100 msg/s (events/s)':>31} | {'ratio':>5} | note")
    print("-" * 130)
    for kind in dict.fromkeys(result.broker for result in results):
        rows = {result.batch_size: result for result in results if result.broker == kind}
        base, one, hundred = rows.get(0), rows.get(1), rows.get(100)

        n = next(iter(rows.values())).n
        print(f"{kind:<10} | {n:>6,} | {f'{base.rate:,.0f}' if base else '-':>14} | "
              f"{f'{one.rate:,.0f}' if one else '-':>21} | {_ratio(one, base):>5} | "
              f"{f'{hundred.rate:,.0f} ({hundred.event_rate:,.0f})' if hundred else '-':>31} | "
              f"{_ratio(hundred, base):>5} | {MOTO if kind == 'sqs' else ''}")
    print("(ratio: trigger messages/s over the consumer's, same broker, same run; each event confirmed stored at "
          f"once; trigger reserve_timeout={RESERVE_TIMEOUT} s)")


# ------------------------------------------------------------------------------------ part 2: Airflow

DAG_FILE = """
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_provider_babelqueue.triggers import BabelQueueMessageTrigger

for broker, (conn_id, queue_name) in {targets!r}.items():
    watcher = AssetWatcher(name=f"bench_{{broker}}",
                           trigger=BabelQueueMessageTrigger(babelqueue_conn_id=conn_id, queue_name=queue_name))
    with DAG(f"bq_bench_trigger_{{broker}}",
             schedule=[Asset(f"babelqueue://{{conn_id}}/{{queue_name}}", watchers=[watcher])]) as dag:
        EmptyOperator(task_id="started")
    globals()[f"dag_{{broker}}"] = dag
"""


@dataclass
class Seen:
    """What the metadata DB says about one message: when its first event was stored, the runs that took it."""

    stored: float | None = None
    runs: dict[int, float | None] = field(default_factory=dict)  # dag_run.id → start_date (None: not started)

    @property
    def started(self) -> float | None:
        starts = [start for start in self.runs.values() if start is not None]
        return min(starts) if starts else None

    @property
    def first_run(self) -> int | None:
        started = {run: start for run, start in self.runs.items() if start is not None}
        return min(started, key=lambda run: started[run]) if started else None


def _epoch(value: Any) -> float | None:
    """An Airflow ``UtcDateTime`` as SQLite keeps it (ISO text, UTC), in seconds since the epoch."""
    if value is None:
        return None
    moment = datetime.datetime.fromisoformat(str(value))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def association_table(db: sqlite3.Connection) -> str:
    """The table linking dag runs to the asset events they consumed (``dagrun_asset_event`` in Airflow 3.3),
    found by its columns rather than assumed."""
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        columns = {row[1] for row in db.execute(f'PRAGMA table_info("{name}")')}
        if {"dag_run_id", "event_id"} <= columns:
            return str(name)
    raise RuntimeError("no table links dag_run to asset_event (columns dag_run_id, event_id)")


def observe(home: Path, tables: list[str] | None = None) -> dict[str, Seen]:
    """``meta.id`` → what happened to it, for every message in a trigger's asset event (``tables``: the tables
    read are appended to it)."""
    out: dict[str, Seen] = {}
    with closing(sqlite3.connect(f"file:{home / 'airflow.db'}?mode=ro", uri=True, timeout=30)) as db:
        link = association_table(db)
        if tables is not None:
            tables += ["asset_event", "dag_run", link]
        rows = db.execute(
            f'SELECT e.id, e.timestamp, e.extra, r.id, r.start_date FROM asset_event e LEFT JOIN "{link}" a '
            "ON a.event_id = e.id LEFT JOIN dag_run r ON r.id = a.dag_run_id").fetchall()
    for _event_id, stamp, extra, run_id, start in rows:
        payload = (json.loads(extra) if extra else {}).get("payload") or {}
        for entry in payload.get("messages") or ():
            seen = out.setdefault(entry["meta_id"], Seen())
            stored = _epoch(stamp)
            if stored is not None and (seen.stored is None or stored < seen.stored):
                seen.stored = stored
            if run_id is not None:
                seen.runs[int(run_id)] = _epoch(start)
    return out


def nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class AirflowDelays:
    broker: str
    published: int
    runs: int = 0
    to_stored: list[float] = field(default_factory=list)
    to_start: list[float] = field(default_factory=list)
    by_tick: int = 0
    missing: int = 0
    ticks: int = 0

    def figures(self, values: Sequence[float]) -> str:
        if not values:
            return "-"
        return f"{statistics.median(values):.2f} / {nearest_rank(values, 0.95):.2f}"


def schedule(kinds: Sequence[str], m: int, spacing: float, seed: int = 7) -> list[tuple[float, int, str]]:
    """When to publish each measured message: ``(seconds from the start, its number, broker)``, in time order.

    Each broker's messages follow one another at random intervals of 0.5 to 1.5 times ``spacing`` (seeded, so runs
    compare). At a fixed interval, every message of a broker would land at the same phase of the triggerer's and
    the scheduler's loops (about a second each), and the brokers would differ by their offset in the second alone.
    """
    rng = random.Random(seed)
    out: list[tuple[float, int, str]] = []
    for kind in kinds:
        at = rng.uniform(0, spacing)
        for i in range(m):
            out.append((at, i, kind))
            at += spacing * rng.uniform(0.5, 1.5)
    return sorted(out)


def airflow_delays(kinds: Sequence[str], m: int, spacing: float, errors: list[str]) -> list[AirflowDelays]:
    """Part 2: publish → asset event stored and publish → DAG run start on a real local Airflow."""
    from tests.local_airflow import LocalAirflow, connection_env

    with tempfile.TemporaryDirectory(prefix="bq-bench-trigger-airflow-") as tmp:
        workdir = Path(tmp)
        brokers = {kind: open_broker(kind, workdir) for kind in kinds}
        specs = {kind: broker.spec() for kind, broker in brokers.items()}
        queues = {kind: broker.queue_name() for kind, broker in brokers.items()}
        conn_ids = {kind: f"bqbench_{kind}" for kind in kinds}
        env: dict[str, str] = {}
        hooks: dict[str, Any] = {}
        for kind, spec in specs.items():
            env.update(connection_env(conn_ids[kind], spec))
            os.environ.update(connection_env(conn_ids[kind], spec))
            hooks[kind] = get_hook(conn_ids[kind])
        targets = {kind: (conn_ids[kind], queues[kind]) for kind in kinds}
        airflow = LocalAirflow(workdir, {"bench_trigger.py": DAG_FILE.format(targets=targets)}, env)
        published: dict[str, float] = {}  # meta.id → when its publish returned
        owner: dict[str, str] = {}  # meta.id → broker
        ticks: dict[str, list[str]] = {kind: [] for kind in kinds}

        def publish(kind: str, n: int, into: dict[str, float] | None = None) -> str:
            body = bq.encode(bq.make_envelope(URN, {"order_id": n, "amount": 9.9}, queue_name=queues[kind]))
            hooks[kind].get_binding().publish(body, queues[kind])
            moment, key = time.time(), meta_id(body)
            owner[key] = kind
            if into is not None:
                into[key] = moment
            return key

        results = {kind: AirflowDelays(kind, m) for kind in kinds}
        try:
            started = time.monotonic()
            print(f"\n== Airflow: migrating and starting (home {airflow.home})", flush=True)
            with airflow:
                print(f"  up after {time.monotonic() - started:.0f} s; a warm-up message per broker", flush=True)
                warm = {kind: publish(kind, -1) for kind in kinds}
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    airflow.check_alive()
                    seen = observe(airflow.home)
                    waiting = [kind for kind, key in warm.items() if key not in seen or seen[key].started is None]
                    if not waiting:
                        break
                    time.sleep(2)
                else:
                    raise RuntimeError(f"no run started for the warm-up message of {waiting} within 300 s\n"
                                       f"{airflow.tails()}")
                print(f"  every watcher started a run after {time.monotonic() - started:.0f} s; publishing {m} "
                      f"per broker, {spacing:g} s apart", flush=True)
                origin = time.monotonic() + 1
                for at, i, kind in schedule(kinds, m, spacing):
                    pause = origin + at - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                    publish(kind, i, published)
                last_publish = time.monotonic()
                deadline, next_tick = last_publish + 240, last_publish + 10
                while time.monotonic() < deadline:
                    airflow.check_alive()
                    seen = observe(airflow.home)
                    waiting = {owner[key] for key in published if key not in seen or seen[key].started is None}
                    if not waiting:
                        break
                    if time.monotonic() >= next_tick:
                        for kind in sorted(waiting):
                            ticks[kind].append(publish(kind, 10_000 + len(ticks[kind])))
                        next_tick = time.monotonic() + 5
                    time.sleep(1)
                tables: list[str] = []
                seen = observe(airflow.home, tables)
                print(f"  read from the metadata DB's {', '.join(tables)}", flush=True)
        except BaseException as exc:  # noqa: BLE001 - LocalAirflow fails through pytest.fail (a BaseException)
            if isinstance(exc, KeyboardInterrupt):
                raise
            text = traceback.format_exc()
            print(text[-6000:], flush=True)
            errors.append(f"airflow: {text.strip().splitlines()[-1][:300]}")
            return []
        finally:
            for kind, hook in hooks.items():
                hook.close()
                os.environ.pop(f"AIRFLOW_CONN_{conn_ids[kind].upper()}", None)
            for kind, broker in brokers.items():
                try:
                    broker.cleanup()
                except Exception:  # noqa: BLE001
                    print(f"  clean-up of {kind} failed:\n{traceback.format_exc()}", flush=True)
                    errors.append(f"airflow, {kind}: clean-up failed")

    tick_ids = {key for keys in ticks.values() for key in keys}
    tick_runs = {run for key in tick_ids if key in seen for run in seen[key].runs}
    for key, moment in published.items():
        row, got = results[owner[key]], seen.get(key)
        if got is None or got.started is None or got.stored is None:
            row.missing += 1
            continue
        if got.first_run in tick_runs:
            row.by_tick += 1
        else:
            row.to_start.append(got.started - moment)
        row.to_stored.append(got.stored - moment)
    for kind, row in results.items():
        row.ticks = len(ticks[kind])
        row.runs = len({seen[key].first_run for key in published if owner[key] == kind and key in seen
                        and seen[key].first_run is not None})
        if row.missing:
            errors.append(f"airflow, {kind}: {row.missing} of {m} messages reached no started run")
    return list(results.values())


def print_delays(rows: Sequence[AirflowDelays], spacing: float) -> None:
    print(f"\n{'broker':<10} | {'messages':>8} | {'runs':>4} | {'publish -> event stored, s':>26} | "
          f"{'publish -> run start, s':>23} | {'run by a tick':>13} | note")
    print(f"{'':<10} | {'':>8} | {'':>4} | {'median / p95':>26} | {'median / p95':>23} | {'':>13} |")
    print("-" * 110)
    for row in rows:
        print(f"{row.broker:<10} | {row.published:>8} | {row.runs:>4} | {row.figures(row.to_stored):>26} | "
              f"{row.figures(row.to_start):>23} | {row.by_tick:>13} | "
              f"{'moto: not a latency figure' if row.broker == 'sqs' else ''}")
    print(f"(one message per broker every {spacing:g} s on average; trigger defaults; runs: distinct first runs of the "
          "messages; 'run by a tick': left out of the run-start figures)")


# ------------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=5000, help="messages per in-process measurement")
    parser.add_argument("--sqs-n", type=int, default=200, help="messages per measurement on moto (at most --n)")
    parser.add_argument("--m", type=int, default=50, help="messages per broker published to the local Airflow")
    parser.add_argument("--spacing", type=float, default=1.0,
                        help="mean seconds between two messages of one broker (each interval 0.5-1.5 times it)")
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma list of: " + ", ".join(BROKERS))
    parser.add_argument("--batch-sizes", default="1,100", help="trigger batch sizes measured in process")
    parser.add_argument("--no-consumer", dest="consumer", action="store_false", help="skip the consumer baseline")
    parser.add_argument("--in-process", action=argparse.BooleanOptionalAction, default=True,
                        help="part 1: events per second in process")
    parser.add_argument("--airflow", action=argparse.BooleanOptionalAction, default=True,
                        help="part 2: publish -> DAG run start on a local Airflow (minutes)")
    args = parser.parse_args(argv)
    kinds = [kind.strip() for kind in args.brokers.split(",") if kind.strip()]
    if unknown := [kind for kind in kinds if kind not in BROKERS]:
        parser.error(f"unknown broker(s) {unknown}; choose from {', '.join(BROKERS)}")
    batch_sizes = [int(size) for size in args.batch_sizes.split(",") if size.strip()]
    print(describe())
    print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; n={args.n:,} "
          f"(sqs {min(args.n, args.sqs_n):,}), m={args.m} per broker, spacing {args.spacing:g} s")
    errors: list[str] = []
    if args.in_process:
        results = bench_in_process(kinds, args.n, sqs_n=args.sqs_n, batch_sizes=batch_sizes,
                                   consumer=args.consumer, errors=errors)
        print_throughput(results)
    if args.airflow:
        rows = airflow_delays(kinds, args.m, args.spacing, errors)
        if rows:
            print_delays(rows, args.spacing)
    for error in errors:
        print(f"ERROR: {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
