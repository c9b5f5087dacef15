"""The replay engine: dead letters replayed once per ledger, in batches. No Airflow here.

The operator (``operators/replay.py``) resolves connections and calls the feeds (:mod:`.feeds`) and
:class:`Replayer`; any other runner (a script, a test, a benchmark) can do the same.

What is replayed. The envelope a stored body carries, reset (``dead_letter`` removed, ``attempts`` 0) and
published bare: a header frame's inner envelope too (the Python SDK dead-letters a framed message as a frame;
older versions of this provider wrote frames annotated on the outside). Skipped with reason ``poison``: bodies
that are not envelopes, malformed frames, bodies holding an integer outside signed 64-bit, poison wrappers
(``{"raw": …, "dead_letter": …}``, ``core.peer``: what a consumer could not annotate, this provider's or the
Python SDK's) and envelopes whose ``dead_letter.reason`` is ``poison``. Such a message's own claims (its
``meta.queue``, a ``dead_letter`` block inside the raw bytes) are never followed.

Ledger. Two persistent seen-sets on the ledger binding (``binding.seen_store``):

* ``<ledger_name>`` holds the ``meta.id`` of every replayed message (the idempotency key, never
  ``trace_id``): a ``meta.id`` in it is never published again under this ledger;
* ``<ledger_name>:copies`` holds a 128-bit BLAKE2b digest of the exact source bytes of each replayed copy.
  A DLQ copy whose ``meta.id`` is in the ledger is acked (deleted) only when its digest is there too —
  the very copy that was replayed (a run that crashed between remember and ack, or the DLQ copy of a
  browse-drained file that was replayed). A copy with a known ``meta.id`` but other bytes (the message
  failed again after its replay, so its ``dead_letter`` block changed) is left in the DLQ, never deleted.

Batches. Candidates are looked up in the ledger a batch at a time (``seen_many``), published with one
``publish_batch`` per target queue, and settled per batch in this order: publish (target confirmed) →
remember the digests → remember the ``meta.id`` values (``remember_many``) → ack the DLQ copies
(``ack_many``). A crash after the publish and before the ``meta.id`` remember re-publishes that batch once on
the next run (each crash can duplicate at most the batch in flight); after it, nothing is ever published
twice. Digests go first so that a crash between the two remembers cannot leave a replayed copy whose
``meta.id`` is known but whose digest is not (it would be kept in the DLQ as if it had failed again).

Atomic publish. When the ledger lives on the target itself (the default: ``ledger_conn_id`` defaults to the
target connection) and the target can write both in one transaction (SQL: one database transaction; Redis:
MULTI/EXEC), the publish and both remembers are one step (``Binding.publish_remembering``): there is no window
left, and a crash never duplicates.

Atomic redrive. When the DLQ and the target are the same RabbitMQ binding, the publish and the ack of the
DLQ copies are one AMQP transaction (``Binding.publish_acking``), followed by the remembers. A crash before the
commit leaves the copies in the DLQ and nothing at the target; after it, the copies are gone from the DLQ, so
a re-run finds nothing to replay again, even though the ledger may lack that last batch. Duplicate copies
waiting to be acked ride in the same transaction (the copy each duplicates is remembered, or in this run).

What keeps the window: SQS, Service Bus and Pulsar targets; a RabbitMQ target fed from a replay-set file or
from another broker's DLQ (nothing to ack in the same transaction). There a crash can duplicate the one
batch in flight.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...bindings.base import Binding, NotSupportedError, PublishBatchError
from ...bindings.message import ReceivedMessage
from ...core import envelope as bq
from ...core.errors import EnvelopeDecodeError, EnvelopeEncodeError
from ...core.frames import open_body
from ...core.idempotency import SeenStore, remember_many, seen_many
from ...core.peer import poison_wrapper
from ..logs import Log
from .selection import Selection, nonblank, original_queue_of, reason_of

__all__ = ["BYPASS_HEADER", "Item", "ReplayResult", "Replayer", "copy_digest"]

logger = logging.getLogger(__name__)

#: Header asking consumers to let a replayed message through (e.g. past a circuit breaker).
BYPASS_HEADER = "bq-replay-bypass"

_SAMPLE_LOG = 20


def copy_digest(body: bytes) -> str:
    """The ledger's fingerprint of one stored copy: BLAKE2b-128 of its exact bytes, hex."""
    return hashlib.blake2b(body, digest_size=16).hexdigest()


