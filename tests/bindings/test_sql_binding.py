"""SQL-binding specifics: the shared PDO layout, byte exactness, and safety under concurrency and crashes.

The generic behaviour is checked by ``test_contract.py``; everything here runs on an SQLite file and on the
local PostgreSQL, which ``make test`` starts; an unreachable server fails these tests with the reason
rather than skipping them, so CI can never pass without having run them.
"""

from __future__ import annotations

import collections
import multiprocessing
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import BindingError
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig, sqlite_url
from airflow_provider_babelqueue.bindings.sql import engine as sql_engine
from tests.bindings.conftest import kept

POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
PSYCOPG3_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
INVALID_UTF8 = [b"\xff\xfe{\"job\": \x00 not json \x80\xc3(", bytes(range(256)), b"\xed\xa0\x80 lone surrogate"]
_pg_error: list[str] = []


def _postgres_unavailable() -> str:
    """Why PostgreSQL cannot be used here, or "" when it can (probed once per session)."""
    if not _pg_error:
        try:
            engine = sa.create_engine(POSTGRES_URL)
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            engine.dispose()
            _pg_error.append("")
        except Exception as exc:  # noqa: BLE001 - any failure means "fail with this reason"
            _pg_error.append(f"PostgreSQL at {POSTGRES_URL} is not usable: {exc}")
    return _pg_error[0]


