"""Dead-letter drains: the drain record format, durable sinks and the drain loop. No Airflow here.

A drain copies dead letters into one JSON Lines file (see ``docs/drain-records.md``): one record per
message, the body exactly as the broker stored it. In ``move`` mode a message is acked only once the
file holding its record is durable, so a crash anywhere leaves every message in the file, in the DLQ,
or in both (a duplicate, which readers drop by ``meta.id``) — never in neither.

Durability per sink: :class:`LocalFileSink` writes a batch, flushes and ``fsync``-s it (and fsyncs the
directory when it creates the file), then the batch is acked. :class:`StreamSink` (object storage) only
knows its data is stored when ``close`` returns, so its acks wait for the end of the run.

Through a binding that offers a dead-letter pipeline (Redis: ``open_dead_letter_pipeline``) ``move`` overlaps
the broker, Python and the disk: the next batch is reserved while this one is written, the fsync runs on a
thread while the next batch's records are built, and acks are sent without waiting for their replies. The
rule is unchanged (a message is acked only after the sync of the file holding it returned); up to three
batches are then held unacked at once, and each comes back after the visibility timeout on a crash.

The operator (``operators/drain.py``) resolves connections into :class:`DrainSource` values and a
destination into a sink, then calls :func:`drain_dead_letters`.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import orjson

from . import envelope as bq
from .bindings.base import Binding, ReceivedMessage, parse_body

__all__ = [
    "RECORD_VERSION",
    "DrainResult",
    "DrainSource",
    "LocalFileSink",
    "ReplayLine",
    "Sink",
    "StreamSink",
    "drain_dead_letters",
    "drain_record",
    "file_name",
    "native_reason_of",
    "parse_replay_line",
    "record_body",
    "safe_segment",
]

logger = logging.getLogger(__name__)

#: Version of the drain record format (the ``v`` key). A reader refuses versions it does not know.
RECORD_VERSION = 1

#: Header names under which brokers carry their own dead-letter reason (RabbitMQ, Azure Service Bus, ...).
_NATIVE_REASON_HEADERS = ("x-first-death-reason", "DeadLetterReason", "dead_letter_reason", "x-death-reason")

_DUMP_OPTIONS = orjson.OPT_APPEND_NEWLINE
_RECORD_KEYS = frozenset(("v", "body"))


# ------------------------------------------------------------------------------------------- records


def _json_default(value: Any) -> Any:
    """What orjson cannot write natively in headers: bytes as text (or base64), sets as lists, else str()."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode("ascii")
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def native_reason_of(message: ReceivedMessage) -> str | None:
    """The broker's own dead-letter reason (e.g. RabbitMQ ``x-first-death-reason``), when it gave one."""
    reason = getattr(message, "native_reason", None)
    if reason is None and message.headers:
        headers = message.headers
        for name in _NATIVE_REASON_HEADERS:
            value = headers.get(name)
            if value is not None:
                reason = value
                break
    if reason is None:
        return None
    return reason if isinstance(reason, str) else str(_json_default(reason))


def drain_record(
    message: ReceivedMessage,
    *,
    broker: str,
    dead_letter_queue: str,
    source_conn_id: str,
    drained_at: int,
) -> bytes:
    """One drain record: a JSON object in the documented key order, newline-terminated.

    The body is the raw bytes the broker returned, never re-encoded: as a JSON string when it is valid
    UTF-8 (``body_encoding`` ``utf-8``), else as the base64 of the bytes (``body_encoding`` ``base64``).
    """
    raw = message.body
    try:
        body, encoding = raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(raw).decode("ascii"), "base64"
    record = {
        "v": RECORD_VERSION,
        "body": body,
        "body_encoding": encoding,
        "broker": broker,
        "queue_name": message.queue_name,
        "dead_letter_queue": dead_letter_queue,
        "source_conn_id": source_conn_id,
        "meta_id": message.meta_id,
        "delivery_count": message.delivery_count,
        "native_reason": native_reason_of(message),
        "headers": dict(message.headers) if message.headers else {},
        "drained_at": drained_at,
    }
    if record["headers"]:
        return orjson.dumps(record, default=_json_default, option=_DUMP_OPTIONS | orjson.OPT_NON_STR_KEYS)
    return orjson.dumps(record, option=_DUMP_OPTIONS)


