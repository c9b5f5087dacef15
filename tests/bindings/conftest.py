"""Binding factories for the contract suite: every binding runs the same test bodies.

Each factory returns a fresh, isolated binding (unique table, key prefix or namespace) and cleans up
after the test. Add a broker here when its binding lands; the contract tests need no change.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage

POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_URL = os.environ.get("BABELQUEUE_TEST_REDIS_URL", f"redis://{REDIS_HOST}:{REDIS_PORT}/0")

BINDINGS = ["memory", "sql-sqlite", "sql-postgresql", "redis", "rabbitmq", "sqs", "pulsar", "azure-service-bus"]
PULSAR_TOKEN = "pulsar-test-token"

#: (binding, test) pairs of the shared suites that cannot hold for that broker, with the reason.
NOT_APPLICABLE = {
    ("pulsar", "test_publish_with_delay"): "Pulsar counts a delayed message as delayed (msgDelayed) only once a "
    "connected consumer's dispatcher has read it; right after a delayed publish with no consumer connected, the "
    "subscription's stats count it as waiting, so depth is 1 on a real broker (a delayed release, with the consumer "
    "connected, is covered by test_release_with_delay)",
    **dict.fromkeys(
        [("pulsar", name) for name in ("test_conformance_sequences_on_a_persistent_store",
                                       "test_stores_are_named_and_forget",
                                       "test_idempotency_skips_redeliveries_of_handled_ids")],
        "a Pulsar topic cannot hold a seen-set (seen_store raises NotSupportedError, checked in "
        "test_pulsar_binding.py); idempotency and replay ledgers use a SQL or Redis connection",
    ),
    ("azure-service-bus", "test_publish_reserve_ack"): "Service Bus's ActiveMessageCount (depth) counts a "
    "peek-locked message as active until it is completed, so depth is 1 while it is reserved; "
    "test_asb_binding.py runs the same flow expecting that",
    **dict.fromkeys(
        [("azure-service-bus", name) for name in ("test_conformance_sequences_on_a_persistent_store",
                                                  "test_stores_are_named_and_forget",
                                                  "test_idempotency_skips_redeliveries_of_handled_ids")],
        "a Service Bus queue cannot hold a seen-set (seen_store raises NotSupportedError, checked in "
        "test_asb_binding.py); idempotency and replay ledgers use a SQL or Redis connection",
    ),
    **dict.fromkeys(
        [("azure-service-bus", name) for name in ("test_oversize_bodies_are_refused_before_sending",
                                                  "test_a_body_exactly_at_the_limit_is_sent")],
        "the limit is the one the namespace announces on the AMQP link (256 KiB on Standard), not a setting: "
        "test_asb_binding.py checks a body over the double's announced limit is refused with nothing sent",
    ),
}
RABBITMQ_HOST, RABBITMQ_PORT = "127.0.0.1", 5672

Factory = Callable[..., Binding]


def _memory(tmp_path: Path, cleanups: list[Callable[[], None]], **options: Any) -> Binding:
    from airflow_provider_babelqueue.bindings.memory import MemoryBinding, MemoryConfig

    return MemoryBinding(MemoryConfig(**options))


def _sql(url: str, cleanups: list[Callable[[], None]], **options: Any) -> Binding:
    from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig

    table = f"t_{uuid.uuid4().hex[:10]}"
    binding = SqlBinding(SqlConfig(url=url, table=table, **options))

    def drop() -> None:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url)
        with engine.begin() as conn:
            for name in (table, f"{table}_failed"):
                conn.execute(sqlalchemy.text(f'DROP TABLE IF EXISTS "{name}"'))
        engine.dispose()

    cleanups.append(binding.close)
    cleanups.append(drop)
    return binding


def _sqlite(tmp_path: Path, cleanups: list[Callable[[], None]], **options: Any) -> Binding:
    from airflow_provider_babelqueue.bindings.sql import sqlite_url

    return _sql(sqlite_url(tmp_path / "queue.sqlite"), cleanups, **options)


def _postgres(tmp_path: Path, cleanups: list[Callable[[], None]], **options: Any) -> Binding:
    return _sql(POSTGRES_URL, cleanups, **options)


def _redis(tmp_path: Path, cleanups: list[Callable[[], None]], **options: Any) -> Binding:
    import redis

    from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig

    prefix = f"bqtest:{uuid.uuid4().hex[:10]}:"
    binding = RedisBinding(RedisConfig(host=REDIS_HOST, port=REDIS_PORT, key_prefix=prefix, **options))

    def drop() -> None:
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()

    cleanups.append(binding.close)
    cleanups.append(drop)
    return binding


def _rabbitmq(tmp_path: Path, cleanups: list[Callable[[], None]], **options: Any) -> Binding:
    import pika

    from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQBinding, RabbitMQConfig

    binding = RabbitMQBinding(RabbitMQConfig(host=RABBITMQ_HOST, port=RABBITMQ_PORT, **options))

    def drop() -> None:  # every queue the binding created: main, DLQ, "-other", delay queues
        connection = pika.BlockingConnection(pika.ConnectionParameters(RABBITMQ_HOST, RABBITMQ_PORT))
        channel = connection.channel()
        for name in sorted(binding.declared_queues):
            channel.queue_delete(name)
        connection.close()

    cleanups.append(drop)
    cleanups.append(binding.close)  # runs first: unacked deliveries are released before the queues go
    return binding


def _sqs(tmp_path: Path, cleanups: list[Callable[[], None]], **options: Any) -> Binding:
    from airflow_provider_babelqueue.bindings.sqs import SqsBinding, SqsConfig
    from tests.bindings.sqs_server import REGION, delete_queues_except, moto_endpoint, queue_urls, sqs_client

    endpoint = moto_endpoint()
    admin = sqs_client(endpoint)
    before = queue_urls(admin)
    binding = SqsBinding(
        SqsConfig(
            region_name=REGION,
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            **({"create_queues": True} | options),  # the contract's tests publish to fresh queues
        )
    )
    cleanups.append(binding.close)
    cleanups.append(lambda: delete_queues_except(admin, before))
    return binding


def _pulsar(tmp_path: Path, cleanups: list[Callable[[], None]], **options: Any) -> Binding:
    """The binding against the fake client and the fake admin HTTP server (no Pulsar broker runs on CI)."""
    from airflow_provider_babelqueue.bindings.pulsar import PulsarBinding, PulsarConfig
    from tests.bindings.pulsar_fake import FakeAdminServer, FakePulsarBroker

    broker = FakePulsarBroker(token=PULSAR_TOKEN)
    admin = FakeAdminServer(broker)
    config = PulsarConfig(service_url="pulsar://127.0.0.1:6650", admin_url=admin.url, token=PULSAR_TOKEN, **options)
    binding = PulsarBinding(config, client_factory=broker.client)
    cleanups.append(admin.close)
    cleanups.append(binding.close)  # runs first: held reservations go back before the server stops
    return binding


def _azure_service_bus(tmp_path: Path, cleanups: list[Callable[[], None]], **options: Any) -> Binding:
    """The binding, through the unmodified azure-servicebus SDK, against the AMQP 1.0 test double (shared per
    test process; no Service Bus emulator runs without Docker). Queues are created by the binding itself."""
    from airflow_provider_babelqueue.bindings.azure_service_bus import AzureServiceBusBinding, AzureServiceBusConfig
    from tests.bindings.asb_double import shared_double

    double = shared_double()
    if "visibility_timeout" in options:  # the suites' name for what Service Bus calls the lock duration
        options["lock_duration"] = options.pop("visibility_timeout")
    before = set(double.entities)
    config = AzureServiceBusConfig(
        connection_string=double.connection_string, connection_verify=double.ca_file, create_queues=True, **options
    )
    binding = AzureServiceBusBinding(config)
    cleanups.append(lambda: [double.delete_queue(name) for name in set(double.entities) - before])
    cleanups.append(binding.close)  # runs first
    return binding


FACTORIES = {
    "memory": _memory,
    "sql-sqlite": _sqlite,
    "sql-postgresql": _postgres,
    "redis": _redis,
    "rabbitmq": _rabbitmq,
    "sqs": _sqs,
    "pulsar": _pulsar,
    "azure-service-bus": _azure_service_bus,
}


@pytest.fixture(params=BINDINGS)
def make_binding(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """``make_binding(**config_options)`` → a fresh binding of the parametrised kind."""
    if reason := NOT_APPLICABLE.get((request.param, request.node.originalname)):
        pytest.skip(f"not applicable to {request.param}: {reason}")
    cleanups: list[Callable[[], None]] = []

    def factory(**options: Any) -> Binding:
        return FACTORIES[request.param](tmp_path, cleanups, **options)

    yield factory
    for cleanup in reversed(cleanups):
        cleanup()


@pytest.fixture
def binding(make_binding: Factory) -> Binding:
    return make_binding()


@pytest.fixture
def queue_name() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def rc() -> Iterator[Any]:
    """A raw redis-py client on the test server (fails, never skips, when the server is down)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.fail(f"no Redis server at {REDIS_URL} (make test starts one): {exc}")
    yield client
    client.close()