class Target:
    """One backend and a unique table pair; ``make()`` opens bindings that are closed at teardown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.table = f"t_{uuid.uuid4().hex[:10]}"
        self.failed = f"{self.table}_failed"
        self.queue = f"orders-{uuid.uuid4().hex[:8]}"
        self.opened: list[SqlBinding] = []

    def make(self, **options: Any) -> SqlBinding:
        binding = SqlBinding(SqlConfig(url=self.url, table=self.table, **options))
        self.opened.append(binding)
        return binding

    def query(self, sql: str) -> list[Any]:
        engine = sa.create_engine(self.url)
        try:
            with engine.connect() as conn:
                return list(conn.execute(sa.text(sql)).all())
        finally:
            engine.dispose()

    def cleanup(self) -> None:
        for binding in self.opened:
            binding.close()
        engine = sa.create_engine(self.url)
        with engine.begin() as conn:
            for name in (self.table, self.failed):
                conn.execute(sa.text(f'DROP TABLE IF EXISTS "{name}"'))
        engine.dispose()


#: For the tests of processes racing or killed: what they check is the database's locking, the same statements
#: on either PostgreSQL driver, so psycopg 3 would add their seconds and nothing else.
TWO_DRIVERS = pytest.mark.parametrize("target", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture(params=["sqlite", "postgresql", "psycopg3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param != "sqlite":
        if reason := _postgres_unavailable():
            pytest.fail(reason)
        # psycopg 3 binds parameters on the server, where a query with parameters holds one statement
        chosen = Target(POSTGRES_URL if request.param == "postgresql" else PSYCOPG3_URL)
    else:
        chosen = Target(sqlite_url(tmp_path / "queue.sqlite"))
    yield chosen
    chosen.cleanup()


def body_for(queue_name: str, n: int = 0) -> bytes:
    return bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n}, queue_name=queue_name))


def must_reserve(binding: SqlBinding, queue_name: str, timeout: float = 2.0) -> ReceivedMessage:
    message = binding.reserve(queue_name, timeout=timeout)
    assert message is not None, f"expected a message on {queue_name}"
    return message


# ------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "table", ["", "jobs;DROP TABLE x", "jobs failed", "a-b", "1jobs", 'jobs"', "schema.jobs", "jöbs", "t" * 41]
)
def test_table_names_that_are_not_plain_identifiers_are_rejected(table: str) -> None:
    with pytest.raises(ValueError, match="table"):
        SqlConfig(url="sqlite://", table=table)


@pytest.mark.parametrize("table", ["jobs", "_jobs", "Jobs_2", "t" * 40])
def test_plain_identifiers_are_accepted(table: str) -> None:
    assert SqlConfig(url="sqlite://", table=table).table == table


@pytest.mark.parametrize(
    ("options", "match"),
    [({"visibility_timeout": 0}, "visibility_timeout"), ({"poll_interval": -1}, "poll_interval"),
     ({"url": "not a url"}, "url")],
)
def test_other_config_errors_are_clear(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SqlConfig(**{"url": "sqlite://", **options})


def test_sqlite_url_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = sqlite_url("sub/q.db")
    assert url == f"sqlite:///{tmp_path.resolve()}/sub/q.db"
    assert sa.make_url(url).database == str(tmp_path.resolve() / "sub" / "q.db")


def test_repr_and_errors_hide_the_password_and_init_does_not_connect() -> None:
    config = SqlConfig(url="postgresql+psycopg2://bq:s3cret@127.0.0.1:1/none", table="jobs")
    assert "s3cret" not in repr(config)
    binding = SqlBinding(config)  # would raise here if __init__ connected
    with pytest.raises(BindingError) as info:
        binding.depth("orders")
    text = str(info.value)
    assert "s3cret" not in text and "127.0.0.1:1" in text and "'jobs'" in text and "'orders'" in text
    binding.close()


def test_missing_tables_without_create_tables_say_so(tmp_path: Path) -> None:
    binding = SqlBinding(SqlConfig(url=sqlite_url(tmp_path / "q.db"), table="absent", create_tables=False))
    with pytest.raises(BindingError, match="absent.*create_tables"):
        binding.publish(b"{}", "orders")
    binding.close()


def test_an_injected_engine_is_used_and_left_open(tmp_path: Path) -> None:
    engine = sa.create_engine(sqlite_url(tmp_path / "q.db"))
    disposed: list[bool] = []
    engine.dispose = lambda *a, **k: disposed.append(True)  # type: ignore[method-assign]
    with SqlBinding(SqlConfig(url="sqlite://", table="jobs"), engine=engine) as binding:
        binding.publish(b"x", "q")
        assert binding.dead_letter_name("q") == "jobs_failed"
    assert disposed == []
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT payload FROM jobs")).scalar_one() == b"x"


# ------------------------------------------------------------------------------------------ layout


def test_tables_have_the_shared_pdo_layout(target: Target) -> None:
    binding = target.make()
    body = body_for(target.queue, 3)
    binding.publish(body, target.queue)
    binding.release(must_reserve(binding, target.queue))
    message = must_reserve(binding, target.queue)
    before = bq.now_ms()
    binding.dead_letter(message, bq.Reason.FAILED, error="Payment gateway timeout", exception="GatewayTimeout")

    engine = sa.create_engine(target.url)
    ready_columns = {c["name"] for c in sa.inspect(engine).get_columns(target.table)}
    engine.dispose()
    assert {"id", "queue", "payload", "attempts", "reserved_at", "available_at", "created_at"} <= ready_columns
    rows = target.query(f"SELECT id, urn, attempts, reason, failed_at, payload FROM {target.failed} ORDER BY id DESC")
    assert len(rows) == 1
    _, urn, attempts, reason, failed_at, payload = rows[0]
    assert (urn, attempts, reason) == ("urn:babel:orders:created", 1, "failed")
    assert type(failed_at) is int and before <= failed_at <= bq.now_ms()
    env = bq.decode(bytes(payload))
    assert env["dead_letter"]["reason"] == "failed" and env["dead_letter"]["original_queue"] == target.queue
    assert env["dead_letter"]["attempts"] == 1 and env["meta"] == bq.decode(body)["meta"]
    assert bytes(payload) == binding.browse_dead_letters(target.queue)[0].body
    extra = target.query(f"SELECT queue, error, exception FROM {target.failed}")
    assert [tuple(r) for r in extra] == [(target.queue, "Payment gateway timeout", "GatewayTimeout")]
    assert target.query(f"SELECT COUNT(*) FROM {target.table}")[0][0] == 0
    assert binding.dead_letter_name(target.queue) == target.failed


def test_invalid_utf8_bodies_round_trip_byte_exact(target: Target) -> None:
    binding = target.make()
    binding.publish(INVALID_UTF8[0], target.queue)
    binding.publish_batch(INVALID_UTF8[1:], target.queue)
    received = [must_reserve(binding, target.queue) for _ in INVALID_UTF8]
    assert [m.body for m in received] == INVALID_UTF8
    assert all(m.envelope is None and m.decode_error and m.attempts == 0 for m in received)
    binding.release(received[0])
    again = must_reserve(binding, target.queue)
    assert again.body == INVALID_UTF8[0]
    for message in [again, *received[1:]]:
        binding.dead_letter(message, bq.Reason.POISON, error=message.decode_error)
    stored = [bytes(r[0]) for r in target.query(f"SELECT payload FROM {target.failed} ORDER BY id")]
    assert stored == INVALID_UTF8  # the payload column keeps the bytes; the reason is in its own column
    assert [kept(m) for m in binding.browse_dead_letters(target.queue)] == INVALID_UTF8
    drained = [binding.reserve_dead_letter(target.queue, timeout=1) for _ in INVALID_UTF8]
    assert [kept(m) for m in drained if m is not None] == INVALID_UTF8


# ------------------------------------------------------------------------------------ reservations


def test_a_late_settle_after_the_row_was_reclaimed_changes_nothing(target: Target) -> None:
    binding = target.make(visibility_timeout=0.5)
    body = body_for(target.queue)
    binding.publish(body, target.queue)
    stale = must_reserve(binding, target.queue)
    time.sleep(0.7)
    current = must_reserve(binding, target.queue, timeout=0)
    assert current.body == body and current.receipt != stale.receipt
    binding.ack(stale)
    binding.release(stale)
    binding.dead_letter(stale, "failed")
    assert target.query(f"SELECT COUNT(*) FROM {target.table}")[0][0] == 1
    assert binding.dead_letter_depth(target.queue) == 0 and binding.reserve(target.queue, timeout=0) is None
    binding.ack(current)
    assert target.query(f"SELECT COUNT(*) FROM {target.table}")[0][0] == 0


def test_dead_letter_reservations_expire_and_release(target: Target) -> None:
    binding = target.make(visibility_timeout=0.5)
    binding.publish(body_for(target.queue), target.queue)
    binding.dead_letter(must_reserve(binding, target.queue), "unknown_urn")
    held = binding.reserve_dead_letter(target.queue)
    assert held is not None and held.from_dead_letter
    assert binding.dead_letter_depth(target.queue) == 0 and binding.reserve_dead_letter(target.queue) is None
    assert len(binding.browse_dead_letters(target.queue)) == 1  # browsing sees reserved rows too
    time.sleep(0.7)
    again = binding.reserve_dead_letter(target.queue, timeout=1)
    assert again is not None and again.body == held.body
    binding.release(again)
    assert binding.dead_letter_depth(target.queue) == 1
    binding.ack(must_not_none(binding.reserve_dead_letter(target.queue)))
    assert binding.dead_letter_depth(target.queue) == 0
    assert target.query(f"SELECT COUNT(*) FROM {target.failed}")[0][0] == 0


def must_not_none(message: ReceivedMessage | None) -> ReceivedMessage:
    assert message is not None
    return message


def _drain(binding: SqlBinding, queue_name: str, sink: Callable[[bytes], None]) -> None:
    while (message := binding.reserve(queue_name, timeout=0.5)) is not None:
        binding.ack(message)
        sink(message.body)


def _assert_each_once(got: list[bytes], bodies: list[bytes]) -> None:
    counts = collections.Counter(got)
    assert [b for b, n in counts.items() if n > 1] == []
    assert len(got) == len(bodies) == 300 and set(got) == set(bodies)


def test_concurrent_threads_get_each_message_exactly_once(target: Target) -> None:
    bodies = [body_for(target.queue, i) for i in range(300)]
    target.make().publish_batch(bodies, target.queue)
    got: list[bytes] = []
    start = threading.Barrier(4)
    consumers = [target.make() for _ in range(4)]  # separate engines: separate connection pools

    def consume(binding: SqlBinding) -> None:
        start.wait()
        _drain(binding, target.queue, got.append)

    threads = [threading.Thread(target=consume, args=(b,)) for b in consumers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    _assert_each_once(got, bodies)
    assert target.query(f"SELECT COUNT(*) FROM {target.table}")[0][0] == 0


def _process_consumer(url: str, table: str, queue_name: str, started: Any, go: Any, out: Any) -> None:
    with SqlBinding(SqlConfig(url=url, table=table)) as binding:
        binding.depth(queue_name)  # connect before the race starts
        started.put(True)
        go.wait(60)
        got: list[bytes] = []
        _drain(binding, queue_name, got.append)
    out.put(got)


@TWO_DRIVERS
def test_concurrent_processes_get_each_message_exactly_once(target: Target) -> None:
    bodies = [body_for(target.queue, i) for i in range(300)]
    target.make().publish_batch(bodies, target.queue)
    ctx = multiprocessing.get_context("spawn")
    started, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_process_consumer, args=(target.url, target.table, target.queue, started, go, out))
        for _ in range(2)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        started.get(timeout=60)
    got: list[bytes] = []
    threads = [threading.Thread(target=_drain, args=(target.make(), target.queue, got.append)) for _ in range(2)]
    go.set()
    for thread in threads:
        thread.start()
    from_children = [out.get(timeout=120) for _ in procs]
    for thread in threads:
        thread.join(timeout=120)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    _assert_each_once(got + [b for chunk in from_children for b in chunk], bodies)


_CRASHING_CONSUMER = """
import os, signal, sys
from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig
url, table, queue = sys.argv[1:4]
binding = SqlBinding(SqlConfig(url=url, table=table, visibility_timeout=1.0))
message = binding.reserve(queue, timeout=5)
sys.stdout.write(message.body.hex())
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