class _RecordTemplate:
    """:func:`drain_record` for the dead letters of one source, byte for byte, at a fraction of its cost.

    Every key but ``body``, ``body_encoding``, ``meta_id``, ``delivery_count`` and ``drained_at`` has the same
    value for all records of a source, so those parts are encoded once here and each record is joined from
    them and three small ``orjson.dumps`` calls, instead of building and serialising a twelve-key dict per
    dead letter. Only records without headers or a native reason take this path (the only ones whose other
    keys are constant); ``tests/operators/test_drain.py`` checks it against :func:`drain_record` byte for byte.

    :param broker: the binding's name; the other parameters are the record keys of the same names.
    """

    __slots__ = ("queue_name", "dead_letter_queue", "_head", "_utf8", "_base64", "_tail")

    def __init__(self, *, broker: str, queue_name: str, dead_letter_queue: str, source_conn_id: str) -> None:
        dumps = orjson.dumps
        self.queue_name, self.dead_letter_queue = queue_name, dead_letter_queue
        self._head = b'{"v":' + dumps(RECORD_VERSION) + b',"body":'
        same = (b',"broker":' + dumps(broker) + b',"queue_name":' + dumps(queue_name) + b',"dead_letter_queue":'
                + dumps(dead_letter_queue) + b',"source_conn_id":' + dumps(source_conn_id) + b',"meta_id":')
        self._utf8 = b',"body_encoding":"utf-8"' + same
        self._base64 = b',"body_encoding":"base64"' + same
        self._tail = b',"native_reason":null,"headers":{},"drained_at":'

    @classmethod
    def for_source(cls, source: DrainSource) -> _RecordTemplate:
        binding = source.binding
        return cls(broker=binding.name, queue_name=source.queue_name,
                   dead_letter_queue=binding.dead_letter_name(source.queue_name), source_conn_id=source.conn_id)

    @staticmethod
    def stamp(drained_at: int) -> bytes:
        """``drained_at`` as the record's closing bytes (computed once per batch by the callers)."""
        return b"%d}\n" % drained_at

    def record(self, raw: bytes, meta_id: str, delivery_count: int | None, stamp: bytes) -> bytes:
        """The record of one dead letter; ``stamp`` comes from :meth:`stamp`."""
        dumps = orjson.dumps
        try:
            body, middle = dumps(raw.decode("utf-8")), self._utf8
        except UnicodeDecodeError:
            body, middle = b'"' + base64.b64encode(raw) + b'"', self._base64
        return b"".join((self._head, body, middle, dumps(meta_id), b',"delivery_count":', dumps(delivery_count),
                         self._tail, stamp))

    def of_message(self, message: ReceivedMessage, drained_at: int) -> bytes | None:
        """The record of ``message``, or ``None`` when it has headers, a native reason or another queue name
        (then :func:`drain_record` writes it)."""
        if message.headers or message.queue_name != self.queue_name or native_reason_of(message) is not None:
            return None
        count = message.delivery_count
        if count is not None and count.__class__ is not int:
            return None
        return self.record(message.body, message.meta_id, count, self.stamp(drained_at))

    def of_raws(self, raws: Sequence[bytes], stamp: bytes) -> list[bytes]:
        """Records of dead letters known only by their stored bytes (a Redis drain batch: no headers, no
        delivery count). ``meta_id`` is what :class:`ReceivedMessage` would give: ``meta.id`` of a body that
        decodes to a JSON object, else ``""``. One tight loop, no per-message objects."""
        loads, dumps, invalid = orjson.loads, orjson.dumps, (orjson.JSONDecodeError, UnicodeDecodeError)
        head, middle, tail = self._head, self._utf8, b',"delivery_count":null' + self._tail + stamp
        out = []
        append = out.append
        for raw in raws:
            try:
                value = loads(raw)  # rejects invalid UTF-8 too, so the decode below cannot fail
                meta = value.get("meta") if value.__class__ is dict else None
                meta_id = meta.get("id") if meta.__class__ is dict else None
                append(b"".join((head, dumps(raw.decode("utf-8")), middle,
                                 dumps(meta_id) if meta_id.__class__ is str else b'""', tail)))
            except invalid:  # poison (not a JSON text, perhaps not UTF-8): what parse_body makes of it
                envelope = parse_body(raw)[0]
                append(self.record(raw, bq.meta_id_of(envelope) if envelope is not None else "", None, stamp))
        return out


def record_body(record: Mapping[str, Any]) -> bytes:
    """The raw body bytes a drain record holds (the inverse of :func:`drain_record` for the body).

    :raises ValueError: for an unknown record version, an unknown ``body_encoding`` or a body that is not
        a string.
    """
    if record.get("v") != RECORD_VERSION:
        raise ValueError(f"drain record version {record.get('v')!r} is not supported (this reader knows 1)")
    body, encoding = record.get("body"), record.get("body_encoding", "utf-8")
    if not isinstance(body, str):
        raise ValueError("drain record 'body' must be a string")
    if encoding == "utf-8":
        return body.encode("utf-8")
    if encoding == "base64":
        return base64.b64decode(body, validate=True)
    raise ValueError(f"drain record body_encoding {encoding!r} is not 'utf-8' or 'base64'")


