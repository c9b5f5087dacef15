"""Consumer body limits: size and nesting, checked on the raw bytes before anything decodes or validates them.

A hostile or runaway producer cannot make a consumer validate, re-encode or hand such a body to a handler:
the consumer dead-letters it as ``poison`` with an error naming the limit and the actual figure.
"""

from __future__ import annotations

from itertools import accumulate

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_NESTING_DEPTH",
    "body_limit_error",
    "check_limit",
    "nesting_depth",
]

#: 16 MiB: above what SQS and Pulsar accept by default, so in practice it stops runaway bodies on brokers with no
#: (or a much larger) limit of their own: the SQL table, Redis lists, RabbitMQ, Service Bus premium.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: 64 levels, counting the envelope's own object as 1: real payloads rarely pass 10, and parsers that recurse
#: (Python's ``json``, many handlers' own code) fail somewhere between a few hundred and a thousand.
DEFAULT_MAX_NESTING_DEPTH = 64


# Bytes kept when measuring nesting: quotes (to find strings) and brackets; braces are folded into brackets
# and the brackets then into signed steps (+1 / -1), since only the nesting counts, not the container type.
_NOT_QUOTE_OR_BRACKET = bytes(byte for byte in range(256) if byte not in b'"[]{}')
_FOLD_BRACES = bytes.maketrans(b"{}", b"[]")
_STEPS = bytes.maketrans(b"[]", b"\x01\xff")


def _brackets_outside_strings(body: bytes) -> bytes:
    """The body's brackets and braces that are not inside a JSON string, in order, as ``[`` and ``]``.

    Bulk byte operations only (no per-byte Python loop, no regular expression): escaped backslashes and escaped
    quotes are dropped first, so every remaining quote opens or closes a string; then everything but quotes and
    brackets. Strings are then ``"..."`` runs holding only brackets: when none holds any, removing ``""`` pairs
    leaves exactly the brackets outside strings; otherwise every second piece between quotes is a string.
    """
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = body.translate(_FOLD_BRACES, _NOT_QUOTE_OR_BRACKET)
    if b'"' in kept:
        outside = kept.replace(b'""', b"")
        kept = outside if b'"' not in outside else b"".join(kept.split(b'"')[::2])
    return kept


def nesting_depth(body: bytes) -> int:
    """How deeply JSON arrays and objects nest in ``body`` (``{}`` is 1, ``{"a":[1]}`` is 2), without decoding it.

    Brackets inside strings do not count. Nothing recurses: the brackets outside strings become +1/-1 steps and
    the depth is the highest running sum, computed in C loops (a body nested a million levels deep takes about
    0.05 s). For a body that is not valid JSON (stray closing brackets, an unterminated string) the figure is
    an estimate; a decoder rejects such a body anyway.
    """
    brackets = _brackets_outside_strings(body)
    if not brackets:
        return 0
    return max(0, max(accumulate(memoryview(brackets.translate(_STEPS)).cast("b"))))


def body_limit_error(body: bytes, max_body_bytes: int | None, max_nesting_depth: int | None, *,
                     size: int | None = None) -> str | None:
    """Why ``body`` breaks a consumer limit, naming the limit and the actual figure; ``None`` when it does not.

    Both checks are cheap for ordinary bodies: the size is ``len``, and the depth is only measured when the
    body has more opening brackets than the limit allows levels (fewer openers cannot nest deeper).

    :param size: the stored body's length when the binding did not read it (``body`` is then empty; see
        ``ReceivedMessage.stored_size``), so such a body is refused with the same error as one that was read.
    """
    size = len(body) if size is None else size
    if max_body_bytes is not None and size > max_body_bytes:
        return f"body is {size:,} bytes; this consumer accepts at most {max_body_bytes:,} (max_body_bytes)"
    if max_nesting_depth is not None and body.count(b"[") + body.count(b"{") > max_nesting_depth:
        depth = nesting_depth(body)
        if depth > max_nesting_depth:
            return (f"body is nested {depth:,} levels deep; this consumer accepts at most {max_nesting_depth:,} "
                    "(max_nesting_depth)")
    return None


def check_limit(value: int | None, name: str) -> int | None:
    """``value`` when it is a usable limit (a positive ``int``, or ``None`` for none); else ``ValueError``
    naming the option, so a typo in a DAG fails when the file is parsed rather than at 3 a.m."""
    if value is None:
        return None
    if value.__class__ is bool or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive whole number or None (no limit), got {value!r}")
    return value
