"""What other SDKs leave on a dead-letter queue that is not an envelope: the Python SDK's poison wrapper.

The Python SDK (1.24) cannot annotate a body that is not an envelope, so it dead-letters it inside a wrapper::

    {"raw":"<the body as text>","dead_letter":{"reason":"poison",...}}
    {"raw":"<base64 of the body>","raw_encoding":"base64","dead_letter":{"reason":"poison",...}}

(the second form for bytes that are not UTF-8). Decoded, the wrapper is a JSON object without a URN, so a
reader that took it for an envelope would call it ``missing_urn`` and a replay would publish the wrapper itself.
:func:`poison_wrapper` recognises it and gives back the original bytes and the SDK's ``dead_letter`` block; the
replayer skips it as ``poison``, the sensors' samples report it as ``poison``, and the Spark triage can use it
(``from airflow_provider_babelqueue.core.peer import poison_wrapper``).

This provider writes the same wrapper (:func:`wrap_raw`) for every dead letter it cannot annotate: a body that
is not an envelope, one refused by a consumer limit (not decoded at all), one that cannot be re-encoded. The
original bytes stay exact inside it, and its ``dead_letter`` block keeps the consumer's reason, error and the
queue the message was quarantined from, so no reader falls back on what the body itself claims (its own
``dead_letter.original_queue`` or ``meta.queue``). Pure module: standard library and orjson.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .envelope import annotate_dead_letter

__all__ = ["PoisonWrapper", "WrapperParts", "poison_wrapper", "wrap_raw", "wrap_raw_parts"]

#: Keys an envelope has and a wrapper never has: their presence means the object is an envelope.
_ENVELOPE_KEYS = ("job", "urn", "meta", "data", "trace_id")


@dataclass(frozen=True, slots=True)
class PoisonWrapper:
    """A recognised poison wrapper.

    :ivar raw: the original body's bytes (``raw`` decoded per ``raw_encoding``): the evidence triage needs.
    :ivar dead_letter: the wrapper's ``dead_letter`` block, as the SDK wrote it.
    :ivar raw_encoding: ``"utf-8"`` (``raw`` held the text) or ``"base64"``.
    """

    raw: bytes
    dead_letter: dict[str, Any]
    raw_encoding: str = "utf-8"

    @property
    def reason(self) -> str:
        """The block's reason (``poison`` as the SDK writes it), ``poison`` when it is missing."""
        reason = self.dead_letter.get("reason")
        return reason if isinstance(reason, str) and reason else "poison"


def poison_wrapper(body: bytes | Mapping[str, Any]) -> PoisonWrapper | None:
    """The poison wrapper ``body`` is, or ``None`` when it is anything else (an envelope, a frame, bytes that are
    not a JSON object, a wrapper whose ``raw`` cannot be decoded as its ``raw_encoding`` says).

    A wrapper is a JSON object with a string ``raw`` and an object ``dead_letter``, an optional ``raw_encoding``
    of ``utf-8`` or ``base64``, and none of an envelope's keys (``job``, ``urn``, ``meta``, ``data``,
    ``trace_id``).

    :param body: the stored bytes, or the JSON object already decoded from them (cheaper when a caller has it).
    """
    if isinstance(body, bytes | bytearray | memoryview):
        raw_body = bytes(body)
        if b'"raw"' not in raw_body:
            return None
        try:
            value: Any = orjson.loads(raw_body)
        except orjson.JSONDecodeError:
            return None
    else:
        value = body
    if not isinstance(value, Mapping) or "raw" not in value or "dead_letter" not in value:
        return None
    raw, block, encoding = value.get("raw"), value.get("dead_letter"), value.get("raw_encoding")
    if not isinstance(raw, str) or not isinstance(block, Mapping) or any(key in value for key in _ENVELOPE_KEYS):
        return None
    if encoding is None or encoding == "utf-8":
        try:
            return PoisonWrapper(raw.encode("utf-8"), dict(block), "utf-8")
        except UnicodeEncodeError:  # a lone surrogate: not text the SDK could have written
            return None
    if encoding == "base64":
        try:
            return PoisonWrapper(base64.b64decode(raw, validate=True), dict(block), "base64")
        except (binascii.Error, ValueError):
            return None
    return None


#: Bytes of ``raw`` the wrapper's writers escape or encode per step: their working memory besides the output.
_STEP = 1 << 20
#: The wrapper's fixed parts: before ``raw``, between it and the block (text form, base64 form), at the end.
_OPEN, _CLOSE = b'{"raw":"', b"}"
_TEXT_BLOCK, _BASE64_BLOCK = b'","dead_letter":', b'","raw_encoding":"base64","dead_letter":'


def _text_parts(raw: bytes, step: int) -> Iterator[memoryview]:
    """``raw``'s JSON string escaping (without quotes), ``step`` bytes of it at a time; raises
    ``UnicodeDecodeError`` when it reaches bytes that are not UTF-8.

    Each step decodes the characters complete in it and escapes them with orjson, the encoder of the whole
    wrapper: JSON escapes one character at a time, so the parts joined are the bytes ``orjson.dumps`` gives for
    the whole text, without a ``str`` of all of it (up to 4x the body for text outside Latin-1).
    """
    view, size, position = memoryview(raw), len(raw), 0
    step = max(step, 4)  # a UTF-8 character has at most 4 bytes: every step completes one
    while position < size:
        end = position + step
        text, used = codecs.utf_8_decode(view[position:end], "strict", end >= size)
        yield memoryview(orjson.dumps(text))[1:-1]
        position += used


