"""BabelQueueReplayOperator: replay dead letters (from a DLQ or a replay-set file) once, on any broker.

The engine (:class:`Replayer`) is Airflow-free; the operator resolves connections and feeds it.

Ledger. Two persistent seen-sets on the ledger connection (``binding.seen_store``):

* ``<ledger_name>`` holds the ``meta.id`` of every replayed message (the idempotency key, never
  ``trace_id``): a ``meta.id`` in it is never published again under this ledger;
* ``<ledger_name>:copies`` holds a 128-bit BLAKE2b digest of the exact source bytes of each replayed copy.
  A DLQ copy whose ``meta.id`` is in the ledger is acked (deleted) only when its digest is there too —
  the very copy that was replayed (a run that crashed between remember and ack, or the DLQ copy of a
  browse-drained file that was replayed). A copy with a known ``meta.id`` but other bytes (the message
  failed again after its replay, so its ``dead_letter`` block changed) is left in the DLQ, never deleted.

Order per message: publish (target confirmed) → remember ``meta.id`` → remember the digest → ack the DLQ
copy. A crash after the publish and before the remember re-publishes that message once on the next run
(each crash can duplicate at most the batch in flight); after the remember, nothing is ever published twice.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import urlsplit

from airflow.sdk import BaseOperator, Context

from .. import envelope as bq
from ..bindings.base import Binding, NotSupportedError, PublishBatchError, ReceivedMessage
from ..drain import parse_replay_line
from ..exceptions import EnvelopeDecodeError, EnvelopeEncodeError
from ..hooks import DEFAULT_CONN_ID, get_hook

__all__ = ["BYPASS_HEADER", "BabelQueueReplayOperator", "Replayer", "Selection", "iter_replay_set"]

logger = logging.getLogger(__name__)

#: Header asking consumers to let a replayed message through (e.g. past a circuit breaker).
BYPASS_HEADER = "bq-replay-bypass"

# Integer literals beyond unsigned 64-bit are read as floats by the fast parser: decode those exactly.
_LONG_DIGITS = re.compile(rb"[0-9]{20,}")
_SAMPLE_LOG = 20


def _decode(body: bytes) -> dict[str, Any]:
    return bq.decode(body, exact=_LONG_DIGITS.search(body) is not None)


def copy_digest(body: bytes) -> str:
    """The ledger's fingerprint of one stored copy: BLAKE2b-128 of its exact bytes, hex."""
    return hashlib.blake2b(body, digest_size=16).hexdigest()


# ----------------------------------------------------------------------------------------- selection


def _names(value: Any, name: str) -> frozenset[str] | None:
    """A templated list: a list/tuple/set, JSON list text, or comma-separated text; empty = no filter."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text or text == "None":
            return None
        if text.startswith("["):
            value = json.loads(text)
        else:
            value = [part.strip() for part in text.split(",")]
    if not isinstance(value, Sequence | set | frozenset) or isinstance(value, bytes):
        raise ValueError(f"{name} must be a list of strings, got {value!r}")
    out = frozenset(str(item) for item in value if str(item))
    return out or None


def _number(value: Any, name: str, *, integer: bool = False) -> float | int | None:
    if value is None or value == "" or value == "None":
        return None
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a {'whole ' if integer else ''}number, got {value!r}") from None
    if number < 0 or (not integer and not math.isfinite(number)):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return number


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no", ""):
        return value.strip().lower() in ("true", "1", "yes")
    if isinstance(value, int):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r}")


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters to replay; every given filter must match (an empty filter matches all).

    Exception types match the full name or its last segment (``GatewayTimeout`` matches
    ``App\\Exceptions\\GatewayTimeout`` and ``app.errors.GatewayTimeout``). Original queues match
    ``dead_letter.original_queue``, else ``meta.queue``. The age is now − ``dead_letter.failed_at``; with an
    age filter, a message without an integer ``failed_at`` does not match.
    """

    reasons: frozenset[str] | None = None
    urns: frozenset[str] | None = None
    exception_types: frozenset[str] | None = None
    original_queues: frozenset[str] | None = None
    min_age_seconds: float | None = None
    max_age_seconds: float | None = None

    def matches(self, envelope: Mapping[str, Any], now_ms: int) -> bool:
        dead = envelope.get("dead_letter")
        dead = dead if isinstance(dead, Mapping) else {}
        if self.reasons is not None and dead.get("reason") not in self.reasons:
            return False
        if self.urns is not None and bq.urn_of(envelope) not in self.urns:
            return False
        if self.exception_types is not None:
            exception = dead.get("exception")
            if not isinstance(exception, str):
                return False
            short = re.split(r"[\\.:/$]", exception)[-1]
            if exception not in self.exception_types and short not in self.exception_types:
                return False
        if self.original_queues is not None and _original_queue(envelope) not in self.original_queues:
            return False
        if self.min_age_seconds is not None or self.max_age_seconds is not None:
            failed_at = dead.get("failed_at")
            if failed_at.__class__ is not int:
                return False
            age = (now_ms - failed_at) / 1000
            if self.min_age_seconds is not None and age < self.min_age_seconds:
                return False
            if self.max_age_seconds is not None and age > self.max_age_seconds:
                return False
        return True


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _original_queue(envelope: Mapping[str, Any]) -> str | None:
    dead, meta = envelope.get("dead_letter"), envelope.get("meta")
    original = _text(dead.get("original_queue")) if isinstance(dead, Mapping) else None
    return original or (_text(meta.get("queue")) if isinstance(meta, Mapping) else None)