@TWO_DRIVERS
def test_kill_9_between_reserve_and_ack_loses_nothing(target: Target) -> None:
    body = body_for(target.queue, 42)
    binding = target.make(visibility_timeout=1.0)
    binding.publish(body, target.queue)
    child = subprocess.run(
        [sys.executable, "-c", _CRASHING_CONSUMER, target.url, target.table, target.queue],
        capture_output=True, timeout=60, check=False,
    )
    killed_at = time.monotonic()
    assert child.returncode == -signal.SIGKILL, child.stderr.decode(errors="replace")
    assert bytes.fromhex(child.stdout.decode()) == body
    assert binding.reserve(target.queue, timeout=0) is None and binding.depth(target.queue) == 0
    assert [bytes(r[0]) for r in target.query(f"SELECT payload FROM {target.table}")] == [body]
    time.sleep(max(0.0, 1.3 - (time.monotonic() - killed_at)))
    recovered = must_reserve(binding, target.queue, timeout=3)
    assert recovered.body == body and recovered.attempts == 0
    binding.ack(recovered)
    assert binding.reserve(target.queue, timeout=0) is None
    assert target.query(f"SELECT COUNT(*) FROM {target.table}")[0][0] == 0


# ------------------------------------------------------------------------------------- batch operations


def seed_dead_letters(binding: SqlBinding, queue_name: str, count: int) -> list[bytes]:
    """``count`` rows straight into ``<table>_failed`` (as any SDK writes them: the annotated envelope), oldest
    first."""
    bodies = [bq.encode(bq.annotate_dead_letter(bq.decode(body_for(queue_name, n)), "failed", original_queue=queue_name,
                                                attempts=3)) for n in range(count)]
    rows = [{"queue": queue_name, "urn": "urn:babel:orders:created", "attempts": 3, "reason": "failed", "error": None,
             "exception": None, "failed_at": bq.now_ms(), "payload": body, "reserved_at": None} for body in bodies]
    with binding._write() as conn:
        conn.execute(sa.insert(binding._failed), rows)
    return bodies


