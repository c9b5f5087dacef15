"""Pages of a dead-letter queue, read without removing anything, filtered as an operator filters them in a console.

A page is read from a position (0 = the oldest dead letter, over every dead-letter source in reading order) and
holds up to ``limit`` dead letters that pass the :class:`DeadLetterQuery`. Each entry says what the Spark triage
would say about it (reason, exception type, error pattern, fingerprint: :func:`~..core.fingerprint.read_dead_letter`,
the one definition) and where it came from (its position and source). A filter that matches rarely could make a
page read the whole queue, so a page stops after ``max_scan`` dead letters or ``time_budget`` seconds, whichever
comes first, and says where the next read starts (``next_position``): the caller asks again from there.

Brokers: one that reads stored bytes by position (:meth:`Binding.browse_dead_letter_bytes`: Redis, SQL) pages to
any depth; one that can only peek from the head (:attr:`Binding.can_browse`: Azure Service Bus) serves the first
:data:`HEAD_LIMIT` dead letters; RabbitMQ, SQS and Pulsar cannot read a queue without taking its messages and
raise :class:`NotSupportedError` (their depth is still known). Pure module: no Airflow import.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ..bindings.base import Binding, NotSupportedError
from ..core.errors import EnvelopeDecodeError
from ..core.fingerprint import error_fingerprint, exception_type, read_dead_letter
from ..core.frames import frame_headers, open_body

__all__ = [
    "CHUNK",
    "HEAD_LIMIT",
    "BrowsePage",
    "MatchScan",
    "DeadLetterEntry",
    "DeadLetterQuery",
    "SelectionChanged",
    "browse_page",
    "dead_letter_headers",
    "dead_letter_raw",
    "entry_of",
    "reads_by_position",
    "matching",
    "selected",
]

#: Dead letters read per call to the broker while a page fills.
CHUNK = 500
#: How far a broker that can only peek from the head is read.
HEAD_LIMIT = 1000
_CANNOT_READ = "the {} binding cannot read a dead-letter queue without taking its messages"
#: Characters of the error an entry carries (the whole text is in the dead letter itself).
ERROR_PREVIEW = 500


@dataclass(frozen=True)
class DeadLetterQuery:
    """Which dead letters a page shows; an empty field restricts nothing, several values in one field are "any of".

    :param reasons: ``dead_letter.reason`` values (``poison`` for an unreadable body).
    :param urns: URN patterns (shell-style: ``urn:babel:orders:*``; an exact URN matches only itself).
    :param exception_types: exception names, full (``App\\Exceptions\\GatewayTimeout``) or the last segment.
    :param fingerprints: error fingerprints, or their first hex digits.
    :param langs: the producing language (``meta.lang``).
    :param original_queues: ``dead_letter.original_queue`` (else ``meta.queue``).
    :param text: a piece of the error text, case-insensitive.
    :param failed_after_ms: only dead letters that failed at or after this Unix time in milliseconds.
    :param failed_before_ms: only those that failed before it.
    """

    reasons: tuple[str, ...] = ()
    urns: tuple[str, ...] = ()
    exception_types: tuple[str, ...] = ()
    fingerprints: tuple[str, ...] = ()
    langs: tuple[str, ...] = ()
    original_queues: tuple[str, ...] = ()
    text: str | None = None
    failed_after_ms: int | None = None
    failed_before_ms: int | None = None

    @property
    def active(self) -> bool:
        return any((self.reasons, self.urns, self.exception_types, self.fingerprints, self.langs,
                    self.original_queues, self.text, self.failed_after_ms is not None,
                    self.failed_before_ms is not None))

    def matches(self, entry: DeadLetterEntry) -> bool:
        if self.reasons and entry.reason not in self.reasons:
            return False
        if self.urns and not (entry.urn is not None and any(fnmatch.fnmatchcase(entry.urn, p) for p in self.urns)):
            return False
        if self.exception_types and not (entry.exception is not None and (
                entry.exception in self.exception_types or entry.exception_type in self.exception_types)):
            return False
        if self.fingerprints and not any(entry.fingerprint.startswith(f.lower()) for f in self.fingerprints):
            return False
        if self.langs and entry.lang not in self.langs:
            return False
        if self.original_queues and entry.original_queue not in self.original_queues:
            return False
        if self.text and self.text.casefold() not in (entry.error or "").casefold():
            return False
        if self.failed_after_ms is not None and (entry.failed_at is None or entry.failed_at < self.failed_after_ms):
            return False
        return self.failed_before_ms is None or (entry.failed_at is not None
                                                 and entry.failed_at < self.failed_before_ms)


@dataclass(frozen=True)
class DeadLetterEntry:
    """One dead letter as a console lists it: what triage says about it and where it is.

    :ivar position: its place in the queue's dead letters (0 = oldest), over every source in reading order.
    :ivar error: the error text, cut to :data:`ERROR_PREVIEW` characters (``error_truncated`` says when).
    :ivar failed_at: ``dead_letter.failed_at``, Unix milliseconds, when the block has one.
    """

    position: int
    size: int
    meta_id: str | None
    urn: str | None
    reason: str
    poison: bool
    exception: str | None
    exception_type: str | None
    error: str | None
    error_truncated: bool
    error_pattern: str | None
    fingerprint: str
    failed_at: int | None
    original_queue: str | None
    lang: str | None
    trace_id: str | None
    attempts: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def entry_of(position: int, body: bytes) -> DeadLetterEntry:
    """The entry of the dead letter stored as ``body`` at ``position``."""
    try:
        envelope: Any = open_body(body)[0]
    except EnvelopeDecodeError:
        envelope = None
    facts = read_dead_letter(body, envelope if isinstance(envelope, dict) else None)
    block: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    if isinstance(envelope, dict):
        found_block, found_meta = envelope.get("dead_letter"), envelope.get("meta")
        block = found_block if isinstance(found_block, dict) else {}
        meta = found_meta if isinstance(found_meta, dict) else {}
    error = facts.error
    pattern = facts.error_pattern
    truncated = error is not None and len(error) > ERROR_PREVIEW
    return DeadLetterEntry(
        position=position, size=len(body), meta_id=facts.meta_id, urn=facts.urn, reason=facts.reason,
        poison=facts.poison, exception=facts.exception, exception_type=exception_type(facts.exception),
        error=error[:ERROR_PREVIEW] if truncated and error is not None else error, error_truncated=truncated,
        error_pattern=pattern, fingerprint=error_fingerprint(facts.exception, pattern),
        failed_at=facts.failed_at,
        original_queue=_text(block.get("original_queue")) or _text(meta.get("queue")),
        lang=_text(meta.get("lang")) or _text(block.get("lang")),
        trace_id=_text(envelope.get("trace_id")) if isinstance(envelope, dict) else None,
        attempts=_whole(envelope.get("attempts")) if isinstance(envelope, dict) else None)


@dataclass
class BrowsePage:
    """A page: the matching entries, where the next read starts (``None``: the end of the queue was reached),
    how many dead letters were read for it and the queue's depth when the page was read."""

    entries: list[DeadLetterEntry] = field(default_factory=list)
    next_position: int | None = None
    scanned: int = 0
    depth: int = 0
    #: Why the page stopped before ``limit`` entries without reaching the end: ``max_scan`` or ``time_budget``.
    stopped_by: str | None = None
    #: Whether the broker can only be read from its head (``HEAD_LIMIT`` dead letters at most).
    head_only: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"entries": [entry.as_dict() for entry in self.entries], "next_position": self.next_position,
                "scanned": self.scanned, "depth": self.depth, "stopped_by": self.stopped_by,
                "head_only": self.head_only}


