"""The message trigger: live BabelQueue messages start DAG runs (``AssetWatcher``, the ``babelqueue+*`` schemes).

At least once, from the broker to a saved asset event. The trigger runs on Airflow's shared-stream ack mode
(``airflow.triggers.shared_stream``): one producer per (connection, queue, filter, event shape) reserves messages,
the triggerer turns each group of them into one event, and the producer settles a message only after the
triggerer has confirmed that its event is stored in the metadata database. Until then the message stays reserved
on the broker: a triggerer killed at any point leaves it there, and the broker hands it out again (at once where
the reservation lives on the connection, RabbitMQ and Pulsar; after the visibility timeout elsewhere). An event
whose storage is not confirmed within the triggerer's ack timeout is handed back the same way. So a message can
start a run twice (after a crash), never zero times; DAGs de-duplicate by ``meta.id`` (docs/events.md).

What is not an event:

* a message the filter does not take (:mod:`..engine.filters`): handed back unchanged after ``unmatched_delay``,
  never acked or dead-lettered (another reader may be the one it is for);
* without a filter, a body that is not a valid envelope: dead-lettered with its reason, as a consumer does;
* a matching message whose envelope would not fit ``max_event_bytes``: dead-lettered (reason ``failed``, the
  error says how large it is), since an event is stored in the metadata database and a run cannot be started
  without its payload; its bytes stay in the DLQ for a consume task or a replay.

Events carry ``{"queue_name", "babelqueue_conn_id", "count", "messages": [{"meta_id", "urn", "attempts",
"envelope"}]}``: one message per event by default, up to ``batch_size`` with a larger one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome, SharedStreamProducer

from ..bindings.base import Binding
from ..bindings.message import ReceivedMessage
from ..core import envelope as bq
from ..core.errors import NotSupportedError
from ..engine.filters import MessageFilter, message_filter
from ..hooks import DEFAULT_CONN_ID
from .thread import BrokerThread

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "EVENT_STORED", "RUN_FINISHED", "BabelQueueMessageTrigger", "MessageProducer",
           "envelopes_from", "event_entries", "held_receipts"]

logger = logging.getLogger(__name__)

#: 64 KiB of envelopes per event: an asset event's payload is a row in the metadata database that every run it
#: starts reads, so it stays far below what the database takes, and well above a typical envelope (under 1 KiB).
DEFAULT_MAX_EVENT_BYTES = 64 * 1024
#: Messages reserved and not yet settled, at most: when the metadata database is slow to confirm, the producer
#: waits instead of reserving the whole queue, and a message waits for its confirmation behind at most this many.
DEFAULT_MAX_PENDING = 100
#: Seconds a reserved message is held while its event waits to be stored, where the broker lets a reservation be
#: extended (SQL, Redis, SQS): longer than the triggerer's ``shared_stream_ack_timeout`` (300 s by default), so the
#: broker never hands a message out again while its event is still on its way; the ack timeout acts first.
DEFAULT_RESERVATION_TIMEOUT = 600.0
#: Seconds a read waits while settlements are due: the broker thread is shared, so a settle waits for the read.
_SETTLE_TURN = 0.2
#: ``settle`` values: a message is settled once its event is stored (every broker), or by the run it started.
EVENT_STORED, RUN_FINISHED = "event_stored", "run_finished"
#: How long a message held for its run stays reserved (``settle="run_finished"``): a run longer than this has its
#: message handed out again.
DEFAULT_RUN_TIMEOUT = 3600.0
#: How :meth:`BabelQueueMessageTrigger.run` (outside a shared stream) reports an event its caller took.
_TAKEN = AdvanceOutcome(acked=1, failed=0)


def event_entries(messages: Sequence[ReceivedMessage], batch_size: int, max_event_bytes: int
                  ) -> tuple[list[list[tuple[ReceivedMessage, dict[str, Any]]]], list[tuple[ReceivedMessage, int]]]:
    """Group messages (in order) into events of at most ``batch_size`` entries and ``max_event_bytes`` of JSON.

    Returns the groups, each a list of ``(message, entry)``, and the messages too large for any event with their
    entry's size. Pure: the producer and the tests use it.
    """
    groups: list[list[tuple[ReceivedMessage, dict[str, Any]]]] = []
    too_large: list[tuple[ReceivedMessage, int]] = []
    current: list[tuple[ReceivedMessage, dict[str, Any]]] = []
    size = 0
    for message in messages:
        entry = {"meta_id": message.meta_id, "urn": message.urn, "attempts": message.attempts,
                 "envelope": message.envelope}
        entry_size = len(orjson.dumps(entry)) + 1
        if entry_size > max_event_bytes:
            too_large.append((message, entry_size))
            continue
        if current and (len(current) >= batch_size or size + entry_size > max_event_bytes):
            groups.append(current)
            current, size = [], 0
        current.append((message, entry))
        size += entry_size
    if current:
        groups.append(current)
    return groups, too_large


def envelopes_from(triggering_asset_events: Mapping[Any, Iterable[Any]] | None) -> list[dict[str, Any]]:
    """The envelopes a run was started for, from its ``triggering_asset_events``, in order, each ``meta.id`` once.

    An asset event made by :class:`BabelQueueMessageTrigger` keeps the trigger's payload under ``extra["payload"]``
    (Airflow's ``{"from_trigger": true, "payload": ...}``); events from anything else are skipped. A message the
    broker handed out twice (after a triggerer restart) may sit in two events of one run: it is returned once.
    Across runs, remember what was processed (a seen-store, as the sample DAG ``babelqueue_order_events`` does).
    """
    out: list[dict[str, Any]] = []
    ids: set[str] = set()
    for payload in _payloads(triggering_asset_events):
        messages = payload.get("messages")
        for entry in messages if isinstance(messages, list) else ():
            envelope, meta_id = entry.get("envelope"), entry.get("meta_id") or ""
            if not isinstance(envelope, dict) or (meta_id and meta_id in ids):
                continue
            ids.add(meta_id)
            out.append(envelope)
    return out


def _payloads(triggering_asset_events: Mapping[Any, Iterable[Any]] | None) -> Iterator[Mapping[str, Any]]:
    """The trigger payloads (``extra["payload"]``) of a run's asset events, in order; other events skipped."""
    for events in (triggering_asset_events or {}).values():
        for event in events:
            extra = getattr(event, "extra", None) or {}
            payload = extra.get("payload") if isinstance(extra, Mapping) else None
            if isinstance(payload, Mapping):
                yield payload


def held_receipts(triggering_asset_events: Mapping[Any, Iterable[Any]] | None) -> dict[str, list[str]]:
    """Connection id → receipts of the messages a run was started for with ``settle="run_finished"``, for
    :meth:`~..bindings.base.Binding.settle_held` (what ``BabelQueueSettleRunOperator`` does)."""
    out: dict[str, list[str]] = {}
    for payload in _payloads(triggering_asset_events):
        if payload.get("settle") != RUN_FINISHED:
            continue
        receipts = [entry["receipt"] for entry in payload.get("messages") or () if entry.get("receipt")]
        out.setdefault(str(payload.get("babelqueue_conn_id")), []).extend(receipts)
    return out


def _split(messages: Sequence[ReceivedMessage], chosen: MessageFilter
           ) -> tuple[list[ReceivedMessage], list[ReceivedMessage], list[tuple[ReceivedMessage, str]]]:
    """(taken, handed back, to dead-letter with a reason) for a reserved batch."""
    taken: list[ReceivedMessage] = []
    others: list[ReceivedMessage] = []
    invalid: list[tuple[ReceivedMessage, str]] = []
    for message in messages:
        if chosen.active:
            (taken if chosen.matches(message.envelope) else others).append(message)
            continue
        reason = bq.Reason.POISON if message.envelope is None else bq.check(message.envelope)
        if reason is None:
            taken.append(message)
        else:
            invalid.append((message, str(reason)))
    return taken, others, invalid


class MessageProducer(SharedStreamProducer):
    """Reserves messages for one shared stream and settles them once their events are stored.

    ``open_stream`` yields ``(event payload, messages)``; :meth:`advance` acks the messages of every event all
    subscribers stored, and hands back (unchanged, not counted as an attempt) those of an event that failed
    (the ack timeout passed without a storage confirmation, or a subscriber fell behind).

    :param kwargs: the trigger's serialised arguments (the ones in its shared-stream key decide what is read).
    """

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs
        self.queue_name: str = kwargs["queue_name"]
        self.conn_id: str = kwargs.get("babelqueue_conn_id") or DEFAULT_CONN_ID
        self.filter = message_filter(kwargs.get("urns"), kwargs.get("jsonpath"))
        self.batch_size = int(kwargs.get("batch_size") or 1)
        self.max_event_bytes = int(kwargs.get("max_event_bytes") or DEFAULT_MAX_EVENT_BYTES)
        self.reserve_timeout = float(kwargs.get("reserve_timeout", 5.0))
        self.unmatched_delay = float(kwargs.get("unmatched_delay", 5.0))
        self.max_pending = int(kwargs.get("max_pending") or DEFAULT_MAX_PENDING)
        self.settle = str(kwargs.get("settle") or EVENT_STORED)
        self.run_timeout = float(kwargs.get("run_timeout") or DEFAULT_RUN_TIMEOUT)
        self.reservation_timeout = float(kwargs.get("reservation_timeout") or DEFAULT_RESERVATION_TIMEOUT)
        #: Whether the binding can hold a reservation (``None`` until the first try).
        self._holds: bool | None = None
        self._broker: BrokerThread | None = None
        self._pending = 0
        self._room = asyncio.Event()
        self._room.set()

    @property
    def broker(self) -> BrokerThread:
        if self._broker is None:
            self._broker = BrokerThread(self.conn_id)
        return self._broker

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        logger.info("reading messages of %s on %s (%s), %d per event", self.queue_name, self.conn_id,
                    self.filter.describe(), self.batch_size)
        want = max(self.batch_size, 10)
        while True:
            await self._room.wait()
            limit = min(want, self.max_pending - self._pending)
            # settlements run on this thread too: while events wait for theirs, a read waits only briefly
            wait = self.reserve_timeout if self._pending == 0 else min(self.reserve_timeout, _SETTLE_TURN)
            batch = await self.broker.call(_reserve, self.queue_name, max(limit, 1), wait)
            if not batch:
                continue
            matching, others, invalid = _split(batch, self.filter)
            groups, too_large = event_entries(matching, self.batch_size, self.max_event_bytes)
            if others:
                await self.broker.call(_hand_back, others, self.unmatched_delay)
            if invalid or too_large:
                await self.broker.call(_dead_letter, invalid, too_large, self.max_event_bytes)
            taken = [message for group in groups for message, _ in group]
            held = await self._hold(taken) if taken else None  # one call for the whole read
            start = 0
            for group in groups:
                items: list[Any] = [message for message, _ in group]
                if held is not None:
                    items, start = held[start:start + len(group)], start + len(group)
                    if self.settle == RUN_FINISHED:  # the run settles them: their receipts travel in the event
                        for (_, entry), receipt in zip(group, items, strict=True):
                            entry["receipt"] = receipt
                self._pending += len(items)
                if self._pending >= self.max_pending:
                    self._room.clear()
                payload = {"queue_name": self.queue_name, "babelqueue_conn_id": self.conn_id, "settle": self.settle,
                           "count": len(group), "messages": [entry for _, entry in group]}
                yield payload, (held is not None, items)

    async def _hold(self, messages: list[ReceivedMessage]) -> list[str] | None:
        """Hold the reservations while their event is on its way (``reservation_timeout``), or for the run
        (``run_timeout``): receipts, or ``None`` where the binding cannot (its reservations live on the connection
        and do not expire: RabbitMQ, Pulsar; Service Bus locks expire by the entity's lock duration)."""
        run = self.settle == RUN_FINISHED
        if self._holds is False and not run:
            return None
        seconds = self.run_timeout if run else self.reservation_timeout
        try:
            receipts = await self.broker.call(_hold, messages, seconds)
        except NotSupportedError:
            if run:
                raise
            self._holds = False
            return None
        self._holds = True
        return receipts

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        held = any(item.broker_payload[0] for item in batch)
        stored = [m for item in batch if item.outcome.is_clean for m in item.broker_payload[1]]
        failed = [m for item in batch if not item.outcome.is_clean for m in item.broker_payload[1]]
        if failed:
            logger.warning("%d message(s) of %s had no stored event (ack timeout or a subscriber fell behind): "
                           "handed back for another event", len(failed), self.queue_name)
        if not held:
            await self.broker.call(_settle, stored, failed)
        elif self.settle == RUN_FINISHED:  # stored: the run settles them; not stored: back for another event
            await self.broker.call(_settle_held, [], failed)
        else:
            await self.broker.call(_settle_held, stored, failed)
        self._pending -= len(stored) + len(failed)
        if self._pending < self.max_pending:
            self._room.set()

    async def aclose(self) -> None:
        if self._broker is not None:
            self._broker.close()


def _reserve(binding: Binding, queue_name: str, limit: int, timeout: float) -> list[ReceivedMessage]:
    return binding.reserve_many(queue_name, limit, timeout)


def _hand_back(binding: Binding, messages: list[ReceivedMessage], delay: float) -> None:
    binding.hand_back(messages, delay)


def _settle(binding: Binding, stored: list[ReceivedMessage], failed: list[ReceivedMessage]) -> None:
    if failed:
        binding.hand_back(failed)
    if stored:
        binding.settle(stored, ())


def _hold(binding: Binding, messages: list[ReceivedMessage], seconds: float) -> list[str]:
    return binding.hold(messages, seconds)


def _settle_held(binding: Binding, stored: list[str], failed: list[str]) -> None:
    if failed:
        binding.settle_held(failed, succeeded=False)
    if stored:
        binding.settle_held(stored, succeeded=True)


def _dead_letter(binding: Binding, invalid: list[tuple[ReceivedMessage, str]],
                 too_large: list[tuple[ReceivedMessage, int]], limit: int) -> None:
    for message, reason in invalid:
        error = message.decode_error if message.envelope is None else f"the envelope failed validation: {reason}"
        binding.dead_letter(message, reason, error=error)
    for message, size in too_large:
        binding.dead_letter(message, bq.Reason.FAILED, error=(
            f"the envelope takes {size:,} bytes in a trigger event, over max_event_bytes={limit:,}: consume it with "
            "BabelQueueConsumeOperator, or raise max_event_bytes"))
    if invalid or too_large:
        logger.warning("dead-lettered %d invalid and %d oversized message(s) of %s", len(invalid), len(too_large),
                       invalid[0][0].queue_name if invalid else too_large[0][0].queue_name)


class BabelQueueMessageTrigger(BaseEventTrigger):
    """Fires for live messages on a queue: at least once from the broker to a stored asset event.

    Usable by ``AssetWatcher`` and through ``MessageQueueTrigger(scheme="babelqueue+<broker>", ...)``. Triggers
    with the same connection, queue, filter and event shape share one reader in the triggerer (Airflow's shared
    stream); each message becomes part of one event, and is settled on the broker only after the event is stored.

    :param queue_name: the logical queue to read.
    :param babelqueue_conn_id: the BabelQueue connection; the triggerer resolves it, never the DAG parser.
    :param urns: only messages whose URN matches one of these ``fnmatch`` patterns make events.
    :param jsonpath: only messages whose ``data`` this RFC 9535 query selects something in make events.
    :param batch_size: messages per event at most (1: one run per message).
    :param max_event_bytes: the most JSON one event's envelopes may take; a larger envelope is dead-lettered.
    :param reserve_timeout: seconds each blocking read waits for a message (the broker's own wait, not a sleep).
    :param unmatched_delay: seconds a message the filter did not take stays hidden before it is ready again (so
        this reader does not take it back at once; other readers get it after the delay too).
    :param max_pending: messages reserved and not yet settled, at most (their events wait to be stored).
    :param settle: ``event_stored`` (default, every broker): a message is acked once its event is stored.
        ``run_finished`` (SQL, Redis and SQS, whose reservations another process can settle): the message stays reserved
        for ``run_timeout`` seconds and the run's ``BabelQueueSettleRunOperator`` acks it when the run succeeded or
        hands it back when it failed, so a failed run's message starts another run.
    :param run_timeout: with ``settle="run_finished"``, how long a message waits for its run to settle it.
    :param reservation_timeout: where the broker lets a reservation be extended (SQL, Redis, SQS), how long a
        reserved message is held while its event waits to be stored (default 600 s, longer than the triggerer's
        ack timeout): a slow metadata database never makes the broker hand it out again meanwhile. After a
        triggerer dies, its messages come back when this runs out.
    """

    def __init__(
        self,
        *,
        queue_name: str,
        babelqueue_conn_id: str = DEFAULT_CONN_ID,
        urns: str | Sequence[str] | None = None,
        jsonpath: str | None = None,
        batch_size: int = 1,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        reserve_timeout: float = 5.0,
        unmatched_delay: float = 5.0,
        max_pending: int = DEFAULT_MAX_PENDING,
        settle: str = EVENT_STORED,
        run_timeout: float = DEFAULT_RUN_TIMEOUT,
        reservation_timeout: float = DEFAULT_RESERVATION_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if settle not in (EVENT_STORED, RUN_FINISHED):
            raise ValueError(f"settle must be {EVENT_STORED!r} or {RUN_FINISHED!r}, got {settle!r}")
        for name, seconds in (("run_timeout", run_timeout), ("reservation_timeout", reservation_timeout)):
            if not 0 < seconds < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {seconds!r}")
        chosen = message_filter(urns, jsonpath)  # an invalid JSONPath fails where the DAG is parsed
        for name, value in (("batch_size", batch_size), ("max_event_bytes", max_event_bytes),
                            ("max_pending", max_pending)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if max_pending < batch_size:
            raise ValueError(f"max_pending ({max_pending}) must be at least batch_size ({batch_size})")
        self.queue_name = queue_name
        self.babelqueue_conn_id = babelqueue_conn_id
        self.urns = list(chosen.urns) or None
        self.jsonpath = chosen.jsonpath
        self.batch_size = batch_size
        self.max_event_bytes = max_event_bytes
        self.reserve_timeout = reserve_timeout
        self.unmatched_delay = unmatched_delay
        self.max_pending = max_pending
        self.settle = settle
        self.run_timeout = run_timeout
        self.reservation_timeout = reservation_timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "queue_name": self.queue_name,
                "babelqueue_conn_id": self.babelqueue_conn_id,
                "urns": self.urns,
                "jsonpath": self.jsonpath,
                "batch_size": self.batch_size,
                "max_event_bytes": self.max_event_bytes,
                "reserve_timeout": self.reserve_timeout,
                "unmatched_delay": self.unmatched_delay,
                "max_pending": self.max_pending,
                "settle": self.settle,
                "run_timeout": self.run_timeout,
                "reservation_timeout": self.reservation_timeout,
            },
        )

    def shared_stream_key(self) -> Hashable:
        """Everything the reader does: triggers equal in all of it share one reader and see the same events."""
        return ("babelqueue-messages", self.babelqueue_conn_id, self.queue_name, tuple(self.urns or ()),
                self.jsonpath, self.batch_size, self.max_event_bytes, self.settle)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return MessageProducer(kwargs)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for payload in shared_stream:
            yield TriggerEvent(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Outside a shared stream (a triggerer that does not share, a test): the same reader, each event's
        messages settled when the next event is asked for, i.e. after the caller took the event (the triggerer's
        storage is not confirmed on this path: a crash between the two can lose that event's messages' run)."""
        producer = MessageProducer(self.serialize()[1])
        stream = producer.open_stream()
        try:
            async for payload, messages in stream:
                yield TriggerEvent(payload)
                await producer.advance([AdvanceItem(messages, _TAKEN)])
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            await producer.aclose()
