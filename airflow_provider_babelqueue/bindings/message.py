"""The message a binding hands out: :class:`ReceivedMessage`, and how a stored body becomes one.

A reserve reads bytes; :func:`parse_body` decodes them with the contract's rules (a frame opened, a poison
wrapper's kept count, an oversized body left undecoded) and :func:`received_message` builds the frozen message
on the reserve's hot path. Pure: no broker client, no Airflow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import envelope as bq
from ..core.errors import EnvelopeDecodeError
from ..core.frames import FRAME_KEY, open_decoded

__all__ = ["ReceivedMessage", "parse_body", "received_message"]


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """One delivery.

    :ivar body: the raw bytes exactly as stored; forward these, never a re-encoding.
    :ivar queue_name: the logical queue it was reserved from (for a DLQ read, the queue whose DLQ it is).
    :ivar envelope: the decoded envelope, or ``None`` when the body is not decodable.
    :ivar decode_error: why the body is not decodable (then it is poison), else ``None``.
    :ivar attempts: the reconciled delivery count (body ``attempts`` and the broker's native count).
    :ivar delivery_count: the broker's native delivery count, where it has one.
    :ivar headers: broker headers / properties (empty where the broker carries none).
    :ivar receipt: the binding's handle for ack/release/dead_letter; opaque to callers.
    :ivar from_dead_letter: whether it was read from the dead-letter queue.
    :ivar dead_letter_source: for a dead-letter read, the dead-letter queue (key, queue, table) it came from,
        one of the binding's ``dead_letter_sources``; ``None`` where the binding does not say.
    :ivar stored_size: the stored body's length in bytes when the binding did not read the body (``body`` is then
        empty, ``envelope`` ``None``), else ``None``. Only a body over :attr:`Binding.decode_limit`, reserved
        from a queue (never a dead-letter read), on a binding that can dead-letter it without holding it: the
        SQL table copies the row inside the database, so a refused body never crosses the wire. ``ack``,
        ``release`` and ``dead_letter`` keep the stored bytes exactly; never forward ``body``.
    """

    body: bytes
    queue_name: str
    envelope: dict[str, Any] | None
    decode_error: str | None
    attempts: int
    delivery_count: int | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)
    receipt: Any = None
    from_dead_letter: bool = False
    dead_letter_source: str | None = None
    stored_size: int | None = None

    @property
    def size(self) -> int:
        """The stored body's length in bytes, whether the binding read it or not (see :attr:`stored_size`)."""
        return len(self.body) if self.stored_size is None else self.stored_size

    @property
    def meta_id(self) -> str:
        return bq.meta_id_of(self.envelope) if self.envelope is not None else ""

    @property
    def urn(self) -> str:
        return bq.urn_of(self.envelope) if self.envelope is not None else ""


def _slot_setter(name: str) -> Callable[[Any, Any], None]:
    return getattr(ReceivedMessage, name).__set__  # type: ignore[no-any-return]


_SET_BODY, _SET_QUEUE, _SET_ENVELOPE, _SET_ERROR, _SET_ATTEMPTS, _SET_DELIVERIES, _SET_HEADERS, _SET_RECEIPT, \
    _SET_FROM_DLQ, _SET_SOURCE, _SET_STORED = map(_slot_setter, (
        "body", "queue_name", "envelope", "decode_error", "attempts", "delivery_count", "headers", "receipt",
        "from_dead_letter", "dead_letter_source", "stored_size"))


def received_message(body: bytes, queue_name: str, envelope: dict[str, Any] | None, decode_error: str | None,
                     attempts: int, headers: Mapping[str, Any], receipt: Any,
                     delivery_count: int | None = None) -> ReceivedMessage:
    """A :class:`ReceivedMessage` of a queue (not a dead-letter read, its body read), built for a reserve's hot
    path: the same frozen object as ``ReceivedMessage(...)``, for about half the cost. A frozen dataclass's
    ``__init__`` sets each of its eleven fields through ``object.__setattr__``; this sets them through the
    slots' own descriptors, once per message of every batch a consumer reserves.

    :param headers: passed, not defaulted: a binding without headers passes one shared empty mapping rather
        than a new dict per message.
    """
    message = _NEW(ReceivedMessage)
    _SET_BODY(message, body)
    _SET_QUEUE(message, queue_name)
    _SET_ENVELOPE(message, envelope)
    _SET_ERROR(message, decode_error)
    _SET_ATTEMPTS(message, attempts)
    _SET_DELIVERIES(message, delivery_count)
    _SET_HEADERS(message, headers)
    _SET_RECEIPT(message, receipt)
    _SET_FROM_DLQ(message, False)
    _SET_SOURCE(message, None)
    _SET_STORED(message, None)
    return message


_NEW = object.__new__


def parse_body(body: bytes, max_bytes: int | None = None) -> tuple[dict[str, Any] | None, str | None, int]:
    """``(envelope, decode_error, body_attempts)`` for a raw body; attempts is 0 when unusable.

    A framed body (Node's Redis adapter, the Python SDK 1.24: ``{"__bq_frame":1,"headers":{…},"body":"…"}``)
    gives its inner envelope and that envelope's attempts; a malformed frame and a body holding an integer
    outside signed 64-bit are undecodable (poison), with the reason in ``decode_error``. The stored bytes are
    the caller's to keep: ``ReceivedMessage.body`` stays exactly what the broker holds (acks match on it).

    :param max_bytes: a longer body is not decoded at all (undecodable, the sizes in ``decode_error``): decoding
        costs several times a body's size in objects, and a consumer refuses such a body unread anyway
        (:attr:`Binding.decode_limit`).
    """
    if max_bytes is not None and len(body) > max_bytes:
        return None, f"body is {len(body):,} bytes; not decoded (over the decode limit of {max_bytes:,})", 0
    try:
        env = bq.decode(body)
        if FRAME_KEY in env:
            env = open_decoded(env)[0]
    except EnvelopeDecodeError as exc:
        return None, str(exc), 0
    attempts = env.get("attempts")
    if attempts is None and "raw" in env and isinstance(block := env.get("dead_letter"), dict):
        attempts = block.get("attempts")  # a poison wrapper (core.peer): the count its consumer kept
    return env, None, attempts if attempts.__class__ is int and attempts >= 0 else 0
