"""A fake Apache Pulsar for tests: the ``pulsar`` client surface the binding uses, and a real admin HTTP server.

No Pulsar broker can run on CI machines, so the contract suite runs the binding against this fake. It keeps the
broker's rules that the binding's behaviour depends on, as the Pulsar broker (3.x) and the C++-backed Python
client (3.13) implement them:

* Every call is checked against the real client's signature (``inspect.signature`` of ``pulsar.Client``,
  ``Producer`` and ``Consumer`` methods) and argument types, so a keyword the real client lacks fails here too.
  Errors are the client's own exception classes (``pulsar.Timeout`` on a receive timeout, ``AlreadyClosed``,
  ``MessageTooBig``, ``ConsumerBusy``, ``InvalidTopicName``, ``InvalidConfiguration``, ``AuthenticationError``)
  with the client's message texts; message ids are real ``_pulsar.MessageId`` objects; received messages are
  ``pulsar.Message`` instances.
* Topic names resolve as Pulsar's ``TopicName`` does (``orders`` → ``persistent://public/default/orders``,
  ``tenant/ns/orders``; ``a/b`` is invalid); topics are created on first producer or consumer (auto-creation on),
  never by a lookup (``get_topic_partitions``).
* Subscriptions keep messages only from their creation: ``Latest`` (the client default) starts at the end,
  ``Earliest`` at the first retained message. A Shared subscription hands each message to one consumer; a
  consumer of another type on a subscription in use fails with ``ConsumerBusy``.
* ``negative_acknowledge`` redelivers after the consumer's ``negative_ack_redelivery_delay_ms``; a redelivery
  (after a negative ack, or after a consumer left while others stay) raises ``redelivery_count`` by one, as the
  broker's in-memory redelivery tracker does, and the tracker is cleared when the last consumer leaves.
* ``deliver_after`` / ``deliver_at`` hold a message back; the dispatcher tracks delayed messages (``msgDelayed``)
  only while a consumer is connected, because it reads the topic only then.
* A receive with a timeout on a zero-size receiver queue fails with ``InvalidConfiguration``, as in the C++ client.
* Topic stats carry the broker's field names (``msgBacklog``, ``msgBacklogNoDelayed``, ``msgDelayed``,
  ``unackedMessages``, ``consumers``…), served over real HTTP at ``/admin/v2/persistent/{tenant}/{ns}/{topic}/stats``
  with Bearer-token checking (401 ``Authentication required``, 404 ``Topic not found``).

Not modelled (see docs/connections/pulsar.md): consumer prefetch (messages are dispatched when ``receive`` is
called, as with a receiver queue that is always empty), batching, partitioned topics, retention and TTL, the
token's signature (any ``AuthenticationToken`` object passes the binary protocol; the admin server checks the
exact token), TLS on the binary protocol, and schemas other than bytes.
"""

from __future__ import annotations

import inspect
import itertools
import json
import queue
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

import _pulsar
import pulsar

__all__ = ["FakeAdminServer", "FakeClient", "FakeConsumer", "FakeMessage", "FakeProducer", "FakePulsarBroker"]

_NAME = re.compile(r"[-=:.\w]+")
#: The real client classes whose signatures every fake call is checked against (taken before anyone patches them).
_CLIENT, _PRODUCER, _CONSUMER = pulsar.Client, pulsar.Producer, pulsar.Consumer


def _error(kind: type[Exception]) -> Exception:
    """The client's exception with the client's text (``Pulsar error: TimeOut`` for a timeout)."""
    return kind("Pulsar error: TimeOut" if kind is pulsar.Timeout else f"Pulsar error: {kind.__name__}")


def _check(method: Callable[..., Any], *args: Any, **kwargs: Any) -> inspect.BoundArguments:
    """Bind the arguments to the real client method's signature (TypeError on a keyword it lacks)."""
    bound = inspect.signature(method).bind(None, *args, **kwargs)
    bound.apply_defaults()
    return bound


def _typed(value: Any, kind: type | tuple[type, ...], name: str, optional: bool = True) -> None:
    if (value is None and optional) or isinstance(value, kind):
        return
    raise ValueError(f"Argument {name} is expected to be of type '{getattr(kind, '__name__', kind)}' and not "
                     f"'{type(value).__name__}'")