# -------------------------------------------------------------------------------------------- engine


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
class _Entry:
    body: bytes
    meta_id: str
    digest: str
    ledger: str
    message: ReceivedMessage | None


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
    """Decide, publish, remember and settle, one item at a time; batches per target queue.

    :param target: the binding replays are published on.
    :param ledger_binding: where the ledger seen-sets live (``seen_store``).
    :param ledger_name: one ledger for every target queue, or ``None`` for ``replay:<target queue>`` each.
    :param target_queue_name: publish everything here; else ``dead_letter.original_queue``, else
        ``meta.queue``, else the item's fallback queue.
    :param source: the DLQ binding the items' reservations belong to (acks and releases), if any.
    :param headers: publish headers (the bypass header); forces one publish per message.
    :param max_messages: replay at most this many (dry run: report at most this many).
    :param batch_size: messages per ``publish_batch`` (smaller under a rate limit, ~0.1 s worth).
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
        log: logging.Logger | logging.LoggerAdapter | None = None,
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
        self._stores: dict[str, tuple[Any, Any]] = {}
        self._run_ids: dict[str, set[str]] = {}
        self._run_digests: dict[str, set[str]] = {}
        self._pending: dict[str, list[_Entry]] = {}
        self._pending_count = 0
        self._duplicate_acks: list[ReceivedMessage] = []
        self._held: list[ReceivedMessage] = []
        self._next_log = self.progress_every
        self._started = time.monotonic()
        self._samples = 0

    @property
    def dry_run(self) -> bool:
        return self.result.dry_run

    @property
    def full(self) -> bool:
        return self.max_messages is not None and self.planned >= self.max_messages

    # -- ledger

    def _ledger(self, queue_name: str) -> tuple[str, Any, Any]:
        name = self.ledger_name or f"replay:{queue_name}"
        stores = self._stores.get(name)
        if stores is None:
            if self.ledger_binding is None:
                raise ValueError("a ledger connection is needed")
            try:
                stores = (self.ledger_binding.seen_store(name), self.ledger_binding.seen_store(f"{name}:copies"))
            except NotSupportedError as exc:
                raise NotSupportedError(f"{exc}; set ledger_conn_id to a connection that can hold the replay "
                                        "ledger") from exc
            self._stores[name] = stores
            self._run_ids[name], self._run_digests[name] = set(), set()
        return name, stores[0], stores[1]

    # -- per item

    def _skip(self, reason: str, item: Item) -> None:
        self.result.skipped[reason] = self.result.skipped.get(reason, 0) + 1
        if item.message is not None:
            self._held.append(item.message)

    def feed(self, item: Item) -> None:
        """Classify one item; a replayable one joins the pending batch (flushed when it is full)."""
        try:
            envelope = _decode(item.body)
        except EnvelopeDecodeError:
            self._skip("poison", item)
            return
        reset = bq.reset_for_replay(envelope)
        reason = bq.check(reset)
        if reason is not None:
            self._skip(str(reason), item)
            return
        if not self.selection.matches(envelope, bq.now_ms()):
            self._skip("not_selected", item)
            return
        meta_id = bq.meta_id_of(envelope)
        if not meta_id:  # nothing to key the ledger on: replaying it could never be made idempotent
            self._skip("missing_meta_id", item)
            return
        queue_name = self.target_queue_name or _original_queue(envelope) or _text(item.fallback_queue)
        if queue_name is None:
            self._skip("no_target_queue", item)
            return
        ledger, ids, digests = self._ledger(queue_name)
        digest = copy_digest(item.body)
        if meta_id in self._run_ids[ledger] or ids.seen(meta_id):
            self.result.duplicates_avoided += 1
            if not item.in_dead_letter or digest in self._run_digests[ledger] or digests.seen(digest):
                if item.message is not None:
                    (self._held if self.dry_run else self._duplicate_acks).append(item.message)
            else:  # same meta.id, other bytes: failed again after its replay. Keep it; never delete it.
                self.result.duplicates_kept += 1
                if item.message is not None:
                    self._held.append(item.message)
            return
        try:
            body = bq.encode(reset)
        except EnvelopeEncodeError:
            self._skip("unencodable", item)
            return
        self._run_ids[ledger].add(meta_id)
        self._run_digests[ledger].add(digest)
        self.planned += 1
        if self.dry_run:
            self._count(queue_name, 1)
            if self._samples < _SAMPLE_LOG:
                self._samples += 1
                self.log.info("dry run: would replay meta.id %s to %s", meta_id, queue_name)
            if item.message is not None:
                self._held.append(item.message)
            return
        self._pending.setdefault(queue_name, []).append(_Entry(body, meta_id, digest, ledger, item.message))
        self._pending_count += 1
        if self._pending_count >= self.batch_size:
            self.flush()

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

    def _publish(self, queue_name: str, chunk: list[_Entry]) -> None:
        self.pacer.wait(len(chunk))
        if self.headers is not None or len(chunk) == 1:
            for index, entry in enumerate(chunk):
                try:
                    self.target.publish(entry.body, queue_name, headers=self.headers)
                except Exception:
                    if index:  # the ones before were confirmed: settle them, then fail
                        self._settle(queue_name, chunk[:index])
                    raise
            return
        self.target.publish_batch([entry.body for entry in chunk], queue_name)

    def _settle(self, queue_name: str, entries: list[_Entry]) -> None:
        """After the target confirmed: remember, then ack the DLQ copy. The order is the guarantee."""
        for entry in entries:
            ids, digests = self._stores[entry.ledger]
            ids.remember(entry.meta_id)
            digests.remember(entry.digest)
            if entry.message is not None:
                self.source.ack(entry.message)
                entry.message = None
            self._count(queue_name, 1)

    def flush(self) -> None:
        """Publish every pending message, remember it, ack its DLQ copy; then ack duplicate copies."""
        while self._pending:
            queue_name, entries = next(iter(self._pending.items()))
            while entries:
                chunk = entries[: self.batch_size]
                try:
                    self._publish(queue_name, chunk)
                except PublishBatchError as exc:
                    failed = set(exc.failed)
                    self._settle(queue_name, [e for i, e in enumerate(chunk) if i not in failed])
                    for entry in (e for i, e in enumerate(chunk) if i in failed):
                        self._run_ids[entry.ledger].discard(entry.meta_id)
                    del entries[: len(chunk)]
                    self._held.extend(e.message for i, e in enumerate(chunk) if i in failed and e.message is not None)
                    self._pending_count -= len(chunk)
                    raise
                self._settle(queue_name, chunk)
                del entries[: len(chunk)]
                self._pending_count -= len(chunk)
            del self._pending[queue_name]
        while self._duplicate_acks:
            self.source.ack(self._duplicate_acks[0])
            self._duplicate_acks.pop(0)

    def finish(self) -> None:
        """Flush, then put every message held back (skipped, kept, dry run) back in its DLQ unchanged."""
        self.flush()
        self._release_held()

    def abort(self) -> None:
        """After an error: everything reserved and not acked goes back to the DLQ unchanged."""
        for entries in self._pending.values():
            self._held.extend(e.message for e in entries if e.message is not None)
        self._pending.clear()
        self._held.extend(self._duplicate_acks)
        self._duplicate_acks.clear()
        self._release_held()

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for message in held:
            try:
                self.source.release(message)
            except Exception:  # noqa: BLE001 - it returns after the binding's visibility timeout anyway
                self.log.exception("could not release a dead letter of %r; it returns to the DLQ after the "
                                   "binding's visibility timeout", message.queue_name)


# ------------------------------------------------------------------------------------------- sources


def feed_from_dead_letters(replayer: Replayer, binding: Binding, queue_name: str, reserve_timeout: float) -> None:
    """Redrive: reserve DLQ messages one by one until the DLQ is empty or ``max_messages`` are planned.
    Messages not replayed stay reserved until the run ends (so the loop moves past them), then are released."""
    while not replayer.full:
        message = binding.reserve_dead_letter(queue_name, timeout=reserve_timeout)
        if message is None:
            return
        replayer.feed(Item(message.body, queue_name, message, True))


def feed_from_browse(replayer: Replayer, binding: Binding, queue_name: str, window: int = 1000) -> None:
    """Dry run on a broker that can browse: read the DLQ in growing windows, touching nothing."""
    seen, limit = 0, max(window, binding.dead_letter_depth(queue_name) + 1)
    while not replayer.full:
        batch = binding.browse_dead_letters(queue_name, limit=limit)
        for message in batch[seen:]:
            if replayer.full:
                return
            replayer.feed(Item(message.body, queue_name, None, True))
        seen = max(seen, len(batch))
        if len(batch) < limit:
            return
        limit *= 2


def _skip_name(name: str) -> bool:
    return name.startswith(("_", ".")) or name.endswith(".crc")


def _replay_files(replay_set: str) -> list[tuple[str, Callable[[], IO[bytes]]]]:
    """Files of a replay set: one file, or every file under a folder (sorted; ``_SUCCESS``, hidden and
    ``.crc`` files skipped, as Spark writes them)."""
    parts = urlsplit(replay_set)
    if len(parts.scheme) <= 1:  # a local path ("C:" is a drive); URLs, file:// included, go through fsspec
        root = os.path.expanduser(replay_set)
        if os.path.isdir(root):
            found = []
            for folder, dirs, names in os.walk(root):
                dirs[:] = sorted(d for d in dirs if not _skip_name(d))
                found.extend(os.path.join(folder, n) for n in sorted(names) if not _skip_name(n))
            return [(path, (lambda p=path: open(p, "rb"))) for path in found]
        if not os.path.exists(root):
            raise FileNotFoundError(f"replay set {replay_set} does not exist")
        return [(root, lambda: open(root, "rb"))]
    from airflow.sdk import ObjectStoragePath

    path = ObjectStoragePath(replay_set)
    if path.is_dir():
        files = sorted((p for p in path.rglob("*")
                        if p.is_file() and not any(_skip_name(x) for x in p.relative_to(path).parts)), key=str)
        return [(str(p), (lambda p=p: p.open("rb"))) for p in files]
    if not path.exists():
        raise FileNotFoundError(f"replay set {replay_set} does not exist")
    return [(str(path), lambda: path.open("rb"))]


def iter_replay_set(replay_set: str, log: logging.Logger | logging.LoggerAdapter | None = None,
                    ) -> Iterator[Item | str]:
    """Items of a replay set, or the string ``"unreadable_line"`` for a line that cannot be used (a torn
    last line after a crash, a foreign record version). ``.gz`` files are decompressed."""
    log = log or logger
    for name, opener in _replay_files(replay_set):
        with opener() as raw:
            stream: IO[bytes] = gzip.GzipFile(fileobj=raw) if name.endswith(".gz") else raw
            for number, line in enumerate(stream, 1):
                try:
                    parsed = parse_replay_line(line)
                except ValueError as exc:
                    log.warning("replay set %s line %d is unusable and is skipped: %s", name, number, exc)
                    yield "unreadable_line"
                    continue
                if parsed is not None:
                    yield Item(parsed.body, parsed.queue_name)


def feed_from_replay_set(replayer: Replayer, replay_set: str) -> None:
    for item in iter_replay_set(replay_set, replayer.log):
        if replayer.full:
            return
        if isinstance(item, str):
            replayer.result.skipped[item] = replayer.result.skipped.get(item, 0) + 1
            continue
        replayer.feed(item)


# ------------------------------------------------------------------------------------------ operator


class BabelQueueReplayOperator(BaseOperator):
    """Replay dead letters exactly once per ledger: reset them and publish them to their queue again.

    Input is either a dead-letter queue (``queue_name`` on ``source_conn_id``: a redrive) or a replay set
    (``replay_set``: JSON Lines files of drain records or of envelopes, e.g. a drain's file or a Spark
    triage job's output). Each message is reset (``dead_letter`` removed, ``attempts`` 0, ``meta.id``,
    ``trace_id`` and unknown keys kept) and published to ``target_queue_name``, else
    ``dead_letter.original_queue``, else ``meta.queue``. Poison (undecodable) bodies and envelopes that fail
    validation are never replayed: they are counted and stay in the DLQ. A ledger of replayed ``meta.id``
    values makes re-runs publish nothing twice. Returns ``{"replayed", "skipped", "duplicates_avoided",
    "duplicates_kept", "dry_run", "targets"}`` (XCom).

    :param source_conn_id: the connection of the DLQ to redrive (templated); with ``replay_set`` it is only
        the default target connection.
    :param queue_name: the logical queue whose DLQ is redriven (templated). Mutually exclusive with
        ``replay_set``.
    :param replay_set: a JSON Lines file or folder, local or any ``ObjectStoragePath`` URL (templated, e.g.
        the ``path`` a drain returned). Lines are drain records (detected by their ``v`` and ``body`` keys)
        or envelope objects; unusable lines (such as a torn last line) are counted as ``unreadable_line``.
    :param target_conn_id: publish on this connection instead (templated; another broker is fine, e.g. SQL
        to Redis); defaults to ``source_conn_id``.
    :param target_queue_name: publish every message to this queue (templated) instead of its original one.
    :param reasons: replay only dead letters with one of these ``dead_letter.reason`` values (templated).
    :param urns: replay only these message URNs (templated).
    :param exception_types: replay only these ``dead_letter.exception`` types, full or last segment
        (templated).
    :param original_queues: replay only messages whose ``dead_letter.original_queue`` (else ``meta.queue``) is
        one of these (templated).
    :param min_age_seconds: replay only dead letters that failed at least this long ago (by
        ``dead_letter.failed_at``; templated), e.g. to let a fix deploy first.
    :param max_age_seconds: replay only dead letters that failed at most this long ago (templated).
    :param max_messages: replay at most this many messages in this run (templated).
    :param dry_run: report what would be replayed and publish, remember and ack nothing (templated). A DLQ
        source is browsed where the broker can; otherwise its messages are reserved and released back
        unchanged at the end (Redis puts them at the tail of the DLQ).
    :param replay_bypass_header: publish with the header ``bq-replay-bypass: 1`` so consumers can let replays
        through; on brokers that carry no headers it is ignored with one log line.
    :param ledger_conn_id: where the ledger lives (a SQL or Redis connection; templated); defaults to the
        target connection, so a replay and its ledger share a broker.
    :param ledger_name: the ledger's name (templated); default ``replay:<target queue>``. A new name starts a
        fresh ledger (everything becomes replayable again).
    :param max_messages_per_second: publish at most this many messages per second (``None`` = unlimited), to
        spare a downstream that just recovered. The operator sleeps; it never busy-waits.
    :param reserve_timeout: seconds to wait for the next dead letter before the DLQ counts as empty.
    :param batch_size: messages per native batch publish (smaller under a rate limit).
    :param progress_every: log a progress line every this many replayed messages.
    """

    template_fields: Sequence[str] = (
        "source_conn_id", "queue_name", "replay_set", "target_conn_id", "target_queue_name", "reasons", "urns",
        "exception_types", "original_queues", "min_age_seconds", "max_age_seconds", "max_messages", "dry_run",
        "ledger_conn_id", "ledger_name",
    )
    ui_color = "#e8ecf4"

    def __init__(
        self,
        *,
        source_conn_id: str = DEFAULT_CONN_ID,
        queue_name: str | None = None,
        replay_set: str | None = None,
        target_conn_id: str | None = None,
        target_queue_name: str | None = None,
        reasons: Sequence[str] | None = None,
        urns: Sequence[str] | None = None,
        exception_types: Sequence[str] | None = None,
        original_queues: Sequence[str] | None = None,
        min_age_seconds: float | None = None,
        max_age_seconds: float | None = None,
        max_messages: int | None = None,
        dry_run: bool = False,
        replay_bypass_header: bool = False,
        ledger_conn_id: str | None = None,
        ledger_name: str | None = None,
        max_messages_per_second: float | None = None,
        reserve_timeout: float = 0.0,
        batch_size: int = 500,
        progress_every: int = 1000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (queue_name is None) == (replay_set is None):
            raise ValueError("give either queue_name (a DLQ to redrive) or replay_set (a file or folder), not both "
                             "and not neither")
        if max_messages_per_second is not None and not max_messages_per_second > 0:
            raise ValueError(f"max_messages_per_second must be positive or None, got {max_messages_per_second!r}")
        if reserve_timeout < 0 or batch_size < 1 or progress_every < 1:
            raise ValueError("reserve_timeout must not be negative; batch_size and progress_every must be positive")
        self.source_conn_id = source_conn_id
        self.queue_name = queue_name
        self.replay_set = replay_set
        self.target_conn_id = target_conn_id
        self.target_queue_name = target_queue_name
        self.reasons = reasons
        self.urns = urns
        self.exception_types = exception_types
        self.original_queues = original_queues
        self.min_age_seconds = min_age_seconds
        self.max_age_seconds = max_age_seconds
        self.max_messages = max_messages
        self.dry_run = dry_run
        self.replay_bypass_header = replay_bypass_header
        self.ledger_conn_id = ledger_conn_id
        self.ledger_name = ledger_name
        self.max_messages_per_second = max_messages_per_second
        self.reserve_timeout = reserve_timeout
        self.batch_size = batch_size
        self.progress_every = progress_every

    def _selection(self) -> Selection:
        selection = Selection(
            reasons=_names(self.reasons, "reasons"),
            urns=_names(self.urns, "urns"),
            exception_types=_names(self.exception_types, "exception_types"),
            original_queues=_names(self.original_queues, "original_queues"),
            min_age_seconds=_number(self.min_age_seconds, "min_age_seconds"),
            max_age_seconds=_number(self.max_age_seconds, "max_age_seconds"),
        )
        low, high = selection.min_age_seconds, selection.max_age_seconds
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_age_seconds ({low}) is greater than max_age_seconds ({high}): nothing could match")
        return selection

    def execute(self, context: Context) -> dict[str, Any]:
        selection = self._selection()
        dry_run = _flag(self.dry_run, "dry_run")
        max_messages = _number(self.max_messages, "max_messages", integer=True)
        target_queue = _text(self.target_queue_name)
        target_conn = self.target_conn_id or self.source_conn_id
        ledger_conn = self.ledger_conn_id or target_conn
        with ExitStack() as stack:
            hooks: dict[str, Any] = {}

            def binding_of(conn_id: str) -> Binding:
                if conn_id not in hooks:
                    hooks[conn_id] = get_hook(conn_id)
                    stack.callback(hooks[conn_id].close)
                return hooks[conn_id].get_binding()

            target = binding_of(target_conn)
            source = binding_of(self.source_conn_id) if self.queue_name is not None else None
            headers = None
            if self.replay_bypass_header:
                if target.carries_headers:
                    headers = {BYPASS_HEADER: 1}
                else:
                    self.log.info("replay_bypass_header is ignored: the %s binding of %r cannot carry headers",
                                  target.name, target_conn)
            replayer = Replayer(
                target=target, ledger_binding=binding_of(ledger_conn), ledger_name=_text(self.ledger_name),
                target_queue_name=target_queue, source=source, selection=selection, max_messages=max_messages,
                dry_run=dry_run, headers=headers, max_messages_per_second=self.max_messages_per_second,
                batch_size=self.batch_size, progress_every=self.progress_every, log=self.log,
            )
            where = (f"the DLQ {source.dead_letter_name(self.queue_name)} of {self.source_conn_id!r}"
                     if source is not None else f"the replay set {self.replay_set}")
            self.log.info("%s %s to %s on %r (ledger on %r)", "dry run of a replay from" if dry_run else "replaying",
                          where, target_queue or "each message's original queue", target_conn, ledger_conn)
            try:
                if source is None:
                    feed_from_replay_set(replayer, str(self.replay_set))
                elif dry_run and source.can_browse:
                    feed_from_browse(replayer, source, self.queue_name)
                else:
                    feed_from_dead_letters(replayer, source, self.queue_name, self.reserve_timeout)
                replayer.finish()
            except BaseException:
                replayer.abort()
                raise
        result = replayer.result.as_dict()
        self.log.info("%s %d messages %s; skipped %s; duplicates avoided %d (%d kept in the DLQ)",
                      "would replay" if dry_run else "replayed", result["replayed"], result["targets"],
                      result["skipped"], result["duplicates_avoided"], result["duplicates_kept"])
        return result
