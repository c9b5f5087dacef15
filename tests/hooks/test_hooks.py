"""Hooks and the connection resolver, against the real brokers on this machine."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import redis as redis_client
import sqlalchemy

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue import hooks as hooks_module
from airflow_provider_babelqueue.bindings.base import BindingError
from airflow_provider_babelqueue.hooks import DEFAULT_CONN_ID, default_sqlite_path, get_hook, remote_executors
from airflow_provider_babelqueue.hooks.base import ConnectionConfigError
from airflow_provider_babelqueue.hooks.redis import BabelQueueRedisHook
from airflow_provider_babelqueue.hooks.sql import BabelQueueSqlHook

PG = {"conn_type": "babelqueue+sql", "host": "127.0.0.1", "port": 5432, "login": "postgres", "schema": "test"}


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, spec: dict) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(spec))
    return conn_id


def round_trip(hook) -> None:  # type: ignore[no-untyped-def]
    binding = hook.get_binding()
    queue_name = f"hook-{uuid.uuid4().hex[:8]}"
    body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": 1}, queue_name=queue_name))
    binding.publish(body, queue_name)
    message = binding.reserve(queue_name, timeout=2)
    assert message is not None and message.body == body
    binding.ack(message)


def test_default_connection_is_the_embedded_sqlite_queue(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.delenv(f"AIRFLOW_CONN_{DEFAULT_CONN_ID.upper()}", raising=False)
    hook = get_hook()
    assert isinstance(hook, BabelQueueSqlHook)
    assert default_sqlite_path() == tmp_path / "babelqueue.sqlite"
    round_trip(hook)
    assert (tmp_path / "babelqueue.sqlite").is_file()
    assert hook.test_connection() == (
        True,
        f"Connected to BabelQueue SQL at sqlite file {tmp_path / 'babelqueue.sqlite'}",
    )
    hook.close()


@pytest.mark.parametrize(
    ("executor", "remote"),
    [
        ("LocalExecutor", []),
        ("airflow.executors.local_executor.LocalExecutor", []),
        ("CeleryExecutor", ["CeleryExecutor"]),
        ("LocalExecutor, fast:airflow.providers.cncf.kubernetes.executors.kubernetes_executor.KubernetesExecutor",
         ["fast:airflow.providers.cncf.kubernetes.executors.kubernetes_executor.KubernetesExecutor"]),
    ],
)
def test_the_embedded_default_under_a_spread_executor_is_warned_about_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path, executor: str,
    remote: list[str],
) -> None:
    """Each worker of a Celery or Kubernetes deployment has its own ``$AIRFLOW_HOME``: the embedded default is then
    one queue per machine, and a message published on one is never seen on another."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", executor)
    monkeypatch.delenv(f"AIRFLOW_CONN_{DEFAULT_CONN_ID.upper()}", raising=False)
    monkeypatch.setattr(hooks_module, "_spread_warned", False)
    assert remote_executors(executor) == remote
    with caplog.at_level("WARNING", logger="airflow_provider_babelqueue.hooks"):
        get_hook().close()
        get_hook().close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "airflow_provider_babelqueue.hooks"]
    if not remote:
        assert warnings == []
        return
    assert len(warnings) == 1
    assert warnings[0].startswith(
        f"babelqueue_default is not defined, so it is the embedded SQLite queue at {tmp_path / 'babelqueue.sqlite'} "
        f"on this machine. The executor {', '.join(remote)} runs tasks on several machines"
    )
    caplog.clear()
    monkeypatch.setattr(hooks_module, "_spread_warned", False)
    define(monkeypatch, DEFAULT_CONN_ID, {"conn_type": "babelqueue+sql", "host": str(tmp_path / "q.sqlite")})
    with caplog.at_level("WARNING", logger="airflow_provider_babelqueue.hooks"):
        get_hook().close()  # a defined babelqueue_default is the team's choice: nothing to say
    assert [r for r in caplog.records if r.name == "airflow_provider_babelqueue.hooks"] == []


