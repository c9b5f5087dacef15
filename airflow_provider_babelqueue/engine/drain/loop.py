"""The dead-letter drain loop: copy or move the dead letters of several sources into one sink. No Airflow here.

A drain copies dead letters into one JSON Lines file (the format is :mod:`...core.records`): one record per
message, the body exactly as the broker stored it. In ``move`` mode a message is acked only once the file
holding its record is durable, so a crash anywhere leaves every message in the file, in the DLQ, or in both (a
duplicate, which readers drop by ``meta.id``) — never in neither.

Through a binding that offers a dead-letter pipeline (the typed optional capability
:class:`~...bindings.base.DeadLetterPipeline`, Redis today) ``move`` overlaps the broker, Python and the disk
(:mod:`.pipelined`). The rule is unchanged: a message is acked only after the sync of the file holding it
returned.

A source is a logical queue; its binding may read several dead-letter queues for it (``dead_letter_sources``:
the spec's name and the ``<queue>.dlq`` the official SDKs' workers write). The drain takes them all, and each
record's ``dead_letter_queue`` names the one its message came from; ``by_source`` stays keyed by connection and
queue.

The operator (``operators/drain.py``) resolves connections into :class:`DrainSource` values and a destination
into a sink, then calls :func:`drain_dead_letters`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ...bindings.base import Binding, DeadLetterPipeline
from ...bindings.message import ReceivedMessage
from ...core.records import RecordTemplate, drain_record
from ..logs import Log
from .pipelined import Piped, move_pipelined
from .sinks import Sink

__all__ = ["DrainResult", "DrainSource", "drain_dead_letters", "template_for"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DrainSource:
    """One dead-letter queue to drain.

    :param binding: the broker binding (from ``hook.get_binding()``).
    :param queue_name: the logical queue whose DLQ is drained.
    :param conn_id: the connection id, written to each record as ``source_conn_id``.
    """

    binding: Binding
    queue_name: str
    conn_id: str

    @property
    def key(self) -> str:
        return f"{self.conn_id}/{self.queue_name}"


@dataclass(slots=True)
class DrainResult:
    """What a drain wrote. ``by_source`` maps ``<conn_id>/<queue_name>`` to records written."""

    path: str
    records: int = 0
    bytes: int = 0
    by_source: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "records": self.records, "bytes": self.bytes, "by_source": dict(self.by_source)}


def template_for(source: DrainSource, dead_letter_queue: str | None = None) -> RecordTemplate:
    """The record template of ``source``'s dead letters (its broker, queue, DLQ and connection id).

    :param dead_letter_queue: the DLQ the records' messages were read from (one of the binding's
        ``dead_letter_sources``); by default the one the binding writes.
    """
    binding = source.binding
    return RecordTemplate(broker=binding.name, queue_name=source.queue_name,
                          dead_letter_queue=dead_letter_queue or binding.dead_letter_name(source.queue_name),
                          source_conn_id=source.conn_id)


def _give_back(binding: Binding, messages: Sequence[ReceivedMessage],
               log: Log) -> None:
    """Give reserved dead letters back to their DLQ unchanged (``release_many``); a failure is logged, not
    raised: each of them returns after the binding's visibility timeout anyway."""
    if not messages:
        return
    try:
        binding.release_many(messages)
    except Exception:  # noqa: BLE001 - it comes back after the visibility timeout anyway
        log.exception("could not release %d dead letters of %r; they return to the DLQ after the binding's "
                      "visibility timeout", len(messages), messages[0].queue_name)


class _Reserved:
    """One reservation batch of the plain protocol (``reserve_dead_letters``): acked with ``ack_many``."""

    __slots__ = ("binding", "messages")

    def __init__(self, binding: Binding, messages: Sequence[ReceivedMessage]) -> None:
        self.binding, self.messages = binding, messages

    def __len__(self) -> int:
        return len(self.messages)

    def held(self, start: int, stop: int) -> Sequence[ReceivedMessage]:
        return self.messages[start:stop]