def _base64_parts(raw: bytes, step: int) -> Iterator[bytes]:
    """``raw``'s base64, about ``step`` bytes of it at a time (whole 3-byte groups: no padding between parts)."""
    view, step = memoryview(raw), max(3, step - step % 3)
    for start in range(0, len(raw), step):
        yield base64.b64encode(view[start:start + step])


def _sized_buffer(size: int) -> io.BytesIO:
    """An empty buffer holding memory for ``size`` bytes from the start: one allocation, which can reuse a block
    just freed (the reply buffer of the client that read the body), where growing step by step would take new
    memory beside it. Writing past the end of a ``BytesIO`` sizes it at once and fills the gap with zeros."""
    out = io.BytesIO()
    if size > 0:
        out.seek(size - 1)
        out.write(b"\0")
        out.seek(0)
    return out


def _block(reason: str, original_queue: str, attempts: int, error: str | None, exception: str | None,
           failed_at: int | None) -> bytes:
    """The wrapper's ``dead_letter`` block, encoded: the block an annotated envelope gets, built by the one
    function that builds it."""
    return orjson.dumps(annotate_dead_letter({}, reason, original_queue=original_queue, attempts=attempts,
                                             error=error, exception=exception, failed_at=failed_at)["dead_letter"])


def wrap_raw(
    raw: bytes,
    reason: str,
    *,
    original_queue: str,
    attempts: int,
    error: str | None = None,
    exception: str | None = None,
    failed_at: int | None = None,
) -> bytes:
    """The poison wrapper of ``raw``: the form :func:`poison_wrapper` reads back, ``raw`` byte for byte.

    ``raw`` is the ``raw`` string when it is UTF-8 (``raw_encoding`` omitted, as the Python SDK writes it),
    else its base64 with ``raw_encoding`` ``base64``. The block has the keys and order of an annotated
    envelope's ``dead_letter`` block. The texts must be encodable (see :func:`~.envelope.storable_text`).

    The bytes are those of ``orjson.dumps({"raw": raw.decode("utf-8"), "dead_letter": block})`` (or its base64
    form), written a megabyte at a time into one buffer: wrapping a body refused for its size then costs about
    the wrapper's own size, not also a ``str`` of the body and the pieces of the output.

    :param reason: the consumer's reason (``poison``, or e.g. ``failed`` for an envelope that could not be
        re-encoded after its handler failed): readers take it from here, never from inside ``raw``.
    :param original_queue: the queue the message was quarantined from: the only route a replay may use.
    """
    block = _block(reason, original_queue, attempts, error, exception, failed_at)
    fixed = len(_OPEN) + len(block) + len(_CLOSE)
    out = _sized_buffer(fixed + len(raw) + len(_TEXT_BLOCK))  # exact for text with nothing to escape
    out.write(_OPEN)
    try:
        for part in _text_parts(raw, _STEP):
            out.write(part)
        out.write(_TEXT_BLOCK)
    except UnicodeDecodeError:
        out.close()  # the text part is freed before the base64 takes its memory
        out = _sized_buffer(fixed + -(-len(raw) // 3) * 4 + len(_BASE64_BLOCK))  # exact
        out.write(_OPEN)
        for encoded in _base64_parts(raw, _STEP):
            out.write(encoded)
        out.write(_BASE64_BLOCK)
    out.write(block)
    out.write(_CLOSE)
    out.truncate()
    # CPython hands the buffer itself over (shrunk in place) when nothing else refers to it: no copy at the end
    return out.getvalue()


class WrapperParts:
    """A poison wrapper (:func:`wrap_raw`'s bytes) as its exact length and its parts, for a writer that sends a
    large one in pieces without ever holding it whole (the Redis binding's settle of a body refused for its size).

    Each iteration yields the parts anew, one step of the body at a time; ``bytes(parts)`` joins them into
    exactly :func:`wrap_raw`'s bytes. Measuring the length takes one pass over the body (escaping it, without
    keeping the result); the parts are made again while they are sent.

    :ivar size: the wrapper's length in bytes, known before any part is made (a protocol frames it first).
    """

    __slots__ = ("_base64", "_block", "_raw", "_step", "size")

    def __init__(self, raw: bytes, block: bytes) -> None:
        """:param raw: the body to wrap, byte for byte. :param block: the encoded ``dead_letter`` block."""
        self._raw, self._block, self._step = raw, block, _STEP
        try:
            length, self._base64 = sum(len(part) for part in _text_parts(raw, self._step)), False
        except UnicodeDecodeError:
            length, self._base64 = -(-len(raw) // 3) * 4, True
        middle = _BASE64_BLOCK if self._base64 else _TEXT_BLOCK
        self.size = len(_OPEN) + length + len(middle) + len(block) + len(_CLOSE)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[bytes | memoryview]:
        yield _OPEN
        if self._base64:
            yield from _base64_parts(self._raw, self._step)
            yield _BASE64_BLOCK
        else:
            yield from _text_parts(self._raw, self._step)
            yield _TEXT_BLOCK
        yield self._block
        yield _CLOSE

    def __bytes__(self) -> bytes:
        out = _sized_buffer(self.size)
        for part in self:
            out.write(part)
        return out.getvalue()


def wrap_raw_parts(
    raw: bytes,
    reason: str,
    *,
    original_queue: str,
    attempts: int,
    error: str | None = None,
    exception: str | None = None,
    failed_at: int | None = None,
) -> WrapperParts:
    """:func:`wrap_raw` as :class:`WrapperParts`: the same bytes, given as their length and their parts (same
    parameters)."""
    return WrapperParts(raw, _block(reason, original_queue, attempts, error, exception, failed_at))