def full_topic_name(topic: Any) -> str:
    """Pulsar's ``TopicName`` resolution; ``InvalidTopicName`` for anything else."""
    if not isinstance(topic, str) or not topic:
        raise _error(pulsar.InvalidTopicName)
    if "://" in topic:
        domain, _, rest = topic.partition("://")
        parts = rest.split("/")
        valid = domain in ("persistent", "non-persistent") and len(parts) == 3 and all(parts)
        if not valid or not all(_NAME.fullmatch(p) for p in parts[:2]):
            raise _error(pulsar.InvalidTopicName)
        return topic
    parts = topic.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{topic}"
    if len(parts) == 3 and all(parts) and all(_NAME.fullmatch(p) for p in parts[:2]):
        return f"persistent://{topic}"
    raise _error(pulsar.InvalidTopicName)


class _Entry:
    __slots__ = ("entry_id", "data", "properties", "partition_key", "publish_time", "deliver_at", "event_time")

    def __init__(self, entry_id: int, data: bytes, properties: dict[str, str], partition_key: str,
                 deliver_at: float, event_time: int) -> None:
        self.entry_id, self.data, self.properties = entry_id, data, properties
        self.partition_key, self.deliver_at, self.event_time = partition_key, deliver_at, event_time
        self.publish_time = int(time.time() * 1000)


class _Subscription:
    """A durable cursor: where it starts, what is acknowledged, what is handed out, the redelivery tracker."""

    def __init__(self, name: str, kind: Any, start: int) -> None:
        self.name, self.kind = name, kind
        self.mark = start  # the mark-delete position: every entry below it is gone for this subscription
        self.read = start  # how far the dispatcher has read (only while a consumer is connected)
        self.acked: set[int] = set()
        self.pending: dict[int, FakeConsumer] = {}
        self.redeliveries: dict[int, int] = {}
        self.delayed: set[int] = set()
        self.consumers: list[FakeConsumer] = []
        self.out_counter = 0


class _Topic:
    def __init__(self, name: str, ledger_id: int) -> None:
        self.name, self.ledger_id = name, ledger_id
        self.entries: list[_Entry] = []
        self.subscriptions: dict[str, _Subscription] = {}
        self.producers: list[FakeProducer] = []
        self.bytes_in = 0


