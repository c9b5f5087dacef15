"""Every capture in ``../shared/interop/peer-captures`` replayed onto the real broker, read with DEFAULT settings.

The captures are the exact bytes the official Node, PHP and Python SDKs stored on Redis and RabbitMQ (with their
AMQP properties). Each one is put back under the peer's own key or queue name (``<queue>`` for ready messages,
``<queue>.dlq`` for what the peers' workers dead-lettered) and read the way a user of this provider reads it, with
the connection's defaults:

* ``plain``, ``headers``, ``floats``, ``empty-data``: reserved and handled (exact ``meta.id``, the data as the
  peer sent it, the peer's headers exposed);
* ``dead-letter*``: counted (depth and the dead-letter sensor's check), drained with their reason, and redriven
  onto the peer's queue as canonical envelopes with ``attempts`` 0;
* ``poison*`` (the Python SDK's ``{"raw": …}`` wrapper included): drained as poison with the original bytes,
  never redriven;
* ``bigint`` (Node's rounded 2**63): quarantined as poison with its bytes kept, never handed to a handler;
* ``delayed`` (the Python SDK's Laravel layout, ``queues:<queue>:delayed``): outside the default layout, not read.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.core.records import record_body
from airflow_provider_babelqueue.engine.checks import dead_letter_status
from airflow_provider_babelqueue.engine.consume import Consumer
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, drain_dead_letters
from airflow_provider_babelqueue.engine.replay import Replayer, feed_from_dead_letters
from tests.bindings.conftest import RABBITMQ_HOST, RABBITMQ_PORT, REDIS_URL
from tests.conftest import ROOT

pytestmark = pytest.mark.interop

CAPTURES = ROOT.parent / "shared" / "interop" / "peer-captures"
ALL = sorted(path.stem for path in CAPTURES.glob("*.json"))


def capture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CAPTURES / f"{name}.json").read_text(encoding="utf-8"))
    data["raw"] = base64.b64decode(data["body_b64"])
    return data


def by_case(*cases: str, broker: str | None = None) -> list[str]:
    return [name for name in ALL if capture(name)["case"] in cases and (broker is None or capture(name)["broker"]
                                                                       == broker)]


def inner(raw: bytes) -> dict[str, Any]:
    """The envelope a capture carries: the frame's body string when the peer framed it."""
    value: dict[str, Any] = json.loads(raw)
    return json.loads(value["body"]) if "__bq_frame" in value else value


# ------------------------------------------------------------------------------------------------ brokers


class Broker:
    """The real broker under the peer's names: put the capture back, and clean every name it touched."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.names: set[str] = set()
        if kind == "redis":
            import redis

            from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig

            self.client: Any = redis.Redis.from_url(REDIS_URL)
            self.binding: Binding = RedisBinding(RedisConfig.from_url(REDIS_URL))
        else:
            import pika

            from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQBinding, RabbitMQConfig

            self.connection = pika.BlockingConnection(pika.ConnectionParameters(RABBITMQ_HOST, RABBITMQ_PORT))
            self.channel = self.connection.channel()
            self.binding = RabbitMQBinding(RabbitMQConfig(host=RABBITMQ_HOST, port=RABBITMQ_PORT))

    def forget(self, queue: str) -> None:
        """Remove every key or queue of ``queue``'s layout (ready, DLQs, processing) before and after a test."""
        names = {queue, f"{queue}.dlq", f"{queue}:failed", f"{queue}.failed", f"{queue}:processing",
                 f"{queue}:processing:deadlines", f"{queue}:delayed", f"queues:{queue}:delayed"}
        self.names |= names
        if self.kind == "redis":
            self.client.delete(*names)
        else:
            for name in names:
                self._channel().queue_delete(name)

    def put(self, data: dict[str, Any]) -> None:
        """Store the capture's bytes where the peer stored them."""
        self.forget(data["queue"])
        key = data["key_or_queue"]
        if self.kind == "redis":
            if data["case"] == "delayed":
                self.client.zadd(key, {data["raw"]: 0})
            else:
                self.client.rpush(key, data["raw"])
            return
        import pika

        props = data["amqp_properties"] or {}
        channel = self._channel()
        channel.queue_declare(key, durable=True)
        channel.basic_publish("", key, data["raw"], pika.BasicProperties(**props))

    def ready(self, queue: str) -> list[bytes]:
        """Every message on ``queue``'s ready list or queue, removed."""
        if self.kind == "redis":
            values = self.client.lrange(queue, 0, -1)
            self.client.delete(queue)
            return [bytes(v) for v in values]
        import pika

        out = []
        channel = self._channel()
        try:
            channel.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:  # no such queue: nothing was ever put on it
            if exc.reply_code != 404:
                raise
            return out
        while True:
            method, _props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append(bytes(body))

    def _channel(self) -> Any:
        """The channel, reopened when the broker closed it (a 404 on a name that does not exist closes it)."""
        if not self.channel.is_open:
            self.channel = self.connection.channel()
        return self.channel

    def close(self) -> None:
        for queue in sorted(self.names):
            if self.kind == "redis":
                self.client.delete(queue)
            else:
                self._channel().queue_delete(queue)
        self.binding.close()
        if self.kind == "redis":
            self.client.close()
        else:
            self.connection.close()


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    opened = Broker(request.param)
    yield opened
    opened.close()


def _broker_of(name: str) -> str:
    return str(capture(name)["broker"])


def cases(*names: str, broker: str | None = None) -> Any:
    chosen = by_case(*names, broker=broker)
    return pytest.mark.parametrize(("broker", "name"), [(_broker_of(n), n) for n in chosen], ids=chosen,
                                   indirect=["broker"])


