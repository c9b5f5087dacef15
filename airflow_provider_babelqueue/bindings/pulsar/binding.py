"""Apache Pulsar binding: persistent topics with one Shared subscription, in the official SDKs' layout.

Wire facts (spec/broker-bindings.md, conformance block ``pulsar``): the payload is the envelope byte for byte,
six string ``bq-*`` properties repeat its routing fields (:func:`message_properties`); attempts = max(body attempts,
redelivery_count), no −1. Topics default to ``persistent://public/default/<queue>``, every consumer joins the Shared
subscription ``babelqueue``, dead letters go to ``<queue>.dlq``. Choices (docs/connections/pulsar.md says more):

* ``release`` publishes a copy with attempts + 1 (``deliver_after`` = the delay), then acknowledges the original,
  as the SDKs' runtimes do: a republish starts the redelivery count at 0 and the body carries the count. An
  undecodable body keeps its bytes and carries the count on ``bq-attempts``.
* A reservation is a received, unacknowledged message. The broker redelivers it when the consumer disconnects
  (a crash included); with ``visibility_timeout`` the binding negatively acknowledges it once expired. Settling is
  gated on the reservation: Pulsar acknowledges by message id and a redelivery keeps the id, so a late ack of an
  expired reservation would otherwise remove the new holder's message.
* A drained dead letter that is released goes back to the DLQ by negative acknowledgement, bytes unchanged.
* The subscription is created (from the earliest message) before the first publish to a topic: Pulsar keeps
  messages only for subscriptions that exist, and ``depth`` reads that subscription's stats.
* ``depth`` / ``dead_letter_depth`` are one GET of the topic's stats on the admin REST API: messages not
  acknowledged, minus the delayed ones the dispatcher tracks, minus those handed to consumers.
"""

from __future__ import annotations

import itertools
import logging
import math
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import Any

from ..base import Binding, BindingError, NotSupportedError, PublishBatchError, require_extra
from ..bodies import bumped_body, dead_letter_body
from ..message import ReceivedMessage, parse_body
from .admin import admin_get
from .config import PulsarConfig
from .wire import (
    CLIENT_HINTS,
    DEFAULT_MAX_MESSAGE_BYTES,
    MIRROR,
    PROJECTED,
    Hold,
    Receipt,
    dead_letter_topic,
    delay_millis,
    message_key,
    message_properties,
    outgoing_properties,
    partition_key,
    ready_count,
    received,
    reconcile_attempts,
    stats_path,
    topic_name,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MIRROR",
    "PROJECTED",
    "PulsarBinding",
    "dead_letter_topic",
    "message_properties",
    "reconcile_attempts",
    "topic_name",
]

logger = logging.getLogger(__name__)
#: Where the C++ client's own log lines go (without a logger it prints them to stdout).
CLIENT_LOGGER = f"{__name__}.client"