def test_a_batch_reservation_stamps_every_row_with_one_fresh_token(target: Target) -> None:
    binding = target.make(visibility_timeout=0.5)
    bodies = seed_dead_letters(binding, target.queue, 5)
    first = binding.reserve_dead_letters(target.queue, 3)
    assert [m.body for m in first] == bodies[:3] and all(m.attempts == 3 for m in first)
    tokens = {m.receipt.token for m in first}
    assert len(tokens) == 1 and len({m.receipt.row_id for m in first}) == 3
    stamped = target.query(f"SELECT id, reserved_at FROM {target.failed} WHERE reserved_at IS NOT NULL ORDER BY id")
    assert [(row[0], row[1]) for row in stamped] == [(m.receipt.row_id, m.receipt.token) for m in first]
    time.sleep(0.7)
    again = binding.reserve_dead_letters(target.queue, 10)  # the expired three come first again (by id)
    assert [m.body for m in again] == bodies
    assert {m.receipt.token for m in again} == {again[0].receipt.token} and again[0].receipt.token > tokens.pop()
    binding.ack_many(first)  # stale receipts: nothing is deleted
    assert target.query(f"SELECT COUNT(*) FROM {target.failed}")[0][0] == 5
    binding.ack_many(again[1:4])
    binding.release_many([again[0], again[4]])
    assert [m.body for m in binding.browse_dead_letters(target.queue)] == [bodies[0], bodies[4]]
    assert binding.dead_letter_depth(target.queue) == 2