def reads_by_position(binding: Binding, queue_name: str) -> bool:
    """Whether the binding reads its stored dead-letter bytes at any position (Redis, SQL), not only the head."""
    return binding.browse_dead_letter_bytes(queue_name, 0, 0) is not None


def _bodies(binding: Binding, queue_name: str, start: int, depth: int) -> tuple[Iterator[bytes], bool]:
    """The stored bytes from ``start`` on, read in chunks; and whether only the head can be read. (A page checks
    its time after each dead letter, so no chunk is fetched once the time is up.)"""
    if reads_by_position(binding, queue_name):
        def chunks() -> Iterator[bytes]:
            position = start
            while True:  # to the end, not the depth: the depth leaves out dead letters a drain holds reserved
                raws = binding.browse_dead_letter_bytes(queue_name, position, position + CHUNK)
                if not raws:
                    return
                yield from raws
                position += len(raws)
        return chunks(), False
    if not binding.can_browse:
        raise NotSupportedError(_CANNOT_READ.format(binding.name) + f"; the console shows its depth ({depth}) and "
                                "works on it through a drain")
    head = binding.browse_dead_letters(queue_name, limit=HEAD_LIMIT)
    return iter([message.body for message in head[start:]]), True


def browse_page(binding: Binding, queue_name: str, query: DeadLetterQuery | None = None, *, start: int = 0,
                limit: int = 50, max_scan: int = 20_000, time_budget: float = 1.5) -> BrowsePage:
    """A page of ``queue_name``'s dead letters from position ``start`` (see the module docstring).

    :param limit: entries at most (1..1000).
    :param max_scan: dead letters read at most for the page, matching or not.
    :param time_budget: seconds the page may take reading; the page stops after the dead letter that passed it.
    """
    if not 1 <= limit <= 1000:
        raise ValueError(f"limit must be between 1 and 1000, got {limit}")
    if start < 0:
        raise ValueError(f"start must not be negative, got {start}")
    query = query or DeadLetterQuery()
    deadline = time.monotonic() + time_budget  # from the start: counting and reading are part of the page's time
    depth = binding.dead_letter_depth(queue_name)
    page = BrowsePage(depth=depth)
    bodies, page.head_only = _bodies(binding, queue_name, start, depth)
    position = start
    for body in bodies:
        entry = entry_of(position, body)
        position += 1
        page.scanned += 1
        if query.matches(entry):
            page.entries.append(entry)
            if len(page.entries) >= limit:
                break
        if page.scanned >= max_scan:
            page.stopped_by = "max_scan"
            break
        if not page.head_only and time.monotonic() >= deadline:  # a head is read at once: going on costs no reads
            page.stopped_by = "time_budget"
            break
    else:
        page.next_position = None  # the end: every dead letter from start on was read
        return page
    page.next_position = position
    return page


