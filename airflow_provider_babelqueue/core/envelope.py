"""The BabelQueue envelope (schema_version 1): build, encode, decode, validate, dead-letter, replay.

This module is the contract every other layer relies on, so it is deliberately pure: the standard
library, orjson and msgspec (optional, see :mod:`.typed_read`), nothing from Airflow and no broker client (a
test enforces it).

Wire format facts kept here (see the project's ``docs/concepts.md``):

* compact UTF-8 JSON, non-ASCII and ``/`` unescaped, keys in the order ``job, trace_id, data, meta,
  attempts`` (``meta``: ``id, queue, lang, schema_version, created_at``), unknown keys kept after the
  known ones, the optional ``dead_letter`` block last;
* the bytes equal those of the official Python SDK's encoder for the same dict, floats included;
* no NaN/Infinity, integers within signed 64-bit.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import orjson

from .errors import EnvelopeDecodeError, EnvelopeEncodeError, InvalidEnvelopeError
from .integers import DIGITS_TO_ZERO as _DIGITS_TO_ZERO
from .integers import INT64_MAX as _INT64_MAX
from .integers import INT64_MIN as _INT64_MIN
from .integers import LONG_RUN as _LONG_RUN
from .integers import check_integer_range
from .typed_read import READ_ERRORS as _READ_ERRORS
from .typed_read import read_checked as _read_checked

__all__ = [
    "DEAD_LETTER_KEYS",
    "LANG",
    "META_KEYS",
    "SCHEMA_VERSION",
    "TOP_LEVEL_KEYS",
    "VALIDATION_REASONS",
    "Reason",
    "accepts",
    "annotate_dead_letter",
    "storable_text",
    "check",
    "data_of",
    "decode",
    "encode",
    "make_envelope",
    "meta_id_of",
    "new_uuid4",
    "now_ms",
    "reset_for_replay",
    "urn_of",
]

SCHEMA_VERSION = 1
LANG = "python"

#: Canonical key orders. ``urn`` (the inbound alias) sits where ``job`` would, so a forwarded
#: alias-only envelope still starts with its identity.
TOP_LEVEL_KEYS = ("job", "urn", "trace_id", "data", "meta", "attempts")
META_KEYS = ("id", "queue", "lang", "schema_version", "created_at")
DEAD_LETTER_KEYS = ("reason", "error", "exception", "failed_at", "original_queue", "attempts", "lang")

_CANON_TOP = ("job", "trace_id", "data", "meta", "attempts")
_ASCII_WS = " \t\n\v\f\r"


class Reason(StrEnum):
    """Machine-readable reasons, shared by validation and the ``dead_letter.reason`` field.

    The first six are the validation reasons :func:`check` returns, in the order it tests them. The last
    three are dead-letter causes: handler retries exhausted, no handler for the URN, undecodable body.
    Members are ``str`` so they compare equal to the plain strings other SDKs write.
    """

    MISSING_URN = "missing_urn"
    MISSING_META = "missing_meta"
    UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"
    INVALID_DATA = "invalid_data"
    MISSING_TRACE_ID = "missing_trace_id"
    INVALID_ATTEMPTS = "invalid_attempts"
    FAILED = "failed"
    UNKNOWN_URN = "unknown_urn"
    POISON = "poison"


VALIDATION_REASONS = (
    Reason.MISSING_URN,
    Reason.MISSING_META,
    Reason.UNSUPPORTED_SCHEMA_VERSION,
    Reason.INVALID_DATA,
    Reason.MISSING_TRACE_ID,
    Reason.INVALID_ATTEMPTS,
)


# --------------------------------------------------------------------------------------------- build


def now_ms() -> int:
    """Current time as integer Unix epoch milliseconds (the contract's only time unit)."""
    return time.time_ns() // 1_000_000


# Variant bits 10xx: the first hex digit of the fourth group is 8, 9, a or b.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
_POOL_SIZE = 128


class _IdPool(threading.local):
    """Per-thread stock of formatted v4 UUIDs, filled from one ``os.urandom`` call per 128 ids.

    Same randomness source as :func:`uuid.uuid4` (the OS CSPRNG), a third of its cost on this project's
    machines: the syscall and the formatting are paid in bulk. Forked children start with an empty
    stock (``os.register_at_fork`` below), so a parent and its task processes never share ids.
    """

    def __init__(self) -> None:
        self.ids: list[str] = []


_ID_POOL = _IdPool()
os.register_at_fork(after_in_child=lambda: setattr(_ID_POOL, "ids", []))


def _refill() -> list[str]:
    h = os.urandom(16 * _POOL_SIZE).hex()
    variant = _VARIANT
    ids = [
        f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-4{h[i + 13 : i + 16]}-"
        f"{variant[h[i + 16]]}{h[i + 17 : i + 20]}-{h[i + 20 : i + 32]}"
        for i in range(0, len(h), 32)
    ]
    _ID_POOL.ids = ids
    return ids


def new_uuid4() -> str:
    """A random (version 4) UUID string from the OS CSPRNG, as :func:`uuid.uuid4` gives, cheaper."""
    ids = _ID_POOL.ids
    return (ids or _refill()).pop()


def _blank(value: str) -> bool:
    # ASCII whitespace is a subset of str.isspace(), so a string that is not isspace() is never blank.
    return not value or (value.isspace() and not value.strip(_ASCII_WS))


def make_envelope(
    urn: str,
    data: Mapping[str, Any],
    *,
    queue_name: str = "default",
    trace_id: str | None = None,
) -> dict[str, Any]:
    """Build a new envelope following the contract's producer rules.

    :param urn: the message identity consumers route on; surrounding ASCII whitespace is trimmed (as the
        other SDKs do) and a blank URN is a programming error, so it raises.
    :param data: the business payload; it must be a JSON object, and is shallow-copied so later changes
        to the caller's dict do not alter the message.
    :param queue_name: the logical queue recorded in ``meta.queue`` (not a broker key).
    :param trace_id: continue an inbound trace by passing its id; it is kept verbatim. Omitted or blank
        starts a new trace with a fresh v4 UUID.
    :raises InvalidEnvelopeError: (a ``ValueError``) for a blank URN, non-object data or a blank queue.
    """
    if urn.__class__ is not str and not isinstance(urn, str) or not urn or urn.isspace() and _blank(urn):
        raise InvalidEnvelopeError(f"The URN must be a non-empty string, got {urn!r}.")
    if data.__class__ is not dict and not isinstance(data, Mapping):
        raise InvalidEnvelopeError(
            f"data must be a JSON object (a dict), got {type(data).__name__}; wrap lists or scalars in a dict."
        )
    if queue_name.__class__ is not str and not isinstance(queue_name, str) or _blank(queue_name):
        raise InvalidEnvelopeError(f"queue_name must be a non-empty string, got {queue_name!r}.")
    if trace_id is None or trace_id == "":
        trace_id = new_uuid4()
    elif not isinstance(trace_id, str):
        raise InvalidEnvelopeError(f"trace_id must be a string, got {type(trace_id).__name__}.")
    elif _blank(trace_id):
        trace_id = new_uuid4()
    return {
        "job": urn.strip(_ASCII_WS),
        "trace_id": trace_id,
        "data": dict(data),
        "meta": {
            "id": new_uuid4(),
            "queue": queue_name,
            "lang": LANG,
            "schema_version": SCHEMA_VERSION,
            "created_at": time.time_ns() // 1_000_000,
        },
        "attempts": 0,
    }


# -------------------------------------------------------------------------------------------- encode

_DUMPS_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
# Strict mode makes orjson raise for integers beyond 2**53; those (rare) envelopes take the checked path,
# which accepts everything within signed 64-bit. orjson writes NaN/Infinity as ``null`` and formats floats
# below 1e-4 differently from Python's repr (``1e-7`` vs ``1e-07``, ``0.00001`` vs ``1e-05``), so bodies
# holding ``null``, ``e-`` or ``0.0000`` have their floats checked; all others are final as written.
_FAST_OPTIONS = _DUMPS_OPTIONS | orjson.OPT_STRICT_INTEGER
_EXPONENT_FLOAT = re.compile(rb"[0-9]e-")

_FLOAT_OK, _FLOAT_REPR, _VALUE_BAD = 0, 1, 2


def _ordered(mapping: Mapping[str, Any], known: tuple[str, ...], last: str | None = None) -> dict[str, Any]:
    out = {key: mapping[key] for key in known if key in mapping}
    for key, value in mapping.items():
        if key not in out and key != last:
            out[key] = value
    if last is not None and last in mapping:
        out[last] = mapping[last]
    return out


def _canonical(envelope: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = envelope.get("meta")
    if (
        envelope.__class__ is dict
        and meta.__class__ is dict
        and tuple(envelope) == _CANON_TOP
        and tuple(meta) == META_KEYS
    ):
        return envelope
    out = _ordered(envelope, TOP_LEVEL_KEYS, last="dead_letter")
    if isinstance(meta, Mapping):
        out["meta"] = _ordered(meta, META_KEYS)
    dead_letter = out.get("dead_letter")
    if isinstance(dead_letter, Mapping):
        out["dead_letter"] = _ordered(dead_letter, DEAD_LETTER_KEYS)
    return out


def _floats(node: Any) -> int:
    """Fast walk: _VALUE_BAD for a NaN/Infinity or an out-of-range integer, _FLOAT_REPR when a float
    needs Python's repr, else _FLOAT_OK. Exact classes are tested first: ABC checks are slow."""
    verdict = _FLOAT_OK
    for item in node.values() if node.__class__ is dict or isinstance(node, Mapping) else node:
        cls = item.__class__
        if cls is str or cls is int or item is None or cls is bool:
            if cls is int and not _INT64_MIN <= item <= _INT64_MAX:
                return _VALUE_BAD
        elif cls is float:
            if item - item != 0.0:
                return _VALUE_BAD
            if -1e-4 < item < 1e-4 and item != 0.0:
                verdict = _FLOAT_REPR
        elif cls is dict or cls is list or isinstance(item, Mapping | list | tuple):
            inner = _floats(item)
            if inner == _VALUE_BAD:
                return inner
            verdict |= inner
        elif isinstance(item, float | int) and not isinstance(item, bool):
            inner = _floats([float(item) if isinstance(item, float) else int(item)])
            if inner == _VALUE_BAD:
                return inner
            verdict |= inner
    return verdict


def _raise_for_bad_value(value: Any) -> None:
    """Slow walk that names the JSON pointer of the first forbidden number."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise EnvelopeEncodeError(f"{item!r} at {path or '/'} is not allowed: JSON has no NaN/Infinity.")
        elif isinstance(item, int) and not isinstance(item, bool):
            if not _INT64_MIN <= item <= _INT64_MAX:
                raise EnvelopeEncodeError(
                    f"integer {item} at {path or '/'} is outside signed 64-bit; carry it as a string."
                )
        elif isinstance(item, Mapping):
            stack.extend((f"{path}/{key}", child) for key, child in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((f"{path}/{index}", child) for index, child in enumerate(item))


def _dump_checked(ordered: Mapping[str, Any], body: bytes | None = None) -> bytes:
    """Walk the values, then return ``body`` (the fast output) when it is already right, or re-encode."""
    verdict = _floats(ordered)
    if verdict == _VALUE_BAD:
        _raise_for_bad_value(ordered)
    if verdict == _FLOAT_REPR:
        return json.dumps(ordered, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    if body is not None:
        return body
    try:
        return orjson.dumps(ordered, option=_DUMPS_OPTIONS)
    except orjson.JSONEncodeError as exc:
        raise EnvelopeEncodeError(
            f"The envelope cannot be written as JSON: {exc}. Data must be plain JSON: convert datetimes to "
            "Unix ms or ISO 8601 strings, bytes to base64, sets to lists, and use string keys."
        ) from exc


def encode(envelope: Mapping[str, Any]) -> bytes:
    """Encode an envelope as contract JSON bytes.

    Keys are written in canonical order whatever order the dict has; unknown keys are kept. The bytes
    equal the official Python SDK's encoder output for the same (canonically ordered) dict.

    :raises EnvelopeEncodeError: for NaN/Infinity, integers outside signed 64-bit, non-string keys and
        values JSON cannot carry (datetimes, sets, arbitrary objects) — the message names what to change.
    """
    if envelope.__class__ is not dict and not isinstance(envelope, Mapping):
        raise EnvelopeEncodeError(f"An envelope must be a JSON object (dict), got {type(envelope).__name__}.")
    ordered = _canonical(envelope)
    try:
        body = orjson.dumps(ordered, option=_FAST_OPTIONS)
    except orjson.JSONEncodeError:
        return _dump_checked(ordered)
    if b"null" in body or b"0.0000" in body or (b"e-" in body and _EXPONENT_FLOAT.search(body)):
        body = _dump_checked(ordered, body)
    # orjson returns its working buffer (allocated at 1 KiB or more, outside pymalloc). Bodies are
    # usually kept (batches, message objects), and keeping those buffers costs ~3 us each in page faults
    # and fragmentation on this machine; an exact-size copy costs ~0.5 us (benchmarks/bench_envelope.py).
    return bytes(memoryview(body))


# -------------------------------------------------------------------------------------------- decode


def decode(body: bytes | bytearray | memoryview | str, *, exact: bool = False) -> dict[str, Any]:
    """Decode a raw body into an envelope dict, keeping unknown keys and their order.

    Decoding does not validate the contract (use :func:`check`); it ensures the body is a JSON object whose
    values a reader gets exactly, so the caller can always tell a poison body from a merely non-conformant one.
    An integer outside signed 64-bit is refused rather than rounded (see :mod:`.integers`): the contract forbids
    it, and a handler must never be given an altered value.

    :param exact: kept for callers written when the fast parser rounded huge integers; every decode is exact
        now (such integers are refused), so it changes nothing.
    :raises EnvelopeDecodeError: for invalid UTF-8, invalid JSON (NaN, Infinity, numbers beyond a double and a
        byte-order mark included) or a JSON value that is not an object; its subclass
        :class:`~.integers.IntegerRangeError` for an integer outside signed 64-bit.
    """
    try:
        return _read_checked(body)  # the fast path (see .typed_read): integers checked inside the parse
    except _READ_ERRORS:
        return _read_orjson(body)


def _read_orjson(body: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    """``decode`` on orjson: every body the typed reader refuses, and every body where msgspec is missing. It
    decides each outcome the typed reader does not accept, and words each error."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if not isinstance(body, bytes | bytearray | memoryview | str):
            raise EnvelopeDecodeError(f"A body must be bytes or str, got {type(body).__name__}.") from None
        if "infinity" in str(exc):  # an integer literal so long that it overflows a double: name it as such
            check_integer_range(_as_bytes(body))
        raise EnvelopeDecodeError(f"The body is not valid JSON: {exc}.") from exc
    if value.__class__ is not dict:
        raise EnvelopeDecodeError(f"The body is JSON but not an object (got a JSON {_json_kind(value)}).")
    raw = body if body.__class__ is bytes else _as_bytes(body)
    if raw.translate(_DIGITS_TO_ZERO).find(_LONG_RUN) >= 0:  # the integers' pre-check, inlined: on every body
        check_integer_range(raw)
    return value


def _as_bytes(body: bytearray | memoryview | str | bytes) -> bytes:
    # orjson accepted the text, so a str holds no lone surrogate and encodes cleanly
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array"


# ------------------------------------------------------------------------------------------ validate


def urn_of(envelope: Mapping[str, Any]) -> str:
    """The message URN: ``job`` when it is a non-blank string, else the ``urn`` alias, else ``""``."""
    job = envelope.get("job")
    if isinstance(job, str) and not _blank(job):
        return job
    alias = envelope.get("urn")
    if isinstance(alias, str) and not _blank(alias):
        return alias
    return ""


def check(envelope: Mapping[str, Any]) -> Reason | None:
    """The first contract rule the envelope breaks, or ``None`` when a consumer should accept it.

    Reasons are tested in this order: ``missing_urn``, ``missing_meta``, ``unsupported_schema_version``,
    ``invalid_data``, ``missing_trace_id``, ``invalid_attempts``. PHP's ``"data": []`` counts as an empty
    object. A failing envelope is quarantined to the dead-letter queue with this reason, never dropped.
    """
    if envelope.__class__ is dict:  # a decoded envelope: accept a conformant one in one test, without .get calls
        try:
            job = envelope["job"]
            trace_id = envelope["trace_id"]
            data = envelope["data"]
            attempts = envelope["attempts"]
            version = envelope["meta"]["schema_version"]
        except Exception:  # a missing key, a meta that is no mapping: the rules in order name the reason
            return _first_broken_rule(envelope)
        # `text >= "!"`: the first character is above every ASCII space, so the text is not blank (one
        # comparison; an empty text, or one that starts with a space, goes the rules in order)
        if (job.__class__ is str and trace_id.__class__ is str and data.__class__ is dict
                and attempts.__class__ is int and version.__class__ is int and version == SCHEMA_VERSION
                and attempts >= 0 and job >= "!" and trace_id >= "!"):
            return None
    return _first_broken_rule(envelope)


def _first_broken_rule(envelope: Mapping[str, Any]) -> Reason | None:
    """:func:`check`'s rules, each tested in the contract's order: the answer for every envelope its one-test
    acceptance does not take (a broken rule, PHP's ``[]``, a mapping that is not a dict, whitespace text)."""
    try:
        get = envelope.get
    except AttributeError:
        raise TypeError(f"check() takes a decoded envelope (dict), got {type(envelope).__name__}.") from None
    job = get("job")
    # each test is `_blank` inlined for the common case (a non-empty str with a non-space character)
    if job.__class__ is not str or not job or (job.isspace() and _blank(job)):
        if not urn_of(envelope):
            return Reason.MISSING_URN
    meta = get("meta")
    if meta.__class__ is not dict and not isinstance(meta, Mapping):
        return Reason.MISSING_META
    version = meta.get("schema_version")
    if version.__class__ is not int or version != SCHEMA_VERSION:
        return Reason.UNSUPPORTED_SCHEMA_VERSION
    data = get("data")
    if data.__class__ is not dict and not isinstance(data, Mapping) and data != []:
        return Reason.INVALID_DATA
    trace_id = get("trace_id")
    if trace_id.__class__ is not str or not trace_id or (trace_id.isspace() and _blank(trace_id)):
        if not isinstance(trace_id, str) or _blank(trace_id):
            return Reason.MISSING_TRACE_ID
    attempts = get("attempts")
    if attempts.__class__ is not int or attempts < 0:
        return Reason.INVALID_ATTEMPTS
    return None


def accepts(envelope: Mapping[str, Any]) -> bool:
    """Whether a consumer should accept the envelope (:func:`check` found nothing)."""
    return check(envelope) is None


def data_of(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """The payload as a dict; PHP's empty ``[]`` (and a missing payload) read as ``{}``."""
    data = envelope.get("data")
    return dict(data) if isinstance(data, Mapping) else {}


def meta_id_of(envelope: Mapping[str, Any]) -> str:
    """``meta.id`` (the idempotency key, never ``trace_id``), or ``""`` when absent or not a string."""
    meta = envelope.get("meta")
    value = meta.get("id") if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else ""


# ----------------------------------------------------------------------------- dead letter and replay


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str | None) -> str | None:
    """``text`` with each lone surrogate (from ``surrogateescape``-decoded bytes, or ``chr(0xD800)`` in an
    exception message) replaced by U+FFFD: JSON encoders and database drivers refuse them, and an error text
    must never stop a dead letter from being written. Other characters, NUL included, are kept."""
    if text is None or text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text)
    return text


def annotate_dead_letter(
    envelope: Mapping[str, Any],
    reason: str,
    *,
    original_queue: str,
    attempts: int,
    error: str | None = None,
    exception: str | None = None,
    failed_at: int | None = None,
) -> dict[str, Any]:
    """A copy of the envelope with the additive ``dead_letter`` block last; the input is not mutated.

    The message's identity (``job``, ``trace_id``, ``meta`` with ``meta.id``, ``data``) and unknown keys
    are kept as they are, so the dead letter can be replayed later. A previous ``dead_letter`` block (a
    message that failed again after a replay) is replaced.

    :param reason: why the message is set aside: a :class:`Reason` or another SDK's reason string.
    :param original_queue: the queue the message failed on; replay sends it back there by default.
    :param attempts: the attempts the message used up when it was given up on (the block's ``attempts``). The
        top-level ``attempts`` is left as the caller set it, as the Python SDK's ``annotate`` does; a worker
        that dead-letters after failed runs sets both to the runs (``bindings.bodies.dead_letter_body``).
    :param error: a human-readable message (e.g. the exception text); ``None`` when there is none.
    :param exception: the exception's type name, so triage can group failures by class.
    :param failed_at: Unix ms; defaults to now. Pass it to make annotation reproducible.
    """
    if not isinstance(reason, str) or not reason:
        raise InvalidEnvelopeError(f"A dead-letter reason must be a non-empty string, got {reason!r}.")
    if not isinstance(original_queue, str):
        raise InvalidEnvelopeError(f"original_queue must be a string, got {type(original_queue).__name__}.")
    if attempts.__class__ is not int or attempts < 0:
        raise InvalidEnvelopeError(f"attempts must be a non-negative integer, got {attempts!r}.")
    out = {key: value for key, value in envelope.items() if key != "dead_letter"}
    out["dead_letter"] = {
        "reason": str(reason),
        "error": error,
        "exception": exception,
        "failed_at": now_ms() if failed_at is None else failed_at,
        "original_queue": original_queue,
        "attempts": attempts,
        "lang": LANG,
    }
    return out


def reset_for_replay(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """A copy ready to be published again: ``dead_letter`` removed and ``attempts`` back to 0.

    Everything else stays, ``meta.id`` included, so consumers' idempotency guards still recognise a
    message that had in fact been processed before it was dead-lettered.
    """
    out = {key: value for key, value in envelope.items() if key != "dead_letter"}
    out["attempts"] = 0
    return out
