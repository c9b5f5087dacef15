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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .envelope import annotate_dead_letter

__all__ = ["PoisonWrapper", "poison_wrapper", "wrap_raw"]

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

    :param reason: the consumer's reason (``poison``, or e.g. ``failed`` for an envelope that could not be
        re-encoded after its handler failed): readers take it from here, never from inside ``raw``.
    :param original_queue: the queue the message was quarantined from: the only route a replay may use.
    """
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    # the block an annotated envelope gets, built by the one function that builds it
    block = annotate_dead_letter({}, reason, original_queue=original_queue, attempts=attempts, error=error,
                                 exception=exception, failed_at=failed_at)["dead_letter"]
    if text is not None:
        return orjson.dumps({"raw": text, "dead_letter": block})
    return orjson.dumps({"raw": base64.b64encode(raw).decode("ascii"), "raw_encoding": "base64",
                         "dead_letter": block})
