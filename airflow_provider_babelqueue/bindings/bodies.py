"""The bodies a binding writes back: a retry's body (``attempts`` + 1) and a dead letter's forms.

Every binding releases and dead-letters through these functions, so a framed message stays framed on a retry,
a dead letter carries the same ``dead_letter`` block on every broker, and a body that cannot be annotated is
kept byte for byte inside the poison wrapper. Pure: no broker client, no Airflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import envelope as bq
from ..core.errors import EnvelopeDecodeError, EnvelopeEncodeError, InvalidEnvelopeError
from ..core.frames import encode_frame, open_body
from ..core.integers import INT64_MAX
from ..core.peer import WrapperParts, wrap_raw, wrap_raw_parts
from .message import ReceivedMessage

__all__ = ["annotated_body", "bumped_body", "dead_letter_body", "dead_letter_parts", "dead_letter_view"]


def bumped_body(message: ReceivedMessage) -> bytes:
    """The body to re-deliver on a release: ``attempts`` = reconciled attempts + 1.

    A framed message stays framed, with the same headers and its inner envelope's ``attempts`` bumped, so the
    peer that framed it still finds its headers on the retry. An undecodable body, or one that cannot be
    re-encoded, goes back unchanged (bytes are never lost).
    """
    if message.envelope is None:
        return message.body
    try:
        env, frame = open_body(message.body)
        env["attempts"] = message.attempts + 1
        body = bq.encode(env)
        return body if frame is None else encode_frame(body, frame.headers)
    except (EnvelopeDecodeError, EnvelopeEncodeError, TypeError, ValueError):
        return message.body


def _with_attempts(env: dict[str, Any], attempts: int) -> dict[str, Any]:
    """``env`` with its top-level ``attempts`` set to the dead letter's (the block's), the spec's "3 and 3"; a value
    that is not a non-negative integer is kept as it is: the evidence of an ``invalid_attempts`` quarantine."""
    current = env.get("attempts")
    if current.__class__ is int and current >= 0:
        env["attempts"] = attempts
    return env


def annotated_body(
    message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
) -> bytes | None:
    """The envelope with its ``dead_letter`` block, encoded; ``None`` when the body cannot be annotated (it is
    not an envelope, it was refused by a consumer limit, or it cannot be re-encoded).

    Its top-level ``attempts`` equals the block's: ``message.attempts``, which the consumer sets to the attempts
    used up (3 and 3 after three failed runs with ``max_attempts=3``, as in spec/dead-letters.md and the Python
    SDK). A top-level ``attempts`` that is not a non-negative integer is kept as it is: the evidence of an
    ``invalid_attempts`` quarantine. A framed message gives its bare annotated envelope, never an annotated
    frame: every SDK's DLQ reader (and replay) then sees an envelope. Lone surrogates in the texts become U+FFFD
    (:func:`~...core.envelope.storable_text`), so no error text can make the annotation fail.
    """
    if message.envelope is None:
        return None
    try:
        env = _with_attempts(open_body(message.body)[0], message.attempts)
        annotated = bq.annotate_dead_letter(
            env,
            reason,
            original_queue=message.queue_name,
            attempts=message.attempts,
            error=bq.storable_text(error),
            exception=bq.storable_text(exception),
        )
        return bq.encode(annotated)
    except (EnvelopeDecodeError, EnvelopeEncodeError, InvalidEnvelopeError):
        return None


def dead_letter_body(
    message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
) -> bytes:
    """The body to store in a DLQ that holds only bodies: :func:`annotated_body`, or when the message cannot be
    annotated, the poison wrapper of its exact bytes (:func:`~...core.peer.wrap_raw`, the Python SDK's form)
    with the reason, the error and the queue it was quarantined from. Nothing depends on what such a body
    claims about itself: readers take the reason and the route from the wrapper's block, and a replay never
    republishes it. Bindings with columns or native fields for the reason (the SQL table, Service Bus's own
    dead-letter queue) store the bytes bare instead and keep the reason there.
    """
    annotated = annotated_body(message, reason, error=error, exception=exception)
    if annotated is not None:
        return annotated
    return dead_letter_view(message.body, None, str(reason), original_queue=message.queue_name,
                            attempts=message.attempts, error=error, exception=exception)


def dead_letter_parts(
    message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
) -> WrapperParts:
    """What :func:`dead_letter_body` stores for a message without an envelope (the poison wrapper of its exact
    bytes), as :class:`~...core.peer.WrapperParts`: the same bytes, as their length and their parts, so a binding
    can send the dead letter of a large body in pieces instead of holding it whole beside the body (Redis).
    """
    return wrap_raw_parts(message.body, str(reason), original_queue=message.queue_name,
                          attempts=min(max(message.attempts, 0), INT64_MAX), error=bq.storable_text(error),
                          exception=bq.storable_text(exception))


def dead_letter_view(
    body: bytes,
    envelope: Mapping[str, Any] | None,
    reason: str,
    *,
    original_queue: str,
    attempts: int,
    error: str | None = None,
    exception: str | None = None,
    failed_at: int | None = None,
) -> bytes:
    """How a dead letter stored bare, with its reason kept beside it (the SQL table's columns, Service Bus's
    DeadLetterReason), is handed to readers: in the form the other DLQs hold, so every reader (drains, replay,
    sensors, Spark triage) finds the reason, the error and the queue it was quarantined from in the body.

    A body that already has a ``dead_letter`` block is returned byte for byte; an envelope gets the block from
    the stored fields; anything else (an envelope stored as ``poison``, refused by a consumer limit; one that
    cannot be re-encoded; bytes that are no envelope) becomes the poison wrapper of its exact bytes
    (:func:`~...core.peer.wrap_raw`). A replay skips both poison forms, so what a refused body claims (its own
    ``meta.queue``) is never followed.

    :param envelope: ``body`` decoded (``parse_body``), or ``None`` when it is not an envelope.
    """
    if envelope is not None and "dead_letter" in envelope:
        return body
    error, exception = bq.storable_text(error), bq.storable_text(exception)
    attempts = min(max(attempts, 0), INT64_MAX)
    if envelope is not None and reason != bq.Reason.POISON:  # poison that decodes: refused by a limit, kept exact
        try:
            env = _with_attempts(open_body(body)[0], attempts)
            return bq.encode(bq.annotate_dead_letter(env, reason, original_queue=original_queue, attempts=attempts,
                                                     error=error, exception=exception, failed_at=failed_at))
        except (EnvelopeDecodeError, EnvelopeEncodeError, InvalidEnvelopeError):
            pass
    return wrap_raw(body, reason, original_queue=original_queue, attempts=attempts, error=error, exception=exception,
                    failed_at=failed_at)
