"""The error fingerprint of a dead letter: the one definition, shared by the Spark triage and the provider's own code.

Two dead letters share a fingerprint when they failed with the same exception and "the same" error text, once the
parts that vary from message to message (ids, numbers, quoted values) are masked. The triage job writes it as its
``fingerprint`` column (``spark/triage.py`` builds its Spark expressions from the patterns below); the dead-letter
trigger's ``fire_on="new_fingerprint"`` and the dead-letter notifier compute it here, in plain Python, with the
same result for every dead letter (a test compares both over a corpus run through the real triage job).

The definition:

1. ``error_pattern``: the dead letter's ``dead_letter.error`` cut to its first :data:`ERROR_CHARS` characters, then
   each mask of :data:`MASKS` applied in order (quoted strings → ``<str>``, UUIDs → ``<uuid>``, hex ids →
   ``<hex>``, numbers → ``<n>``, whitespace runs → one space), then leading and trailing spaces removed. The
   error texts triage writes itself for an unreadable body (:data:`OWN_POISON_ERRORS`) are their own pattern.
   No error: no pattern.
2. ``fingerprint``: the first :data:`FINGERPRINT_CHARS` hex digits of SHA-256 over the UTF-8 bytes of
   ``exception + "\\0" + error_pattern`` (a missing one as ``""``), ``exception`` being the full
   ``dead_letter.exception`` text, blank (spaces only) as missing.

The patterns are written so that Java's ``java.util.regex`` (Spark) and Python's ``re`` read them identically:
ASCII character classes spelled out (``[0-9]``, never ``\\d``; the whitespace class Java's ``\\s`` means), and a
word boundary written as a look-around on ``[A-Za-z0-9_]`` instead of ``\\b`` (whose meaning next to a non-ASCII
letter differs between Python, Java 17 and Java 19+).

Pure module: the fingerprint and pattern functions use the standard library only; :func:`read_dead_letter` reads a
stored body with the core's own decoder (:mod:`.frames`, :mod:`.peer`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .envelope import Reason
from .errors import EnvelopeDecodeError
from .frames import FRAME_KEY, FrameError, open_body
from .peer import poison_wrapper

__all__ = [
    "ERROR_CHARS",
    "EXCEPTION_TYPE_PATTERN",
    "FINGERPRINT_CHARS",
    "FINGERPRINT_SEPARATOR",
    "HEX_PATTERN",
    "MASKS",
    "NUMBER_PATTERN",
    "OWN_POISON_ERRORS",
    "POISON_INVALID_FRAME",
    "POISON_INVALID_JSON",
    "POISON_INVALID_UTF8",
    "POISON_WRAPPED",
    "QUOTED_PATTERN",
    "UNANNOTATED",
    "UUID_PATTERN",
    "WHITESPACE_PATTERN",
    "DeadLetterFacts",
    "error_fingerprint",
    "error_pattern",
    "exception_type",
    "read_dead_letter",
]

#: Only the first characters of an error count: a stack trace's tail would split groups without telling more.
ERROR_CHARS = 2000
#: Hex digits kept of the SHA-256: 64 bits, plenty for the few thousand error kinds a deployment has.
FINGERPRINT_CHARS = 16
#: Between the exception and the pattern in the hashed text (no exception or error text holds a NUL in practice;
#: without a separator ``("ab", "c")`` and ``("a", "bc")`` would collide).
FINGERPRINT_SEPARATOR = "\u0000"

#: The error of a body that is not UTF-8.
POISON_INVALID_UTF8 = "body is not valid UTF-8"
#: The error of a body that is not a JSON object (as the core decodes it).
POISON_INVALID_JSON = "body is not a JSON object"
#: The error of a header frame that carries no envelope (core.frames calls such a frame poison too).
POISON_INVALID_FRAME = "header frame does not hold an envelope"
#: The error of a poison wrapper whose ``dead_letter`` block has none.
POISON_WRAPPED = "dead-lettered as poison by its SDK"
#: The errors the readers write themselves for an unreadable body: kept as they are by :func:`error_pattern`
#: (masking would turn ``UTF-8`` into ``UTF-<n>``). A peer's own error text (a poison wrapper's) is masked.
OWN_POISON_ERRORS = frozenset({POISON_INVALID_UTF8, POISON_INVALID_JSON, POISON_INVALID_FRAME})
#: The reason of a decodable dead letter without ``dead_letter.reason`` (triage's ``reason`` column).
UNANNOTATED = "unannotated"

# (ASCII classes spelled out, so Java and Python read them alike; see the module docstring)
_WORD = "A-Za-z0-9_"
_START = f"(?<![{_WORD}])"
_END = f"(?![{_WORD}])"
_HEXDIGIT = "[0-9a-fA-F]"

#: A double- or single-quoted run (no escapes: ``"a\\"b"`` masks as ``<str>b"``).
QUOTED_PATTERN = "\"[^\"]*\"|'[^']*'"
#: A UUID of any version or case, not inside a longer word.
UUID_PATTERN = (f"{_START}{_HEXDIGIT}{{8}}-{_HEXDIGIT}{{4}}-{_HEXDIGIT}{{4}}-{_HEXDIGIT}{{4}}-{_HEXDIGIT}{{12}}"
                f"{_END}")
#: A hex id: ``0x…``, or a word of 8 or more hex digits holding at least one digit and one letter.
HEX_PATTERN = (f"{_START}0[xX]{_HEXDIGIT}+{_END}"
               f"|{_START}(?={_HEXDIGIT}*[0-9])(?={_HEXDIGIT}*[a-fA-F]){_HEXDIGIT}{{8,}}{_END}")
#: A number, with ``.`` or ``,`` groups (``1,234.5``); ASCII digits only.
NUMBER_PATTERN = "[0-9]+(?:[.,][0-9]+)*"
#: A run of whitespace as Java's ``\\s`` means it (ASCII space, tab, newline, vertical tab, form feed, return).
WHITESPACE_PATTERN = r"[ \t\n\x0B\f\r]+"

#: The masks of :func:`error_pattern`, applied in this order: ``(pattern, replacement, needs)``. ``needs`` lists
#: characters without which the pattern cannot match in the error text (the masks before it only ever insert
#: ``<``, ``>`` and letters): the Spark job skips a pass for an error that lacks them all. An empty ``needs``
#: means "always run".
MASKS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (QUOTED_PATTERN, "<str>", ("'", '"')),
    (UUID_PATTERN, "<uuid>", ("-",)),
    (HEX_PATTERN, "<hex>", ()),
    (NUMBER_PATTERN, "<n>", ()),
    # without one of these (a lone space stays as it is) there is nothing to collapse
    (WHITESPACE_PATTERN, " ", ("  ", "\t", "\n", "\x0b", "\f", "\r")),
)

#: The last segment of an exception's type name (``.``, ``\\``, ``:``, ``/`` and ``$`` separate segments), as
#: the Spark jobs' ``short_exception`` extracts it.
EXCEPTION_TYPE_PATTERN = r"([^\\.:/$]*)$"

_COMPILED = tuple((re.compile(pattern), replacement) for pattern, replacement, _ in MASKS)
_EXCEPTION_TYPE = re.compile(EXCEPTION_TYPE_PATTERN)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _java_text(text: str) -> str:
    """``text`` as the JVM holds it after a UTF-8 round trip: a lone surrogate (which no decoded body holds: the
    core refuses them) becomes ``?``, as Java's UTF-8 encoder writes it, so hashing never fails."""
    if text.isascii():
        return text
    return _SURROGATE.sub("?", text)