@pytest.fixture
def queue(rc: Any) -> Iterator[str]:
    """A unique Redis queue name; every key containing it is deleted afterwards."""
    name = f"bqtest-{uuid.uuid4().hex[:12]}"
    yield name
    keys = list(rc.scan_iter(match=f"*{name}*"))
    if keys:
        rc.delete(*keys)


@pytest.fixture(scope="module")
def endpoint() -> str:
    """The shared moto server's endpoint URL (SQS tests)."""
    from tests.bindings.sqs_server import moto_endpoint

    return moto_endpoint()


@pytest.fixture
def admin(endpoint: str) -> Iterator[Any]:
    """A plain SQS client for looking at the server; every queue created during the test is deleted after it."""
    from tests.bindings.sqs_server import delete_queues_except, queue_urls, sqs_client

    client = sqs_client(endpoint)
    before = queue_urls(client)
    yield client
    delete_queues_except(client, before)


def kept(item: ReceivedMessage | bytes) -> bytes:
    """The exact bytes a dead letter keeps: a poison wrapper's ``raw`` (what a binding stores for a body it cannot
    annotate, with the reason beside it), else the stored body itself."""
    from airflow_provider_babelqueue.core.peer import poison_wrapper

    body = item.body if isinstance(item, ReceivedMessage) else item
    wrapper = poison_wrapper(body)
    return body if wrapper is None else wrapper.raw


def reserve_all(binding: Binding, queue_name: str, count: int, within: float = 10.0) -> list[ReceivedMessage]:
    """Reserve until ``count`` messages came (brokers that push may hand out fewer per call) or ``within`` passed."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + within
    while len(got) < count and time.monotonic() < deadline:
        got += binding.reserve_many(queue_name, count - len(got), timeout=0.5)
    return got
