"""Dead-letter drains: the drain record format, durable sinks and the drain loop. No Airflow here.

A drain copies dead letters into one JSON Lines file (see ``docs/drain-records.md``): one record per
message, the body exactly as the broker stored it. In ``move`` mode a message is acked only once the
file holding its record is durable, so a crash anywhere leaves every message in the file, in the DLQ,
or in both (a duplicate, which readers drop by ``meta.id``) — never in neither.

Durability per sink: :class:`LocalFileSink` writes a batch, flushes and ``fsync``-s it (and fsyncs the
directory when it creates the file), then the batch is acked. :class:`StreamSink` (object storage) only
knows its data is stored when ``close`` returns, so its acks wait for the end of the run.

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
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import orjson

from .bindings.base import Binding, ReceivedMessage

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


class _Drain:
    """One run: the batch buffer, the reservations not acked yet, the counters."""

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
        self.unsynced: list[tuple[Binding, ReceivedMessage]] = []  # in the buffer or written, not durable
        self.unacked: list[tuple[Binding, ReceivedMessage]] = []  # durable, not acked yet
        # The reservation batch being buffered: its first ``taken`` messages are in ``unsynced`` (or further).
        self.hand: list[ReceivedMessage] = []
        self.hand_binding: Binding | None = None
        self.taken = 0
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

    def add(self, source: DrainSource, message: ReceivedMessage, dlq_name: str, reserved: bool) -> bool:
        """Buffer one record; ``False`` (and :attr:`full`) when it does not fit, and then it is not in the file:
        the caller gives a reserved message back to its DLQ."""
        record = drain_record(message, broker=source.binding.name, dead_letter_queue=dlq_name,
                              source_conn_id=source.conn_id, drained_at=time.time_ns() // 1_000_000)
        if not self.room_for(len(record)):
            self.full = True
            return False
        self.buffer.append(record)
        self.buffered += len(record)
        if reserved:
            self.unsynced.append((source.binding, message))
            self.taken += 1
        result = self.result
        result.records += 1
        result.bytes += len(record)
        result.by_source[source.key] = result.by_source.get(source.key, 0) + 1
        if len(self.buffer) >= self.batch_records or self.buffered >= self.batch_bytes:
            self.flush()
        if result.records >= self.next_log:
            self.next_log += self.progress_every
            elapsed = time.monotonic() - self.started
            self.log.info("drained %d dead letters (%d bytes) so far, %.0f msg/s", result.records, result.bytes,
                          result.records / elapsed if elapsed > 0 else 0.0)
        return True

    def flush(self) -> None:
        """Write the buffer; when the sink makes batches durable, sync it and ack what it holds."""
        if self.buffer:
            data = b"".join(self.buffer)
            self.buffer, self.buffered = [], 0
            self.sink.write(data)
            if self.sink.durable_batches:
                self.sink.sync()
                self.durable += len(data)
        if self.sink.durable_batches and self.unsynced:
            self.unacked, self.unsynced = self.unsynced, []
            self.ack_all()

    def ack_all(self) -> None:
        """Ack in reservation order (cheapest for list-based DLQs), one ``ack_many`` per run of messages from
        the same binding; on an error that run and the rest stay listed (released on failure: settling a
        message again is harmless)."""
        done = 0
        try:
            while done < len(self.unacked):
                binding, end = self.unacked[done][0], done + 1
                while end < len(self.unacked) and self.unacked[end][0] is binding:
                    end += 1
                binding.ack_many([message for _, message in self.unacked[done:end]])
                done = end
        finally:
            del self.unacked[:done]

    def finish(self) -> None:
        self.flush()
        self.sink.close()
        if self.unsynced:  # object storage: durable only now that close() returned
            self.unacked, self.unsynced = self.unsynced, []
            self.ack_all()

    def fail(self) -> None:
        """Something failed: cut the file back to what is durable and release every message not acked back to
        its DLQ, so each one is in the file, in the DLQ, or (durable but not acked) in both."""
        try:
            self.sink.abort(self.durable)
        except Exception:  # noqa: BLE001 - report, then go on releasing
            self.log.exception("could not cut %s back to its last durable size", self.sink.location)
        if self.unacked:
            self.log.warning("%d dead letters are in the file but were not acked; they stay in the DLQ too "
                             "(duplicates, removed by meta.id downstream)", len(self.unacked))
        by_binding: dict[int, tuple[Binding, list[ReceivedMessage]]] = {}
        in_hand = [(self.hand_binding, message) for message in self.hand[self.taken:]]  # reserved, not buffered
        for binding, message in self.unacked + self.unsynced + in_hand:
            by_binding.setdefault(id(binding), (binding, []))[1].append(message)
        self.unsynced, self.unacked, self.hand = [], [], []
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
        their records; :meth:`flush` acks each durable batch with ``ack_many``."""
        binding, dlq_name = source.binding, source.binding.dead_letter_name(source.queue_name)
        while not self.count_full() and not self.full:
            messages = binding.reserve_dead_letters(source.queue_name, self.reserve_limit(),
                                                    timeout=self.reserve_timeout)
            if not messages:
                return
            self.hand, self.hand_binding, self.taken = messages, binding, 0
            for message in messages:
                if not self.add(source, message, dlq_name, reserved=True):
                    rest, self.hand = messages[self.taken:], []
                    _give_back(binding, rest, self.log)  # back to the DLQ unchanged: not in the file
                    return
            self.hand = []

    def browse(self, source: DrainSource) -> None:
        """Read the DLQ in growing windows (browse has no cursor: each call reads from the head) and write
        the messages past the ones already written. A concurrent consumer can shift the window: browse
        mode is a best-effort snapshot, not an exact one. A window is held in memory whole."""
        binding, dlq_name = source.binding, source.binding.dead_letter_name(source.queue_name)
        # Start with the whole DLQ (one read when nothing arrives meanwhile); the window doubles if it grew.
        seen, limit = 0, max(self.batch_records, binding.dead_letter_depth(source.queue_name) + 1)
        while not self.count_full() and not self.full:
            if self.max_messages is not None:
                limit = min(limit, seen + self.max_messages - self.result.records)
            batch = binding.browse_dead_letters(source.queue_name, limit=limit)
            for message in batch[seen:]:
                if not self.add(source, message, dlq_name, reserved=False):
                    return
            seen = max(seen, len(batch))
            if len(batch) < limit:
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
