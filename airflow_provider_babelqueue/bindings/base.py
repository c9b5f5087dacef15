"""The binding protocol: what every broker binding does, and its typed optional capabilities.

A binding moves encoded envelopes (bytes) in and out of one broker. It never imports Airflow. It takes a
typed frozen config and an optional injected client (the test seam), and imports its broker client lazily
so a missing extra produces an error naming the extra to install.

Semantics every binding honours (the contract suite in ``tests/bindings`` checks them on each one):

* ``publish`` stores the body byte for byte; ``publish_batch`` uses the broker's native batch.
* ``reserve`` is at-least-once: the message stays recoverable until ``ack``; a consumer that dies
  before acking does not lose it (it comes back after the binding's visibility timeout).
* ``release`` sends the message back for a retry with ``attempts`` one higher.
* ``dead_letter`` writes the annotated envelope to the dead-letter queue, then removes the original. A body
  that cannot be annotated keeps its exact bytes, with the reason and error beside them (a poison wrapper, or
  the broker's own columns / fields): writing a dead letter never fails because of what the message holds.
* ``depth`` / ``dead_letter_depth`` are cheap counts of messages ready for delivery.
* ``reserve_dead_letter`` + ``ack`` drain the DLQ; ``browse_dead_letters`` reads it without removing
  anything where the broker allows it.
* The batch operations ``reserve_dead_letters``, ``ack_many`` and ``release_many`` mean exactly what a loop
  over their single-message forms means (the default implementations here are those loops, so a binding
  that implements only the single-message methods keeps working); bindings override them to save round
  trips. Every member of a batch is its own reservation: it is settled, gated and returned after the
  visibility timeout on its own.

The message a binding hands out is :class:`~.message.ReceivedMessage`; the bodies it writes back on a release or
a dead letter come from :mod:`.bodies`, so every broker writes the same forms.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..core.errors import (
    BindingError,
    MissingExtraError,
    NotSupportedError,
    PublishBatchError,
)
from .message import ReceivedMessage

if TYPE_CHECKING:
    from ..core.idempotency import SeenStore

__all__ = [
    "Binding",
    "BindingError",
    "DeadLetterPipeline",
    "MissingExtraError",
    "NotSupportedError",
    "PipelinedBatch",
    "PublishBatchError",
    "check_sizes",
    "require_extra",
]


def require_extra(module: str, extra: str) -> Any:
    """Import a broker client lazily, or say which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{module} is not installed; install it with: pip install 'airflow-provider-babelqueue[{extra}]'"
        ) from exc


def check_sizes(bodies: Sequence[bytes], limit: int | None, where: str, why: str = "") -> None:
    """Refuse bodies over ``limit`` bytes before anything is sent, naming the limit: a broker that refuses them
    later would fail half a batch, and a database would store what no consumer of the other SDKs can read.

    :param where: the binding and queue, for the message.
    :param why: where the limit comes from (e.g. "Redis's proto-max-bulk-len"), appended to the message.
    :raises PublishBatchError: listing every index of the batch (nothing was sent); for one body, too.
    """
    if limit is None:
        return
    too_big = [index for index, body in enumerate(bodies) if len(body) > limit]
    if too_big:
        largest = max(len(bodies[index]) for index in too_big)
        where_from = f" ({why})" if why else ""
        raise PublishBatchError(
            f"{where}: {len(too_big)} of {len(bodies)} bodies are over max_message_bytes={limit:,}{where_from}; "
            f"the largest is {largest:,} bytes (indexes {too_big[:10]}); nothing was sent",
            range(len(bodies)),
        )


class PipelinedBatch(Protocol):
    """One reservation batch a :class:`DeadLetterPipeline` received: the stored bytes, built into messages only
    when they must be released.

    :ivar raws: the stored values, in reservation order.
    :ivar requested: how many were asked for; fewer means the DLQ had no more ready at that moment.
    """

    raws: list[bytes]
    requested: int

    def __len__(self) -> int: ...

    def messages(self, start: int, stop: int) -> Sequence[ReceivedMessage]:
        """Reservations ``start``..``stop`` - 1 as messages (to release them)."""
        ...


