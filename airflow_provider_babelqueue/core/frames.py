"""The header frame three official SDKs write on Redis: ``{"__bq_frame":1,"headers":{…},"body":"<envelope>"}``.

Node's Redis adapter and the Python SDK (1.24) wrap a message published with headers in this frame: the
envelope travels as a JSON *string* in ``body`` and the out-of-band headers (a W3C ``traceparent``, custom
keys) beside it. The frame is not in the spec; the provider unwraps it on the way in (the inner body is the
envelope, the frame's headers are the message's headers) and writes the bare envelope on the way out unless a
connection switches frames on. Pure module: standard library and orjson.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from .errors import EnvelopeDecodeError

__all__ = ["FRAME_KEY", "FRAME_VERSION", "Frame", "FrameError", "encode_frame", "looks_framed", "unwrap_frame"]

#: The key that marks a frame, and the only frame version the SDKs write.
FRAME_KEY = "__bq_frame"
FRAME_VERSION = 1

_MARK = b'"' + FRAME_KEY.encode("ascii") + b'"'
#: How far into a body the marker is looked for: the SDKs write it as the first key.
_MARK_WINDOW = 64


class FrameError(EnvelopeDecodeError):
    """A body marked as a frame whose ``body`` is missing, not a string, or whose headers are not an object.

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
    body = value.get("body")
    if not isinstance(body, str):
        raise FrameError("header frame 'body' must be the envelope as a JSON string, got "
                         f"{'nothing' if body is None else type(body).__name__}")
    headers = value.get("headers", {})
    if headers is None:
        headers = {}
    if not isinstance(headers, Mapping):
        raise FrameError(f"header frame 'headers' must be an object, got {type(headers).__name__}")
    try:
        inner = body.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escaped in the frame's JSON string
        raise FrameError("header frame 'body' is not valid UTF-8 text (a lone surrogate)") from None
    return Frame(inner, {str(key): item for key, item in headers.items()})


def encode_frame(body: bytes, headers: Mapping[str, Any]) -> bytes:
    """The frame the SDKs write for ``body`` (an encoded envelope) and ``headers``, keys in their order.

    :raises ValueError: ``body`` is not UTF-8 (an envelope always is).
    """
    return orjson.dumps({FRAME_KEY: FRAME_VERSION, "headers": dict(headers), "body": body.decode("utf-8")})