def test_the_default_defined_by_its_type_alone_is_the_same_file(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """docs/connections/sql.md: defining ``babelqueue_default`` with its type alone (so Airflow's own commands can
    test it) keeps the embedded file."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    define(monkeypatch, DEFAULT_CONN_ID, {"conn_type": "babelqueue+sql"})
    with get_hook() as hook:
        round_trip(hook)
        assert hook.test_connection() == (True, f"Connected to BabelQueue SQL at sqlite file {default_sqlite_path()}")
    assert default_sqlite_path() == tmp_path / "babelqueue.sqlite" and default_sqlite_path().is_file()


def test_sqlite_connection_with_a_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "queues.db"
    conn_id = define(monkeypatch, "bq_sqlite", {"conn_type": "babelqueue+sql", "host": str(path)})
    hook = get_hook(conn_id)
    round_trip(hook)
    hook.close()
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    assert {"jobs", "jobs_failed"} <= set(sqlalchemy.inspect(engine).get_table_names())
    engine.dispose()


def test_postgresql_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    table = f"h_{uuid.uuid4().hex[:8]}"
    conn_id = define(monkeypatch, "bq_pg", PG | {"extra": {"dialect": "postgresql", "table": table}})
    hook = get_hook(conn_id)
    assert isinstance(hook, BabelQueueSqlHook)
    try:
        round_trip(hook)
        assert hook.test_connection() == (True, "Connected to BabelQueue SQL at 127.0.0.1:5432/test")
    finally:
        hook.close()
        engine = sqlalchemy.create_engine("postgresql+psycopg2://postgres@127.0.0.1:5432/test")
        with engine.begin() as conn:
            for name in (table, f"{table}_failed"):
                conn.execute(sqlalchemy.text(f'DROP TABLE IF EXISTS "{name}"'))
        engine.dispose()


def test_redis_connection_reads_allowlisted_extras_only(monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"bqhook:{uuid.uuid4().hex[:8]}:"
    extra = {
        "key_prefix": prefix,
        "dead_letter_suffix": ".dlq",
        "visibility_timeout": "30",
        "socket_timeout": 0.001,
        "password": "not-read-from-extra",
    }
    conn_id = define(
        monkeypatch, "bq_redis", {"conn_type": "babelqueue+redis", "host": "127.0.0.1", "port": 6379, "extra": extra}
    )
    hook = get_hook(conn_id)
    assert isinstance(hook, BabelQueueRedisHook)
    config = hook.get_binding().config
    assert (config.key_prefix, config.dead_letter_suffix, config.visibility_timeout) == (prefix, ".dlq", 30.0)
    assert config.password is None and config.socket_timeout != 0.001
    binding = hook.get_binding()
    binding.publish(bq.encode(bq.make_envelope("urn:x", {})), "orders")
    binding.dead_letter(binding.reserve("orders", timeout=1), "failed")
    client = redis_client.Redis(host="127.0.0.1", port=6379)
    try:
        assert client.llen(f"{prefix}orders.dlq") == 1
    finally:
        client.delete(*client.keys(f"{prefix}*"))
        client.close()
        hook.close()


def test_other_connection_types_are_refused_with_the_expected_types(monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = define(monkeypatch, "bq_http", {"conn_type": "http", "host": "example.invalid"})
    with pytest.raises(BindingError, match=r"type 'http'.*babelqueue\+redis, babelqueue\+servicebus, babelqueue\+sql"):
        get_hook(conn_id)


def test_a_missing_non_default_connection_is_an_error() -> None:
    from airflow.sdk.exceptions import AirflowNotFoundException

    with pytest.raises(AirflowNotFoundException):
        get_hook("bq_does_not_exist")


def test_hooks_look_nothing_up_when_constructed(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object, **kwargs: object) -> None:
        raise AssertionError("connection looked up at construction")

    monkeypatch.setattr(BabelQueueRedisHook, "get_connection", classmethod(explode))
    monkeypatch.setattr(BabelQueueSqlHook, "get_connection", classmethod(explode))
    BabelQueueRedisHook("anything")
    BabelQueueSqlHook("anything")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"conn_type": "babelqueue+redis", "host": "127.0.0.1", "port": 1}, "127.0.0.1:1"),
        (
            {
                "conn_type": "babelqueue+redis",
                "host": "127.0.0.1",
                "port": 6379,
                "login": "ghost",
                "password": "Hunter2-secret",
            },
            "127.0.0.1:6379",
        ),
        (PG | {"port": 1, "password": "Hunter2-secret", "extra": {"dialect": "postgresql"}}, "127.0.0.1"),
        ({"conn_type": "babelqueue+sql", "host": "/nonexistent-dir/x/queue.db"}, "/nonexistent-dir/x/queue.db"),
    ],
    ids=["redis-closed-port", "redis-bad-password", "postgres-closed-port", "sqlite-bad-path"],
)
def test_test_connection_says_what_is_wrong_without_secrets(
    monkeypatch: pytest.MonkeyPatch, spec: dict, fragment: str
) -> None:
    hook = get_hook(define(monkeypatch, "bq_bad", spec))
    ok, message = hook.test_connection()
    assert ok is False
    assert fragment in message, message
    assert "Hunter2-secret" not in message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"conn_type": "babelqueue+redis", "extra": {"visibility_timeout": "soon"}},
            "'visibility_timeout' must be a number",
        ),
        ({"conn_type": "babelqueue+redis", "extra": {"db": "zero"}}, "'db' must be a database number"),
        ({"conn_type": "babelqueue+redis", "extra": {"ssl": "maybe"}}, "'ssl' must be true or false"),
        ({"conn_type": "babelqueue+sql", "extra": {"dialect": "oracle"}}, "'dialect' must be 'sqlite' or 'postgresql'"),
    ],
)
def test_bad_extras_name_the_field(monkeypatch: pytest.MonkeyPatch, spec: dict, message: str) -> None:
    hook = get_hook(define(monkeypatch, "bq_extra", spec))
    with pytest.raises(ConnectionConfigError, match=message):
        hook.get_binding()


def test_test_connection_creates_no_tables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "probe.db"
    hook = get_hook(define(monkeypatch, "bq_probe", {"conn_type": "babelqueue+sql", "host": str(path)}))
    assert hook.test_connection()[0] is True
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    assert sqlalchemy.inspect(engine).get_table_names() == []
    engine.dispose()


def test_postgresql_tls_extras_reach_libpq(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local PostgreSQL has no TLS, so ``sslmode=require`` must be refused by libpq itself (proving the
    extra reaches it) and ``sslmode=disable`` must work; the password never shows in the message."""
    from airflow_provider_babelqueue.hooks.sql import sql_url

    plain = define(monkeypatch, "bq_pg_plain", PG | {"extra": {"dialect": "postgresql", "sslmode": "disable"}})
    ok, message = get_hook(plain).test_connection()
    assert ok, message
    tls = PG | {"password": "Hunter2-secret",
                "extra": {"dialect": "postgresql", "sslmode": "require", "sslrootcert": "/etc/ssl/ca.pem"}}
    ok, message = get_hook(define(monkeypatch, "bq_pg_tls", tls)).test_connection()
    assert ok is False and "server does not support SSL" in message, message
    assert "Hunter2-secret" not in message

    from airflow.sdk import Connection

    url = sql_url(Connection(conn_id="x", conn_type="babelqueue+sql", host="db", login="u", schema="d"),
                  {"dialect": "postgresql", "sslmode": "verify-full", "sslrootcert": "/etc/ca b.pem", "sslkey": ""})
    assert url == "postgresql+psycopg2://u@db/d?sslmode=verify-full&sslrootcert=%2Fetc%2Fca+b.pem"


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ({"conn_type": "babelqueue+redis", "host": "127.0.0.1", "port": 6379}, "redis"),
        ({"conn_type": "babelqueue+rabbitmq", "host": "127.0.0.1", "port": 5672}, "rabbitmq"),
        ({"conn_type": "babelqueue+sql"}, "sql"),
    ],
    ids=["redis", "rabbitmq", "sql"],
)
def test_max_message_bytes_extra_reaches_the_binding(monkeypatch: pytest.MonkeyPatch, spec: dict, kind: str,
                                                     tmp_path: Path) -> None:
    if kind == "sql":
        spec = spec | {"host": str(tmp_path / "q.sqlite")}
    hook = get_hook(define(monkeypatch, "bq_limit", spec | {"extra": {"max_message_bytes": "4096"}}))
    binding = hook.get_binding()
    assert binding.config.max_message_bytes == 4096
    big = bq.encode(bq.make_envelope("urn:babel:orders:created", {"pad": "x" * 5000}, queue_name="limits"))
    with pytest.raises(BindingError, match="max_message_bytes=4,096"):
        binding.publish(big, f"limits-{uuid.uuid4().hex[:6]}")
    hook.close()
    bad = get_hook(define(monkeypatch, "bq_limit_bad", spec | {"extra": {"max_message_bytes": "1.5k"}}))
    with pytest.raises(ConnectionConfigError, match="'max_message_bytes' must be a number"):
        bad.get_binding()