class DeadLetterPipeline(Protocol):
    """Typed optional capability: reservations and acks of one DLQ kept in flight on one connection, so a move
    drain's broker work overlaps its writes (``engine/drain/pipelined``). A binding offers it through
    :meth:`Binding.open_dead_letter_pipeline`; the guarantees are those of ``reserve_dead_letters`` and
    ``ack_many`` (a batch reserved and not acked comes back after the visibility timeout).
    """

    @property
    def binding(self) -> Binding:
        """The binding the pipeline's reservations belong to (to release them through)."""
        ...

    @property
    def reservations_in_flight(self) -> int:
        """Reservation requests sent whose batch :meth:`receive` has not returned yet."""
        ...

    def request(self, limit: int) -> int:
        """Send the reservation of up to ``limit`` dead letters without waiting; returns how many were asked."""
        ...

    def receive(self) -> PipelinedBatch:
        """The batch of the oldest reservation in flight (waits for its reply)."""
        ...

    def ack(self, batch: PipelinedBatch, start: int, stop: int) -> None:
        """Send the ack of reservations ``start``..``stop`` - 1 of ``batch`` (one this pipeline's :meth:`receive`
        returned) without waiting for its reply."""
        ...

    def finish(self) -> None:
        """Read every reply still in flight, settle what the fast path refused, give the connection back."""
        ...

    def abort(self) -> list[ReceivedMessage]:
        """After an error: read what can be read and return the reservations not acked, to release them."""
        ...


def _one_by_one(reserve: Callable[..., ReceivedMessage | None], queue_name: str, limit: int,
                timeout: float) -> list[ReceivedMessage]:
    """Up to ``limit`` single reservations, waiting ``timeout`` for the first only (the default batch reads)."""
    out: list[ReceivedMessage] = []
    while len(out) < limit:
        message = reserve(queue_name, timeout=timeout if not out else 0)
        if message is None:
            break
        out.append(message)
    return out