class _Drain:
    """One run: the batch buffer, the reservations not acked yet, the counters.

    Reservations are tracked as segments ``[batch, start, stop]`` (a range of one reservation batch) rather
    than per message: ``unsynced`` ones have records in the buffer or written but not durable, ``unacked``
    ones are durable and wait for their ack.
    """

    def __init__(self, sink: Sink, *, mode: str, max_messages: int | None, max_bytes: int | None,
                 reserve_timeout: float, batch_records: int, batch_bytes: int, progress_every: int,
                 log: Log) -> None:
        self.sink, self.mode, self.log = sink, mode, log
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self.reserve_timeout = reserve_timeout
        self.batch_records, self.batch_bytes, self.progress_every = batch_records, batch_bytes, progress_every
        self.result = DrainResult(path=sink.location)
        self.buffer: list[bytes] = []
        self.buffered = 0
        self.durable = 0  # bytes of the file known durable (written + synced)
        self.unsynced: list[list[Any]] = []  # [batch, start, stop]: in the buffer or written, not durable
        self.unacked: list[list[Any]] = []  # durable, not acked yet
        # The reservation batch being buffered: its first ``taken`` messages are in ``unsynced`` (or further).
        self.hand: _Reserved | Piped | None = None
        self.taken = 0
        # Open dead-letter pipelines: the current source's, and (object storage, whose acks wait for close())
        # those of earlier sources whose acks are still to be sent.
        self.pipelines: list[DeadLetterPipeline] = []
        # Sync-ahead (pipelined sources on a durable sink): one thread runs the sink's sync of the batch just
        # written while the next batch is built; ``syncing`` = (future, its segments, durable size once done).
        self.syncer: ThreadPoolExecutor | None = None
        self.syncing: tuple[Future[None], list[list[Any]], int] | None = None
        self.next_log = progress_every
        self.started = time.monotonic()
        self.full = False
        self.templates: dict[tuple[str, str | None], RecordTemplate] = {}

    def template(self, source: DrainSource, dead_letter_queue: str | None) -> RecordTemplate:
        """The record template of ``source``'s dead letters read from ``dead_letter_queue`` (built once)."""
        key = (source.key, dead_letter_queue)
        if (template := self.templates.get(key)) is None:
            template = self.templates[key] = template_for(source, dead_letter_queue)
        return template

    # -- bounds

    def room_for(self, size: int) -> bool:
        """Whether a record of ``size`` bytes may still be written. The first record always may, so a
        single record larger than ``max_bytes`` cannot stall every future drain."""
        if self.max_messages is not None and self.result.records >= self.max_messages:
            return False
        if self.max_bytes is not None:
            total = self.result.bytes
            return total == 0 or total + size <= self.max_bytes
        return True

    def count_full(self) -> bool:
        return self.max_messages is not None and self.result.records >= self.max_messages

    # -- records

    def add(self, source: DrainSource, message: ReceivedMessage, template: RecordTemplate,
            batch: _Reserved | None, index: int) -> bool:
        """Buffer one record; ``False`` (and :attr:`full`) when it does not fit, and then it is not in the file:
        the caller gives a reserved message back to its DLQ. ``batch`` and ``index`` say which reservation the
        message is (``None`` in browse mode: nothing to ack)."""
        drained_at = time.time_ns() // 1_000_000
        record = template.of_message(message, drained_at)
        if record is None:
            record = drain_record(message, broker=source.binding.name, dead_letter_queue=template.dead_letter_queue,
                                  source_conn_id=source.conn_id, drained_at=drained_at)
        if not self.room_for(len(record)):
            self.full = True
            return False
        self.buffer.append(record)
        self.buffered += len(record)
        if batch is not None:
            self._hold(batch, index, index + 1)
            self.taken = index + 1
        result = self.result
        result.records += 1
        result.bytes += len(record)
        result.by_source[source.key] = result.by_source.get(source.key, 0) + 1
        if len(self.buffer) >= self.batch_records or self.buffered >= self.batch_bytes:
            self.flush()
        self._progress()
        return True

    def add_batch(self, source: DrainSource, batch: Piped, template: RecordTemplate) -> None:
        """Buffer the records of a whole pipelined batch, flushing at the same thresholds as :meth:`add`. A
        record that no longer fits (``max_bytes``; ``max_messages`` is kept by the reservation sizes) sets
        :attr:`full`, and it and the rest of the batch go back to the DLQ at once."""
        records = template.of_raws(batch.batch.raws, template.stamp(time.time_ns() // 1_000_000))
        self.hand, self.taken = batch, 0
        added = self._buffer(source, records, batch)
        if added < len(records):
            self.hand = None
            _give_back(batch.binding, batch.held(added, len(records)), self.log)  # not in the file

    def add_raws(self, source: DrainSource, raws: Sequence[bytes], template: RecordTemplate) -> None:
        """Browse mode's :meth:`add_batch`: records of stored bytes, nothing reserved (nothing to ack or give
        back); stops (:attr:`full`) at the first record past ``max_bytes`` or ``max_messages``."""
        for start in range(0, len(raws), self.batch_records):
            chunk = raws[start:start + self.batch_records]
            self._buffer(source, template.of_raws(chunk, template.stamp(time.time_ns() // 1_000_000)), None)
            if self.full:
                return

    def _buffer(self, source: DrainSource, records: Sequence[bytes], batch: Piped | None) -> int:
        """Buffer ``records`` while they fit (:meth:`room_for`; the first that does not sets :attr:`full`),
        flushing at the batch thresholds; record ``i`` is reservation ``i`` of ``batch`` when there is one.
        Returns how many were buffered."""
        result, buffer, start = self.result, self.buffer, 0
        batch_records, batch_bytes = self.batch_records, self.batch_bytes
        added = len(records)
        for index, record in enumerate(records):
            size = len(record)
            if not self.room_for(size):
                self.full, added = True, index
                break
            buffer.append(record)
            self.buffered += size
            result.records += 1
            result.bytes += size
            if len(buffer) >= batch_records or self.buffered >= batch_bytes:
                if batch is not None:
                    self._hold(batch, start, index + 1)
                    start = self.taken = index + 1
                self.flush()
        if batch is not None:
            self._hold(batch, start, added)
            self.taken = added
        result.by_source[source.key] = result.by_source.get(source.key, 0) + added
        self._progress()
        return added

    def _hold(self, batch: _Reserved | Piped, start: int, stop: int) -> None:
        """Reservations ``start``..``stop`` - 1 of ``batch`` now have records in the buffer."""
        if stop <= start:
            return
        last = self.unsynced[-1] if self.unsynced else None
        if last is not None and last[0] is batch and last[2] == start:
            last[2] = stop
        else:
            self.unsynced.append([batch, start, stop])

    def _progress(self) -> None:
        result = self.result
        if result.records >= self.next_log:
            while self.next_log <= result.records:
                self.next_log += self.progress_every
            elapsed = time.monotonic() - self.started
            self.log.info("drained %d dead letters (%d bytes) so far, %.0f msg/s", result.records, result.bytes,
                          result.records / elapsed if elapsed > 0 else 0.0)

    def flush(self) -> None:
        """Write the buffer; when the sink makes batches durable, sync it and ack what it holds. While the
        syncer thread is on (a pipelined source on a durable sink) the sync runs there and its batch is acked
        at the next flush (or :meth:`settle_sync`), so the disk works while the next batch's records are built;
        a batch is still acked only after its sync returned."""
        if self.syncer is not None:
            self.settle_sync()
            if self.buffer or self.unsynced:
                data = b"".join(self.buffer)
                self.buffer.clear()  # in place: add_batch holds the list
                self.buffered = 0
                if data:
                    self.sink.write(data)
                self.syncing = (self.syncer.submit(self.sink.sync), self.unsynced, self.durable + len(data))
                self.unsynced = []
            return
        if self.buffer:
            data = b"".join(self.buffer)
            self.buffer.clear()  # in place: add_batch holds the list
            self.buffered = 0
            self.sink.write(data)
            if self.sink.durable_batches:
                self.sink.sync()
                self.durable += len(data)
        if self.sink.durable_batches and self.unsynced:
            self.unacked, self.unsynced = self.unsynced, []
            self.ack_all()

    def settle_sync(self) -> None:
        """Wait for the sync in flight (sync-ahead mode), then ack the batch it made durable. A failed sync puts
        its segments back in :attr:`unsynced` (not durable: cut from the file and released) and raises."""
        error = self._collect_sync()
        if error is not None:
            raise error
        self.ack_all()

    def stop_syncer(self) -> None:
        """Leave sync-ahead mode once no sync is in flight (after :meth:`settle_sync`, or on failure: then
        the sync in flight is waited for and its batch counts as durable only if it succeeded)."""
        self._collect_sync()  # an error here is already being handled: the batch is released with the rest
        if self.syncer is not None:
            syncer, self.syncer = self.syncer, None
            syncer.shutdown(wait=True)

    def _collect_sync(self) -> BaseException | None:
        """Wait for the sync in flight, if any: on success its segments are durable and wait for their ack; on
        failure they go back to :attr:`unsynced` and the error is returned."""
        if self.syncing is None:
            return None
        future, segments, durable = self.syncing
        self.syncing = None
        try:
            future.result()
        except BaseException as exc:  # noqa: BLE001 - returned to the caller, which raises or releases
            self.unsynced[:0] = segments
            return exc
        self.durable = durable
        self.unacked.extend(segments)
        return None

    def ack_all(self) -> None:
        """Ack in reservation order (cheapest for list-based DLQs): a pipelined segment through its pipeline
        (sent, not waited for), else one ``ack_many`` per run of segments from the same binding; on an error
        that run and the rest stay listed (released on failure: settling a message again is harmless)."""
        unacked, done = self.unacked, 0
        try:
            while done < len(unacked):
                batch, start, stop = unacked[done]
                end = done + 1
                if isinstance(batch, Piped):
                    batch.pipeline.ack(batch.batch, start, stop)
                else:
                    messages = list(batch.held(start, stop))
                    while (end < len(unacked) and isinstance(unacked[end][0], _Reserved)
                           and unacked[end][0].binding is batch.binding):
                        messages.extend(unacked[end][0].held(unacked[end][1], unacked[end][2]))
                        end += 1
                    batch.binding.ack_many(messages)
                done = end
        finally:
            del unacked[:done]

    def finish(self) -> None:
        self.flush()
        self.sink.close()
        if self.unsynced:  # object storage: durable only now that close() returned
            self.unacked, self.unsynced = self.unsynced, []
            self.ack_all()
        self.close_pipelines()

    def close_pipelines(self) -> None:
        """Settle the open pipelines' acks in flight and give their connections back (one that fails stays
        listed for :meth:`fail` to abort)."""
        while self.pipelines:
            self.pipelines[0].finish()
            del self.pipelines[0]

    def fail(self) -> None:
        """Something failed: cut the file back to what is durable and release every message not acked back to
        its DLQ, so each one is in the file, in the DLQ, or (durable but not acked) in both."""
        self.stop_syncer()
        try:
            self.sink.abort(self.durable)
        except Exception:  # noqa: BLE001 - report, then go on releasing
            self.log.exception("could not cut %s back to its last durable size", self.sink.location)
        if self.unacked:
            self.log.warning("%d dead letters are in the file but were not acked; they stay in the DLQ too "
                             "(duplicates, removed by meta.id downstream)",
                             sum(stop - start for _, start, stop in self.unacked))
        by_binding: dict[int, tuple[Binding, list[ReceivedMessage]]] = {}

        def give(binding: Binding, messages: Sequence[ReceivedMessage]) -> None:
            by_binding.setdefault(id(binding), (binding, []))[1].extend(messages)

        pipelines, self.pipelines = self.pipelines, []
        for pipeline in pipelines:  # reserved ahead, acks in flight: read what can be read, then release
            give(pipeline.binding, pipeline.abort())
        for batch, start, stop in self.unacked + self.unsynced:
            give(batch.binding, batch.held(start, stop))
        if self.hand is not None:  # reserved, not buffered
            give(self.hand.binding, self.hand.held(self.taken, len(self.hand)))
        self.unsynced, self.unacked, self.hand = [], [], None
        for binding, messages in by_binding.values():
            _give_back(binding, messages, self.log)

    # -- modes

    def reserve_limit(self) -> int:
        """How many dead letters the next reservation may take: what fills the current batch, within
        ``max_messages``, and (with ``max_bytes``) about what still fits at the average record size so far."""
        limit = self.batch_records - len(self.buffer)
        result = self.result
        if self.max_messages is not None:
            limit = min(limit, self.max_messages - result.records)
        if self.max_bytes is not None and result.records:
            average = max(result.bytes // result.records, 1)
            limit = min(limit, max((self.max_bytes - result.bytes) // average + 1, 1))
        return max(limit, 1)

    def move(self, source: DrainSource) -> None:
        """Reserve dead letters in batches (``reserve_dead_letters``, one round trip on Redis and SQL, taking each
        dead-letter source in turn), buffer their records; :meth:`flush` acks each durable batch with
        ``ack_many``. A binding with a dead-letter pipeline (Redis) is drained through one pipeline per source
        instead (:func:`.pipelined.move_pipelined`); with a ``reserve_timeout``, a queue found empty is then
        waited for here."""
        binding = source.binding
        piped = False
        for dead_letter_queue in binding.dead_letter_sources(source.queue_name):
            pipeline = binding.open_dead_letter_pipeline(source.queue_name, source=dead_letter_queue)
            if pipeline is None:
                break
            piped = True
            move_pipelined(self, source, pipeline, self.template(source, dead_letter_queue))
            if self.full or self.count_full():
                return
        if piped and self.reserve_timeout <= 0:
            return
        settled = False
        while not self.count_full() and not self.full:
            messages = binding.reserve_dead_letters(source.queue_name, self.reserve_limit(),
                                                    timeout=self.reserve_timeout)
            if not messages:
                # What we hold may hide the rest of the DLQ (SQS FIFO groups): make it durable, ack it, look again.
                if settled or not self.sink.durable_batches or not self.unsynced \
                        or not binding.dead_letters_hidden_while_held(source.queue_name):
                    return
                self.flush()
                settled = True
                continue
            settled = False
            batch = _Reserved(binding, messages)
            self.hand, self.taken = batch, 0
            for index, message in enumerate(messages):
                template = self.template(source, message.dead_letter_source)
                if not self.add(source, message, template, batch, index):
                    self.hand = None
                    _give_back(binding, messages[index:], self.log)  # back to the DLQ unchanged: not in the file
                    return
            self.hand = None

    def browse(self, source: DrainSource) -> None:
        """Read the DLQ in growing windows (browse has no cursor: each call reads from the head) and write
        the messages past the ones already written. A concurrent consumer can shift the window: browse
        mode is a best-effort snapshot, not an exact one. A window is held in memory whole.

        Where the binding offers the stored bytes (Redis), each dead-letter source is read on its own, so every
        record names its source; otherwise the binding's browse spans the sources and each message names its."""
        binding = source.binding
        # Start with the whole DLQ (one read when nothing arrives meanwhile); the window doubles if it grew.
        window = max(self.batch_records, binding.dead_letter_depth(source.queue_name) + 1)
        for dead_letter_queue in binding.dead_letter_sources(source.queue_name):
            if not self.browse_raws(source, dead_letter_queue, window):
                break  # not offered: browse the messages of every source below
            if self.count_full() or self.full:
                return
        else:
            return
        seen, limit = 0, window
        while not self.count_full() and not self.full:
            if self.max_messages is not None:
                limit = min(limit, seen + self.max_messages - self.result.records)
            batch = binding.browse_dead_letters(source.queue_name, limit=limit)
            for message in batch[seen:]:
                if not self.add(source, message, self.template(source, message.dead_letter_source), None, 0):
                    return
            seen = max(seen, len(batch))
            if seen < limit:
                return
            limit *= 2

    def browse_raws(self, source: DrainSource, dead_letter_queue: str, limit: int) -> bool:
        """Browse one dead-letter source through ``browse_dead_letter_raws`` (only the bytes past the ones
        written: on Redis an LRANGE from ``seen``); ``False`` when the binding does not offer it."""
        binding, template = source.binding, self.template(source, dead_letter_queue)
        seen = 0
        while not self.count_full() and not self.full:
            if self.max_messages is not None:
                limit = min(limit, seen + self.max_messages - self.result.records)
            raws = binding.browse_dead_letter_raws(source.queue_name, seen, limit, source=dead_letter_queue)
            if raws is None:
                return False
            self.add_raws(source, raws, template)
            seen += len(raws)
            if self.full or seen < limit:
                break
            limit *= 2
        return True


def drain_dead_letters(
    sources: Sequence[DrainSource],
    sink: Sink,
    *,
    mode: str = "move",
    max_messages: int | None = None,
    max_bytes: int | None = None,
    reserve_timeout: float = 0.0,
    batch_records: int = 1000,
    batch_bytes: int = 8 * 1024 * 1024,
    progress_every: int = 10_000,
    log: Log | None = None,
) -> DrainResult:
    """Copy (``browse``) or move (``move``) dead letters of each source into ``sink``, in order.

    ``move``: reserve dead letters a batch at a time (``reserve_dead_letters``, up to ``batch_records``),
    buffer their records; every ``batch_records`` records (or ``batch_bytes`` bytes) write the batch, make
    it durable, then ack its messages (``ack_many``). On any error the file is cut back to its durable part
    and the messages not durable are released to their DLQ, then the error propagates. A reserved message
    whose record no longer fits (``max_bytes``) goes back to its DLQ with the rest of its reservation
    batch. The sink is closed (or aborted) here.

    :param mode: ``move`` (remove from the DLQ once durable) or ``browse`` (copy; needs ``can_browse``).
    :param max_messages: stop after this many records in total (over all sources).
    :param max_bytes: stop before a record would take the file past this size (the first record is always
        written, so an oversized message cannot block the drain).
    :param reserve_timeout: seconds to wait for the next dead letter before a source counts as empty.
    :param progress_every: log a progress line every this many records.
    :returns: the :class:`DrainResult`; the sink's location is its ``path``.
    """
    if mode not in ("move", "browse"):
        raise ValueError(f"mode must be 'move' or 'browse', got {mode!r}")
    for bound, name in ((max_messages, "max_messages"), (max_bytes, "max_bytes")):
        if bound is not None and bound < 0:
            raise ValueError(f"{name} must not be negative, got {bound}")
    if batch_records < 1 or batch_bytes < 1 or progress_every < 1:
        raise ValueError("batch_records, batch_bytes and progress_every must be positive")
    run = _Drain(sink, mode=mode, max_messages=max_messages, max_bytes=max_bytes,
                 reserve_timeout=max(float(reserve_timeout), 0.0), batch_records=batch_records,
                 batch_bytes=batch_bytes, progress_every=progress_every, log=log or logger)
    for source in sources:
        run.result.by_source.setdefault(source.key, 0)
    try:
        for source in sources:
            if run.count_full() or run.full:
                break
            before = run.result.records
            (run.move if mode == "move" else run.browse)(source)
            run.log.info("%s: %d dead letters from %s of %s", "moved" if mode == "move" else "copied",
                         run.result.records - before,
                         " + ".join(source.binding.dead_letter_sources(source.queue_name)), source.key)
        run.finish()
    except BaseException:
        run.fail()
        raise
    return run.result