class FakePulsarBroker:
    """The broker's state, shared by every client made from it; :meth:`client` is the ``client_factory``.

    :param token: when set, clients need an ``authentication`` and the admin API this exact Bearer token.
    :param max_message_size: the broker's ``maxMessageSize``.
    :param auto_topic_creation: off: producers and consumers of unknown topics fail with ``TopicNotFound``.
    """

    def __init__(self, *, token: str | None = None, max_message_size: int = 5 * 1024 * 1024,
                 auto_topic_creation: bool = True) -> None:
        self.token, self.max_message_size, self.auto_topic_creation = token, max_message_size, auto_topic_creation
        self.cond = threading.Condition()
        self.topics: dict[str, _Topic] = {}
        self.clients: list[FakeClient] = []
        #: Fault injection: ``send_hook(topic, data)`` may return a ``pulsar.Result`` to fail that send with.
        self.send_hook: Callable[[str, bytes], Any] | None = None
        self._ledgers = itertools.count(11)

    def client(self, service_url: Any, **options: Any) -> FakeClient:
        """Build a client exactly as ``pulsar.Client(service_url, **options)`` would be called."""
        client = FakeClient(self, service_url, **options)
        with self.cond:
            self.clients.append(client)
        return client

    # -------------------------------------------------------------------------------- broker internals

    def _topic(self, name: str, create: bool = True) -> _Topic:
        topic = self.topics.get(name)
        if topic is None:
            if not (create and self.auto_topic_creation):
                raise _error(pulsar.TopicNotFound)
            topic = self.topics[name] = _Topic(name, next(self._ledgers))
        return topic

    def _sweep(self, now: float) -> None:
        """Everything time-driven: negative acks that fell due, delayed messages the dispatcher reads."""
        for topic in self.topics.values():
            for sub in topic.subscriptions.values():
                for consumer in sub.consumers:
                    for entry_id in [e for e, due in consumer.nacks.items() if due <= now]:
                        del consumer.nacks[entry_id]
                        if sub.pending.get(entry_id) is consumer:
                            del sub.pending[entry_id]
                            sub.redeliveries.setdefault(entry_id, 0)
                if sub.consumers:
                    for entry in topic.entries[sub.read:]:
                        if entry.deliver_at > now and entry.entry_id not in sub.acked:
                            sub.delayed.add(entry.entry_id)
                    sub.read = max(sub.read, len(topic.entries))
                sub.delayed = {e for e in sub.delayed if topic.entries[e].deliver_at > now}

    def _next_wake(self, now: float) -> float:
        """The next moment something time-driven happens (a nack or a delayed message falling due)."""
        times = [due for t in self.topics.values() for s in t.subscriptions.values() for c in s.consumers
                 for due in c.nacks.values()]
        times += [t.entries[e].deliver_at for t in self.topics.values() for s in t.subscriptions.values()
                  for e in range(s.mark, len(t.entries)) if t.entries[e].deliver_at > now]
        return min(times, default=now + 3600)

    def _dispatch(self, topic: _Topic, sub: _Subscription, consumer: FakeConsumer, now: float) -> FakeMessage | None:
        for entry in topic.entries[sub.mark:]:
            entry_id = entry.entry_id
            if entry_id in sub.acked or entry_id in sub.pending or entry.deliver_at > now:
                continue
            sub.pending[entry_id] = consumer
            sub.out_counter += 1
            count = 0
            if entry_id in sub.redeliveries:  # the tracker counts a redelivery when it is dispatched
                count = sub.redeliveries[entry_id] = sub.redeliveries[entry_id] + 1
            return FakeMessage(topic, entry, count)
        return None

    def _ack(self, topic: _Topic, sub: _Subscription, entry_id: int) -> None:
        if entry_id < sub.mark or entry_id in sub.acked or entry_id >= len(topic.entries):
            return
        sub.acked.add(entry_id)
        sub.pending.pop(entry_id, None)
        sub.redeliveries.pop(entry_id, None)
        sub.delayed.discard(entry_id)
        while sub.mark in sub.acked:
            sub.acked.discard(sub.mark)
            sub.mark += 1

    def _remove_consumer(self, topic: _Topic, sub: _Subscription, consumer: FakeConsumer) -> None:
        sub.consumers.remove(consumer)
        mine = [e for e, holder in sub.pending.items() if holder is consumer]
        for entry_id in mine:
            del sub.pending[entry_id]
        if sub.consumers:  # the others get its messages, each counted as a redelivery
            for entry_id in mine:
                sub.redeliveries.setdefault(entry_id, 0)
        else:  # all consumers gone: the dispatcher forgets its tracker and rewinds to the mark-delete position
            sub.redeliveries.clear()
            sub.delayed.clear()
            sub.read = sub.mark

    def delete_topic(self, name: str, force: bool = False) -> int:
        """The admin API's topic deletion: 204, 404 when unknown, 412 when in use and not forced (forced: its
        producers and consumers are closed, as the broker disconnects them)."""
        with self.cond:
            topic = self.topics.get(name)
            if topic is None:
                return 404
            consumers = [c for sub in topic.subscriptions.values() for c in sub.consumers]
            if (consumers or topic.producers) and not force:
                return 412
            for resource in [*consumers, *topic.producers]:
                resource.closed = True
            del self.topics[name]
            self.cond.notify_all()
            return 204

    # ----------------------------------------------------------------------------------------- stats

    def stats(self, topic_name: str) -> dict[str, Any] | None:
        """The topic's stats document as the admin API returns it; ``None`` for an unknown topic."""
        with self.cond:
            self._sweep(time.monotonic())
            topic = self.topics.get(topic_name)
            if topic is None:
                return None
            subscriptions = {}
            for sub in topic.subscriptions.values():
                backlog = sum(1 for e in range(sub.mark, len(topic.entries)) if e not in sub.acked)
                consumers = [
                    {
                        "consumerName": c.name,
                        "unackedMessages": sum(1 for holder in sub.pending.values() if holder is c),
                        "availablePermits": c.receiver_queue_size,
                        "blockedConsumerOnUnackedMsgs": False,
                        "msgRateOut": 0.0,
                        "msgThroughputOut": 0.0,
                    }
                    for c in sub.consumers
                ]
                unacked = sum(c["unackedMessages"] for c in consumers)
                subscriptions[sub.name] = {
                    "msgRateOut": 0.0,
                    "msgThroughputOut": 0.0,
                    "msgOutCounter": sub.out_counter,
                    "msgRateRedeliver": 0.0,
                    "msgBacklog": backlog,
                    "msgBacklogNoDelayed": backlog - len(sub.delayed),
                    "blockedSubscriptionOnUnackedMsgs": False,
                    "msgDelayed": len(sub.delayed),
                    "unackedMessages": unacked if sub.kind == pulsar.ConsumerType.Shared else 0,
                    "type": sub.kind.name,
                    "msgRateExpired": 0.0,
                    "totalMsgExpired": 0,
                    "consumers": consumers,
                    "isDurable": True,
                    "isReplicated": False,
                }
            return {
                "msgRateIn": 0.0,
                "msgThroughputIn": 0.0,
                "msgRateOut": 0.0,
                "msgThroughputOut": 0.0,
                "bytesInCounter": topic.bytes_in,
                "msgInCounter": len(topic.entries),
                "averageMsgSize": 0.0,
                "msgChunkPublished": False,
                "storageSize": topic.bytes_in,
                "backlogSize": topic.bytes_in,
                "publishers": [{"producerName": p.name} for p in topic.producers],
                "waitingPublishers": 0,
                "subscriptions": subscriptions,
                "replication": {},
                "deduplicationStatus": "Disabled",
            }