def test_concurrent_batch_drains_get_each_dead_letter_exactly_once(target: Target) -> None:
    bodies = seed_dead_letters(target.make(), target.queue, 300)
    got: list[bytes] = []
    start = threading.Barrier(4)
    drains = [target.make() for _ in range(4)]  # separate engines: separate connection pools

    def drain(binding: SqlBinding) -> None:
        start.wait()
        while batch := binding.reserve_dead_letters(target.queue, 17, timeout=0.3):
            binding.ack_many(batch)
            got.extend(m.body for m in batch)

    threads = [threading.Thread(target=drain, args=(b,)) for b in drains]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    _assert_each_once(got, bodies)
    assert target.query(f"SELECT COUNT(*) FROM {target.failed}")[0][0] == 0


def test_release_many_of_ready_rows_bumps_attempts_and_delays(target: Target) -> None:
    binding = target.make()
    bodies = [body_for(target.queue, n) for n in range(3)]
    binding.publish_batch(bodies, target.queue)
    held = [must_reserve(binding, target.queue) for _ in bodies]
    binding.release_many(held[:2])
    binding.release_many(held[2:], delay=30)
    assert binding.depth(target.queue) == 2
    again = [must_reserve(binding, target.queue) for _ in range(2)]
    assert [m.attempts for m in again] == [1, 1] and binding.reserve(target.queue, timeout=0) is None
    rows = target.query(f"SELECT attempts, reserved_at FROM {target.table} ORDER BY id")
    assert [row[0] for row in rows] == [1, 1, 1] and rows[2][1] is None


