"""Page latency of the dead-letter console (``engine.browse.browse_page``) on a dead-letter queue of ``--n`` letters.

For each broker (Redis, SQLite in a temp file, PostgreSQL), one dead-letter queue of ``--n`` realistic annotated
dead letters is filled fast and untimed (the fill time is printed, not tabled): straight into the binding's own
dead-letter store, as the binding would have written them one by one:

* Redis: RPUSH of 1,000 bodies per command, 20 commands per pipeline, into ``binding.dead_letter_name(queue)``
  (``<key_prefix><queue>:failed``, the list the binding writes and reads first);
* SQLite (a temp file) and PostgreSQL (a fresh uuid-named table): the binding creates its tables, then the rows of
  ``<table>_failed`` (the binding's columns: queue, urn, attempts, reason, error, exception, failed_at, payload) go
  in with the driver's executemany (SQLite) or ``execute_values`` (PostgreSQL), 10,000 rows per transaction.
  PostgreSQL's table then gets ``VACUUM ANALYZE``: what autovacuum does to a table that grew by that much.

The letters (one seed, the same for every broker): ~90 % reason ``failed`` (five kinds of error, each with its own
exception type and ids, numbers or quoted values in its text), ~9 % ``unknown_urn``, ~1 % poison (bytes that are
not an envelope: the SQL table keeps them bare, Redis holds the binding's poison wrapper of them); five common URNs
and two unknown ones; and one RARE URN with a rare reason, 10 times only, near the end of the queue.

Measured, each ``--pages`` times (median and p95 latency of one ``browse_page`` call with the console's defaults:
limit 50, ``max_scan`` 20,000, ``time_budget`` 1.5 s), with the entries returned, dead letters scanned and why the
page stopped early (``stopped_by``):

1. unfiltered page of 50 at start 0, at the middle (n/2) and at the end (n - 50);
2. reason=failed, reason=unknown_urn and a common URN pattern, each from a random start in the first half; the
   RARE URN from start 0 (on a large queue the page stops at ``max_scan`` or the time budget: the rate at which it
   read dead letters is printed);
3. a piece of error text (case-insensitive) and a fingerprint prefix, from start 0;
4. the unfiltered middle page through the console's HTTP route, ``GET /babelqueue/console/api/dead-letters``, in
   Airflow's API application (``create_app``, the simple auth manager, the plugin mounted as Airflow mounts it,
   a viewer's token), called in-process through Starlette's TestClient (no socket), against an ``AIRFLOW_CONN_<ID>``
   connection to the same queue: each request opens the connection's hook and binding and closes them, as the
   console does. The metadata database is a throwaway Airflow home (``airflow db migrate``, untimed), unless
   Airflow is already imported (a test): then the current home.

5. a console job's read of the whole queue (``MatchScan`` for reason=unknown_urn, as a background action reads it),
   once, untabled: its time and rate are printed.

Every page is checked against the letters written: the entries must be exactly the matching dead letters of the
range the page scanned (position, URN, reason), in order; an unfiltered page holds 50 consecutive positions. A full
scan for the RARE URN (from 0 when n <= 50,000, else from just before its first position) must find all 10.

The goal (docs/benchmarks.md): unfiltered pages and reason/URN filters under 2 s per page (p95 here) on a DLQ of
1,000,000 on Redis and SQL; one line per broker says whether it held. A missed goal does not fail the run (it is a
measurement); a wrong count or an error does. Every key, table and file made is removed at the end.

Run: ``.venv/bin/python benchmarks/bench_console_browse.py --n 1000000 [--brokers redis,sqlite,postgresql]
[--pages 20]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import psycopg2
import psycopg2.extras
import redis
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402

from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.bodies import dead_letter_view
from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig  # noqa: E402
from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig, sqlite_url  # noqa: E402
from airflow_provider_babelqueue.core import envelope as bq  # noqa: E402
from airflow_provider_babelqueue.core.fingerprint import error_fingerprint, error_pattern  # noqa: E402
from airflow_provider_babelqueue.engine.browse import BrowsePage, DeadLetterQuery, MatchScan, browse_page  # noqa: E402

POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
BROKERS = ("redis", "sqlite", "postgresql")
QUEUE = "orders"
LIMIT = 50
GOAL_SECONDS = 2.0
GOAL_N = 1_000_000
SEED = 20_251_124
FIRST_FAILED_AT = 1_764_000_000_000  # Unix ms; the letters failed 50 ms apart from here on
ROUTE = "/babelqueue/console/api/dead-letters"
#: A full scan for the rare URN runs from position 0 up to this depth (beyond it: from just before the first one).
FULL_SCAN_MAX = 50_000

COMMON_URNS = ("urn:babel:orders:created", "urn:babel:orders:paid", "urn:babel:payments:captured",
               "urn:babel:shipping:label-printed", "urn:babel:customers:updated")
UNKNOWN_URNS = ("urn:babel:legacy:invoice-sync", "urn:babel:marketing:newsletter-sent")
RARE_URN, RARE_REASON, RARES = "urn:babel:ledger:reconciled", "invalid_data", 10
URN_PATTERN = "urn:babel:orders:*"
TEXT = "sharelock"  # in the deadlock errors only, written "ShareLock": the filter is case-insensitive
LANGS = (("python", 70), ("php", 20), ("node", 10))


def _timeout(rng: random.Random) -> str:
    return (f"timeout after {rng.randint(5, 60)}s waiting for order {rng.randint(1, 9_999_999)} "
            f"(attempt {rng.randint(1, 3)})")


def _gateway(rng: random.Random) -> str:
    return (f"payment gateway answered 502 for charge ch_{rng.getrandbits(48):012x} after {rng.randint(80, 30_000)} ms "
            f"(request {uuid.UUID(int=rng.getrandbits(128), version=4)})")


def _deadlock(rng: random.Random) -> str:
    return (f"deadlock detected: process {rng.randint(1000, 65_000)} waits for ShareLock on transaction "
            f"{rng.randint(10**6, 10**9)}; blocked by process {rng.randint(1000, 65_000)}")


def _amount(rng: random.Random) -> str:
    return (f"invalid amount '{rng.randint(-999, 99_999) / 100}' on line {rng.randint(1, 40)} "
            f"of order {rng.randint(1, 9_999_999)}")


def _missing_key(rng: random.Random) -> str:
    return f"'sku-{rng.randint(1, 99_999)}'"


#: The failed letters' kinds: (kind, weight in %, exception, error text).
FAILURES: tuple[tuple[str, int, str, Callable[[random.Random], str]], ...] = (
    ("timeout", 35, "TimeoutError", _timeout),
    ("gateway", 25, "httpx.HTTPStatusError", _gateway),
    ("deadlock", 15, "psycopg2.errors.DeadlockDetected", _deadlock),
    ("amount", 15, "ValueError", _amount),
    ("missing_key", 10, "KeyError", _missing_key),
)
#: The fingerprint filter's kind: every letter of it shares one fingerprint (its numbers and quoted value masked).
FINGERPRINT_KIND = "amount"
POISON_BODIES = (b"\xff\xfe\x00garbage from a misconfigured producer",
                 b"<html><body><h1>502 Bad Gateway</h1></body></html>",
                 b'{"job": "urn:babel:orders:created", "trace_id": "cut off in the midd')


class Letter(NamedTuple):
    """One dead letter as written: its stored body (bare; Redis stores a poison one in the binding's wrapper) and
    the columns of its SQL row; ``kind`` names its generator (a failure kind, ``unknown_urn``, ``poison``, ``rare``)."""

    body: bytes
    urn: str | None
    reason: str
    error: str | None
    exception: str | None
    failed_at: int
    attempts: int
    kind: str


def rare_positions(n: int) -> list[int]:
    """Where the 10 RARE letters are: near the end, ``n // 1000`` apart (at least 1)."""
    step = max(1, n // 1000)
    return sorted(n - 1 - step * k for k in range(RARES))


def make_letters(n: int, seed: int = SEED) -> list[Letter]:
    """``n`` annotated dead letters of queue :data:`QUEUE` (see the module docstring): for one seed and ``n``, the same
    letters but for their fresh ``meta.id`` and ``trace_id``."""
    rng = random.Random(seed)
    rare = set(rare_positions(n))
    kinds = [kind for kind, weight, _, _ in FAILURES for _ in range(weight)]
    failures = {kind: (exception, text) for kind, _, exception, text in FAILURES}
    langs = [lang for lang, weight in LANGS for _ in range(weight)]
    out: list[Letter] = []
    for i in range(n):
        failed_at = FIRST_FAILED_AT + 50 * i
        draw = rng.random()
        if i in rare:
            kind, urn, reason, exception = "rare", RARE_URN, RARE_REASON, None
            error, attempts = f"ledger entry {rng.randint(1, 10**6)} does not balance by {rng.randint(1, 999)} cents", 0
        elif draw < 0.01:
            raw = POISON_BODIES[i % len(POISON_BODIES)]
            out.append(Letter(raw, None, "poison", "body is not a JSON object", None, failed_at, 0, "poison"))
            continue
        elif draw < 0.10:
            kind, urn, reason, exception = "unknown_urn", UNKNOWN_URNS[i % 2], "unknown_urn", None
            error, attempts = f"no handler for {UNKNOWN_URNS[i % 2]}", 0
        else:
            kind = rng.choice(kinds)
            urn, reason, (exception, text) = rng.choice(COMMON_URNS), "failed", failures[kind]
            error, attempts = text(rng), 3
        data = {"order_id": i, "customer": f"c-{rng.randint(1, 500_000)}", "amount": rng.randint(100, 500_000) / 100,
                "currency": "EUR", "items": [{"sku": f"sku-{rng.randint(1, 99_999)}", "qty": rng.randint(1, 5)}]}
        envelope = bq.make_envelope(urn, data, queue_name=QUEUE)
        envelope["meta"]["lang"] = rng.choice(langs)
        envelope["meta"]["created_at"] = failed_at - rng.randint(100, 600_000)
        envelope["attempts"] = attempts
        annotated = bq.annotate_dead_letter(envelope, reason, original_queue=QUEUE, attempts=attempts, error=error,
                                            exception=exception, failed_at=failed_at)
        out.append(Letter(bq.encode(annotated), urn, reason, error, exception, failed_at, attempts, kind))
    return out


def redis_body(letter: Letter) -> bytes:
    """What the Redis binding stores for the letter: the annotated envelope, or the poison wrapper of bare bytes."""
    if letter.kind != "poison":
        return letter.body
    return dead_letter_view(letter.body, None, letter.reason, original_queue=QUEUE, attempts=letter.attempts,
                            error=letter.error, failed_at=letter.failed_at)


# ------------------------------------------------------------------------------------------------- brokers


class Target:
    """One broker's dead-letter queue: the binding reading it, the fill, the Airflow connection that names it, and
    the clean-up of everything made."""

    kind = ""
    binding: Binding

    def server(self) -> str:
        raise NotImplementedError

    def fill(self, letters: Sequence[Letter]) -> None:
        raise NotImplementedError

    def connection(self) -> dict[str, Any]:
        raise NotImplementedError

    def cleanup(self) -> None:
        raise NotImplementedError


class RedisTarget(Target):
    kind = "redis"

    def __init__(self) -> None:
        self.prefix = f"bqbrowse:{uuid.uuid4().hex[:8]}:"
        self.client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
        self.binding = RedisBinding(RedisConfig(host=REDIS_HOST, port=REDIS_PORT, key_prefix=self.prefix))

    def server(self) -> str:
        return f"Redis {self.client.info('server')['redis_version']}"

    def fill(self, letters: Sequence[Letter]) -> None:
        key = self.binding.dead_letter_name(QUEUE)
        pipe = self.client.pipeline(transaction=False)
        for start in range(0, len(letters), 1000):
            pipe.rpush(key, *(redis_body(letter) for letter in letters[start:start + 1000]))
            if len(pipe) >= 20:
                pipe.execute()
        pipe.execute()

    def connection(self) -> dict[str, Any]:
        return {"conn_type": "babelqueue+redis", "host": REDIS_HOST, "port": REDIS_PORT,
                "extra": {"key_prefix": self.prefix}}

    def cleanup(self) -> None:
        self.binding.close()
        keys = list(self.client.scan_iter(match=f"{self.prefix}*", count=1000))
        if keys:
            self.client.delete(*keys)
        self.client.close()


_COLUMNS = ("queue", "urn", "attempts", "reason", "error", "exception", "failed_at", "payload")
ROWS_PER_TRANSACTION = 10_000


def _row(letter: Letter) -> tuple[Any, ...]:
    return (QUEUE, letter.urn, letter.attempts, letter.reason, letter.error, letter.exception, letter.failed_at,
            letter.body)


class SqliteTarget(Target):
    kind = "sqlite"

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="bqbrowse-")
        self.path = Path(self.tmp.name) / "queue.sqlite"
        self.table = f"bqb_{uuid.uuid4().hex[:10]}"
        self.binding = SqlBinding(SqlConfig(url=sqlite_url(self.path), table=self.table))

    def server(self) -> str:
        return f"SQLite {sqlite3.sqlite_version} (temp file, WAL)"

    def fill(self, letters: Sequence[Letter]) -> None:
        self.binding.dead_letter_depth(QUEUE)  # the binding creates its tables (and sets WAL)
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        insert = (f"INSERT INTO {self.table}_failed ({', '.join(_COLUMNS)}) "
                  f"VALUES ({', '.join('?' * len(_COLUMNS))})")
        try:
            for start in range(0, len(letters), ROWS_PER_TRANSACTION):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(insert, map(_row, letters[start:start + ROWS_PER_TRANSACTION]))
                conn.execute("COMMIT")
        finally:
            conn.close()

    def connection(self) -> dict[str, Any]:
        return {"conn_type": "babelqueue+sql", "host": str(self.path), "extra": {"table": self.table}}

    def cleanup(self) -> None:
        self.binding.close()
        self.tmp.cleanup()


class PostgresTarget(Target):
    kind = "postgresql"

    def __init__(self) -> None:
        self.table = f"bqb_{uuid.uuid4().hex[:10]}"
        self.binding = SqlBinding(SqlConfig(url=POSTGRES_URL, table=self.table))
        url = sa.make_url(POSTGRES_URL)
        self.conn = psycopg2.connect(host=url.host, port=url.port or 5432, user=url.username, password=url.password,
                                     dbname=url.database)

    def server(self) -> str:
        with self.conn.cursor() as cur:
            cur.execute("SHOW server_version")
            version = cur.fetchone()[0]
        self.conn.rollback()
        return f"PostgreSQL {version}"

    def fill(self, letters: Sequence[Letter]) -> None:
        self.binding.dead_letter_depth(QUEUE)  # the binding creates its tables
        insert = f"INSERT INTO {self.table}_failed ({', '.join(_COLUMNS)}) VALUES %s"
        with self.conn.cursor() as cur:
            for start in range(0, len(letters), ROWS_PER_TRANSACTION):
                psycopg2.extras.execute_values(cur, insert, map(_row, letters[start:start + ROWS_PER_TRANSACTION]),
                                               page_size=1000)
                self.conn.commit()
        self.conn.autocommit = True
        try:
            with self.conn.cursor() as cur:
                cur.execute(f"VACUUM ANALYZE {self.table}_failed")
        finally:
            self.conn.autocommit = False

    def connection(self) -> dict[str, Any]:
        url = sa.make_url(POSTGRES_URL)
        return {"conn_type": "babelqueue+sql", "host": url.host, "port": url.port or 5432, "login": url.username,
                "schema": url.database, "extra": {"dialect": "postgresql", "table": self.table}}

    def cleanup(self) -> None:
        self.binding.close()
        self.conn.rollback()
        self.conn.autocommit = True
        with self.conn.cursor() as cur:
            for name in (self.table, f"{self.table}_failed"):
                cur.execute(f'DROP TABLE IF EXISTS "{name}"')
        self.conn.close()


def open_target(kind: str) -> Target:
    factories: dict[str, Callable[[], Target]] = {"redis": RedisTarget, "sqlite": SqliteTarget,
                                                  "postgresql": PostgresTarget}
    return factories[kind]()


# -------------------------------------------------------------------------------------------- the HTTP route


class _Entry(NamedTuple):
    """The fields of an entry the checks read, from the route's JSON."""

    position: int
    urn: str | None
    reason: str


class Api:
    """Airflow's API application with the console plugin, as ``tests/plugins/common.py`` builds it, and a viewer's
    token; made on first use, closed at the end.

    :param own_home: run Airflow in a throwaway home (migrated, removed at the end); ``False``: in the current
        ``AIRFLOW_HOME`` (a test's), migrated when it has no metadata database yet.
    """

    def __init__(self, own_home: bool = True) -> None:
        self.own_home = own_home
        self.saved: dict[str, str | None] = {}
        self.home: str | None = None
        self.client: Any = None
        self.token = ""
        self.conn_ids: list[str] = []
        self._plugins: tuple[Any, Any] | None = None

    def _env(self, name: str, value: str) -> None:
        self.saved.setdefault(name, os.environ.get(name))
        os.environ[name] = value

    def open(self) -> None:
        if self.own_home:
            if "airflow" in sys.modules:
                raise RuntimeError("Airflow is imported already, so it would not read a new AIRFLOW_HOME: "
                                   "use --airflow-home current")
            self.home = tempfile.mkdtemp(prefix="bqbrowse-airflow-")
            self._env("AIRFLOW_HOME", self.home)
            self._env("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")  # no access log line per request
        self._env("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        home = Path(os.environ["AIRFLOW_HOME"])
        if not (home / "airflow.db").exists():
            airflow = Path(sys.executable).parent / "airflow"
            subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True, timeout=600)
        self._env("AIRFLOW__CORE__AUTH_MANAGER",
                  "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
        self._env("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
        self._env("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "viewer:viewer")
        self._env("AIRFLOW__API_AUTH__JWT_SECRET", "bench-console-" + uuid.uuid4().hex * 2)
        self._env("AIRFLOW__API__HOST", "127.0.0.1")  # a loopback, local-executor shape: no "looks like production"
        self._env("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
        from airflow import plugins_manager
        from airflow.api_fastapi import app as api_app
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
        from fastapi.testclient import TestClient

        from airflow_provider_babelqueue.plugins.plugin import BabelQueuePlugin

        self._plugins = (plugins_manager, plugins_manager.get_fastapi_plugins)
        plugins_manager.get_fastapi_plugins = lambda: (BabelQueuePlugin.fastapi_apps, [])  # as Airflow hands it
        api_app.purge_cached_app()
        with contextlib.redirect_stdout(io.StringIO()):  # the simple auth manager prints the users' new passwords
            self.client = TestClient(api_app.create_app(apps="core"))
        self.token = api_app.get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="viewer", role="viewer"))

    def connection(self, target: Target) -> str:
        conn_id = f"bq_bench_browse_{target.kind}"
        self._env(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(target.connection()))
        return conn_id

    def page(self, conn_id: str, start: int) -> tuple[BrowsePage, float]:
        if self.client is None:
            self.open()
        params = {"conn_id": conn_id, "queue_name": QUEUE, "start": start, "limit": LIMIT}
        began = time.perf_counter()
        answer = self.client.get(ROUTE, params=params, headers={"Authorization": f"Bearer {self.token}"})
        seconds = time.perf_counter() - began
        if answer.status_code != 200:
            raise RuntimeError(f"GET {ROUTE} answered {answer.status_code}: {answer.text[:500]}")
        data = answer.json()
        page = BrowsePage(entries=[_Entry(e["position"], e["urn"], e["reason"]) for e in data["entries"]],
                          next_position=data["next_position"], scanned=data["scanned"], depth=data["depth"],
                          stopped_by=data["stopped_by"])
        return page, seconds

    def close(self) -> None:
        if self.client is not None:
            from airflow.api_fastapi import app as api_app

            self.client.close()
            api_app.purge_cached_app()
        if self._plugins is not None:
            module, original = self._plugins
            module.get_fastapi_plugins = original
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ measurements


@dataclass
class Row:
    measurement: str
    broker: str
    seconds: list[float] = field(default_factory=list)
    entries: list[int] = field(default_factory=list)
    scanned: list[int] = field(default_factory=list)
    stopped: list[str | None] = field(default_factory=list)
    #: Whether the row is one of the goal's pages (unfiltered, reason, URN).
    goal: bool = False

    @property
    def median_ms(self) -> float:
        return statistics.median(self.seconds) * 1000

    @property
    def p95_ms(self) -> float:
        ordered = sorted(self.seconds)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] * 1000

    @property
    def scan_rate(self) -> float:
        """Dead letters read per second, median over the samples."""
        return statistics.median(s / t for s, t in zip(self.scanned, self.seconds, strict=True) if t > 0)


def _span(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def _stops(values: Sequence[str | None]) -> str:
    counts = Counter(value or "-" for value in values)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{name} {count}/{len(values)}" for name, count in sorted(counts.items()))


class Check(NamedTuple):
    """A measurement: its label, the query (``None``: unfiltered), and which letters it should list."""

    label: str
    query: DeadLetterQuery | None
    matches: Callable[[Letter], bool]
    goal: bool


def checks(letters: Sequence[Letter]) -> dict[str, Check]:
    sample = next(letter for letter in letters if letter.kind == FINGERPRINT_KIND)
    prefix = error_fingerprint(sample.exception, error_pattern(sample.error))[:8]
    return {
        "unfiltered": Check("unfiltered", None, lambda letter: True, True),
        "failed": Check("reason=failed", DeadLetterQuery(reasons=("failed",)), lambda x: x.reason == "failed", True),
        "unknown_urn": Check("reason=unknown_urn", DeadLetterQuery(reasons=("unknown_urn",)),
                             lambda x: x.reason == "unknown_urn", True),
        "urn": Check(f"urn={URN_PATTERN}", DeadLetterQuery(urns=(URN_PATTERN,)),
                     lambda x: x.urn is not None and x.urn.startswith(URN_PATTERN[:-1]), True),
        "rare": Check(f"rare urn={RARE_URN}", DeadLetterQuery(urns=(RARE_URN,)), lambda x: x.urn == RARE_URN, True),
        "text": Check(f"text={TEXT!r}", DeadLetterQuery(text=TEXT),
                      lambda x: x.error is not None and TEXT in x.error.casefold(), False),
        "fingerprint": Check(f"fingerprint={prefix}*", DeadLetterQuery(fingerprints=(prefix,)),
                             lambda x: x.kind == FINGERPRINT_KIND, False),
    }


def verify(label: str, page: BrowsePage, start: int, letters: Sequence[Letter], check: Check, n: int) -> None:
    """The page lists exactly the matching letters of the range it scanned, in order, and stops where it says."""
    if page.depth != n:
        raise AssertionError(f"{label}: depth {page.depth:,}, expected {n:,}")
    end = min(start + page.scanned, n)
    expected = [p for p in range(start, end) if check.matches(letters[p])]
    got = [entry.position for entry in page.entries]
    if got != expected:
        raise AssertionError(f"{label}: positions {got[:12]}... differ from the expected {expected[:12]}... "
                             f"({len(got)} vs {len(expected)}, scanned {start:,}..{end:,})")
    for entry in page.entries:
        letter = letters[entry.position]
        if entry.reason != letter.reason or (letter.kind != "poison" and entry.urn != letter.urn):
            raise AssertionError(f"{label}: position {entry.position} reads as {entry.urn}/{entry.reason}, "
                                 f"written as {letter.urn}/{letter.reason}")
    full = len(got) >= LIMIT
    if not full and page.stopped_by is None and end != n:
        raise AssertionError(f"{label}: {len(got)} entries, not stopped, but only scanned up to {end:,} of {n:,}")
    if page.stopped_by is not None and full:
        raise AssertionError(f"{label}: a full page says it stopped by {page.stopped_by}")


@dataclass
class BrokerResult:
    kind: str
    n: int
    fill_seconds: float = 0.0
    rows: list[Row] = field(default_factory=list)
    #: Positions where a full scan for the RARE URN found it, and from where that scan started.
    rare_found: list[int] = field(default_factory=list)
    rare_scan_start: int = 0
    #: A background job's read of the whole queue (``MatchScan``, reason=unknown_urn): seconds and matches.
    job_seconds: float = 0.0
    job_matched: int = 0


def measure(target: Target, letters: Sequence[Letter], pages: int, api: Api | None, seed: int = SEED) -> BrokerResult:
    n = len(letters)
    binding = target.binding
    result = BrokerResult(target.kind, n)
    began = time.perf_counter()
    target.fill(letters)
    result.fill_seconds = time.perf_counter() - began
    depth = binding.dead_letter_depth(QUEUE)
    if depth != n:
        raise AssertionError(f"{target.kind}: dead-letter depth {depth:,} after the fill, expected {n:,}")
    print(f"  fill (untimed in the table): {n:,} dead letters in {result.fill_seconds:.1f} s "
          f"({n / result.fill_seconds:,.0f}/s)", flush=True)
    rng = random.Random(seed)
    by = checks(letters)

    def run(label: str, check: Check, start_of: Callable[[], int],
            page_of: Callable[[int], tuple[BrowsePage, float]] | None = None) -> Row:
        row = Row(label, target.kind, goal=check.goal)
        for _ in range(pages):
            start = start_of()
            if page_of is None:
                began = time.perf_counter()
                page = browse_page(binding, QUEUE, check.query, start=start, limit=LIMIT)
                seconds = time.perf_counter() - began
            else:
                page, seconds = page_of(start)
            verify(f"{target.kind} {label} from {start:,}", page, start, letters, check, n)
            row.seconds.append(seconds)
            row.entries.append(len(page.entries))
            row.scanned.append(page.scanned)
            row.stopped.append(page.stopped_by)
        print(f"  {label:<48} median {row.median_ms:8.1f} ms  p95 {row.p95_ms:8.1f} ms  entries "
              f"{_span(row.entries):>5}  scanned {_span(row.scanned):>13}  stopped_by {_stops(row.stopped)}"
              + (f"  ({row.scan_rate:,.0f} dead letters/s read)" if any(row.stopped) else ""), flush=True)
        result.rows.append(row)
        return row

    def random_start() -> int:
        return rng.randrange(0, max(1, n // 2))

    for label, start in (("start 0", 0), ("middle (n/2)", n // 2), ("end (n-50)", max(0, n - LIMIT))):
        run(f"unfiltered, {label}", by["unfiltered"], lambda start=start: start)
    for key in ("failed", "unknown_urn", "urn"):
        run(f"{by[key].label}, random start", by[key], random_start)
    run(f"{by['rare'].label}, start 0", by["rare"], lambda: 0)
    for key in ("text", "fingerprint"):
        run(f"{by[key].label}, start 0", by[key], lambda: 0)
    if api is not None:
        conn_id = api.connection(target)
        run("HTTP GET, unfiltered, middle (n/2)", by["unfiltered"], lambda: n // 2,
            lambda start: api.page(conn_id, start))

    # untimed: a scan with no bound finds every RARE letter
    positions = rare_positions(n)
    result.rare_scan_start = 0 if n <= FULL_SCAN_MAX else max(0, positions[0] - 1000)
    page = browse_page(binding, QUEUE, by["rare"].query, start=result.rare_scan_start, limit=1000, max_scan=n + 1,
                       time_budget=float("inf"))
    verify(f"{target.kind} full rare scan", page, result.rare_scan_start, letters, by["rare"], n)
    result.rare_found = [entry.position for entry in page.entries]
    if result.rare_found != positions or page.next_position is not None:
        raise AssertionError(f"{target.kind}: the full scan found the rare URN at {result.rare_found}, "
                             f"expected {positions}")
    print(f"  check: the rare URN found {len(result.rare_found)} times by a scan without bounds from "
          f"{result.rare_scan_start:,} ({page.scanned:,} scanned)", flush=True)

    # a console job's read of the whole queue, as it runs outside the request
    check = by["unknown_urn"]
    assert check.query is not None
    began = time.perf_counter()
    scan = MatchScan(binding, QUEUE, check.query)
    while not scan.done:
        result.job_matched += len(scan.next_chunk())
    result.job_seconds = time.perf_counter() - began
    expected = sum(1 for letter in letters if check.matches(letter))
    if (scan.scanned, result.job_matched) != (n, expected):
        raise AssertionError(f"{target.kind}: the job read {scan.scanned:,} and matched {result.job_matched:,}, "
                             f"expected {n:,} and {expected:,}")
    print(f"  job read of the whole queue ({check.label}): {n:,} read, {result.job_matched:,} matched in "
          f"{result.job_seconds:.1f} s ({n / result.job_seconds:,.0f} dead letters/s)", flush=True)
    return result


# ------------------------------------------------------------------------------------------------------ main


@dataclass
class Report:
    results: list[BrokerResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[Row]:
        return [row for result in self.results for row in result.rows]


def bench(kinds: Sequence[str], n: int, pages: int, *, http: bool = True, own_home: bool = True) -> Report:
    """Every broker of ``kinds`` in turn on the same ``n`` letters; a broker's error is reported, the others run.

    :param http: measure the HTTP route too; ``own_home``: see :class:`Api`."""
    report = Report()
    began = time.perf_counter()
    letters = make_letters(n)
    print(f"letters: {n:,} made in {time.perf_counter() - began:.1f} s, {sum(len(x.body) for x in letters) / n:.0f} B "
          f"each on average; {dict(Counter(x.kind for x in letters).most_common())}", flush=True)
    api = Api(own_home) if http else None
    try:
        for kind in kinds:
            target = None
            try:
                target = open_target(kind)
                print(f"\n== {kind}: {target.server()}", flush=True)
                report.results.append(measure(target, letters, pages, api))
            except Exception:  # noqa: BLE001 - the other brokers still run; the exit status says it failed
                text = traceback.format_exc()
                print(text, flush=True)
                report.errors.append(f"{kind}: {text.strip().splitlines()[-1]}")
            finally:
                if target is not None:
                    try:
                        target.cleanup()
                    except Exception:  # noqa: BLE001
                        print(f"  clean-up of {kind} failed:\n{traceback.format_exc()}", flush=True)
                        report.errors.append(f"{kind}: clean-up failed")
    finally:
        if api is not None:
            api.close()
    return report


HEADER = ("measurement", "broker", "median ms", "p95 ms", "entries", "scanned", "stopped_by")


def print_table(report: Report, n: int) -> None:
    widths = (48, 10, 9, 9, 7, 13, 22)
    print("\n" + " | ".join(f"{name:<{width}}" if i < 2 or i == 6 else f"{name:>{width}}"
                            for i, (name, width) in enumerate(zip(HEADER, widths, strict=True))))
    print("-" * (sum(widths) + 3 * (len(widths) - 1)))
    for row in report.rows:
        print(f"{row.measurement:<48} | {row.broker:<10} | {row.median_ms:>9.1f} | {row.p95_ms:>9.1f} | "
              f"{_span(row.entries):>7} | {_span(row.scanned):>13} | {_stops(row.stopped)}")
    print(f"(n = {n:,} dead letters; {len(report.rows[0].seconds) if report.rows else 0} pages per row; limit "
          f"{LIMIT}, max_scan 20,000, time_budget 1.5 s: the console's defaults)")
    for row in report.rows:
        if any(row.stopped):
            print(f"scan rate: {row.measurement} on {row.broker}: {row.scan_rate:,.0f} dead letters/s read "
                  f"(stopped by {_stops(row.stopped)})")
    for result in report.results:
        print(f"job read: {result.kind}: the whole queue of {result.n:,} in {result.job_seconds:.1f} s "
              f"({result.n / max(result.job_seconds, 1e-9):,.0f} dead letters/s), {result.job_matched:,} matched")
    size = f"a DLQ of {n:,}" + ("" if n == GOAL_N else f" (the goal names {GOAL_N:,})")
    for result in report.results:
        goal_rows = [row for row in result.rows if row.goal]
        slowest = max(goal_rows, key=lambda row: row.p95_ms)
        held = slowest.p95_ms < GOAL_SECONDS * 1000
        print(f"goal {result.kind}: unfiltered and reason/URN pages under {GOAL_SECONDS:.0f} s on {size}: "
              f"{'met' if held else 'MISSED'} (slowest p95: {slowest.p95_ms:,.0f} ms, {slowest.measurement})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=GOAL_N, help="dead letters in the queue (at least 1,000)")
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma list of: " + ", ".join(BROKERS))
    parser.add_argument("--pages", type=int, default=20, help="samples per measurement")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP route measurement")
    parser.add_argument("--airflow-home", choices=("temp", "current"), default="temp",
                        help="for the HTTP route: a throwaway Airflow home (default), or the current AIRFLOW_HOME "
                             "(migrated if it has no airflow.db)")
    args = parser.parse_args(argv)
    kinds = [kind.strip() for kind in args.brokers.split(",") if kind.strip()]
    if unknown := [kind for kind in kinds if kind not in BROKERS]:
        parser.error(f"unknown broker(s) {unknown}; choose from {', '.join(BROKERS)}")
    if args.n < 1000:
        parser.error("--n must be at least 1000")
    if args.pages < 1:
        parser.error("--pages must be at least 1")
    print(describe())
    print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; n={args.n:,}, "
          f"{args.pages} pages per measurement")
    report = bench(kinds, args.n, args.pages, http=not args.no_http, own_home=args.airflow_home == "temp")
    if report.rows:
        print_table(report, args.n)
    for error in report.errors:
        print(f"ERROR: {error}")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