@dataclass(frozen=True, slots=True)
class ReplayLine:
    """One usable line of a replay set.

    :ivar body: the message bytes to replay (a drain record's raw body, or the envelope line itself).
    :ivar queue_name: the record's ``queue_name`` (a drain record), else ``None``; the last-resort target.
    :ivar is_record: whether the line was a drain record rather than a bare envelope object.
    """

    body: bytes
    queue_name: str | None
    is_record: bool


def parse_replay_line(line: bytes) -> ReplayLine | None:
    """Read one replay-set line: a drain record (has ``v`` and ``body``) or an envelope JSON object.

    Returns ``None`` for a blank line. An envelope line's bytes are returned as they are (stripped of
    surrounding whitespace), so nothing is re-encoded before the replay reset.

    :raises ValueError: for a line that is not a JSON object (e.g. the torn last line a crash can leave)
        or a drain record this reader cannot use.
    """
    stripped = line.strip()
    if not stripped:
        return None
    try:
        value = orjson.loads(stripped)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not a JSON object: {exc}") from None
    if value.__class__ is not dict:
        raise ValueError("not a JSON object")
    if _RECORD_KEYS <= value.keys():
        queue_name = value.get("queue_name")
        return ReplayLine(record_body(value), queue_name if isinstance(queue_name, str) else None, True)
    return ReplayLine(stripped, None, False)


# --------------------------------------------------------------------------------------------- sinks