@dataclass(slots=True)
class Item:
    """One candidate: the stored bytes, a last-resort target queue, and the DLQ reservation if any.

    :ivar in_dead_letter: whether the bytes are a copy in a DLQ (reserved or browsed), so a duplicate of an
        already replayed copy may be acked and a changed copy is reported as kept.
    """

    body: bytes
    fallback_queue: str | None = None
    message: ReceivedMessage | None = None
    in_dead_letter: bool = False


@dataclass(slots=True)
class _Candidate:
    """An item that passed the checks; whether it is a duplicate is decided with its batch."""

    item: Item
    reset: dict[str, Any]
    meta_id: str
    digest: str
    queue_name: str
    ledger: str
    seq: int


@dataclass(slots=True)
class _Entry:
    body: bytes
    meta_id: str
    digest: str
    ledger: str
    message: ReceivedMessage | None
    seq: int


class _Pacer:
    """At most ``rate`` publishes per second: publish number i (from 0) waits until start + i/rate. Sleeps,
    never spins."""

    def __init__(self, rate: float | None) -> None:
        self.rate, self.start, self.sent = rate, 0.0, 0

    def wait(self, count: int) -> None:
        if not self.rate:
            return
        now = time.monotonic()
        if self.sent == 0:
            self.start = now
        due = self.start + (self.sent + count - 1) / self.rate
        if due > now:
            time.sleep(due - now)
        self.sent += count


@dataclass(slots=True)
class ReplayResult:
    replayed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    duplicates_avoided: int = 0
    duplicates_kept: int = 0
    dry_run: bool = False
    targets: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"replayed": self.replayed, "skipped": dict(self.skipped), "duplicates_avoided": self.duplicates_avoided,
                "duplicates_kept": self.duplicates_kept, "dry_run": self.dry_run, "targets": dict(self.targets)}