class PulsarBinding(Binding):
    """Persistent topics with one Shared subscription (see the module docstring). The DLQ cannot be browsed."""

    name = "pulsar"
    held_reservations_note = "an unacknowledged message belongs to the consumer that received it (the triggerer's)"
    client_loggers = ("pulsar", CLIENT_LOGGER)
    carries_headers = True
    can_browse = False

    def __init__(self, config: PulsarConfig | None = None, client_factory: Callable[..., Any] | None = None) -> None:
        """:param config: where the cluster is and how topics are used.
        :param client_factory: called as ``client_factory(service_url, **options)`` with the options of
            ``pulsar.Client`` (the test seam, or to wrap the client); default ``pulsar.Client``. The binding owns
            the client it gets and closes it in :meth:`close`.
        """
        self.config = config or PulsarConfig()
        self._pulsar = require_extra("pulsar", "pulsar")
        self._factory = client_factory or self._pulsar.Client
        self._client: Any = None
        self._lock = threading.RLock()
        self._producers: dict[str, Any] = {}
        self._consumers: dict[str, Any] = {}
        self._subscribed: set[str] = set()
        self._held: dict[tuple[str, tuple[int, int, int, int]], Hold] = {}
        self._tokens = itertools.count(1)
        self._ssl: ssl.SSLContext | None = None

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                options = self.config.client_options(self._pulsar, logging.getLogger(CLIENT_LOGGER))
                with self._guard("create a client for", "the service URL"):
                    try:
                        self._client = self._factory(self.config.service_url, **options)
                    except ValueError as exc:  # the client's URL check quotes the URL, userinfo and query included
                        from ..redaction import redact_url, scrub, url_secrets

                        url = self.config.service_url
                        raise BindingError(
                            f"Pulsar {redact_url(url)}: the client refused the service URL: use pulsar://host:port or "
                            f"pulsar+ssl://host:port, with no user or query ({scrub(str(exc), url_secrets(url))})"
                        ) from None
            return self._client

    @contextmanager
    def _guard(self, action: str, target: str) -> Iterator[None]:
        """Turn a client error into a :class:`BindingError` saying where, what failed and what to check."""
        try:
            yield
        except self._pulsar.PulsarException as exc:
            from ..redaction import redact_url, scrub, url_secrets

            cfg = self.config
            secrets = [cfg.token or "", *url_secrets(cfg.service_url), *url_secrets(cfg.admin_url)]
            kind, text = type(exc).__name__, scrub(str(exc), secrets)
            raise BindingError(
                f"Pulsar {redact_url(cfg.service_url)}: {action} {target!r} failed: "
                f"{CLIENT_HINTS.get(kind, 'the broker refused the operation')} ({kind}: {text})"
            ) from exc

    def _topic(self, queue_name: str) -> str:
        return topic_name(queue_name, self.config.tenant, self.config.namespace)

    def dead_letter_name(self, queue_name: str) -> str:
        """The queue's dead-letter topic, ``persistent://<tenant>/<namespace>/<queue><suffix>``."""
        return dead_letter_topic(queue_name, self.config.dead_letter_suffix, self.config.tenant, self.config.namespace)

    def dead_letter_sources(self, queue_name: str) -> list[str]:
        """The written dead-letter topic, then those of :attr:`PulsarConfig.dead_letter_sources` (none by default),
        each as a full topic name."""
        entries = self.config.dead_letter_sources
        assert isinstance(entries, tuple)  # normalised by PulsarConfig
        names = self.named_dead_letter_sources(queue_name, entries)
        return list(dict.fromkeys([names[0], *(self._topic(name) for name in names[1:])]))

    def _producer(self, topic: str) -> Any:
        with self._lock:
            if (producer := self._producers.get(topic)) is None:
                # No client-side batching: a negative ack of one batched message redelivers the whole batch.
                producer = self._producers[topic] = self.client.create_producer(
                    topic, batching_enabled=False, block_if_queue_full=True,
                    send_timeout_millis=self.config.operation_timeout_seconds * 1000,
                )
            return producer

    def _subscribe(self, topic: str, receiver_queue_size: int) -> Any:
        pulsar = self._pulsar
        return self.client.subscribe(
            topic, self.config.subscription, consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=receiver_queue_size,
            negative_ack_redelivery_delay_ms=round(self.config.redelivery_delay * 1000),
        )

    def _consumer(self, topic: str) -> Any:
        with self._lock:
            if (consumer := self._consumers.get(topic)) is None:
                with self._guard("subscribe to", topic):
                    consumer = self._consumers[topic] = self._subscribe(topic, self.config.receiver_queue_size)
                self._subscribed.add(topic)
            return consumer

    def _ensure_subscription(self, topic: str) -> None:
        """Create the subscription once per topic, with a zero-queue consumer closed at once (it is sent nothing,
        so no message is taken and no redelivery count rises). Without consume rights it is left to consumers."""
        if not self.config.create_subscription or topic in self._subscribed:
            return
        with self._lock:
            if topic in self._subscribed:
                return
            try:
                self._subscribe(topic, 0).close()
            except (self._pulsar.AuthorizationError, self._pulsar.InvalidConfiguration) as exc:
                logger.warning(
                    "Pulsar subscription %r on %s was not created (%s: %s); messages published before a consumer "
                    "subscribes are kept only if the subscription exists", self.config.subscription, topic,
                    type(exc).__name__, exc,
                )
            self._subscribed.add(topic)

    def _send(self, topic: str, body: bytes, properties: dict[str, str], envelope: Any, delay_ms: int = 0) -> None:
        """One message, after the size check and the subscription (the caller holds the guard)."""
        if len(body) > self.config.max_message_bytes:
            raise BindingError(
                f"a {len(body)}-byte body for {topic!r} is over max_message_bytes={self.config.max_message_bytes}; "
                "nothing was sent"
            )
        self._ensure_subscription(topic)
        self._producer(topic).send(
            body, properties=properties, partition_key=partition_key(envelope),
            deliver_after=timedelta(milliseconds=delay_ms) if delay_ms else None,
        )

    def _context(self) -> ssl.SSLContext | None:
        if self._ssl is None and self.config.admin_url.startswith("https:"):
            self._ssl = self.config.ssl_context()
        return self._ssl

    def publish(
        self, body: bytes, queue_name: str, *, headers: Mapping[str, Any] | None = None, delay: float = 0
    ) -> None:
        """Send one message (blocking until the broker persisted it).

        :param headers: further string properties; the ``bq-*`` projection wins a name clash.
        :param delay: seconds before delivery (``deliver_after``, Shared subscriptions only), mirrored on ``bq-delay``.
        """
        body, topic, delay_ms = bytes(body), self._topic(queue_name), delay_millis(delay)
        envelope = parse_body(body)[0]
        with self._guard("publish to", topic):
            self._send(topic, body, outgoing_properties(envelope, headers, delay_ms=delay_ms), envelope, delay_ms)

    def publish_batch(self, bodies: Sequence[bytes], queue_name: str) -> None:
        """Pipeline every body with ``send_async``, flush, then read each send's result.

        A body over ``max_message_bytes`` fails the batch before anything is sent; otherwise
        :class:`PublishBatchError` lists exactly the bodies whose send did not succeed (or never started).
        """
        bodies, topic = [bytes(b) for b in bodies], self._topic(queue_name)
        limit = self.config.max_message_bytes
        if too_big := [i for i, body in enumerate(bodies) if len(body) > limit]:
            raise PublishBatchError(
                f"bodies {too_big[:10]} are over max_message_bytes={limit}; nothing was sent", range(len(bodies))
            )
        results: list[Any] = [None] * len(bodies)
        settled = threading.Condition()

        def record(index: int, result: Any, _message_id: Any) -> None:  # on a client thread: must never raise
            with settled:
                results[index] = result
                settled.notify_all()

        started, error = 0, None
        try:
            with self._guard("publish a batch to", topic):
                if bodies:
                    self._ensure_subscription(topic)
                for body in bodies:
                    envelope = parse_body(body)[0]
                    self._producer(topic).send_async(
                        body, partial(record, started), properties=outgoing_properties(envelope),
                        partition_key=partition_key(envelope),
                    )
                    started += 1
                if bodies:
                    self._producer(topic).flush()
        except BindingError as exc:
            error = exc
        with settled:  # flush returns once the sends completed; this covers callbacks still on their way
            settled.wait_for(lambda: None not in results[:started], self.config.operation_timeout_seconds)
        ok = self._pulsar.Result.Ok
        failed = [i for i, result in enumerate(results) if result != ok]
        if error is not None:
            delivered = len(bodies) - len(failed)
            raise PublishBatchError(f"{error}; {delivered} of {len(bodies)} bodies were delivered", failed) from error
        if failed:
            from ..redaction import redact_url

            reasons = sorted({str(results[i]) for i in failed})
            raise PublishBatchError(
                f"Pulsar {redact_url(self.config.service_url)}: {len(failed)} of {len(bodies)} bodies for {topic!r} "
                "were not "
                f"delivered ({', '.join(reasons)}); all others were",
                failed,
            )

    def _take(self, queue_name: str, topic: str, timeout: float, dead: bool) -> ReceivedMessage | None:
        """Receive one message within ``timeout`` (at least ``min_receive_wait``), expiring leases meanwhile."""
        consumer = self._consumer(topic)
        deadline = time.monotonic() + max(timeout, self.config.min_receive_wait)
        while True:
            self._expire()
            wait = deadline - time.monotonic()
            if (lease := self._next_lease()) is not None:
                wait = min(wait, max(lease - time.monotonic(), 0.005))
            with self._guard("receive from", topic):
                try:
                    message = consumer.receive(timeout_millis=max(0, math.ceil(wait * 1000)))
                except self._pulsar.Timeout:
                    message = None
            if message is not None:
                return self._hold(message, consumer, topic, queue_name, dead)
            if time.monotonic() >= deadline:
                return None

    def _hold(self, message: Any, consumer: Any, topic: str, queue_name: str, dead: bool) -> ReceivedMessage:
        key, token, lease = message_key(message.message_id()), next(self._tokens), self.config.visibility_timeout
        with self._lock:
            self._held[(topic, key)] = Hold(token, time.monotonic() + lease if lease else math.inf, consumer, message)
        return received(message, queue_name, Receipt(topic, key, token), dead, topic, self.decode_limit)

    def _next_lease(self) -> float | None:
        with self._lock:
            deadline = min((hold.deadline for hold in self._held.values()), default=math.inf)
        return deadline if deadline < math.inf else None

    def _expire(self) -> None:
        """Negatively acknowledge reservations held past ``visibility_timeout``: the broker redelivers them."""
        if self.config.visibility_timeout is None:
            return
        now = time.monotonic()
        with self._lock:
            for place in [place for place, hold in self._held.items() if hold.deadline <= now]:
                hold = self._held.pop(place)
                try:
                    hold.consumer.negative_acknowledge(hold.message)
                except self._pulsar.PulsarException:  # a closed consumer: the broker redelivers what it held
                    logger.debug("Pulsar negative ack of an expired reservation failed", exc_info=True)
                logger.warning(
                    "Pulsar message %s on %s passed its visibility timeout (%s s): negatively acknowledged, "
                    "redelivered after %s s", place[1], place[0], self.config.visibility_timeout,
                    self.config.redelivery_delay,
                )

    def _settle(self, message: ReceivedMessage, action: str, copy: tuple[Any, ...] | None = None,
                nack: bool = False) -> None:
        """Publish ``copy`` (topic, body, properties, envelope, delay ms) if any, then ack (or negatively ack)."""
        receipt = message.receipt
        if not isinstance(receipt, Receipt):
            raise BindingError(f"message from queue {message.queue_name!r} was not reserved by a Pulsar binding")
        place = (receipt.topic, receipt.key)
        with self._lock:
            self._expire()
            hold = self._held.get(place)
            if hold is None or hold.token != receipt.token:
                logger.warning(
                    "Pulsar message %s on %s is no longer held by this reservation (settled already, visibility "
                    "timeout passed, or the binding closed); nothing was changed", receipt.key, receipt.topic,
                )
                return
            del self._held[place]
        try:
            with self._guard(action, receipt.topic):
                if copy is not None:
                    self._send(*copy)
                if nack:
                    hold.consumer.negative_acknowledge(hold.message)
                else:
                    hold.consumer.acknowledge(hold.message)
        except BaseException:
            with self._lock:  # still ours: the caller may retry or dead-letter it
                self._held.setdefault(place, hold)
            raise

    def reserve(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        return self._take(queue_name, self._topic(queue_name), timeout, dead=False)

    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        """From the written dead-letter topic, then each extra source whose stats show messages (subscribing to a
        topic would create it, and a read must not); waits on the written topic while all are empty."""
        written, *extras = self.dead_letter_sources(queue_name)
        if not extras:
            return self._take(queue_name, written, timeout, dead=True)
        end = time.monotonic() + max(timeout, 0)
        while True:
            if (message := self._take(queue_name, written, 0, dead=True)) is not None:
                return message
            for topic in extras:
                if self._count(topic) > 0 and (message := self._take(queue_name, topic, 0, dead=True)) is not None:
                    return message
            if time.monotonic() >= end:
                return None

    def ack(self, message: ReceivedMessage) -> None:
        self._settle(message, "acknowledge a message of")

    def reservation_seconds(self, queue_name: str) -> float | None:
        """An unacknowledged message stays this consumer's until it closes, unless ``visibility_timeout`` sets a
        lease."""
        return self.config.visibility_timeout

    def hand_back(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """Publish each message again as it is (bytes and properties; ``deliver_after`` = delay), then acknowledge
        the original: the copy is a new message, so the subscription's redelivery count does not move. A dead
        letter goes back to its DLQ by negative acknowledgement, as :meth:`release` does."""
        delay_ms = delay_millis(delay)
        for message in messages:
            if message.from_dead_letter:
                self._settle(message, "return a dead letter to", nack=True)
                continue
            properties = outgoing_properties(message.envelope, message.headers, delay_ms=delay_ms,
                                             attempts=message.attempts)
            topic = message.receipt.topic if isinstance(message.receipt, Receipt) else self._topic(message.queue_name)
            self._settle(message, "hand back a message to", (topic, message.body, properties, message.envelope,
                                                             delay_ms))

    def release(self, message: ReceivedMessage, delay: float = 0) -> None:
        """Publish a copy with ``attempts`` + 1 (``deliver_after`` = delay), then acknowledge the original. A
        message drained from the DLQ goes back there unchanged by negative acknowledgement, after
        ``redelivery_delay`` (a per-message ``delay`` does not apply)."""
        if message.from_dead_letter:
            return self._settle(message, "return a dead letter to", nack=True)
        body, delay_ms = bumped_body(message), delay_millis(delay)
        envelope = parse_body(body)[0]
        properties = outgoing_properties(envelope, message.headers, delay_ms=delay_ms, attempts=message.attempts + 1)
        topic = message.receipt.topic if isinstance(message.receipt, Receipt) else self._topic(message.queue_name)
        self._settle(message, "release a message to", (topic, body, properties, envelope, delay_ms))

    def dead_letter(
        self, message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
    ) -> None:
        """Publish the annotated envelope (poison: the bytes) to ``<queue><suffix>``, then acknowledge the original."""
        body = dead_letter_body(message, reason, error=error, exception=exception)
        envelope = parse_body(body)[0]
        properties = outgoing_properties(envelope, message.headers, attempts=message.attempts)
        topic = self.dead_letter_name(message.queue_name)
        self._settle(message, "dead-letter a message to", (topic, body, properties, envelope, 0))

    def _count(self, topic: str) -> int:
        self._expire()
        return ready_count(admin_get(self.config, stats_path(topic), self._context()), self.config.subscription)

    def depth(self, queue_name: str) -> int:
        """Ready messages of the ``babelqueue`` subscription: one admin stats GET (0 for a missing topic)."""
        return self._count(self._topic(queue_name))

    def dead_letter_depth(self, queue_name: str) -> int:
        """The ready count of each dead-letter topic, summed: one admin stats GET each (a missing topic is 0)."""
        return sum(self._count(topic) for topic in self.dead_letter_sources(queue_name))

    def browse_dead_letters(self, queue_name: str, limit: int = 100) -> list[ReceivedMessage]:
        """Not supported: a Reader also returns dead letters already drained (acknowledgements do not hide
        messages from readers until retention deletes them), so a browse would report messages that are gone."""
        raise NotSupportedError(
            f"Pulsar cannot list the dead letters of {self.dead_letter_name(queue_name)!r} without taking them "
            "(a Reader also returns acknowledged ones); drain it with reserve_dead_letter + ack instead"
        )

    def ping(self) -> None:
        """One admin stats GET (the web service and the token; a 404 is fine) and one topic lookup on the broker
        (the service URL, TLS and the token). Creates nothing: no topic, producer or subscription."""
        topic = self._topic("babelqueue-ping")
        admin_get(self.config, stats_path(topic), self._context())
        with self._guard("look up", topic):
            self.client.get_topic_partitions(topic)

    def close(self) -> None:
        """Close consumers, producers and the client; unacknowledged reservations go back to the subscription."""
        with self._lock:
            resources = [*self._consumers.values(), *self._producers.values(), self._client]
            self._consumers, self._producers, self._held, self._subscribed, self._client = {}, {}, {}, set(), None
        for resource in filter(None, resources):
            try:
                resource.close()
            except self._pulsar.PulsarException:
                logger.debug("Pulsar close failed; the broker drops the connection anyway", exc_info=True)