class FakeMessage(pulsar.Message):
    """A received message (a ``pulsar.Message``): payload, properties, id, redelivery count, publish time."""

    def __init__(self, topic: _Topic, entry: _Entry, redelivery_count: int) -> None:
        self._topic, self._entry, self._redelivery_count = topic.name, entry, redelivery_count
        self._id = _pulsar.MessageId(-1, topic.ledger_id, entry.entry_id, -1)

    def data(self) -> bytes:
        return self._entry.data

    def value(self) -> bytes:
        return self._entry.data

    def properties(self) -> dict[str, str]:
        return dict(self._entry.properties)

    def partition_key(self) -> str:
        return self._entry.partition_key

    def ordering_key(self) -> str:
        return ""

    def publish_timestamp(self) -> int:
        return self._entry.publish_time

    def event_timestamp(self) -> int:
        return self._entry.event_time

    def message_id(self) -> _pulsar.MessageId:
        return self._id

    def topic_name(self) -> str:
        return self._topic

    def redelivery_count(self) -> int:
        return self._redelivery_count


class FakeProducer:
    """``pulsar.Producer``: ``send`` blocks until stored; ``send_async`` reports on a client thread."""

    def __init__(self, client: FakeClient, topic: _Topic, name: str) -> None:
        self._client, self._topic, self.name, self.closed = client, topic, name, False
        self._callbacks: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run_callbacks, daemon=True, name=f"fake-pulsar-{name}")
        self._worker.start()

    def _run_callbacks(self) -> None:
        while (job := self._callbacks.get()) is not None:
            try:
                job()
            finally:
                self._callbacks.task_done()
        self._callbacks.task_done()

    def topic(self) -> str:
        return self._topic.name

    def producer_name(self) -> str:
        return self.name

    def _store(self, content: Any, options: inspect.BoundArguments) -> _pulsar.MessageId:
        a = options.arguments
        _typed(content, bytes, "data", optional=False)
        _typed(a["properties"], dict, "properties")
        _typed(a["partition_key"], str, "partition_key")
        _typed(a["deliver_at"], int, "deliver_at")
        _typed(a["deliver_after"], timedelta, "deliver_after")
        _typed(a["event_timestamp"], int, "event_timestamp")
        properties = a["properties"] or {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items()):
            raise TypeError("property(): incompatible function arguments (str, str expected)")
        if self.closed:
            raise _error(pulsar.AlreadyClosed)
        broker = self._client.broker
        if len(content) > broker.max_message_size:
            raise _error(pulsar.MessageTooBig)
        if broker.send_hook is not None and (result := broker.send_hook(self._topic.name, content)) is not None:
            raise _error(getattr(pulsar, result.name, pulsar.UnknownError))
        now = time.monotonic()
        deliver_at = now
        if a["deliver_after"]:
            deliver_at = now + a["deliver_after"].total_seconds()
        elif a["deliver_at"]:
            deliver_at = now + (a["deliver_at"] / 1000 - time.time())
        with broker.cond:
            entry = _Entry(len(self._topic.entries), bytes(content), dict(properties), a["partition_key"] or "",
                           deliver_at, a["event_timestamp"] or 0)
            self._topic.entries.append(entry)
            self._topic.bytes_in += len(content)
            broker.cond.notify_all()
        return _pulsar.MessageId(-1, self._topic.ledger_id, entry.entry_id, -1)

    def send(self, content: Any, *args: Any, **kwargs: Any) -> _pulsar.MessageId:
        return self._store(content, _check(_PRODUCER.send, content, *args, **kwargs))

    def send_async(self, content: Any, callback: Callable[[Any, Any], None], *args: Any, **kwargs: Any) -> None:
        options = _check(_PRODUCER.send_async, content, callback, *args, **kwargs)
        _typed(content, bytes, "data", optional=False)  # the real client checks these before queueing
        try:
            message_id, result = self._store(content, options), pulsar.Result.Ok
        except pulsar.PulsarException as exc:
            message_id, result = None, getattr(pulsar.Result, type(exc).__name__, pulsar.Result.UnknownError)
        self._callbacks.put(lambda: callback(result, message_id))

    def flush(self) -> None:
        if self.closed:
            raise _error(pulsar.AlreadyClosed)
        self._callbacks.join()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._callbacks.put(None)
            with self._client.broker.cond:
                self._topic.producers.remove(self)

    def is_connected(self) -> bool:
        return not self.closed