def error_pattern(error: str | None, *, poison: bool = False) -> str | None:
    """The error text with its variable parts masked, so similar errors group (see the module docstring).

    :param error: the dead letter's ``dead_letter.error`` (for a poison body, the reader's own error text).
    :param poison: the body is poison; then one of :data:`OWN_POISON_ERRORS` is its own pattern.
    :returns: the pattern, or ``None`` when there is no error text.
    """
    if error is None:
        return None
    if poison and error in OWN_POISON_ERRORS:
        return error
    text = _java_text(error[:ERROR_CHARS])
    for pattern, replacement in _COMPILED:
        text = pattern.sub(replacement, text)
    return text.strip(" ")


def _blank_is_none(text: str | None) -> str | None:
    """Triage's reading of a text field: one holding nothing but spaces (or nothing) is missing."""
    return text if text is not None and text.strip(" ") else None


def error_fingerprint(exception: str | None, pattern: str | None) -> str:
    """The fingerprint of an (exception, error pattern) pair: :data:`FINGERPRINT_CHARS` lowercase hex digits.

    :param exception: the full ``dead_letter.exception`` text (``App\\Exceptions\\GatewayTimeout``, not its
        last segment); blank reads as missing, as in the triage's ``exception`` column.
    :param pattern: the error pattern (:func:`error_pattern`), not the raw error text.
    """
    exception = _blank_is_none(exception)
    text = FINGERPRINT_SEPARATOR.join((_java_text(exception or ""), pattern or ""))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:FINGERPRINT_CHARS]