class Replayer:
    """Classify items one at a time; look them up in the ledger, publish, remember and settle a batch at a time.

    :param target: the binding replays are published on.
    :param ledger_binding: where the ledger seen-sets live (``seen_store``).
    :param ledger_name: one ledger for every target queue, or ``None`` for ``replay:<target queue>`` each.
    :param target_queue_name: publish everything here; else ``dead_letter.original_queue``, else
        ``meta.queue``, else the item's fallback queue.
    :param source: the DLQ binding the items' reservations belong to (acks and releases), if any.
    :param headers: publish headers (the bypass header); forces one publish per message.
    :param max_messages: replay at most this many (dry run: report at most this many).
    :param batch_size: messages per ledger lookup and per ``publish_batch`` (smaller under a rate limit,
        ~0.1 s worth).
    """

    def __init__(
        self,
        *,
        target: Binding,
        ledger_binding: Binding | None,
        ledger_name: str | None = None,
        target_queue_name: str | None = None,
        source: Binding | None = None,
        selection: Selection | None = None,
        max_messages: int | None = None,
        dry_run: bool = False,
        headers: Mapping[str, Any] | None = None,
        max_messages_per_second: float | None = None,
        batch_size: int = 500,
        progress_every: int = 1000,
        log: Log | None = None,
    ) -> None:
        self.target, self.ledger_binding, self.ledger_name = target, ledger_binding, ledger_name
        self.target_queue_name, self.source = target_queue_name, source
        self.selection = selection or Selection()
        self.max_messages, self.headers = max_messages, dict(headers) if headers else None
        self.pacer = _Pacer(max_messages_per_second)
        if max_messages_per_second:
            batch_size = max(1, min(batch_size, math.ceil(max_messages_per_second / 10)))
        self.batch_size = max(1, batch_size)
        self.progress_every, self.log = max(1, progress_every), log or logger
        self.result = ReplayResult(dry_run=dry_run)
        self.planned = 0
        self._stores: dict[str, tuple[SeenStore, SeenStore]] = {}
        self._run_ids: dict[str, set[str]] = {}
        self._run_digests: dict[str, set[str]] = {}
        self._candidates: list[_Candidate] = []
        self._pending: dict[str, list[_Entry]] = {}
        self._pending_count = 0
        self._duplicate_acks: list[tuple[int, ReceivedMessage]] = []
        #: Reservations to give back at the end, with their feed position: released in feed order.
        self._held: list[tuple[int, ReceivedMessage]] = []
        self._fed = 0
        #: Items the engine has taken over (skipped and held, or waiting, or settled): see :meth:`hold`.
        self.taken = 0
        self._next_log = self.progress_every
        self._started = time.monotonic()
        self._samples = 0

    @property
    def dry_run(self) -> bool:
        return self.result.dry_run

    @property
    def full(self) -> bool:
        """Whether ``max_messages`` are planned. Candidates waiting for their ledger lookup are resolved as soon
        as they could reach the bound, so this is exact between two :meth:`feed` calls."""
        return self.max_messages is not None and self.planned >= self.max_messages

    @property
    def unsettled(self) -> bool:
        """Whether fed reservations wait for their lookup, publish or ack (what :meth:`flush` settles)."""
        return bool(self._candidates or self._pending_count or self._duplicate_acks)

    def room(self) -> int:
        """How many more items a feed may take at once without reserving past ``max_messages``: what fills
        the current lookup batch, within the bound (at least 1)."""
        room = self.batch_size - len(self._candidates)
        if self.max_messages is not None:
            room = min(room, self.max_messages - self.planned - len(self._candidates))
        return max(room, 1)

    def _source(self) -> Binding:
        """The binding the fed reservations belong to; items carry reservations only when it is given."""
        if self.source is None:
            raise ValueError("dead letters were fed with their reservations, but no source binding was given")
        return self.source

    # -- ledger

    def _ledger(self, queue_name: str) -> str:
        name = self.ledger_name or f"replay:{queue_name}"
        if name not in self._stores:
            if self.ledger_binding is None:
                raise ValueError("a ledger connection is needed")
            try:
                stores = (self.ledger_binding.seen_store(name), self.ledger_binding.seen_store(f"{name}:copies"))
            except NotSupportedError as exc:
                raise NotSupportedError(f"{exc}; set ledger_conn_id to a connection that can hold the replay "
                                        "ledger") from exc
            self._stores[name] = stores
            self._run_ids[name], self._run_digests[name] = set(), set()
        return name

    # -- per item

    def _skip(self, reason: str, item: Item, seq: int) -> None:
        self.result.skipped[reason] = self.result.skipped.get(reason, 0) + 1
        if item.message is not None:
            self._held.append((seq, item.message))

    def hold(self, messages: Sequence[ReceivedMessage]) -> None:
        """Take reservations that were never fed (a feed failed midway through a reserved batch), so that
        :meth:`abort` gives them back at once rather than after the visibility timeout."""
        for message in messages:
            self._fed += 1
            self._held.append((self._fed, message))

    def feed(self, item: Item) -> None:
        """Classify one item; a replayable one joins the lookup batch (resolved when it is full or could reach
        ``max_messages``), and what it plans joins the publish batch (flushed when full)."""
        candidate = self._classify(item)
        self.taken += 1
        if candidate is None:
            return
        self._candidates.append(candidate)
        if len(self._candidates) >= self.batch_size or (
            self.max_messages is not None and self.planned + len(self._candidates) >= self.max_messages
        ):
            self._resolve()
            if self._pending_count >= self.batch_size:
                self.flush()

    def _classify(self, item: Item) -> _Candidate | None:
        """The checks that need no ledger: a skipped item is counted (and its reservation held) here."""
        seq = self._fed = self._fed + 1
        try:
            # a frame's inner envelope (Python SDK framed dead letters, old annotated frames): replayed bare.
            # Poison: not an envelope, a malformed frame, an integer outside signed 64-bit (core.integers).
            envelope = open_body(item.body)[0]
        except EnvelopeDecodeError:
            self._skip("poison", item, seq)
            return None
        if poison_wrapper(envelope) is not None or reason_of(envelope) == bq.Reason.POISON:
            # a poison wrapper (the bytes of a body its consumer could not annotate, ours or the Python SDK's) and
            # an envelope its consumer quarantined as poison (e.g. refused for its size, annotated later from
            # Service Bus's own fields) are never republished: the consumer refused what they claim
            self._skip("poison", item, seq)
            return None
        reset = bq.reset_for_replay(envelope)
        reason = bq.check(reset)
        if reason is not None:
            self._skip(str(reason), item, seq)
            return None
        if not self.selection.matches(envelope, bq.now_ms(), item.fallback_queue):
            self._skip("not_selected", item, seq)
            return None
        meta_id = bq.meta_id_of(envelope)
        if not meta_id:  # nothing to key the ledger on: replaying it could never be made idempotent
            self._skip("missing_meta_id", item, seq)
            return None
        queue_name = self.target_queue_name or original_queue_of(envelope) or nonblank(item.fallback_queue)
        if queue_name is None:
            self._skip("no_target_queue", item, seq)
            return None
        return _Candidate(item, reset, meta_id, copy_digest(item.body), queue_name, self._ledger(queue_name), seq)

    def _resolve(self) -> None:
        """Decide the waiting candidates in feed order, with one ledger lookup per ledger for the batch. They
        stay listed (so :meth:`abort` gives their reservations back) until each is decided."""
        candidates = self._candidates
        if not candidates:
            return
        known_ids: dict[str, set[str]] = {}
        known_digests: dict[str, set[str]] = {}
        by_ledger: dict[str, list[_Candidate]] = {}
        for candidate in candidates:
            by_ledger.setdefault(candidate.ledger, []).append(candidate)
        for ledger, group in by_ledger.items():
            ids, digests = self._stores[ledger]
            run_ids, run_digests = self._run_ids[ledger], self._run_digests[ledger]
            known = seen_many(ids, [c.meta_id for c in group if c.meta_id not in run_ids])
            repeated = Counter(c.meta_id for c in group)
            # A digest matters only for a DLQ copy whose meta.id is (or becomes, within this batch) a duplicate.
            ask = [c.digest for c in group if c.item.in_dead_letter and c.digest not in run_digests
                   and (c.meta_id in known or c.meta_id in run_ids or repeated[c.meta_id] > 1)]
            known_ids[ledger], known_digests[ledger] = known, seen_many(digests, ask)
        self._candidates = []
        for index, candidate in enumerate(candidates):
            try:
                self._decide(candidate, known_ids[candidate.ledger], known_digests[candidate.ledger])
            except BaseException:
                self._candidates = candidates[index:]  # undecided: still ours to give back
                raise

    def _decide(self, candidate: _Candidate, known_ids: set[str], known_digests: set[str]) -> None:
        item, ledger, meta_id, digest = candidate.item, candidate.ledger, candidate.meta_id, candidate.digest
        seq = candidate.seq
        if meta_id in self._run_ids[ledger] or meta_id in known_ids:
            self.result.duplicates_avoided += 1
            if not item.in_dead_letter or digest in self._run_digests[ledger] or digest in known_digests:
                if item.message is not None:
                    (self._held if self.dry_run else self._duplicate_acks).append((seq, item.message))
            else:  # same meta.id, other bytes: failed again after its replay. Keep it; never delete it.
                self.result.duplicates_kept += 1
                if item.message is not None:
                    self._held.append((seq, item.message))
            return
        try:
            body = bq.encode(candidate.reset)
        except EnvelopeEncodeError:
            self._skip("unencodable", item, seq)
            return
        queue_name = candidate.queue_name
        self._run_ids[ledger].add(meta_id)
        self._run_digests[ledger].add(digest)
        self.planned += 1
        if self.dry_run:
            self._count(queue_name, 1)
            if self._samples < _SAMPLE_LOG:
                self._samples += 1
                self.log.info("dry run: would replay meta.id %s to %s", meta_id, queue_name)
            if item.message is not None:
                self._held.append((seq, item.message))
            return
        self._pending.setdefault(queue_name, []).append(_Entry(body, meta_id, digest, ledger, item.message, seq))
        self._pending_count += 1

    def _count(self, queue_name: str, count: int) -> None:
        result = self.result
        result.replayed += count
        result.targets[queue_name] = result.targets.get(queue_name, 0) + count
        if result.replayed >= self._next_log:
            self._next_log = (result.replayed // self.progress_every + 1) * self.progress_every
            elapsed = time.monotonic() - self._started
            self.log.info("%s %d messages so far (%.0f msg/s)", "would replay" if self.dry_run else "replayed",
                          result.replayed, result.replayed / elapsed if elapsed > 0 else 0.0)

    # -- publishing

    def _publish(self, queue_name: str, chunk: list[_Entry]) -> tuple[bool, bool]:
        """Publish a chunk. Returns ``(remembered, acked)``: whether its ledger entries, or its DLQ acks (and the
        duplicate copies' acks waiting so far), were written in the same atomic step as the publish."""
        self.pacer.wait(len(chunk))
        bodies = [entry.body for entry in chunk]
        if self.headers is None and self.target.publish_remembering(bodies, queue_name, self._marks(chunk)):
            return True, False
        if self.source is self.target and all(entry.message is not None for entry in chunk):
            # Safe to ack the duplicates with this batch: the copy each duplicates is in the ledger already, or
            # in this run (published here or earlier, or still reserved in the DLQ until its own batch).
            acks = [entry.message for entry in chunk if entry.message is not None]
            acks += [message for _, message in self._duplicate_acks]
            if self.target.publish_acking(bodies, queue_name, acks, headers=self.headers):
                self._duplicate_acks.clear()
                return False, True
        if self.headers is not None or len(chunk) == 1:
            for index, entry in enumerate(chunk):
                try:
                    self.target.publish(entry.body, queue_name, headers=self.headers)
                except Exception:
                    if index:  # the ones before were confirmed: settle them, then fail
                        self._settle(queue_name, chunk[:index])
                    raise
            return False, False
        self.target.publish_batch(bodies, queue_name)
        return False, False

    def _marks(self, entries: list[_Entry]) -> list[tuple[SeenStore, list[str]]]:
        """The ledger writes for ``entries``, digests before meta.ids, per ledger."""
        by_ledger: dict[str, list[_Entry]] = {}
        for entry in entries:
            by_ledger.setdefault(entry.ledger, []).append(entry)
        marks: list[tuple[SeenStore, list[str]]] = []
        for ledger, group in by_ledger.items():
            ids, digests = self._stores[ledger]
            marks += [(digests, [entry.digest for entry in group]), (ids, [entry.meta_id for entry in group])]
        return marks

    def _settle(self, queue_name: str, entries: list[_Entry], remembered: bool = False, acked: bool = False) -> None:
        """After the target confirmed: remember the digests, then the meta.ids (unless ``remembered`` with the
        publish), then ack the DLQ copies (unless ``acked`` with the publish). The order is the guarantee (see
        the module docstring)."""
        if not remembered:
            for store, keys in self._marks(entries):
                remember_many(store, keys)
        messages = [entry.message for entry in entries if entry.message is not None]
        if acked:
            for entry in entries:
                entry.message = None
        elif messages:
            self._source().ack_many(messages)
            for entry in entries:
                entry.message = None
        self._count(queue_name, len(entries))

    def flush(self) -> None:
        """Decide the waiting candidates; publish every pending message, remember it, ack its DLQ copy; then ack
        duplicate copies (only now: the copy they duplicate may have been remembered just above)."""
        self._resolve()
        while self._pending:
            queue_name, entries = next(iter(self._pending.items()))
            while entries:
                chunk = entries[: self.batch_size]
                try:
                    remembered, acked = self._publish(queue_name, chunk)
                except PublishBatchError as exc:
                    failed = set(exc.failed)
                    self._settle(queue_name, [e for i, e in enumerate(chunk) if i not in failed])
                    for entry in (e for i, e in enumerate(chunk) if i in failed):
                        self._run_ids[entry.ledger].discard(entry.meta_id)
                    del entries[: len(chunk)]
                    self._held.extend((e.seq, e.message) for i, e in enumerate(chunk)
                                      if i in failed and e.message is not None)
                    self._pending_count -= len(chunk)
                    raise
                self._settle(queue_name, chunk, remembered, acked)
                del entries[: len(chunk)]
                self._pending_count -= len(chunk)
            del self._pending[queue_name]
        if self._duplicate_acks:
            self._source().ack_many([message for _, message in self._duplicate_acks])
            self._duplicate_acks.clear()

    def finish(self) -> None:
        """Flush, then put every message held back (skipped, kept, dry run) back in its DLQ unchanged."""
        self.flush()
        self._release_held()

    def abort(self) -> None:
        """After an error: everything reserved and not acked goes back to the DLQ unchanged."""
        self._held.extend((c.seq, c.item.message) for c in self._candidates if c.item.message is not None)
        self._candidates.clear()
        for entries in self._pending.values():
            self._held.extend((e.seq, e.message) for e in entries if e.message is not None)
        self._pending.clear()
        self._pending_count = 0
        self._held.extend(self._duplicate_acks)
        self._duplicate_acks.clear()
        self._release_held()

    def _release_held(self) -> None:
        """Give every held reservation back to its DLQ unchanged, in feed order (``release_many``)."""
        held = [message for _, message in sorted(self._held, key=lambda pair: pair[0])]
        self._held = []
        if not held:
            return
        try:
            self._source().release_many(held)
        except Exception:  # noqa: BLE001 - they return after the binding's visibility timeout anyway
            self.log.exception("could not release %d dead letters of %r; they return to the DLQ after the "
                               "binding's visibility timeout", len(held), held[0].queue_name)