class FakeConsumer:
    """``pulsar.Consumer`` on one topic: pull-dispatched ``receive``, acks, negative acks with their delay."""

    def __init__(self, client: FakeClient, topic: _Topic, sub: _Subscription, name: str, receiver_queue_size: int,
                 nack_delay_ms: int) -> None:
        self._client, self._topic, self._sub, self.name = client, topic, sub, name
        self.receiver_queue_size, self.nack_delay = receiver_queue_size, nack_delay_ms / 1000
        self.nacks: dict[int, float] = {}
        self.closed = False

    def topic(self) -> str:
        return self._topic.name

    def subscription_name(self) -> str:
        return self._sub.name

    def consumer_name(self) -> str:
        return self.name

    def receive(self, timeout_millis: Any = None) -> FakeMessage:
        _check(_CONSUMER.receive, timeout_millis)
        if timeout_millis is not None:
            _typed(timeout_millis, int, "timeout_millis", optional=False)
            if self.receiver_queue_size == 0:  # the C++ client: "Can't use this function if the queue size is 0"
                raise _error(pulsar.InvalidConfiguration)
        broker = self._client.broker
        deadline = None if timeout_millis is None else time.monotonic() + max(timeout_millis, 0) / 1000
        with broker.cond:
            while True:
                if self.closed:
                    raise _error(pulsar.AlreadyClosed)
                now = time.monotonic()
                broker._sweep(now)
                if (message := broker._dispatch(self._topic, self._sub, self, now)) is not None:
                    return message
                if deadline is not None and now >= deadline:
                    raise _error(pulsar.Timeout)
                wake = broker._next_wake(now)
                broker.cond.wait(max(0.0, min(wake, deadline if deadline is not None else wake) - now))

    def _entry_id(self, message: Any) -> int:
        message_id = message.message_id() if isinstance(message, pulsar.Message) else message
        if isinstance(message_id, pulsar.MessageId):
            message_id = message_id._msg_id
        if not isinstance(message_id, _pulsar.MessageId):
            raise ValueError(f"Argument message is expected to be of type 'Message' or 'MessageId', got {message!r}")
        if message_id.ledger_id() != self._topic.ledger_id:
            raise ValueError(f"message id {message_id} is not of topic {self._topic.name}")
        return message_id.entry_id()

    def acknowledge(self, message: Any) -> None:
        entry_id = self._entry_id(message)
        if self.closed:
            raise _error(pulsar.AlreadyClosed)
        with self._client.broker.cond:
            self.nacks.pop(entry_id, None)
            self._client.broker._ack(self._topic, self._sub, entry_id)
            self._client.broker.cond.notify_all()

    def negative_acknowledge(self, message: Any) -> None:
        entry_id = self._entry_id(message)
        with self._client.broker.cond:
            if not self.closed and self._sub.pending.get(entry_id) is self:
                self.nacks[entry_id] = time.monotonic() + self.nack_delay
                self._client.broker.cond.notify_all()

    def redeliver_unacknowledged_messages(self) -> None:
        with self._client.broker.cond:
            for entry_id in [e for e, holder in self._sub.pending.items() if holder is self]:
                self.nacks[entry_id] = time.monotonic()
            self._client.broker.cond.notify_all()

    def close(self) -> None:
        if self.closed:
            raise _error(pulsar.AlreadyClosed)
        broker = self._client.broker
        with broker.cond:
            self.closed = True
            self.nacks.clear()
            broker._remove_consumer(self._topic, self._sub, self)
            self._client.consumers.remove(self)
            broker.cond.notify_all()

    def unsubscribe(self) -> None:
        broker = self._client.broker
        with broker.cond:
            if [c for c in self._sub.consumers if c is not self]:
                raise _error(pulsar.ConsumerBusy)
            self.close()
            del self._topic.subscriptions[self._sub.name]

    def is_connected(self) -> bool:
        return not self.closed


