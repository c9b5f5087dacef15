"""The Redis binding's drain pipeline: reservations and acks of one DLQ kept in flight on one connection.

The binding hands it out through ``RedisBinding.open_dead_letter_pipeline``, the typed optional capability
``bindings.base.DeadLetterPipeline``; the scripts, keys and members are the binding's own, so every guarantee
is its.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from typing import Any

from ..base import BindingError, PipelinedBatch
from ..message import ReceivedMessage
from .binding import MANY_CHUNK, DeadLetterBatch, RedisBinding, as_bytes
from .scripts import ACK_HEAD, RESERVE_MANY, SWEEP_BATCH

__all__ = ["RedisDeadLetterPipeline"]

logger = logging.getLogger(__name__)


class RedisDeadLetterPipeline:
    """Reservations and acks of one DLQ in flight on one connection of the binding's pool: a drain sends the
    reservation of batch N + 1 before it writes and syncs batch N, and sends the ack of batch N without
    waiting for its reply, so the server runs its scripts while Python works instead of between its steps.

    Same scripts, keys and members as :meth:`RedisBinding.reserve_dead_letters` and
    :meth:`RedisBinding.ack_many`, so the guarantees are theirs: a reserved batch not acked yet (the one being
    written, the one reserved ahead) comes back after the visibility timeout if the process dies. Replies are
    read in the order the commands were sent; an ack the fast script refuses (a reservation expired meanwhile)
    is settled member by member when its reply is read, as :meth:`RedisBinding.ack_many` does.

    The connection is used without the client's retries: a lost connection fails the drain, which releases
    what it can through the client, and the reservations only this connection's replies would have named come
    back after the visibility timeout.

    :param binding: the binding whose client, config and key layout are used.
    :param queue_name: the queue whose DLQ is drained.
    :param source: the DLQ list drained, one of the binding's ``dead_letter_sources`` (a pipeline holds one
        list's reservations); by default the written one.
    """

    def __init__(self, binding: RedisBinding, queue_name: str, *, source: str | None = None) -> None:
        self.binding, self.queue_name = binding, queue_name
        self.source = source or binding.dead_letter_name(queue_name)
        self._keys = binding._keys(self.source, dead=True)
        self._vt = repr(float(binding.config.visibility_timeout))
        client = binding.client
        with binding._guard("load the drain scripts", self.source):  # EVALSHA below needs them on the server
            self._reserve_sha = client.script_load(RESERVE_MANY)
            self._ack_sha = client.script_load(ACK_HEAD)
            self._conn: Any = client.connection_pool.get_connection()
        #: What each reply not read yet answers: ("reserve", stem, limit) or ("ack", batch, start, stop).
        self._pending: deque[tuple[Any, ...]] = deque()
        #: Acks not confirmed although their reply was read (refused, or their settling failed).
        self._unsettled: list[tuple[Any, ...]] = []

    @property
    def reservations_in_flight(self) -> int:
        """Reservation requests sent whose batch :meth:`receive` has not returned yet."""
        return sum(1 for entry in self._pending if entry[0] == "reserve")

    def request(self, limit: int) -> int:
        """Send a reservation of up to ``limit`` dead letters (at most 2000) without waiting; returns how many
        were asked for. The server runs it as soon as the commands sent before it are done."""
        want, stem = max(min(limit, MANY_CHUNK), 1), secrets.token_hex(12)
        self._send("reserve", "EVALSHA", self._reserve_sha, 3, *self._keys, self._vt, stem, SWEEP_BATCH, want)
        self._pending.append(("reserve", stem, want))
        return want

    def ack(self, batch: PipelinedBatch, start: int, stop: int) -> None:
        """Send the ack of reservations ``start``..``stop`` - 1 of ``batch`` (one :meth:`receive` returned)
        without waiting. Acks are sent in reservation order, so they are the head of the processing list (the
        fast script's case)."""
        if stop > start:
            if not isinstance(batch, DeadLetterBatch):
                raise TypeError(f"the drain pipeline of {self.source!r} acks only the batches it received")
            self._send("ack reservations", "EVALSHA", self._ack_sha, 2, self._keys[1], self._keys[2],
                       batch.tokens(start, stop))
            self._pending.append(("ack", batch, start, stop))

    def receive(self) -> DeadLetterBatch:
        """The oldest requested batch (waits for it), after settling the acks whose replies come first.

        :raises BindingError: the server or the connection failed; what was reserved comes back after the
            visibility timeout, or at once through :meth:`abort`.
        """
        if not self.reservations_in_flight:
            raise BindingError(f"no reservation of {self.source!r} is in flight")
        while self._pending[0][0] == "ack":
            self._settle_next()
        (_, stem, want), reply = self._next_reply()
        raws = as_bytes(reply) if isinstance(reply, list) else []
        return DeadLetterBatch(self.binding, self.queue_name, self._keys[1], stem, raws, want)

    def finish(self) -> None:
        """Read every reply still due (acks settle; a batch reserved but never received goes back to the DLQ
        at once), then return the connection to the pool.

        :raises BindingError: a reply could not be read or an ack could not be settled (:meth:`abort` still
            returns what is unsettled).
        """
        left: list[DeadLetterBatch] = []
        while self._pending:
            if self._pending[0][0] == "ack":
                self._settle_next()
            elif (batch := self.receive()).raws:
                left.append(batch)
        self.close()
        if left:
            self.binding.release_many([message for batch in left for message in batch.messages()])

    def abort(self) -> list[ReceivedMessage]:
        """After a failure: every reservation this pipeline holds without a confirmed ack (batches reserved and
        not received, acks in flight or refused), for the caller to release at once. Replies still due are
        read; from a connection that cannot answer, the reservations only its replies would name come back
        after the visibility timeout. Never raises; closes the pipeline."""
        held = [message for _, batch, start, stop in self._unsettled for message in batch.messages(start, stop)]
        self._unsettled = []
        try:
            while self._pending:
                try:
                    entry, reply = self._next_reply()
                except BindingError as exc:
                    if not self._is_reply_error(exc):
                        raise
                    continue  # that command did nothing: no reservation, no ack
                if entry[0] == "ack":
                    if not (isinstance(reply, int) and reply >= 0):
                        held.extend(entry[1].messages(entry[2], entry[3]))
                elif isinstance(reply, list) and reply:
                    batch = DeadLetterBatch(self.binding, self.queue_name, self._keys[1], entry[1],
                                            as_bytes(reply), entry[2])
                    held.extend(batch.messages())
        except Exception:  # noqa: BLE001 - the connection is unusable: the server returns the rest later
            logger.warning("the Redis drain connection for %r failed while aborting; its unread reservations "
                           "return after the visibility timeout", self.source, exc_info=True)
            held.extend(message for entry in self._pending if entry[0] == "ack"
                        for message in entry[1].messages(entry[2], entry[3]))
        self.close()
        return held

    def close(self) -> None:
        """Return the connection to the pool; with replies still due it is disconnected first, so no later
        command can read them."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._pending:
            self._pending.clear()
            conn.disconnect()
        self.binding.client.connection_pool.release(conn)

    # -- internals

    def _send(self, action: str, *args: Any) -> None:
        if self._conn is None:
            raise BindingError(f"the drain pipeline of {self.source!r} is closed")
        with self.binding._guard(action, self.source):
            self._conn.send_command(*args)

    def _next_reply(self) -> tuple[tuple[Any, ...], Any]:
        """The oldest pending entry and its reply. An error reply is consumed (its entry too) and raised; a
        connection error leaves the entry listed (the connection is then unusable)."""
        if self._conn is None:
            raise BindingError(f"the drain pipeline of {self.source!r} is closed")
        entry = self._pending[0]
        errors = self.binding._redis.exceptions
        with self.binding._guard("read a reply", self.source):
            try:
                reply = self._conn.read_response()
            except errors.ResponseError:
                self._pending.popleft()
                raise
        self._pending.popleft()
        return entry, reply

    def _is_reply_error(self, exc: BaseException) -> bool:
        return isinstance(exc.__cause__, self.binding._redis.exceptions.ResponseError)

    def _settle_next(self) -> None:
        """Read the reply of the oldest ack in flight: the fast script settled them all, or it refused (-1: a
        reservation expired meanwhile) and each reservation is settled on its own, as ``ack_many`` does. An
        ack not confirmed (error reply, settling failed) is kept for :meth:`abort`, then the error raised."""
        entry = self._pending[0]
        try:
            _, reply = self._next_reply()
        except BindingError as exc:
            if self._is_reply_error(exc):
                self._unsettled.append(entry)
            raise
        if int(reply) >= 0:
            return
        _, batch, start, stop = entry
        self._unsettled.append(entry)
        self.binding._settle_many({(batch.processing, None, 0.0): [(r, b"") for r in batch.receipts(start, stop)]},
                                  "ack reservations")
        self._unsettled.remove(entry)