class Binding(abc.ABC):
    """Base class of every broker binding. Subclasses set :attr:`name` and implement the operations."""

    #: Short broker name used in records and logs ("memory", "sql", "redis", ...).
    name: str = ""
    #: Bodies longer than this are delivered undecoded (see :func:`~.message.parse_body`); ``None``: no limit. A
    #: consumer sets it to its ``max_body_bytes``, so a body it will refuse for its size costs no decoding.
    decode_limit: int | None = None
    #: Whether ``publish(headers=...)`` reaches consumers; bindings that cannot carry headers ignore them.
    carries_headers: bool = False
    #: Whether :meth:`browse_dead_letters` works.
    can_browse: bool = False
    #: The loggers of the broker client library this binding drives (``pika``, ``botocore``...). The bindings
    #: leave them alone; Airflow's hooks keep them at WARNING in task logs unless the user set their level
    #: (:mod:`airflow_provider_babelqueue.hooks.client_logs`), since a client's INFO lines describe its own
    #: connection handling, not the task's work.
    client_loggers: tuple[str, ...] = ()

    @abc.abstractmethod
    def publish(
        self, body: bytes, queue_name: str, *, headers: Mapping[str, Any] | None = None, delay: float = 0
    ) -> None:
        """Store one encoded envelope; ``delay`` seconds before it becomes visible."""

    @abc.abstractmethod
    def publish_batch(self, bodies: Sequence[bytes], queue_name: str) -> None:
        """Store many bodies with the broker's native batching; raises :class:`PublishBatchError`
        naming the bodies that were not delivered."""

    @abc.abstractmethod
    def reserve(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        """Take the next ready message, waiting up to ``timeout`` seconds; ``None`` when there is none."""

    def reserve_many(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """Take up to ``limit`` ready messages in order, the broker's batch where it has one (a consumer's batch).

        Waits up to ``timeout`` seconds for the first message only, with the broker's blocking primitive where it
        has one, then takes whatever else is ready without waiting (where the broker pushes deliveries, RabbitMQ,
        what has arrived: a batch may be shorter than what the queue holds); an empty list means nothing came
        within the timeout. Each message is its own reservation, settled one by one or with :meth:`ack_many`: a
        crash before the settle returns every unsettled one, as for :meth:`reserve`. A binding may keep deliveries
        it fetched ahead (a prefetch window) until :meth:`end_reservations`.

        The default loops over :meth:`reserve`; bindings override it with one round trip.
        """
        return _one_by_one(self.reserve, queue_name, limit, timeout)

    def settle(self, acks: Sequence[ReceivedMessage],
               releases: Sequence[tuple[ReceivedMessage, float]] = ()) -> None:
        """The end of a consumer's batch: release each of ``releases`` (a message and its own delay, as
        :meth:`release`) and ack every one of ``acks`` (as :meth:`ack_many`). Gated like those: a reservation that
        expired and was handed out again is left alone.

        The default releases per delay with :meth:`release_many`, then acks with :meth:`ack_many`; the SQL table
        does both in one transaction."""
        by_delay: dict[float, list[ReceivedMessage]] = {}
        for message, delay in releases:
            by_delay.setdefault(delay, []).append(message)
        for delay, messages in by_delay.items():
            self.release_many(messages, delay)
        if acks:
            self.ack_many(acks)

    def settle_and_reserve(self, queue_name: str, limit: int, timeout: float = 0, *,
                           acks: Sequence[ReceivedMessage] = (),
                           releases: Sequence[tuple[ReceivedMessage, float]] = ()) -> list[ReceivedMessage]:
        """:meth:`settle` the previous batch, then :meth:`reserve_many` the next: what a consumer does between two
        batches. A binding may do both in one round trip or transaction (the SQL table: one commit per batch);
        the settlement is done when this returns, whatever the reservation finds. The default calls the two."""
        if acks or releases:
            self.settle(acks, releases)
        return self.reserve_many(queue_name, limit, timeout)

    def end_reservations(self, queue_name: str) -> None:  # noqa: B027 - optional hook
        """Hand back at once what the binding fetched ahead for ``queue_name`` and did not return from
        :meth:`reserve_many` (RabbitMQ's prefetch window), so another consumer gets it now rather than when this
        binding's connection closes. Reservations already handed out are untouched. The default has none."""

    def reservation_seconds(self, queue_name: str) -> float | None:
        """How long a message reserved from ``queue_name`` stays this reader's while it is unsettled, in seconds
        from the start of the reserve call that took it, before the broker hands it out again to any reader;
        ``None`` when nothing hands it out meanwhile (it is held until this binding's connection closes). A
        consumer stops starting handlers on a batch whose reservations are half through this time and hands the
        rest back, so a slow batch is never handled twice by parallel readers. The default is ``None``."""
        return None

    @abc.abstractmethod
    def ack(self, message: ReceivedMessage) -> None:
        """Remove a reserved message for good (also for messages reserved from the DLQ)."""

    @abc.abstractmethod
    def release(self, message: ReceivedMessage, delay: float = 0) -> None:
        """Return a reserved message for another attempt (attempts + 1), visible after ``delay`` s."""

    @abc.abstractmethod
    def dead_letter(
        self, message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
    ) -> None:
        """Move a reserved message to the DLQ with its ``dead_letter`` block, then remove it."""

    @abc.abstractmethod
    def depth(self, queue_name: str) -> int:
        """Messages ready for delivery (not reserved, not delayed)."""

    @abc.abstractmethod
    def dead_letter_depth(self, queue_name: str) -> int:
        """Messages in the queue's DLQ."""

    @abc.abstractmethod
    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        """Take the next message from the queue's DLQ (for a drain); ack it once its copy is durable."""

    def reserve_dead_letters(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """Take up to ``limit`` messages from the queue's DLQ, oldest first (for a drain or a redrive).

        Waits up to ``timeout`` seconds for the first message only, then takes whatever else is ready
        without waiting; an empty list means the DLQ had nothing within the timeout. Each message is its own
        reservation (ack, release or let it expire one by one or with :meth:`ack_many`).

        The default loops over :meth:`reserve_dead_letter`; bindings override it with one round trip.
        """
        return _one_by_one(self.reserve_dead_letter, queue_name, limit, timeout)

    def ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        """:meth:`ack` each message, in order (reservation order is the cheapest for list-based queues).

        Gated like :meth:`ack`: a member whose reservation expired and was handed out again is left alone.
        On an error some members may be acked and others not; settling a member again is harmless (a
        release or ack of a settled reservation changes nothing). The default loops over :meth:`ack`.
        """
        for message in messages:
            self.ack(message)

    def release_many(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """:meth:`release` each message, in order; the default loops over :meth:`release`."""
        for message in messages:
            self.release(message, delay)

    def hand_back(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """Return reserved messages that were not for this reader (a filter did not take them), unhandled.

        Unlike :meth:`release` this is not a failed attempt: the stored bytes stay exactly as they were and the
        binding's own ``attempts`` count does not move, so a message handed back a hundred times still has its
        whole retry budget for the consumer it is meant for. Brokers that count deliveries themselves (SQS's
        receive count and redrive policy, Service Bus's and Pulsar's delivery limits, a RabbitMQ quorum queue's
        ``x-delivery-count``) still count where the hand-back is a redelivery: docs/events.md says which. After
        ``delay`` seconds the message is ready again; a delay keeps one filtered reader from taking the same
        message over and over. Gated like :meth:`release`: a reservation that expired meanwhile is left alone.

        The default releases (which counts an attempt); every shipped binding overrides it.
        """
        self.release_many(messages, delay)

    #: Why :meth:`hold` is impossible on this broker (a reservation belongs to the connection that made it).
    held_reservations_note = "its reservations belong to the connection that made them"

    def hold(self, messages: Sequence[ReceivedMessage], seconds: float) -> list[str]:
        """Keep these fresh reservations for ``seconds`` (a DAG run's length, not the visibility timeout) and return
        a receipt for each that another process can settle with :meth:`settle_held` (a task of the run).

        Only brokers whose reservation is a record, not a connection's state, can: the SQL table (a row's mark),
        Redis (a deadline member and the stored value under its token), SQS (a receipt handle). Others raise
        :class:`NotSupportedError` saying why.
        """
        raise NotSupportedError(f"the {self.name} binding cannot hand a reservation to another process: "
                                f"{self.held_reservations_note}")

    def settle_held(self, receipts: Sequence[str], *, succeeded: bool) -> None:
        """Settle reservations :meth:`hold` returned, from any process: acked when ``succeeded``, else ready again at
        once, bytes unchanged (the run failed, not the message; SQS counts the receive). A receipt whose reservation
        is gone (settled already, or expired and handed out again) is left alone."""
        raise NotSupportedError(f"the {self.name} binding cannot settle a reservation from another process: "
                                f"{self.held_reservations_note}")

    def browse_dead_letters(self, queue_name: str, limit: int = 100) -> list[ReceivedMessage]:
        """Read up to ``limit`` DLQ messages without removing them."""
        raise NotSupportedError(f"the {self.name} binding cannot browse a dead-letter queue without removing")

    @property
    def can_discard(self) -> bool:
        """Whether :meth:`discard_dead_letters` is offered (asked before a console archives what it would remove)."""
        return type(self).discard_dead_letters is not Binding.discard_dead_letters

    def discard_dead_letters(self, queue_name: str, bodies: Sequence[bytes]) -> int:
        """Remove one stored copy of each body from the queue's dead letters (the oldest, over every dead-letter
        source in reading order) and return how many were removed: a body no longer there (taken by a drain
        meanwhile) is skipped. For a console's discard, after the bodies were archived; never for a drain, whose
        reservations are acked instead."""
        raise NotSupportedError(f"the {self.name} binding cannot remove chosen dead letters; drain the queue "
                                "instead")

    def queue_names(self, limit: int = 200) -> list[str] | None:
        """The queues that hold messages or dead letters now, as far as the broker can list them (for a console's
        overview), sorted, at most ``limit``. ``None``: the broker cannot list its queues through this binding."""
        return None

    def dead_letters_failed_since(self, queue_name: str, since_ms: int, *,
                                  max_scan: int = 20_000) -> tuple[int, bool] | None:
        """How many of the queue's dead letters failed at or after ``since_ms`` (Unix milliseconds), for a console's
        "arrivals in the last hour", and whether the count is whole (``False``: at least that many, the binding
        stopped after reading ``max_scan`` dead letters). ``None``: the broker cannot tell without taking them."""
        return None

    def browse_dead_letter_bytes(self, queue_name: str, start: int, stop: int) -> list[bytes] | None:
        """The bytes of DLQ positions ``start``..``stop`` - 1 over every dead-letter source in reading order,
        nothing reserved or removed, for a console's pages (which read what triage reads: the bytes a drain
        records). They are the stored bytes, but where a broker keeps a dead letter bare with its reason beside it
        (the SQL table's columns): that one reads in the form the other DLQs hold (``bodies.dead_letter_view``),
        and :meth:`discard_dead_letters` takes it in that form. ``None``: the binding reads no position but the
        head. By default :meth:`browse_dead_letter_raws`."""
        return self.browse_dead_letter_raws(queue_name, start, stop)

    def dead_letter_bytes_after(self, queue_name: str, cursor: Any, count: int) -> tuple[list[bytes], Any] | None:
        """The stored bytes of the next ``count`` dead letters after ``cursor`` (``None``: from the oldest), in
        reading order over every source, and the cursor after them: a read of a whole dead-letter queue in chunks
        (a console's job), nothing reserved or removed. ``None``: the binding reads no position but the head.

        A whole-number cursor is a position (the default, over :meth:`browse_dead_letter_bytes`): dead letters
        removed before it move it back by as many. A binding that reads after a key instead (SQL: a table and a
        row id) returns another kind, which stays right whatever is removed."""
        start = 0 if cursor is None else int(cursor)
        raws = self.browse_dead_letter_bytes(queue_name, start, start + count)
        return None if raws is None else (raws, start + len(raws))

    def browse_dead_letter_raws(self, queue_name: str, start: int, stop: int, *,
                                source: str | None = None) -> list[bytes] | None:
        """The stored bytes of DLQ positions ``start``..``stop`` - 1, nothing reserved or removed, for a browse
        drain on a binding whose dead letters carry nothing but their bytes (no headers, no native reason or
        delivery count). ``None``: not offered; the drain then browses :class:`ReceivedMessage` values.

        :param source: one of :meth:`dead_letter_sources`: positions are within that DLQ alone, so a drain can
            name each record's source. ``None``: positions run over every source, in reading order.
        """
        return None

    def open_dead_letter_pipeline(self, queue_name: str, *, source: str | None = None) -> DeadLetterPipeline | None:
        """Optional capability :class:`DeadLetterPipeline`: a pipeline that keeps a move drain's reservations and
        acks of one of ``queue_name``'s DLQs in flight while the drain writes (Redis: ``RedisDeadLetterPipeline``),
        or ``None``: the drain then reserves with :meth:`reserve_dead_letters` and acks with :meth:`ack_many`, one
        round trip each.

        :param source: which of :meth:`dead_letter_sources` the pipeline drains (a pipeline holds one DLQ's
            reservations); ``None``: the written one, :meth:`dead_letter_name`.
        """
        return None

    def seen_store(self, name: str) -> SeenStore:
        """A persistent ``meta.id`` seen-set named ``name`` on this broker, for consumer idempotency and
        replay ledgers. Brokers that cannot hold one raise :class:`NotSupportedError`."""
        raise NotSupportedError(
            f"the {self.name} binding cannot hold an idempotency store; use a babelqueue+sql or babelqueue+redis "
            "connection for it"
        )

    def publish_remembering(self, bodies: Sequence[bytes], queue_name: str,
                            marks: Sequence[tuple[SeenStore, Sequence[str]]]) -> bool:
        """Publish ``bodies`` as one batch *and* add each mark's keys to its seen store in one atomic step: both
        happen or neither. A replay uses it so that a crash between "published" and "remembered" cannot exist,
        and a re-run can never publish a message twice.

        Possible only when every store lives on this binding (the same database or Redis server); otherwise,
        and on brokers without transactions, this returns ``False`` having done nothing, and the caller
        publishes and remembers in two steps.

        :raises PublishBatchError: nothing was stored (every index is listed).
        """
        return False

    def publish_acking(self, bodies: Sequence[bytes], queue_name: str, messages: Sequence[ReceivedMessage], *,
                       headers: Mapping[str, Any] | None = None) -> bool:
        """Publish ``bodies`` to ``queue_name`` *and* ack ``messages`` (reservations taken by this binding) in one
        atomic step. A redrive on one broker uses it so that after a crash each dead letter is either still in
        the DLQ or at the target, never both: a re-run cannot replay it twice, whatever the ledger holds.

        Brokers without a transaction spanning publishes and acks (and messages this binding does not hold)
        return ``False`` having done nothing; the caller publishes, then acks.

        :raises PublishBatchError: nothing was committed (every index is listed).
        """
        return False

    def ping(self) -> None:
        """Reach the broker once (used by hooks' ``test_connection``); raises :class:`BindingError`."""
        self.depth("babelqueue-ping")

    def dead_letter_name(self, queue_name: str) -> str:
        """Where this binding writes the queue's dead letters (a key, queue or table name): one name."""
        return f"{queue_name}:failed"

    def dead_letter_sources(self, queue_name: str) -> list[str]:
        """Every dead-letter queue read for ``queue_name``, in reading order, the written one
        (:meth:`dead_letter_name`) first: the official SDKs' workers write ``<queue>.dlq`` where the spec says
        ``<queue>:failed`` / ``.failed``, so reads (counts, drains, browses, redrives) take every source. A
        source that does not exist counts as empty and is never created by a read."""
        return [self.dead_letter_name(queue_name)]

    @staticmethod
    def source_entries(value: str | Iterable[str] | None) -> tuple[str, ...]:
        """A ``dead_letter_sources`` setting as a tuple of entries, for the bindings' configs: a list as it is, text
        (a connection extra, a URL parameter) split on commas; ``None``, ``""`` or ``"none"``: no entry.

        :raises ValueError: an entry is not text, so a typo in a JSON extra fails where it is configured.
        """
        if value is None:
            return ()
        if isinstance(value, str):
            value = () if value.strip().lower() in ("", "none") else value.split(",")
        entries: list[str] = []
        for entry in value:
            if not isinstance(entry, str):
                raise ValueError(f"dead_letter_sources entries must be names or suffixes (text), got {entry!r}")
            if entry.strip() and entry.strip() not in entries:
                entries.append(entry.strip())
        return tuple(entries)

    def named_dead_letter_sources(self, queue_name: str, entries: Iterable[str], *, stem: str | None = None,
                                  placeholder: str = "{queue}", prefix: str = "") -> list[str]:
        """:meth:`dead_letter_name` first, then each entry of a ``dead_letter_sources`` setting as a name, without
        repeats: the written DLQ is always read, so configuring the list can never hide our own dead letters.

        An entry holding ``placeholder`` is a template (``legacy-{queue}-dead``); one that starts with a letter or
        digit is a full name, read for every queue; any other is a suffix after ``stem`` (``.dlq``, ``:failed``).

        :param stem: what a suffix follows; ``queue_name`` by default (SQL passes its table).
        :param prefix: put before every name made from an entry (Redis's ``key_prefix``, which every key takes).
        """
        stem = queue_name if stem is None else stem
        names = [self.dead_letter_name(queue_name)]
        for entry in entries:
            if placeholder in entry:
                name = entry.replace(placeholder, stem)
            else:
                name = entry if entry[:1].isalnum() else f"{stem}{entry}"
            name = f"{prefix}{name}"
            if name not in names:
                names.append(name)
        return names

    def dead_letters_hidden_while_held(self, queue_name: str) -> bool:
        """Whether dead letters reserved from ``queue_name``'s DLQ and not yet settled can hide the rest of it from
        the next reservation (an SQS FIFO message group returns nothing more while one of it is in flight). A
        drain or redrive then settles what it holds before it takes an empty reservation for an empty DLQ."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release broker connections this binding created (injected clients are left open)."""

    def __enter__(self) -> Binding:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
