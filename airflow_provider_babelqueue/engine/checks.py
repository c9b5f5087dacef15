"""The checks behind the sensors and triggers: one pure implementation for every mode.

Sensors call these in ``poke``; triggers call the same functions from a worker thread, so poke,
reschedule and deferrable modes decide identically. Pure: bindings only, no Airflow import.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..bindings.base import Binding, NotSupportedError
from ..bindings.message import ReceivedMessage
from ..core import envelope as bq
from ..core.errors import EnvelopeDecodeError
from ..core.frames import FRAME_KEY, open_body
from ..core.peer import poison_wrapper
from .filters import MessageFilter, message_filter

__all__ = [
    "COMPARISONS",
    "DeadLetterStatus",
    "DepthStatus",
    "compare",
    "dead_letter_matches",
    "dead_letter_status",
    "depth_status",
]

COMPARISONS: dict[str, Callable[[int, int], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
}
WHICH = ("ready", "dead_letter")


def compare(observed: int, comparison: str, threshold: int) -> bool:
    """``observed <comparison> threshold``; the comparison is one of ``>=, >, <=, <, ==``."""
    try:
        return COMPARISONS[comparison](observed, threshold)
    except KeyError:
        raise ValueError(f"comparison must be one of {', '.join(COMPARISONS)}, got {comparison!r}") from None


def validate_depth_args(which: str, comparison: str, threshold: int, consecutive: int) -> None:
    if which not in WHICH:
        raise ValueError(f"which must be 'ready' or 'dead_letter', got {which!r}")
    compare(0, comparison, 0)
    if threshold < 0:
        raise ValueError(f"threshold must not be negative, got {threshold}")
    if consecutive < 1:
        raise ValueError(f"consecutive must be at least 1, got {consecutive}")


@dataclass(frozen=True, slots=True)
class DepthStatus:
    matched: bool
    depth: int
    observations: tuple[int, ...]


def depth_status(
    binding: Binding,
    queue_name: str,
    *,
    which: str = "ready",
    comparison: str = ">=",
    threshold: int = 1,
    consecutive: int = 1,
    interval: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> DepthStatus:
    """Observe a queue's depth; it matches when ``consecutive`` observations ``interval`` seconds apart all
    satisfy the comparison. Several observations tolerate eventually consistent counts (SQS): one stale
    reading cannot end the wait. Stops at the first reading that does not match."""
    validate_depth_args(which, comparison, threshold, consecutive)
    measure = binding.depth if which == "ready" else binding.dead_letter_depth
    seen: list[int] = []
    for index in range(consecutive):
        if index:
            sleep(interval)
        seen.append(measure(queue_name))
        if not compare(seen[-1], comparison, threshold):
            return DepthStatus(False, seen[-1], tuple(seen))
    return DepthStatus(True, seen[-1], tuple(seen))


@dataclass(frozen=True, slots=True)
class DeadLetterStatus:
    """``depth``: the DLQ depth; ``matching``: dead letters passing the filters among those browsed (the
    depth itself when no filter is set); ``sample``: up to ``sample_size`` of them as
    ``{"meta_id", "urn", "reason"}``."""

    matched: bool
    depth: int
    matching: int
    sample: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"depth": self.depth, "matching": self.matching, "sample": self.sample}


def _read_dead_letter(message: ReceivedMessage) -> tuple[dict[str, Any], Mapping[str, Any] | None]:
    """One browsed dead letter as ``({"meta_id", "urn", "reason"}, envelope)``, read as every reader reads stored
    bodies: a framed dead letter (the Python SDK keeps the frame) as its inner envelope, a poison wrapper with its
    block's reason (``poison`` when it has none) and any undecodable body as ``poison``. The envelope is ``None``
    for a poison wrapper or an undecodable body: neither has a URN or a ``data`` a filter could look at."""
    envelope = message.envelope
    if envelope is not None and FRAME_KEY in envelope:  # a binding that did not unwrap: read the stored bytes
        try:
            envelope = open_body(message.body)[0]
        except EnvelopeDecodeError:
            envelope = None
    if envelope is None:
        return {"meta_id": "", "urn": "", "reason": str(bq.Reason.POISON)}, None
    wrapper = poison_wrapper(envelope)
    if wrapper is not None:  # the consumer's reason, kept beside the bytes it could not annotate
        return {"meta_id": "", "urn": "", "reason": wrapper.reason}, None
    block = envelope.get("dead_letter")
    reason = block.get("reason") if isinstance(block, dict) else None
    return {"meta_id": bq.meta_id_of(envelope), "urn": bq.urn_of(envelope), "reason": reason}, envelope


def dead_letter_matches(chosen: MessageFilter, envelope: Mapping[str, Any] | None) -> bool:
    """Whether a dead letter's URN and ``data`` pass ``chosen``, with :class:`MessageFilter`'s rules (URN
    patterns, case-sensitive, any one matching; the JSONPath selecting at least one node of ``data``; both set,
    both), but without its validity gate: a live consumer must not take an envelope that breaks a contract rule,
    while the dead-letter queue is where such envelopes are kept, and the one quarantined as ``invalid_data`` is
    still an order by its URN (``reasons`` is the filter on why it was dead-lettered). ``data`` that is not an
    object reads as ``{}``. ``envelope`` ``None`` (a poison wrapper, an undecodable body) matches no active
    filter: it has neither a URN nor ``data``.

    :param chosen: the filter, already validated (its JSONPath compiled once when it was built).
    :param envelope: the dead letter's inner envelope, as :func:`_read_dead_letter` returns it.
    """
    return chosen.matches_fields(envelope)


def dead_letter_status(
    binding: Binding,
    queue_name: str,
    *,
    min_count: int = 1,
    baseline: int | None = None,
    reasons: Sequence[str] | None = None,
    urns: str | Sequence[str] | None = None,
    jsonpath: str | None = None,
    sample_size: int = 5,
    browse_limit: int = 1000,
) -> DeadLetterStatus:
    """Have dead letters arrived?

    Without filters: matched when the DLQ depth is at least ``min_count`` — or, with a ``baseline``, when
    it grew by at least ``min_count`` since the baseline was taken. With ``reasons``/``urns``/``jsonpath`` the
    first ``browse_limit`` dead letters are read without removing them (where the broker can browse) and only
    matching ones count (growth is then judged on the depth, the filter on the browsed messages).

    :param reasons: ``dead_letter.reason`` values (exact); a dead letter counts when its reason is one of them.
    :param urns: URN patterns (``fnmatch``, case-sensitive; an exact URN matches only itself), so one sensor can
        watch a family of message types (``urn:babel:orders:*``).
    :param jsonpath: an RFC 9535 query over the dead letter's ``data`` (the original payload); it counts when
        the query selects something, so a sensor can wait for the failures that matter (``$[?$.amount > 100]``).
    :param browse_limit: how many dead letters a filtered check reads at most, which bounds each poll's cost.
    :raises ValueError: for an invalid URN pattern or JSONPath (the message names the expression).
    :raises NotSupportedError: for filters on a broker that cannot browse its DLQ.
    """
    if min_count < 1:
        raise ValueError(f"min_count must be at least 1, got {min_count}")
    chosen = message_filter(urns, jsonpath)
    depth = binding.dead_letter_depth(queue_name)
    filtered = bool(reasons) or chosen.active
    sample: list[dict[str, Any]] = []
    matching = depth
    if filtered or (sample_size > 0 and binding.can_browse):
        if filtered and not binding.can_browse:
            raise NotSupportedError(
                f"filtering dead letters by reason, URN or JSONPath needs a broker that can browse its dead-letter "
                f"queue without removing messages; the {binding.name} binding cannot (without filters the whole "
                f"dead-letter queue's depth counts)"
            )
        read = [_read_dead_letter(m) for m in binding.browse_dead_letters(queue_name, browse_limit)]
        if filtered:
            read = [
                (entry, envelope)
                for entry, envelope in read
                if (not reasons or entry["reason"] in reasons) and dead_letter_matches(chosen, envelope)
            ]
            matching = len(read)
        sample = [entry for entry, _ in read[: max(sample_size, 0)]]
    if baseline is not None:
        matched = depth - baseline >= min_count and matching > 0
    else:
        matched = matching >= min_count
    return DeadLetterStatus(matched, depth, matching, sample)