class FakeClient:
    """``pulsar.Client`` against a :class:`FakePulsarBroker`; records the options it was built with."""

    def __init__(self, broker: FakePulsarBroker, service_url: Any, *args: Any, **kwargs: Any) -> None:
        self.options = dict(_check(_CLIENT.__init__, service_url, *args, **kwargs).arguments)
        del self.options["self"]
        if not isinstance(service_url, str):
            raise ValueError("Argument service_url is expected to be of type 'str', 'AutoClusterFailover' or "
                             "'ServiceInfoProvider'")
        if "://" not in service_url:
            raise ValueError(f"The scheme part is missing: {service_url}")
        _typed(self.options["authentication"], pulsar.Authentication, "authentication")
        for name in ("operation_timeout_seconds", "connection_timeout_ms"):
            _typed(self.options[name], int, name, optional=False)
        for name in ("tls_allow_insecure_connection", "tls_validate_hostname"):
            _typed(self.options[name], bool, name, optional=False)
        _typed(self.options["tls_trust_certs_file_path"], str, "tls_trust_certs_file_path")
        self.broker, self.service_url, self.closed = broker, service_url, False
        self.producers: list[FakeProducer] = []
        self.consumers: list[FakeConsumer] = []
        self._names = itertools.count()

    def _connect(self) -> None:
        """What the broker checks on connect: a closed client, the URL scheme, authentication."""
        if self.closed:
            raise _error(pulsar.AlreadyClosed)
        if urlsplit(self.service_url).scheme not in ("pulsar", "pulsar+ssl"):
            raise _error(pulsar.ConnectError)
        if self.broker.token is not None and not isinstance(self.options["authentication"],
                                                            pulsar.AuthenticationToken):
            raise _error(pulsar.AuthenticationError)

    def create_producer(self, topic: Any, *args: Any, **kwargs: Any) -> FakeProducer:
        options = _check(_CLIENT.create_producer, topic, *args, **kwargs).arguments
        for name in ("send_timeout_millis", "max_pending_messages"):
            _typed(options[name], int, name, optional=False)
        for name in ("batching_enabled", "block_if_queue_full"):
            _typed(options[name], bool, name, optional=False)
        name = full_topic_name(topic)
        self._connect()
        with self.broker.cond:
            producer = FakeProducer(self, self.broker._topic(name), options["producer_name"] or
                                    f"fake-{id(self):x}-{next(self._names)}")
            producer._topic.producers.append(producer)
            self.producers.append(producer)
        return producer

    def subscribe(self, topic: Any, subscription_name: Any, *args: Any, **kwargs: Any) -> FakeConsumer:
        options = _check(_CLIENT.subscribe, topic, subscription_name, *args, **kwargs).arguments
        _typed(subscription_name, str, "subscription_name", optional=False)
        _typed(options["consumer_type"], pulsar.ConsumerType, "consumer_type", optional=False)
        _typed(options["initial_position"], pulsar.InitialPosition, "initial_position", optional=False)
        for name in ("receiver_queue_size", "negative_ack_redelivery_delay_ms"):
            _typed(options[name], int, name, optional=False)
        if options["unacked_messages_timeout_ms"] and options["unacked_messages_timeout_ms"] < 10000:
            raise ValueError("Consumer Config Exception: Unacknowledged message timeout should be greater than 10 "
                             "seconds.")
        if options["message_listener"] is not None:
            raise NotImplementedError("the fake has no message listeners")
        name, kind = full_topic_name(topic), options["consumer_type"]
        self._connect()
        with self.broker.cond:
            target = self.broker._topic(name)
            sub = target.subscriptions.get(subscription_name)
            if sub is None:
                start = 0 if options["initial_position"] == pulsar.InitialPosition.Earliest else len(target.entries)
                sub = target.subscriptions[subscription_name] = _Subscription(subscription_name, kind, start)
            elif sub.consumers and (sub.kind != kind or kind == pulsar.ConsumerType.Exclusive):
                raise _error(pulsar.ConsumerBusy)
            sub.kind = kind
            consumer = FakeConsumer(self, target, sub, options["consumer_name"] or
                                    f"fake-{id(self):x}-{next(self._names)}", options["receiver_queue_size"],
                                    options["negative_ack_redelivery_delay_ms"])
            sub.consumers.append(consumer)
            self.consumers.append(consumer)
            self.broker.cond.notify_all()
        return consumer

    def get_topic_partitions(self, topic: Any) -> list[str]:
        """A lookup: partitions of the topic (itself, when not partitioned); creates nothing."""
        name = full_topic_name(topic)
        self._connect()
        return [name]

    def close(self) -> None:
        for resource in [*self.consumers, *self.producers]:
            if not resource.closed:
                resource.close()
        self.closed = True

    def shutdown(self) -> None:
        self.close()