def exception_type(exception: str | None) -> str | None:
    """The last segment of an exception type name: ``App\\Exceptions\\GatewayTimeout`` → ``GatewayTimeout``
    (triage's ``exception_type`` column); ``None`` for a blank or missing exception."""
    exception = _blank_is_none(exception)
    if exception is None:
        return None
    found = _EXCEPTION_TYPE.search(exception)
    return found.group(1) if found else ""


def _json_text(value: Any) -> str | None:
    """A body field read as text, as the Spark job reads it: a JSON string gives its text, ``null`` nothing, any
    other value its compact JSON text (exact for integers, booleans and containers of strings and integers;
    Spark's JSON writer spells some floats and escapes differently)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True, slots=True)
class DeadLetterFacts:
    """What the triage row of one dead letter says about its failure, read from the stored body alone.

    :ivar meta_id: ``meta.id``, or ``None`` (poison, or an envelope without one).
    :ivar urn: ``job``, else the ``urn`` alias, or ``None``.
    :ivar reason: ``dead_letter.reason``; ``poison`` for an unreadable body or a poison wrapper without one;
        :data:`UNANNOTATED` for an envelope without one.
    :ivar poison: the body is not an envelope (undecodable, a malformed frame, a poison wrapper whose block says
        ``poison``).
    :ivar exception: ``dead_letter.exception`` (blank as ``None``).
    :ivar error: ``dead_letter.error``; for an unreadable body, the reader's own text (:data:`OWN_POISON_ERRORS`).
    :ivar failed_at: ``dead_letter.failed_at`` (Unix milliseconds) when the block has a whole number there.
    """

    meta_id: str | None
    urn: str | None
    reason: str
    poison: bool
    exception: str | None
    error: str | None
    failed_at: int | None = None

    @property
    def exception_type(self) -> str | None:
        return exception_type(self.exception)

    @property
    def error_pattern(self) -> str | None:
        return error_pattern(self.error, poison=self.poison)

    @property
    def fingerprint(self) -> str:
        return error_fingerprint(self.exception, self.error_pattern)


def _block_text(block: Mapping[str, Any] | None, key: str) -> str | None:
    return _json_text(block.get(key)) if block is not None else None


def read_dead_letter(body: bytes, envelope: Mapping[str, Any] | None = None) -> DeadLetterFacts:
    """The failure facts of one stored dead letter, as the triage job derives them from the same bytes (a header
    frame gives its inner envelope; the Python SDK's poison wrapper gives its block's reason, error and
    exception; a body the core cannot decode is poison with the reader's own error text).

    The Spark job reads two kinds of body differently from the core (a field nested deeper than 1,000 levels
    and an object key longer than 50,000 characters: poison there, readable here), and reads a blank
    (spaces-only) reason as missing, as here.

    :param body: the stored bytes, exactly as the broker holds them.
    :param envelope: ``body`` already decoded by :func:`~.frames.open_body` (a binding's
        ``ReceivedMessage.envelope``), to save a second decode; ``None``: decoded here.
    """
    if envelope is None or FRAME_KEY in envelope:
        try:
            envelope = open_body(body)[0]
        except FrameError:
            return DeadLetterFacts(None, None, str(Reason.POISON), True, None, POISON_INVALID_FRAME)
        except EnvelopeDecodeError:
            try:
                body.decode("utf-8")
            except UnicodeDecodeError:
                return DeadLetterFacts(None, None, str(Reason.POISON), True, None, POISON_INVALID_UTF8)
            return DeadLetterFacts(None, None, str(Reason.POISON), True, None, POISON_INVALID_JSON)
    value = envelope.get("dead_letter")
    block = value if isinstance(value, Mapping) else None
    exception = _blank_is_none(_block_text(block, "exception"))
    error = _block_text(block, "error")
    reason = _blank_is_none(_block_text(block, "reason"))
    stamp = block.get("failed_at") if block is not None else None
    failed_at = stamp if isinstance(stamp, int) and not isinstance(stamp, bool) else None
    wrapper = poison_wrapper(envelope)
    if wrapper is not None:  # the SDK's reason, error and exception, kept beside bytes it could not annotate
        reason = reason or str(Reason.POISON)
        poison = reason == Reason.POISON
        if poison and error is None:
            error = POISON_WRAPPED
        return DeadLetterFacts(None, None, reason, poison, exception, error, failed_at)
    meta = envelope.get("meta")
    meta_id = _blank_is_none(_json_text(meta.get("id"))) if isinstance(meta, Mapping) else None
    urn = _blank_is_none(_json_text(envelope.get("job"))) or _blank_is_none(_json_text(envelope.get("urn")))
    return DeadLetterFacts(meta_id, urn, reason or UNANNOTATED, False, exception, error, failed_at)