# ---------------------------------------------------------------------------------------- ready messages


@cases("plain", "headers", "floats", "empty-data")
def test_peer_messages_are_handled_with_their_data_and_headers(broker: Broker, name: str) -> None:
    data = capture(name)
    broker.put(data)
    sent = inner(data["raw"])
    message = broker.binding.reserve(data["queue"], timeout=1)
    assert message is not None and message.decode_error is None, message
    assert message.meta_id == sent["meta"]["id"]
    assert message.envelope is not None
    expected_data = sent["data"] if sent["data"] != [] else {}  # PHP's "data": [] is an empty object
    assert bq.data_of(message.envelope) == expected_data
    assert bq.check(message.envelope) is None
    if data["case"] == "headers":
        assert message.headers.get("traceparent") == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        assert message.headers.get("x-tenant") == "acme-eu"
    broker.binding.ack(message)
    assert broker.binding.depth(data["queue"]) == 0


@cases("plain", "headers", "floats", "empty-data")
def test_the_consumer_hands_peer_messages_to_their_handler(broker: Broker, name: str) -> None:
    data = capture(name)
    broker.put(data)
    sent = inner(data["raw"])
    seen: list[dict[str, Any]] = []
    summary = Consumer(broker.binding, data["queue"], {sent["job"]: seen.append}).run(max_messages=1)
    assert summary.handled == 1 and not summary.dead_lettered, summary.as_dict()
    assert [m["meta"]["id"] for m in seen] == [sent["meta"]["id"]]


@cases("bigint")
def test_an_integer_beyond_64_bits_is_quarantined_with_its_bytes(broker: Broker, name: str) -> None:
    data = capture(name)
    broker.put(data)
    seen: list[dict[str, Any]] = []
    summary = Consumer(broker.binding, data["queue"], {inner(data["raw"])["job"]: seen.append}).run(max_messages=1)
    assert seen == [] and summary.dead_lettered == {"poison": 1}, summary.as_dict()
    [stored] = broker.binding.browse_dead_letters(data["queue"], 10)
    wrapper = poison_wrapper(stored.body)  # kept byte for byte: nothing rounded a second time
    assert wrapper is not None and wrapper.raw == data["raw"] and wrapper.reason == "poison"
    assert "64-bit" in wrapper.dead_letter["error"]


@cases("delayed")
def test_the_laravel_delayed_set_is_outside_the_default_layout(broker: Broker, name: str) -> None:
    data = capture(name)
    broker.put(data)
    assert broker.binding.reserve(data["queue"], timeout=0) is None
    assert broker.binding.depth(data["queue"]) == 0
    assert broker.client.zcard(data["key_or_queue"]) == 1  # left where the peer put it


# ------------------------------------------------------------------------------------------- dead letters


def _drain(broker: Broker, queue: str, tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "drain.jsonl"
    result = drain_dead_letters([DrainSource(broker.binding, queue, "peer")], LocalFileSink(path), mode="move")
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert result.records == len(records)
    return records


@cases("dead-letter", "dead-letter-headers", "poison", "poison-binary")
def test_peer_dead_letters_are_counted_and_drained_with_their_bytes(broker: Broker, name: str,
                                                                     tmp_path: Path) -> None:
    data = capture(name)
    broker.put(data)
    queue = data["queue"]
    assert broker.binding.dead_letter_depth(queue) == 1
    status = dead_letter_status(broker.binding, queue, sample_size=5)
    assert status.matched and status.depth == 1
    expected_reason = "poison" if data["case"].startswith("poison") else "failed"
    if status.sample:
        assert status.sample[0]["reason"] == expected_reason
    [record] = _drain(broker, queue, tmp_path)
    assert record_body(record) == data["raw"]
    assert record["dead_letter_queue"] == data["key_or_queue"]
    assert broker.binding.dead_letter_depth(queue) == 0


@cases("dead-letter", "dead-letter-headers")
def test_peer_dead_letters_are_redriven_as_canonical_envelopes(broker: Broker, name: str) -> None:
    data = capture(name)
    broker.put(data)
    queue = data["queue"]
    sent = inner(data["raw"])
    ledger = f"peer-captures:{name}"
    replayer = Replayer(target=broker.binding, ledger_binding=_ledger_binding(), ledger_name=ledger,
                        source=broker.binding)
    feed_from_dead_letters(replayer, broker.binding, queue, 0)
    replayer.finish()
    assert replayer.result.replayed == 1, replayer.result.as_dict()
    [body] = broker.ready(queue)
    replayed = orjson.loads(body)
    assert "dead_letter" not in replayed and replayed["attempts"] == 0
    assert replayed["meta"]["id"] == sent["meta"]["id"] and replayed["job"] == sent["job"]
    assert body == bq.encode(bq.reset_for_replay(bq.decode(body)))  # canonical: our encoding of itself
    assert broker.binding.dead_letter_depth(queue) == 0


@cases("poison", "poison-binary")
def test_peer_poison_is_never_redriven(broker: Broker, name: str) -> None:
    data = capture(name)
    broker.put(data)
    queue = data["queue"]
    replayer = Replayer(target=broker.binding, ledger_binding=_ledger_binding(), ledger_name=f"peer:{name}",
                        source=broker.binding)
    feed_from_dead_letters(replayer, broker.binding, queue, 0)
    replayer.finish()
    assert replayer.result.replayed == 0 and replayer.result.skipped == {"poison": 1}
    assert broker.ready(queue) == []
    assert broker.binding.dead_letter_depth(queue) == 1  # left in the DLQ for a person


def _ledger_binding() -> Binding:
    from airflow_provider_babelqueue.bindings.memory import MemoryBinding

    return MemoryBinding()