def test_remember_many_is_idempotent_under_concurrency(target: Target) -> None:
    stores = [target.make().seen_store("ledger") for _ in range(3)]
    keys = [f"id-{i}" for i in range(1500)]
    start = threading.Barrier(3)
    errors: list[BaseException] = []

    def remember(store: Any, part: list[str]) -> None:
        start.wait()
        try:
            store.remember_many(part)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    parts = [keys[:1000], keys[500:], keys[::2]]  # overlapping: the same keys race
    threads = [threading.Thread(target=remember, args=pair) for pair in zip(stores, parts, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    try:
        assert errors == []
        assert len(stores[0]) == 1500 and stores[1].seen_many(keys + ["nope"]) == set(keys)
    finally:
        engine = sa.create_engine(target.url)
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP TABLE IF EXISTS "{target.table}_seen"'))
        engine.dispose()


def test_a_dead_letter_row_is_written_whatever_the_message_holds(target: Target,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """NUL in the URN and the error, a lone surrogate, and attempts past 32 bits: PostgreSQL refused each one in
    the dead-letter INSERT, which left the row reserved at the head of the queue. On a table created with a 32-bit
    ``attempts`` (an earlier version's), the column is clamped and a warning says how to widen it."""
    if target.url.startswith("postgresql"):
        engine = sa.create_engine(target.url)
        with engine.begin() as conn:  # the earlier layout: attempts INTEGER
            conn.execute(sa.text(
                f"CREATE TABLE {target.failed} (id BIGSERIAL PRIMARY KEY, queue VARCHAR(255) NOT NULL, urn TEXT, "
                "attempts INTEGER NOT NULL DEFAULT 0, reason TEXT NOT NULL, error TEXT, exception TEXT, "
                "failed_at BIGINT NOT NULL, payload BYTEA NOT NULL, reserved_at DOUBLE PRECISION)"))
        engine.dispose()
    binding = target.make()
    envelope = bq.make_envelope("urn:babel:orders:cre\x00ated", {"note": "a\x00b"}, queue_name=target.queue)
    envelope["attempts"] = 2**31 + 5
    body = bq.encode(envelope)
    binding.publish(body, target.queue)
    message = must_reserve(binding, target.queue)
    with caplog.at_level("WARNING"):
        binding.dead_letter(message, bq.Reason.FAILED, error="handler said a\x00b \ud800", exception="E\x00")
    [(urn, attempts, error, exception, payload)] = target.query(
        f"SELECT urn, attempts, error, exception, payload FROM {target.failed}")
    assert (urn, error, exception) == ("urn:babel:orders:created", "handler said ab \ufffd", "E")
    stored = bq.decode(bytes(payload))
    assert stored["job"] == "urn:babel:orders:cre\x00ated" and stored["attempts"] == 2**31 + 5  # payload exact
    assert stored["dead_letter"]["error"] == "handler said a\x00b \ufffd"
    old_layout = target.url.startswith("postgresql")
    assert attempts == (2**31 - 1 if old_layout else 2**31 + 5)
    assert ("ALTER COLUMN attempts TYPE BIGINT" in caplog.text) == old_layout
    assert binding.depth(target.queue) == 0 and binding.dead_letter_depth(target.queue) == 1


# ------------------------------------------------------------------------------------------ SQLite's driver path


def test_a_locked_sqlite_database_fails_the_batch_with_the_hint_and_loses_nothing(tmp_path: Path) -> None:
    """The consumer's batch statements run on SQLite's driver: its "database is locked" still becomes a
    BindingError that says what to do, the previous batch stays reserved, and the next call settles it."""
    import sqlite3

    path = tmp_path / "q.db"
    engine = sa.create_engine(sqlite_url(path), connect_args={"timeout": 0.2})  # short busy wait: fail fast
    bodies = [body_for("q", n) for n in range(5)]
    with SqlBinding(SqlConfig(url="sqlite://", table="jobs"), engine=engine) as binding:
        binding.publish_batch(bodies, "q")
        first = binding.settle_and_reserve("q", 2)
        assert [m.body for m in first] == bodies[:2]
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the busy timeout
        try:
            with pytest.raises(BindingError, match="another connection held the database lock too long"):
                binding.settle_and_reserve("q", 2, acks=first)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        second = binding.settle_and_reserve("q", 10, acks=first)  # the same acks, again: nothing was settled
        assert [m.body for m in second] == bodies[2:]
        binding.settle(second)
        assert (binding.depth("q"), binding.dead_letter_depth("q")) == (0, 0)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar_one() == 0
        # the pooled driver connection is back in its implicit-transaction mode for SQLAlchemy's own statements
        driver = conn.connection.driver_connection
        assert driver is not None and driver.isolation_level == ""


def test_a_batch_released_and_acked_on_sqlite_keeps_each_outcome(tmp_path: Path) -> None:
    """The driver's executemany release: attempts one higher in the column and the body, each its own delay;
    the acked rows gone; an unread body (over the decode limit) released as stored."""
    with SqlBinding(SqlConfig(url=sqlite_url(tmp_path / "q.db"), table="jobs")) as binding:
        binding.decode_limit = 400
        big = bq.encode(bq.make_envelope("urn:babel:orders:created", {"pad": "x" * 500}, queue_name="q"))
        bodies = [body_for("q", 0), body_for("q", 1), big]
        binding.publish_batch(bodies, "q")
        taken = binding.settle_and_reserve("q", 3)
        assert [m.stored_size for m in taken] == [None, None, len(big)]
        binding.settle([taken[0]], [(taken[1], 0.0), (taken[2], 3600.0)])
        again = binding.settle_and_reserve("q", 3)
        assert [(m.attempts, bq.decode(m.body)["attempts"]) for m in again] == [(1, 1)]
        assert bq.decode(again[0].body)["meta"] == bq.decode(bodies[1])["meta"]
        with binding._read() as conn:
            rows = conn.execute(sa.text("SELECT attempts, payload, available_at > :soon FROM jobs ORDER BY id"),
                                {"soon": time.time() + 3000}).all()
        assert [(attempts, later) for attempts, _, later in rows] == [(1, 0), (1, 1)]
        assert rows[1][1] == big  # unread: released as stored, its count in the column


@pytest.fixture
def pg_target() -> Iterator[Target]:
    if reason := _postgres_unavailable():
        pytest.fail(reason)
    chosen = Target(POSTGRES_URL)
    yield chosen
    chosen.cleanup()


def _driver_autocommit(binding: SqlBinding) -> bool:
    with binding._get_engine().connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        return bool(driver.autocommit)


def test_postgresql_settle_and_reserve_is_all_or_nothing(pg_target: Target) -> None:
    """The previous batch's acks and the next reserve go to PostgreSQL as one query, which the server runs as one
    transaction: when the reserve fails (here a trigger refuses every update of the table), the acks are undone
    with it, the error says what failed, and the same call once the fault is gone settles them and reserves."""
    binding = pg_target.make()
    bodies = [body_for(pg_target.queue, n) for n in range(6)]
    binding.publish_batch(bodies, pg_target.queue)
    first = binding.settle_and_reserve(pg_target.queue, 2)
    assert [m.body for m in first] == bodies[:2]
    table = f'"{pg_target.table}"'
    engine = sa.create_engine(POSTGRES_URL)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE FUNCTION {pg_target.table}_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'updates refused by the test trigger'; END $$")
            conn.exec_driver_sql(f"CREATE TRIGGER refuse BEFORE UPDATE ON {table} FOR EACH ROW "
                                 f"EXECUTE FUNCTION {pg_target.table}_refuse()")
        with pytest.raises(BindingError, match=r"could not settle and reserve .*updates refused by the test trigger"):
            binding.settle_and_reserve(pg_target.queue, 2, acks=first)
        # the DELETE of the acks ran before the failing UPDATE, and was rolled back with it
        assert pg_target.query(f"SELECT count(*) FROM {table}") == [(6,)]
        assert not _driver_autocommit(binding)  # the pool's connections are back in transaction mode
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TRIGGER refuse ON {table}")
            conn.exec_driver_sql(f"DROP FUNCTION {pg_target.table}_refuse()")
    finally:
        engine.dispose()
    second = binding.settle_and_reserve(pg_target.queue, 10, acks=first)
    assert [m.body for m in second] == bodies[2:]
    assert pg_target.query(f"SELECT count(*) FROM {table}") == [(4,)]
    binding.settle(second)
    assert (binding.depth(pg_target.queue), binding.dead_letter_depth(pg_target.queue)) == (0, 0)
    assert not _driver_autocommit(binding)


def _backend_pid(binding: SqlBinding) -> int:
    """The server process of the binding's pooled connection (one in the pool: the one the next batch takes)."""
    with binding._get_engine().connect() as conn:
        return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def test_a_postgresql_connection_dropped_between_batches_is_replaced_and_loses_nothing(
        pg_target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server ends the consumer's pooled connection between two batches (a restart, an idle killer) while the
    pool still counts it fresh: the next settle-and-reserve fails with the hint to check the database, its acks
    not applied; the dead connection is dropped from the pool, so the same call again goes through on a new one
    and settles them."""
    monkeypatch.setattr(sql_engine, "_FRESH_SECONDS", 60.0)  # no checkout ping: the batch's own query meets it
    binding = pg_target.make()
    bodies = [body_for(pg_target.queue, n) for n in range(5)]
    binding.publish_batch(bodies, pg_target.queue)
    first = binding.settle_and_reserve(pg_target.queue, 2)
    pid = _backend_pid(binding)
    assert pg_target.query(f"SELECT pg_terminate_backend({pid}, 5000)") == [(True,)]  # waits for it to end
    with pytest.raises(BindingError, match="cannot reach the database"):
        binding.settle_and_reserve(pg_target.queue, 2, acks=first)
    assert pg_target.query(f'SELECT count(*) FROM "{pg_target.table}"') == [(5,)]
    second = binding.settle_and_reserve(pg_target.queue, 10, acks=first)
    assert [m.body for m in second] == bodies[2:]
    binding.settle(second)
    assert (binding.depth(pg_target.queue), binding.dead_letter_depth(pg_target.queue)) == (0, 0)
    assert _backend_pid(binding) != pid


def test_a_postgresql_connection_idle_in_the_pool_is_pinged_and_handed_out_idle(
        pg_target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooled connection that sat idle is pinged at checkout: a dead one is replaced without a failed batch, and
    a live one is handed out outside a transaction (the ping's own is ended), which the batch query's autocommit
    switch needs."""
    import psycopg2.extensions

    monkeypatch.setattr(sql_engine, "_FRESH_SECONDS", 0.0)  # every checkout pings
    binding = pg_target.make()
    bodies = [body_for(pg_target.queue, n) for n in range(4)]
    binding.publish_batch(bodies, pg_target.queue)
    first = binding.settle_and_reserve(pg_target.queue, 2)
    with binding._get_engine().connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        assert driver.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    pid = _backend_pid(binding)
    assert pg_target.query(f"SELECT pg_terminate_backend({pid}, 5000)") == [(True,)]
    second = binding.settle_and_reserve(pg_target.queue, 10, acks=first)  # no error: replaced at checkout
    assert [m.body for m in second] == bodies[2:]
    binding.settle(second)
    assert (binding.depth(pg_target.queue), binding.dead_letter_depth(pg_target.queue)) == (0, 0)
    assert _backend_pid(binding) != pid


def test_a_consumer_run_settles_each_outcome_on_every_driver(target: Target) -> None:
    """A run over batches holding handled, retried-then-failed and unknown-URN messages, on each driver (the
    psycopg 3 path settles and reserves in separate statements): every message ends as its handler decided."""
    from airflow_provider_babelqueue.engine.consume import Backoff, Consumer

    binding = target.make()
    bodies = [body_for(target.queue, n) for n in range(12)]
    stray = bq.encode(bq.make_envelope("urn:babel:orders:unknown", {"n": 99}, queue_name=target.queue))
    binding.publish_batch([*bodies, stray], target.queue)

    def handle(envelope: dict[str, Any]) -> None:
        if envelope["data"]["n"] % 4 == 0:
            raise RuntimeError(f"order {envelope['data']['n']} refused")

    consumer = Consumer(binding, target.queue, {"urn:babel:orders:created": handle}, max_attempts=2,
                        backoff=Backoff("fixed", 0), batch_size=5)
    summary = consumer.run(reserve_timeout=0.5)
    assert (summary.handled, summary.retried) == (9, 3)
    assert dict(summary.dead_lettered) == {"failed": 3, "unknown_urn": 1}
    assert (binding.depth(target.queue), binding.dead_letter_depth(target.queue)) == (0, 4)
    dead = binding.reserve_dead_letters(target.queue, 10)
    envelopes = [m.envelope for m in dead]
    assert all(envelope is not None for envelope in envelopes)
    failed = sorted(e["data"]["n"] for e in envelopes if e is not None and e["dead_letter"]["reason"] == "failed")
    assert failed == [0, 4, 8]
    assert {e["dead_letter"]["attempts"] for e in envelopes if e is not None and e["data"]["n"] != 99} == {2}


def test_a_postgresql_batch_query_that_fails_outside_the_driver_drops_its_connection(pg_target: Target) -> None:
    """The batch query switches its connection to autocommit for one call: when the call fails with an error that
    is not the driver's (here a parameter whose adaptation raises), the connection is dropped from the pool, not
    returned in autocommit, where SQLAlchemy's later transactions would run a statement at a time."""

    class Refuses:
        def __conform__(self, _protocol: object) -> None:  # psycopg2 asks a value it has no adapter for
            raise RuntimeError("this value refuses to be sent")

    binding = pg_target.make()
    body = body_for(pg_target.queue)
    binding.publish_batch([body], pg_target.queue)
    before = _backend_pid(binding)
    with pytest.raises(RuntimeError, match="refuses to be sent"):
        binding._at_once("SELECT %(value)s", {"value": Refuses()})
    assert not _driver_autocommit(binding)
    assert _backend_pid(binding) != before
    taken = binding.reserve_many(pg_target.queue, 10)
    assert [m.body for m in taken] == [body]