def dead_letter_raw(binding: Binding, queue_name: str, position: int) -> bytes | None:
    """The stored bytes of the dead letter at ``position`` (``None``: no dead letter there any more).

    :raises NotSupportedError: the broker cannot read its dead letters without taking them."""
    raws = binding.browse_dead_letter_bytes(queue_name, position, position + 1)
    if raws is None:
        if not binding.can_browse:
            raise NotSupportedError(_CANNOT_READ.format(binding.name))
        head = binding.browse_dead_letters(queue_name, limit=min(position + 1, HEAD_LIMIT))
        return head[position].body if position < len(head) else None
    return raws[0] if raws else None


def dead_letter_headers(binding: Binding, queue_name: str, position: int, raw: bytes) -> dict[str, Any]:
    """The headers of the dead letter at ``position``, whose stored bytes are ``raw``: a header frame's headers
    where the bytes are all the broker keeps (Redis, SQL), else the native properties the broker reads with it (a
    head read: Service Bus), each value as JSON gives it or as text."""
    if reads_by_position(binding, queue_name) or not binding.can_browse:
        return frame_headers(raw)
    head = binding.browse_dead_letters(queue_name, limit=min(position + 1, HEAD_LIMIT))
    if position >= len(head) or head[position].body != raw:
        return frame_headers(raw)
    return {str(key): _plain(value) for key, value in head[position].headers.items()}


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return str(value)


