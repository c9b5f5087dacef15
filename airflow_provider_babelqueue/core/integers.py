"""The contract's integer range, checked on the raw bytes of a body: every integer must fit signed 64-bit.

Other SDKs do not all keep to it. Node writes ``2**63 - 1`` as ``9223372036854776000`` (a double, printed
without an exponent), and a hand-written producer can put anything in a JSON number. orjson cannot be asked
afterwards: it keeps ``2**63`` .. ``2**64 - 1`` as ints but reads ``2**64`` and beyond (and everything below
``-2**63``) as floats, which then look like any other float. So wherever a body is read on orjson (``decode``'s
orjson path, drain records, dead letters in SQL), the bytes are read instead; ``decode``'s fast path
(:mod:`.typed_read`) has msgspec refuse such literals inside its parse.

Every integer outside signed 64-bit is written with at least 19 digits (``2**63`` is ``9223372036854775808``),
so the check is a byte-level pre-check first (a run of 19 digits anywhere, found with one ``bytes.translate``
and a substring search, both C loops) and an exact reading of the literals only when that run exists outside
JSON strings: digits inside strings (ids, card numbers, big integers carried as strings, as the contract asks)
never count. Pure module: standard library only.
"""

from __future__ import annotations

import re

from .errors import EnvelopeDecodeError

__all__ = [
    "DIGITS_TO_ZERO",
    "INT64_MAX",
    "INT64_MIN",
    "IntegerRangeError",
    "LONG_RUN",
    "check_integer_range",
    "may_hold_wide_integer",
    "out_of_range_integer",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: Every digit becomes "0", so a run of 19 digits becomes the substring :data:`LONG_RUN`: ~8x faster than a
#: regular expression ``[0-9]{19}`` on typical bodies, same answer.
DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
#: 19 digits as :data:`DIGITS_TO_ZERO` leaves them: ``body.translate(DIGITS_TO_ZERO).find(LONG_RUN) >= 0`` is the
#: pre-check (``find`` rather than ``in``: the same search, about 0.1 µs less on a 500-byte body on CPython 3.11).
LONG_RUN = b"0" * 19
#: A whole integer literal of 19+ digits: not the fraction or exponent of a float (nothing of a number before
#: it), not the integer part of a float (no ``.``/``e`` after it).
_LONG_INTEGER = re.compile(rb"(?<![0-9.eE+\-])-?[0-9]{19,}(?![0-9.eE])")
#: Literals longer than this are shown cut in messages (a hostile body can hold thousands of digits).
_SHOWN = 40


class IntegerRangeError(EnvelopeDecodeError):
    """A body holds an integer outside signed 64-bit. The contract forbids it and a reader would get a rounded
    or float value, so the body is poison: consumers quarantine it with its bytes kept exactly."""


def may_hold_wide_integer(body: bytes) -> bool:
    """The cheap pre-check alone: whether ``body`` has a run of 19 digits anywhere (strings included).

    ``False`` proves the body holds no integer outside signed 64-bit; ``True`` needs
    :func:`out_of_range_integer` to tell.
    """
    return body.translate(DIGITS_TO_ZERO).find(LONG_RUN) >= 0


def _outside_strings(body: bytes) -> bytes:
    """The body with the content of every JSON string removed (quotes removed too), for a valid JSON text.

    Escaped backslashes and escaped quotes go first, so every remaining quote opens or closes a string; the
    pieces between quotes then alternate outside / inside.
    """
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(body.split(b'"')[::2])


def out_of_range_integer(body: bytes) -> str | None:
    """The first integer literal of ``body`` (a valid JSON text) outside signed 64-bit, as written; else ``None``.

    Digits inside JSON strings, and the digits of floats (``12345678901234567890.5``, ``1e-400``), do not count:
    floats are doubles by contract, and their range is checked by the JSON parser.

    :param body: the raw bytes, already known to be valid JSON (the answer for invalid JSON is a guess; a
        parser refuses such a body anyway).
    """
    if body.translate(DIGITS_TO_ZERO).find(LONG_RUN) < 0:
        return None
    outside = _outside_strings(body)
    if outside.translate(DIGITS_TO_ZERO).find(LONG_RUN) < 0:
        return None
    for match in _LONG_INTEGER.finditer(outside):
        literal = match.group()
        digits = len(literal) - (literal[:1] == b"-")
        # No leading zeros in JSON: past 19 digits the value is out of range without converting it (Python
        # refuses to convert more than 4,300 digits anyway).
        if digits > 19 or not INT64_MIN <= int(literal) <= INT64_MAX:
            return literal.decode("ascii")
    return None


def check_integer_range(body: bytes) -> None:
    """Raise :class:`IntegerRangeError` when ``body`` (a valid JSON text) holds an integer outside signed 64-bit.

    :raises IntegerRangeError: naming the literal (cut after 40 characters) and the allowed range.
    """
    literal = out_of_range_integer(body)
    if literal is None:
        return
    digits = len(literal) - literal.startswith("-")
    shown = literal if len(literal) <= _SHOWN else f"{literal[:20]}... ({digits:,} digits)"
    raise IntegerRangeError(
        f"integer {shown} is outside the signed 64-bit range the contract allows ({INT64_MIN} to {INT64_MAX}); "
        "a producer must carry such a value as a string"
    )