@pytest.mark.parametrize("conn_type,extra,expected", [
    ("babelqueue+redis", {}, ["orders:failed", "orders.dlq", "legacy-orders-dead"]),
    ("babelqueue+redis", {"dead_letter_sources": "none"}, ["orders:failed"]),
    ("babelqueue+sql", {"dialect": "sqlite", "path": ":memory:"}, ["jobs_failed"]),  # tables: its own setting only
])
def test_the_fleets_dead_letter_sources_apply_where_a_connection_names_none(
        monkeypatch: pytest.MonkeyPatch, conn_type: str, extra: dict[str, str], expected: list[str]) -> None:
    """``[babelqueue] dead_letter_sources`` is every connection's list unless the connection sets its own."""
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__DEAD_LETTER_SOURCES", ".dlq,legacy-{queue}-dead")
    conn_id = define(monkeypatch, "bq_fleet", {"conn_type": conn_type, "host": "127.0.0.1", "port": 6379,
                                               "extra": extra})
    hook = get_hook(conn_id)
    try:
        assert hook.get_binding().dead_letter_sources("orders") == expected
    finally:
        hook.close()


def test_a_hook_in_a_with_block_closes_its_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker sees the connection go when the block ends, also when the block raised."""
    conn_id = define(monkeypatch, "with_redis", {"conn_type": "babelqueue+redis", "host": "127.0.0.1", "port": 6379})
    admin = redis_client.Redis(host="127.0.0.1", port=6379)
    name = f"bq-with-{uuid.uuid4().hex[:8]}"

    def named() -> int:
        return sum(1 for client in admin.client_list() if client.get("name") == name)

    with pytest.raises(RuntimeError, match="handler"):
        with get_hook(conn_id) as hook:
            binding = hook.get_binding()
            binding.depth("orders")
            binding.client.client_setname(name)  # type: ignore[attr-defined]
            assert named() == 1
            raise RuntimeError("handler")
    assert hook._binding is None and named() == 0
    admin.close()