class Sink(Protocol):
    """Where drain records go. ``durable_batches`` says whether :meth:`sync` makes the data durable
    (then each batch is acked after it); otherwise only a completed :meth:`close` does."""

    durable_batches: bool
    location: str

    def write(self, data: bytes) -> None: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...

    def abort(self, durable_size: int) -> None: ...


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalFileSink:
    """A new local file, written with ``os.write`` and made durable with ``fsync`` per batch.

    The file is created exclusively (an existing file is never overwritten) and its directory entry is
    fsynced, so after :meth:`sync` returns both the data and the file's name survive a power cut.

    :param path: the file to create; missing parent directories are created.
    """

    durable_batches = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.location = os.fspath(path)
        parent = os.path.dirname(os.path.abspath(self.location))
        os.makedirs(parent, exist_ok=True)
        try:
            self._fd: int | None = os.open(self.location, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise FileExistsError(f"drain destination {self.location} exists already; a drain never overwrites "
                                  "a file (give a folder, or a new file name)") from None
        _fsync_dir(parent)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def abort(self, durable_size: int) -> None:
        """Cut the file back to its last durable size (records of messages that go back to the DLQ)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, durable_size)
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None


class StreamSink:
    """Any writable binary stream, e.g. ``ObjectStoragePath.open("wb")`` for S3/GCS/Azure Blob.

    Object stores publish an object only when its upload completes, so data counts as durable only once
    :meth:`close` returned; the drain acks after that. :meth:`abort` discards the upload where the stream
    can (fsspec's ``discard``), else closes it (a partial object then holds duplicates, never losses).

    :param opener: returns the open binary stream; called once, immediately.
    :param location: the URL, for logs and the result.
    """

    durable_batches = False

    def __init__(self, opener: Callable[[], IO[bytes]], location: str) -> None:
        self.location = location
        self._stream: IO[bytes] | None = opener()

    def write(self, data: bytes) -> None:
        self._stream.write(data)

    def sync(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()

    def abort(self, durable_size: int) -> None:
        if self._stream is None:
            return
        stream, self._stream = self._stream, None
        discard = getattr(stream, "discard", None)
        if callable(discard):
            discard()
        else:
            stream.close()


# --------------------------------------------------------------------------------------------- drain


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


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _give_back(binding: Binding, messages: Sequence[ReceivedMessage],
               log: logging.Logger | logging.LoggerAdapter) -> None:
    """Give reserved dead letters back to their DLQ unchanged (``release_many``); a failure is logged, not
    raised: each of them returns after the binding's visibility timeout anyway."""
    if not messages:
        return
    try:
        binding.release_many(messages)
    except Exception:  # noqa: BLE001 - it comes back after the visibility timeout anyway
        log.exception("could not release %d dead letters of %r; they return to the DLQ after the binding's "
                      "visibility timeout", len(messages), messages[0].queue_name)


def safe_segment(text: str) -> str:
    """``text`` with runs of characters unsafe in object keys and Hadoop paths (``:``, ``+``, spaces, ``/``)
    replaced by ``_``, so a run id can name a file or a folder."""
    return _SAFE.sub("_", text).strip("_")


def file_name(run_id: str | None, unique: str) -> str:
    """``dlq-<run id, or UTC time>-<unique>.jsonl``, with characters unsafe in object keys replaced."""
    stamp = run_id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"dlq-{safe_segment(stamp)}-{unique}.jsonl"


class _Reserved:
    """One reservation batch of the plain protocol (``reserve_dead_letters``): acked with ``ack_many``."""

    __slots__ = ("binding", "messages")

    def __init__(self, binding: Binding, messages: Sequence[ReceivedMessage]) -> None:
        self.binding, self.messages = binding, messages

    def __len__(self) -> int:
        return len(self.messages)

    def held(self, start: int, stop: int) -> Sequence[ReceivedMessage]:
        return self.messages[start:stop]


class _Piped:
    """One reservation batch received from a binding's dead-letter pipeline (``open_dead_letter_pipeline``,
    Redis): raw values, acked through the pipeline without waiting, messages built only to release them."""

    __slots__ = ("binding", "pipeline", "batch")

    def __init__(self, binding: Binding, pipeline: Any, batch: Any) -> None:
        self.binding, self.pipeline, self.batch = binding, pipeline, batch

    def __len__(self) -> int:
        return len(self.batch)

    def held(self, start: int, stop: int) -> Sequence[ReceivedMessage]:
        return self.batch.messages(start, stop)


class _Drain:
    """One run: the batch buffer, the reservations not acked yet, the counters.

    Reservations are tracked as segments ``[batch, start, stop]`` (a range of one reservation batch) rather
    than per message: ``unsynced`` ones have records in the buffer or written but not durable, ``unacked``
    ones are durable and wait for their ack.
    """

    def __init__(self, sink: Sink, *, mode: str, max_messages: int | None, max_bytes: int | None,
                 reserve_timeout: float, batch_records: int, batch_bytes: int, progress_every: int,
                 log: logging.Logger | logging.LoggerAdapter) -> None:
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
        self.hand: _Reserved | _Piped | None = None
        self.taken = 0
        # Open dead-letter pipelines: the current source's, and (object storage, whose acks wait for close())
        # those of earlier sources whose acks are still to be sent.
        self.pipelines: list[Any] = []
        # Sync-ahead (pipelined sources on a durable sink): one thread runs the sink's sync of the batch just
        # written while the next batch is built; ``syncing`` = (future, its segments, durable size once done).
        self.syncer: ThreadPoolExecutor | None = None
        self.syncing: tuple[Future[None], list[list[Any]], int] | None = None
        self.next_log = progress_every
        self.started = time.monotonic()
        self.full = False

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

    def add(self, source: DrainSource, message: ReceivedMessage, template: _RecordTemplate,
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

    def add_batch(self, source: DrainSource, batch: _Piped, template: _RecordTemplate) -> None:
        """Buffer the records of a whole pipelined batch, flushing at the same thresholds as :meth:`add`. A
        record that no longer fits (``max_bytes``; ``max_messages`` is kept by the reservation sizes) sets
        :attr:`full`, and it and the rest of the batch go back to the DLQ at once."""
        records = template.of_raws(batch.batch.raws, template.stamp(time.time_ns() // 1_000_000))
        self.hand, self.taken = batch, 0
        added = self._buffer(source, records, batch)
        if added < len(records):
            self.hand = None
            _give_back(batch.binding, batch.held(added, len(records)), self.log)  # not in the file

    def add_raws(self, source: DrainSource, raws: Sequence[bytes], template: _RecordTemplate) -> None:
        """Browse mode's :meth:`add_batch`: records of stored bytes, nothing reserved (nothing to ack or give
        back); stops (:attr:`full`) at the first record past ``max_bytes`` or ``max_messages``."""
        for start in range(0, len(raws), self.batch_records):
            chunk = raws[start:start + self.batch_records]
            self._buffer(source, template.of_raws(chunk, template.stamp(time.time_ns() // 1_000_000)), None)
            if self.full:
                return

    def _buffer(self, source: DrainSource, records: Sequence[bytes], batch: _Piped | None) -> int:
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

    def _hold(self, batch: _Reserved | _Piped, start: int, stop: int) -> None:
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
                if isinstance(batch, _Piped):
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
        """Reserve dead letters in batches (``reserve_dead_letters``, one round trip on Redis and SQL), buffer
        their records; :meth:`flush` acks each durable batch with ``ack_many``. A binding with a dead-letter
        pipeline (Redis) is drained through it instead (:meth:`move_pipelined`); with a ``reserve_timeout``, a
        source found empty is then waited for here."""
        binding, template = source.binding, _RecordTemplate.for_source(source)
        pipeline = binding.open_dead_letter_pipeline(source.queue_name)
        if pipeline is not None:
            self.move_pipelined(source, pipeline, template)
            if self.reserve_timeout <= 0:
                return
        while not self.count_full() and not self.full:
            messages = binding.reserve_dead_letters(source.queue_name, self.reserve_limit(),
                                                    timeout=self.reserve_timeout)
            if not messages:
                return
            batch = _Reserved(binding, messages)
            self.hand, self.taken = batch, 0
            for index, message in enumerate(messages):
                if not self.add(source, message, template, batch, index):
                    self.hand = None
                    _give_back(binding, messages[index:], self.log)  # back to the DLQ unchanged: not in the file
                    return
            self.hand = None

    def move_pipelined(self, source: DrainSource, pipeline: Any, template: _RecordTemplate) -> None:
        """Move through a dead-letter pipeline: the reservation of the next batch is sent before this batch's
        records are written and synced, and a durable batch's ack is sent without waiting for its reply, so
        the broker works while Python does. The pipeline offers ``request(limit) -> asked``, ``receive() ->
        batch`` (``raws``, ``requested``, ``messages(start, stop)``), ``ack(batch, start, stop)``,
        ``reservations_in_flight``, ``finish()`` and ``abort() -> messages to release``.

        Reserving ahead keeps the drain at-least-once: a batch reserved and not yet acked comes back after the
        visibility timeout if the process dies, and is released at once on an error. It never reserves past
        ``max_messages`` (the next batch is at most what is left after the one in hand); with ``max_bytes``
        it does not reserve ahead (how many fit depends on the records of the batch in hand). On a durable sink
        the source ends with its records durable and acked, and the pipeline closed; on object storage the
        pipeline stays open until :meth:`finish` has closed the sink and sent the acks."""
        self.pipelines.append(pipeline)
        ahead = self.max_bytes is None
        if self.sink.durable_batches:
            self.syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="babelqueue-drain-sync")
        pipeline.request(self.reserve_limit())
        while pipeline.reservations_in_flight:
            received = pipeline.receive()
            exhausted = len(received.raws) < received.requested
            if ahead and not exhausted:
                limit = self.batch_records
                if self.max_messages is not None:
                    limit = min(limit, self.max_messages - self.result.records - len(received.raws))
                if limit > 0:
                    pipeline.request(limit)
            if received.raws:
                self.add_batch(source, _Piped(source.binding, pipeline, received), template)
                self.hand = None
            if self.full or self.count_full():
                break
            if not exhausted and not pipeline.reservations_in_flight:
                pipeline.request(self.reserve_limit())
        self.flush()
        self.settle_sync()
        self.stop_syncer()
        if self.sink.durable_batches:
            self.close_pipelines()

    def browse(self, source: DrainSource) -> None:
        """Read the DLQ in growing windows (browse has no cursor: each call reads from the head) and write
        the messages past the ones already written. A concurrent consumer can shift the window: browse
        mode is a best-effort snapshot, not an exact one. A window is held in memory whole."""
        binding, template = source.binding, _RecordTemplate.for_source(source)
        # Start with the whole DLQ (one read when nothing arrives meanwhile); the window doubles if it grew.
        seen, limit = 0, max(self.batch_records, binding.dead_letter_depth(source.queue_name) + 1)
        while not self.count_full() and not self.full:
            if self.max_messages is not None:
                limit = min(limit, seen + self.max_messages - self.result.records)
            # Only the bytes past the ones written, where the binding offers them (Redis: an LRANGE from seen).
            raws = binding.browse_dead_letter_raws(source.queue_name, seen, limit)
            if raws is not None:
                self.add_raws(source, raws, template)
                if self.full:
                    return
                seen = got = seen + len(raws)
            else:
                batch = binding.browse_dead_letters(source.queue_name, limit=limit)
                for message in batch[seen:]:
                    if not self.add(source, message, template, None, 0):
                        return
                seen = got = max(seen, len(batch))
            if got < limit:
                return
            limit *= 2


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
    log: logging.Logger | logging.LoggerAdapter | None = None,
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
                         run.result.records - before, source.binding.dead_letter_name(source.queue_name),
                         source.key)
        run.finish()
    except BaseException:
        run.fail()
        raise
    return run.result
