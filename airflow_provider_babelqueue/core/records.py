"""The drain record: one JSON Lines record per dead letter, the body exactly as the broker stored it.

This module is the format (see ``docs/drain-records.md``): writing a record (:func:`drain_record`, and
:class:`RecordTemplate`, the same bytes at a fraction of the cost for a run of records from one source),
reading one back (:func:`record_body`) and reading a replay-set line (:func:`parse_replay_line`). The drain
engine (``engine/drain``), the replay engine, the Spark jobs and the sample DAGs' helpers all read and write
records through it. Pure module: the standard library and orjson.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from . import envelope as bq
from .errors import EnvelopeDecodeError
from .frames import FRAME_KEY, open_body
from .integers import may_hold_wide_integer

__all__ = [
    "RECORD_VERSION",
    "DrainedMessage",
    "RecordTemplate",
    "ReplayLine",
    "drain_record",
    "native_reason_of",
    "parse_replay_line",
    "record_body",
]

#: Version of the drain record format (the ``v`` key). A reader refuses versions it does not know.
RECORD_VERSION = 1

#: Header names under which brokers carry their own dead-letter reason (RabbitMQ, Azure Service Bus, ...).
_NATIVE_REASON_HEADERS = ("x-first-death-reason", "DeadLetterReason", "dead_letter_reason", "x-death-reason")

_DUMP_OPTIONS = orjson.OPT_APPEND_NEWLINE
_RECORD_KEYS = frozenset(("v", "body"))


class DrainedMessage(Protocol):
    """What a record is written from: a received dead letter (``bindings.message.ReceivedMessage`` has it all)."""

    @property
    def body(self) -> bytes: ...

    @property
    def queue_name(self) -> str: ...

    @property
    def meta_id(self) -> str: ...

    @property
    def delivery_count(self) -> int | None: ...

    @property
    def headers(self) -> Mapping[str, Any]: ...


def _meta_id_of_raw(raw: bytes) -> str:
    """``meta.id`` of a body that decodes as an envelope (a frame's inner one), else ``""``: what a received
    message reports (``bindings.message.parse_body`` reads bodies with the same :func:`~.frames.open_body`)."""
    try:
        return bq.meta_id_of(open_body(raw)[0])
    except EnvelopeDecodeError:
        return ""


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


def native_reason_of(message: DrainedMessage) -> str | None:
    """The broker's own dead-letter reason (e.g. RabbitMQ ``x-first-death-reason``), when it gave one."""
    reason = None
    if message.headers:
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
    message: DrainedMessage,
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


class RecordTemplate:
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

    def of_message(self, message: DrainedMessage, drained_at: int) -> bytes | None:
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
        decodes to an envelope (a frame's inner one), else ``""``. One tight loop, no per-message objects;
        frames and bodies with a 19-digit run (perhaps an integer outside signed 64-bit, which makes the body
        poison) take the exact path."""
        loads, dumps, invalid = orjson.loads, orjson.dumps, (orjson.JSONDecodeError, UnicodeDecodeError)
        head, middle, tail = self._head, self._utf8, b',"delivery_count":null' + self._tail + stamp
        out: list[bytes] = []
        append = out.append
        for raw in raws:
            try:
                value = loads(raw)  # rejects invalid UTF-8 too, so the decode below cannot fail
                if value.__class__ is dict and (FRAME_KEY in value or may_hold_wide_integer(raw)):
                    append(self.record(raw, _meta_id_of_raw(raw), None, stamp))
                    continue
                meta = value.get("meta") if value.__class__ is dict else None
                meta_id = meta.get("id") if meta.__class__ is dict else None
                append(b"".join((head, dumps(raw.decode("utf-8")), middle,
                                 dumps(meta_id) if meta_id.__class__ is str else b'""', tail)))
            except invalid:  # poison (not a JSON text, perhaps not UTF-8): what a ReceivedMessage would say
                append(self.record(raw, _meta_id_of_raw(raw), None, stamp))
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