class FakeAdminServer:
    """The admin REST endpoints the project uses, over real HTTP(S), on the fake broker's state.

    ``GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/stats`` answers 200 with the stats document or 404
    ``{"reason": "Topic not found"}``; ``GET /admin/v2/persistent/{tenant}/{namespace}`` lists the namespace's
    topics; ``DELETE …/{topic}[?force=true]`` deletes one (204, 404, or 412 while in use and not forced). Every
    request answers 401 ``{"reason": "Authentication required"}`` when the broker has a token and the request does
    not carry ``Authorization: Bearer <token>``. Every request is recorded.

    :param ssl_context: a server-side context to serve HTTPS.
    """

    _STATS = re.compile(r"/admin/v2/persistent/([^/]+)/([^/]+)/([^/]+)/stats")
    _TOPICS = re.compile(r"/admin/v2/persistent/([^/]+)/([^/]+)")
    _TOPIC = re.compile(r"/admin/v2/persistent/([^/]+)/([^/]+)/([^/]+)")

    def __init__(self, broker: FakePulsarBroker, ssl_context: ssl.SSLContext | None = None) -> None:
        self.broker = broker
        self.requests: list[tuple[str, str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _authorized(self, method: str) -> bool:
                auth = self.headers.get("Authorization")
                server.requests.append((method, self.path, auth))
                if server.broker.token is not None and auth != f"Bearer {server.broker.token}":
                    self._reply(401, {"reason": "Authentication required"})
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802 - http.server's names
                if not self._authorized("GET"):
                    return
                path = urlsplit(self.path).path
                if match := server._TOPICS.fullmatch(path):  # the namespace's topics
                    prefix = f"persistent://{unquote(match[1])}/{unquote(match[2])}/"
                    with server.broker.cond:
                        return self._reply(200, sorted(t for t in server.broker.topics if t.startswith(prefix)))
                if (match := server._STATS.fullmatch(path)) is None:
                    return self._reply(404, {"reason": "Not Found"})
                tenant, namespace, local = (unquote(part) for part in match.groups())
                stats = server.broker.stats(f"persistent://{tenant}/{namespace}/{local}")
                if stats is None:
                    return self._reply(404, {"reason": "Topic not found"})
                self._reply(200, stats)

            def do_DELETE(self) -> None:  # noqa: N802
                if not self._authorized("DELETE"):
                    return
                parts = urlsplit(self.path)
                if (match := server._TOPIC.fullmatch(parts.path)) is None:
                    return self._reply(404, {"reason": "Not Found"})
                name = "persistent://" + "/".join(unquote(part) for part in match.groups())
                status = server.broker.delete_topic(name, force="force=true" in parts.query)
                self._reply(status, None if status == 204 else {"reason": {
                    404: "Topic not found", 412: "Topic has active producers/subscriptions"}[status]})

            def _reply(self, status: int, document: Any) -> None:
                payload = b"" if document is None else json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if ssl_context is not None:
            self._server.socket = ssl_context.wrap_socket(self._server.socket, server_side=True)
        self.scheme = "https" if ssl_context is not None else "http"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="fake-pulsar-admin")
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> FakeAdminServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def fake_pulsar(token: str | None = None, **options: Any) -> Iterator[tuple[FakePulsarBroker, FakeAdminServer]]:
    """A broker and its admin server, closed afterwards (for ``yield from`` in fixtures)."""
    broker = FakePulsarBroker(token=token, **options)
    with FakeAdminServer(broker) as admin:
        yield broker, admin
        for client in list(broker.clients):
            client.close()
