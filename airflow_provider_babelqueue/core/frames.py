"""The header frame three official SDKs write on Redis: ``{"__bq_frame":1,"headers":{…},"body":"<envelope>"}``.

Node's Redis adapter and the Python SDK (1.24) wrap a message published with headers in this frame: the
envelope travels as a JSON *string* in ``body`` and the out-of-band headers (a W3C ``traceparent``, custom
keys) beside it. The frame is not in the spec; the provider unwraps it on the way in (the inner body is the
envelope, the frame's headers are the message's headers) and writes the bare envelope on the way out unless a
connection switches frames on. Pure module: standard library and orjson.

Where a body is read, :func:`open_body` gives the envelope it carries (the inner one of a frame) and the frame;
a malformed frame (the marker present, but ``body`` missing, not a string, not JSON, or not a JSON object) is
poison like any undecodable body. :func:`frame_headers` gives a binding the frame's headers without more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import envelope as bq
from .errors import EnvelopeDecodeError

__all__ = [
    "FRAME_KEY",
    "FRAME_VERSION",
    "Frame",
    "FrameError",
    "encode_frame",
    "frame_headers",
    "looks_framed",
    "open_body",
    "open_decoded",
    "unwrap_frame",
]

#: The key that marks a frame, and the only frame version the SDKs write.
FRAME_KEY = "__bq_frame"
FRAME_VERSION = 1

_MARK = b'"' + FRAME_KEY.encode("ascii") + b'"'
#: How far into a body the marker is looked for: the SDKs write it as the first key.
_MARK_WINDOW = 64


class FrameError(EnvelopeDecodeError):
    """A body marked as a frame that is not a usable one: an unknown frame version, ``body`` missing, not a
    string, not JSON or not a JSON object, or ``headers`` not an object.

    Such a message is poison: its stored bytes are kept exactly (a decode error, like any undecodable body).
    """


@dataclass(frozen=True, slots=True)
class Frame:
    """An unwrapped frame.

    :ivar body: the inner envelope's bytes (the frame's ``body`` string, UTF-8 encoded), never re-encoded.
    :ivar headers: the frame's headers (string keys; values as the peer wrote them).
    """

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)


def looks_framed(raw: bytes) -> bool:
    """A cheap test on the raw bytes: whether the frame marker appears where the SDKs put it (the first key).

    ``False`` for every ordinary envelope (whose first key is ``job``); a ``True`` is confirmed by
    :func:`unwrap_frame`.
    """
    return _MARK in raw[:_MARK_WINDOW]


def unwrap_frame(value: Mapping[str, Any]) -> Frame | None:
    """The frame held by a decoded JSON object, or ``None`` when the object is not a frame.

    :param value: the decoded body (a JSON object).
    :raises FrameError: the object carries the frame marker but is not a usable frame (unknown version,
        ``body`` missing or not a string, ``headers`` not an object).
    """
    if FRAME_KEY not in value:
        return None
    version = value.get(FRAME_KEY)
    if version.__class__ is not int or version != FRAME_VERSION:
        raise FrameError(f"header frame version {version!r} is not supported (this reader knows 1)")
    if "body" not in value:
        raise FrameError("header frame has no 'body': it must hold the envelope as a JSON string")
    body = value["body"]
    if not isinstance(body, str):
        raise FrameError(f"header frame 'body' must be the envelope as a JSON string, got {_kind(body)}")
    headers = value.get("headers", {})
    if headers is None:
        headers = {}
    if not isinstance(headers, Mapping):
        raise FrameError(f"header frame 'headers' must be an object, got {_kind(headers)}")
    try:
        inner = body.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escaped in the frame's JSON string
        raise FrameError("header frame 'body' is not valid UTF-8 text (a lone surrogate)") from None
    return Frame(inner, {str(key): item for key, item in headers.items()})


def _kind(value: Any) -> str:
    """How a decoded JSON value is named in messages (a frame's readers know JSON, not Python types)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a JSON boolean"
    if isinstance(value, int | float):
        return "a JSON number"
    if isinstance(value, Mapping):
        return "a JSON object"
    return "a JSON array" if isinstance(value, list) else type(value).__name__


def encode_frame(body: bytes, headers: Mapping[str, Any]) -> bytes:
    """The frame the SDKs write for ``body`` (an encoded envelope) and ``headers``, keys in their order.

    :raises ValueError: ``body`` is not UTF-8 (an envelope always is).
    """
    return orjson.dumps({FRAME_KEY: FRAME_VERSION, "headers": dict(headers), "body": body.decode("utf-8")})


def open_body(raw: bytes) -> tuple[dict[str, Any], Frame | None]:
    """The envelope a stored body carries, and the frame it came in (``None`` for a bare envelope).

    Every reader of stored bodies goes through this (the bindings' ``parse_body``, the replayer, the drain
    records' ``meta_id``), so a framed message is the same message everywhere: its inner envelope, decoded
    with the same rules (:func:`~.envelope.decode`: an integer outside signed 64-bit is refused there too).

    :param raw: the stored bytes, exactly as the broker returned them.
    :raises EnvelopeDecodeError: the body is not a JSON object (poison).
    :raises FrameError: the body is marked as a frame but is not a usable one; the message says what is wrong.
    """
    return open_decoded(bq.decode(raw))


def open_decoded(value: dict[str, Any]) -> tuple[dict[str, Any], Frame | None]:
    """:func:`open_body` of a body already decoded (with :func:`~.envelope.decode`) into ``value``: a reserve
    decodes every body anyway and opens the rare frame from the value it has.

    :raises EnvelopeDecodeError: the frame's ``body`` does not hold an envelope.
    :raises FrameError: ``value`` is marked as a frame but is not a usable one.
    """
    if FRAME_KEY not in value:
        return value, None
    frame = unwrap_frame(value)
    if frame is None:  # pragma: no cover - the marker is there, so unwrap_frame returns a frame or raises
        return value, None
    try:
        inner = bq.decode(frame.body)
    except EnvelopeDecodeError as exc:
        text = str(exc)
        raise FrameError(f"header frame 'body' does not hold an envelope: {text[:1].lower()}{text[1:]}") from None
    return inner, frame


def frame_headers(raw: bytes) -> dict[str, Any]:
    """The headers of a framed body, or ``{}`` (a bare envelope, a malformed frame, anything undecodable).

    Cheap for a bare envelope (one substring test on the bytes); a frame is parsed once more. A binding calls
    it to expose the frame's headers as the message's headers while ``body`` stays the stored bytes.

    :param raw: the stored bytes.
    """
    if _MARK not in raw:
        return {}
    try:
        value = orjson.loads(raw)
        frame = unwrap_frame(value) if value.__class__ is dict else None
    except (orjson.JSONDecodeError, FrameError):
        return {}
    return frame.headers if frame is not None else {}