class SelectionChanged(ValueError):
    """A selected position no longer holds the dead letter the caller saw there (the queue changed)."""


def selected(binding: Binding, queue_name: str, positions: list[int], meta_ids: list[str | None]) -> list[bytes]:
    """The stored bytes at ``positions``, each checked to still be the dead letter with that ``meta_ids`` entry
    (``None``: a dead letter without one, e.g. poison, checked to still have none), so an action never lands on
    a dead letter the caller did not see.

    :raises SelectionChanged: a position is gone or holds another dead letter.
    """
    if len(positions) != len(meta_ids):
        raise ValueError("give one meta_id (or null) per position")
    out = []
    for position, meta_id in zip(positions, meta_ids, strict=True):
        raw = dead_letter_raw(binding, queue_name, position)
        if raw is None or entry_of(position, raw).meta_id != meta_id:
            raise SelectionChanged(f"position {position} of {queue_name!r} no longer holds the dead letter "
                                   f"{meta_id or '(no meta.id)'}; reload the page and select again")
        out.append(raw)
    return out


def matching(binding: Binding, queue_name: str, query: DeadLetterQuery, max_items: int) -> list[bytes]:
    """The stored bytes of every dead letter that passes ``query``, oldest first, up to ``max_items`` (for an
    action on "everything matching this filter"): the whole queue is read, without a time budget.

    :raises ValueError: more than ``max_items`` match.
    """
    out: list[bytes] = []
    bodies, _ = _bodies(binding, queue_name, 0, binding.dead_letter_depth(queue_name))
    for position, body in enumerate(bodies):
        if query.matches(entry_of(position, body)):
            if len(out) >= max_items:
                raise ValueError(f"more than {max_items} dead letters match; narrow the filter")
            out.append(body)
    return out


class MatchScan:
    """Every dead letter that passes a query, read from the oldest in chunks, for an action too large for one
    request (a console's background job): :meth:`next_chunk` gives the matches of the next :data:`CHUNK` dead
    letters read (:meth:`Binding.dead_letter_bytes_after`), and a caller that removed some of them says so with
    :meth:`removed`, so a read by position goes on where the remaining dead letters now are. Dead letters taken from
    before the read position meanwhile (a drain) move the rest forward on a broker read by position; those are read
    on the next run.

    :raises NotSupportedError: the binding reads no position but the head (an action on it fits in one request).
    """

    def __init__(self, binding: Binding, queue_name: str, query: DeadLetterQuery) -> None:
        if not reads_by_position(binding, queue_name):
            raise NotSupportedError(
                f"the {binding.name} binding cannot read dead letters by position; an action on its first "
                f"{HEAD_LIMIT} dead letters runs within the request" if binding.can_browse else
                _CANNOT_READ.format(binding.name) + "; drain it and replay the drained records instead")
        self.binding, self.queue_name, self.query = binding, queue_name, query
        self.cursor: Any = None
        self.scanned = 0
        self.matched = 0
        self.done = False

    def next_chunk(self) -> list[bytes]:
        """The stored bytes of the matching dead letters among the next ones read (possibly none); :attr:`done`
        once the end was reached."""
        read = self.binding.dead_letter_bytes_after(self.queue_name, self.cursor, CHUNK)
        raws, self.cursor = read if read is not None else ([], self.cursor)
        if len(raws) < CHUNK:
            self.done = True
        out = [body for offset, body in enumerate(raws) if self.query.matches(entry_of(self.scanned + offset, body))]
        self.scanned += len(raws)
        self.matched += len(out)
        return out

    def removed(self, count: int) -> None:
        """``count`` of the dead letters already read were removed from the queue."""
        if isinstance(self.cursor, int):  # a position: what was before it moved up
            self.cursor = max(self.cursor - count, 0)
