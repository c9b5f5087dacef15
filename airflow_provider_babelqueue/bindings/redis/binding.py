"""Redis binding: the reliable-queue list pattern, in the official SDKs' legacy key layout.

Keys of queue ``q`` (``P`` = :attr:`RedisConfig.key_prefix`, empty by default as in the SDKs): ready list
``Pq`` (RPUSH of the envelope bytes, no wrapping); ``Pq:processing`` (reserved elements, moved by
LMOVE/BLMOVE so a crash before the ack loses nothing); ``Pq:processing:deadlines`` (one member
``<32-hex token>:<raw value>`` per reservation, score = deadline: the SDK's format, so either side's sweep
returns the other's abandoned reservations and a settle touches only its own); ``Pq:delayed`` (members
``<token>:<raw>``, score = due time; other SDKs never see them early); DLQ ``Pq<dead_letter_suffix>``,
with its own ``:processing`` list and deadline set for drains; ``Pq:processing:spill:<token>`` (a copy of a
reserved value over the consumer's decode limit, read in slices, then deleted; it expires with the reservation).

Dead letters are written to that one list (``:failed``, the spec's name) and read from every list of
:meth:`RedisBinding.dead_letter_sources`: by default ``Pq:failed`` and ``Pq.dlq``, where the official SDKs'
workers put theirs. A reservation from a DLQ lives in that list's own ``:processing`` list, so its ack or
release goes back to the list it came from. Reads create no key.

Header frames: Node's adapter and the Python SDK store a message published with headers as
``{"__bq_frame":1,"headers":{…},"body":"<envelope>"}``. A reserved frame exposes the inner envelope and the
frame's headers (the stored bytes stay the message's ``body``, which the ack removes exactly). Writing frames is
opt-in (:attr:`RedisConfig.frames`): the spec's Redis value is the bare envelope.

Scores are fractional epoch seconds from the server's ``TIME``, read inside Lua, so worker clock skew cannot
expire a reservation early (the SDK uses its own clock, in whole seconds). Every multi-key step is one Lua
script, except a blocking reserve: BLMOVE waits, then a script registers the deadline. An element left
without a member by a consumer that died in that gap is *adopted* (all-zero token, due one visibility timeout
later) by the next maintenance pass, and swept back like any other. A queue's keys must share one node
(Redis Cluster only with a hash tag such as ``{orders}``). Needs Redis >= 6.2.
"""

from __future__ import annotations

import contextlib
import io
import logging
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from ...core.frames import encode_frame, frame_headers
from ...core.peer import WrapperParts
from ..base import Binding, BindingError, PublishBatchError, check_sizes, require_extra
from ..bodies import bumped_body, dead_letter_body, dead_letter_parts
from ..message import ReceivedMessage, parse_body
from .config import RedisConfig
from .scripts import ACK_HEAD, CLAIM, HOLD, RESERVE, RESERVE_MANY, SETTLE, SETTLE_HELD, SETTLE_MANY, SWEEP_BATCH

__all__ = ["LARGE_VALUE", "DeadLetterBatch", "RedisBinding", "command_parts"]

if TYPE_CHECKING:
    from ...core.idempotency import SeenStore
    from .pipeline import RedisDeadLetterPipeline
    from .stores import RedisSeenStore

logger = logging.getLogger(__name__)

#: Most bytes of values one batch reservation returns (beyond its first value): bounds a consumer's batch in memory.
_BATCH_REPLY_BUDGET = 8 * 1024 * 1024
#: Longest single BLMOVE wait: maintenance (due delayed items, expired reservations) runs at least this often.
_BLOCK_SLICE = 1.0
#: Bodies per RPUSH in publish_batch.
_CHUNK = 1000

#: Reservations per RESERVE_MANY / SETTLE_MANY call (bounds one script's run time and memory).
MANY_CHUNK = 2000

#: A command whose values exceed this many bytes in all is sent in pieces (``RedisBinding._run``); a reply this
#: large is followed by a PING that frees the parser's copy of it, and a reserved value over both this and the
#: consumer's ``decode_limit`` is read in slices of ``_SLICE`` bytes instead (``RedisBinding._take``).
LARGE_VALUE = 1 << 20
_SLICE = 1 << 20






class _Receipt(NamedTuple):
    """One reservation: its token and the exact stored value, so a settle removes exactly it. (A tuple: a
    batch reservation makes thousands, and a tuple is the cheapest immutable record to build.)"""

    token: str
    raw: bytes
    processing: str


#: ``%08x`` of 0..MANY_CHUNK: the index part of a batch reservation's token (see DeadLetterBatch.tokens).
_HEX_INDEXES = tuple(f"{index:08x}" for index in range(MANY_CHUNK + 1))


class DeadLetterBatch:
    """The dead letters one ``RESERVE_MANY`` call reserved, kept as the raw values the server returned.

    A drain needs only the bytes (its record carries the body verbatim) and a way to ack them: building a
    :class:`ReceivedMessage` (and decoding its envelope) per dead letter cost more than the rest of the drain,
    so messages are built only on demand, to release them. Reservation ``i`` (0-based) holds the token
    ``<stem><i + 1 as 8 hex>``, as the binding acks them.

    :ivar raws: the stored values, in reservation order.
    :ivar requested: how many were asked for; fewer means the DLQ had no more ready at that moment.
    """

    __slots__ = ("binding", "queue_name", "processing", "stem", "raws", "requested")

    def __init__(self, binding: RedisBinding, queue_name: str, processing: str, stem: str, raws: list[bytes],
                 requested: int) -> None:
        self.binding, self.queue_name, self.processing = binding, queue_name, processing
        self.stem, self.raws, self.requested = stem, raws, requested

    def __len__(self) -> int:
        return len(self.raws)

    def tokens(self, start: int, stop: int) -> str:
        """The 32-character tokens of reservations ``start``..``stop`` - 1, concatenated (an ack's argument):
        the stem joined with the precomputed 8-hex indexes, one C-level join instead of a format per token."""
        if stop <= start:
            return ""
        return self.stem + self.stem.join(_HEX_INDEXES[start + 1:stop + 1])

    def receipts(self, start: int, stop: int) -> list[_Receipt]:
        stem, raws, processing = self.stem, self.raws, self.processing
        return [_Receipt(f"{stem}{index + 1:08x}", raws[index], processing) for index in range(start, stop)]

    def messages(self, start: int = 0, stop: int | None = None) -> list[ReceivedMessage]:
        """Reservations ``start``..``stop`` - 1 as messages the binding can ack or release one by one."""
        receipts = self.receipts(start, len(self.raws) if stop is None else stop)
        return [self.binding._parsed(receipt.raw, self.queue_name, True, receipt) for receipt in receipts]


def command_parts(encode: Callable[[Any], bytes], *args: Any) -> Iterator[bytes | memoryview]:
    """A command in the Redis protocol (RESP), as the pieces a socket can send one after the other: each value
    as it is (never copied into one buffer with the rest), a :class:`~...core.peer.WrapperParts` framed by its
    known length and made part by part while it is sent.

    :param encode: the connection's encoder (``str``, ``int``, ``float`` to bytes, as the client sends them).
    """
    yield b"*%d\r\n" % len(args)
    for arg in args:
        if isinstance(arg, WrapperParts):
            yield b"$%d\r\n" % len(arg)
            yield from arg
        else:
            value = arg if isinstance(arg, bytes) else encode(arg)
            yield b"$%d\r\n" % len(value)
            yield value
        yield b"\r\n"


def _source_of(receipt: _Receipt) -> str:
    """The list a reservation was taken from: its processing list's name without ``:processing``."""
    return receipt.processing.removesuffix(":processing")


def as_bytes(raws: list[Any]) -> list[bytes]:
    """A script's reply values as bytes, in place (a client with ``decode_responses`` gives ``str``)."""
    for index, raw in enumerate(raws):
        if raw.__class__ is not bytes:
            raws[index] = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)
    return raws


class RedisBinding(Binding):
    """Queues as Redis lists in the official SDKs' legacy layout (see the module docstring)."""

    name = "redis"
    client_loggers = ("redis",)
    can_browse = True
    carries_headers = False

    def __init__(self, config: RedisConfig, client: Any = None) -> None:
        """:param config: server and key layout.
        :param client: a ready ``redis.Redis`` (the test seam, or to share a pool); it must return bytes
            (``decode_responses=False``) so bodies stay byte-exact. :meth:`close` leaves it open.
        """
        self.config = config
        self._redis = require_extra("redis", "redis")
        self._owns_client = client is None
        if client is None:  # building a client does not connect; the first command does
            backoff = self._redis.backoff.ExponentialWithJitterBackoff(base=0.05, cap=1.0)
            client = self._redis.Redis(
                host=config.host, port=config.port, db=config.db, username=config.username,
                password=config.password, ssl=config.ssl, ssl_ca_certs=config.ssl_ca_certs,
                socket_timeout=config.socket_timeout, socket_connect_timeout=config.socket_timeout,
                # A few quick retries ride out a blip; every script is safe to repeat (at-least-once).
                retry=self._redis.retry.Retry(backoff, 3),
            )
        self.client = client
        #: Truthful per connection: headers reach consumers only when frames are written.
        self.carries_headers = config.frames
        self._told_headers_dropped = False
        self._reserve_script = client.register_script(RESERVE)
        self._claim_script = client.register_script(CLAIM)
        self._settle_script = client.register_script(SETTLE)
        self._reserve_many_script = client.register_script(RESERVE_MANY)
        self._settle_many_script = client.register_script(SETTLE_MANY)
        self._ack_head_script = client.register_script(ACK_HEAD)
        self._hold_script = client.register_script(HOLD)
        self._settle_held_script = client.register_script(SETTLE_HELD)

    def _key(self, queue_name: str) -> str:
        return f"{self.config.key_prefix}{queue_name}"

    def dead_letter_name(self, queue_name: str) -> str:
        return f"{self.config.key_prefix}{queue_name}{self.config.dead_letter_suffix}"

    def dead_letter_sources(self, queue_name: str) -> list[str]:
        """The written DLQ list, then :attr:`RedisConfig.dead_letter_sources` (by default ``<queue>:failed`` and
        ``<queue>.dlq``), every key with the prefix."""
        entries = self.config.dead_letter_sources
        assert isinstance(entries, tuple)  # normalised by RedisConfig
        return self.named_dead_letter_sources(queue_name, entries, prefix=self.config.key_prefix)

    @staticmethod
    def _keys(source: str, dead: bool) -> list[str]:
        """A list's script keys: itself, its processing list, deadline set and (not for a DLQ) delayed set."""
        keys = [source, f"{source}:processing", f"{source}:processing:deadlines", f"{source}:delayed"]
        return keys[:3] if dead else keys

    @contextmanager
    def _guard(self, action: str, key: str) -> Iterator[None]:
        """Turn a redis-py error into a :class:`BindingError` that says where and what to check."""
        try:
            yield
        except self._redis.exceptions.RedisError as exc:
            from ..redaction import scrub

            errors, text = self._redis.exceptions, scrub(str(exc), [self.config.password or ""])
            if isinstance(exc, errors.AuthenticationError) or "NOAUTH" in text or "WRONGPASS" in text:
                hint = "authentication failed; check the username and password"
            elif isinstance(exc, errors.ConnectionError | errors.TimeoutError):
                hint = (f"cannot reach the server; check that Redis runs there, that the port is reachable from "
                        f"this worker and that TLS is {'on' if self.config.ssl else 'off'} on the server too")
            elif "WRONGTYPE" in text:
                hint = "a key of this queue holds another data type; use another queue name or key_prefix"
            else:
                hint = "the server refused the command (needs Redis >= 6.2; an ACL user needs list/zset/script rights)"
            where = f"{self.config.host}:{self.config.port}/{self.config.db}"
            message = f"Redis {where}: {action} on {key!r} failed: {hint} ({type(exc).__name__}: {text})"
            raise BindingError(message) from exc

    def _parsed(self, raw: bytes, queue_name: str, dead: bool, receipt: _Receipt | None = None,
                source: str | None = None) -> ReceivedMessage:
        """A message of the stored value ``raw``: a header frame's envelope and headers are the message's (its
        body stays ``raw``, which the ack removes). ``source``: the DLQ a browse read it from (a reservation's
        is its processing list's)."""
        envelope, error, attempts = parse_body(raw, self.decode_limit)
        if dead and source is None and receipt is not None:
            source = _source_of(receipt)
        return ReceivedMessage(
            body=raw, queue_name=queue_name, envelope=envelope, decode_error=error, attempts=attempts,
            delivery_count=None, headers=frame_headers(raw) if envelope is not None else {}, receipt=receipt,
            from_dead_letter=dead, dead_letter_source=source if dead else None,
        )

    def _length(self, source: str, dead: bool) -> int:
        with self._guard("count", source):  # the reserve script's maintenance, then LLEN
            args = [repr(float(self.config.visibility_timeout)), "", SWEEP_BATCH]
            return int(self._reserve_script(keys=self._keys(source, dead), args=args))

    def _take(self, queue_name: str, source: str, timeout: float, dead: bool) -> ReceivedMessage | None:
        """Maintain + LMOVE in one script; when empty and ``timeout`` > 0, wait in BLMOVE slices (so due
        delayed items and expired reservations still move while every consumer waits), then claim."""
        keys, vt = self._keys(source, dead), repr(float(self.config.visibility_timeout))
        slice_cap = min(_BLOCK_SLICE, self.config.socket_timeout / 2) if self.config.socket_timeout else _BLOCK_SLICE
        end = time.monotonic() + max(timeout, 0)
        # a value over the consumer's decode limit (and over 1 MiB) is spilled by the script and read in slices
        spill_over = None if dead or self.decode_limit is None else max(self.decode_limit, LARGE_VALUE)
        with self._guard("reserve", source):
            while True:
                token = secrets.token_hex(16)
                if spill_over is None:
                    raw = self._reserve_script(keys=keys, args=[vt, token, SWEEP_BATCH])
                else:
                    spill = f"{keys[1]}:spill:{token}"
                    raw = self._reserve_script(keys=[*keys, spill], args=[vt, token, SWEEP_BATCH, spill_over])
                    if isinstance(raw, list):
                        raw = self._read_spilled(spill, int(raw[0]))
                        return self._parsed(raw, queue_name, dead, _Receipt(token, raw, keys[1]))
                if raw is None:
                    if (remaining := end - time.monotonic()) < 0.01:
                        return None
                    raw = self.client.blmove(source, keys[1], min(remaining, slice_cap), "LEFT", "RIGHT")
                    if raw is None or not self._run(self._claim_script, keys[1:3], [token, raw, vt]):
                        continue  # nothing yet, or reclaimed between BLMOVE and the claim (back on the ready list)
                raw = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)
                if len(raw) > LARGE_VALUE:
                    self._free_reply_buffer()
                return self._parsed(raw, queue_name, dead, _Receipt(token, raw, keys[1]))

    def _read_spilled(self, spill: str, size: int) -> bytes:
        """The reserved value the reserve script copied to ``spill`` (see ``RESERVE``), read in slices of 1 MiB into
        one buffer of its size: the client holds it once, where one reply would be held twice (hiredis keeps the
        reply's buffer beside the bytes it makes). The spill key is deleted after; it expires with the reservation.

        :raises BindingError: the key held less than ``size`` (it expired: the reservation is over anyway).
        """
        out = io.BytesIO()
        out.seek(size - 1)  # writing past the end sizes the buffer at once (zero-filled): no regrowth, no copy
        out.write(b"\0")
        out.seek(0)
        for start in range(0, size, _SLICE):
            out.write(self.client.getrange(spill, start, min(start + _SLICE, size) - 1))
        self.client.delete(spill)
        if out.tell() != size:
            raise BindingError(f"Redis {spill!r}: the reserved value's copy held {out.tell():,} of {size:,} bytes "
                               "(expired); the reservation is delivered again after its visibility timeout")
        return out.getvalue()  # the buffer itself, not a copy (CPython shares it when nothing else refers to it)

    def _free_reply_buffer(self) -> None:
        """Make the parser let go of its copy of a large reply: hiredis keeps the buffer of the last reply it
        read (the body's size once more) until it reads the next one, so a PING, on the connection the pool hands
        back first (the one just used, from a single thread), frees it before a handler decodes the body. Best
        effort: a failed PING changes nothing."""
        with contextlib.suppress(self._redis.exceptions.RedisError):
            self.client.ping()

    def _run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """``script(keys=keys, args=args)``. When the values exceed :data:`LARGE_VALUE` (a large body, its dead
        letter), the command goes out in pieces (:func:`command_parts`): each value as it is, a poison wrapper
        (:class:`~...core.peer.WrapperParts`) made step by step while it is sent, where the client's hiredis packer
        copies the whole command into one buffer (about 3x the command at its peak). Same EVALSHA (the script loaded
        on NOSCRIPT) and the same retries as the client's own call; a client without a connection pool (a cluster
        client) takes the usual path, with the wrapper joined."""
        pool: Any = getattr(self.client, "connection_pool", None)
        size = sum(len(arg) for arg in args if isinstance(arg, bytes | str | WrapperParts))
        if size <= LARGE_VALUE or not callable(getattr(pool, "get_connection", None)):
            return script(keys=keys, args=[bytes(arg) if isinstance(arg, WrapperParts) else arg for arg in args])
        conn = pool.get_connection()
        try:
            encode = conn.encoder.encode

            def call() -> Any:
                conn.send_packed_command(command_parts(encode, "EVALSHA", script.sha, len(keys), *keys, *args))
                try:
                    return conn.read_response()
                except self._redis.exceptions.NoScriptError:  # a restarted or flushed server: load it, once
                    conn.send_packed_command(command_parts(encode, "SCRIPT", "LOAD", script.script))
                    conn.read_response()
                    conn.send_packed_command(command_parts(encode, "EVALSHA", script.sha, len(keys), *keys, *args))
                    return conn.read_response()

            retry = getattr(conn, "retry", None)
            return call() if retry is None else retry.call_with_retry(call, lambda _error: conn.disconnect())
        finally:
            pool.release(conn)

    def _settle(self, message: ReceivedMessage, target: str | None, body: bytes | WrapperParts = b"",
                delay: float = 0) -> None:
        receipt = message.receipt
        if not isinstance(receipt, _Receipt):
            raise BindingError(f"this message was not reserved by a Redis binding (receipt {receipt!r})")
        keys = [receipt.processing, f"{receipt.processing}:deadlines"] + ([target] if target else [])
        args = [receipt.token, receipt.raw, body, repr(float(max(delay, 0))), secrets.token_hex(16)]
        with self._guard("settle a reservation", receipt.processing):
            done = self._run(self._settle_script, keys, args)
        if not done:
            logger.warning("Redis reservation in %r is gone (settled already, or expired and requeued for another "
                           "delivery); nothing was changed", receipt.processing)

    @staticmethod
    def _settle_calls(groups: dict[tuple[str, str | None, float], list[tuple[_Receipt, bytes]]]
                      ) -> list[tuple[list[str], list[Any], int]]:
        """``SETTLE_MANY`` calls (keys, args, reservations) settling reservations grouped by (processing list,
        target, delay): one per chunk of a group, the tokens, raw values and bodies packed into a few arguments."""
        calls: list[tuple[list[str], list[Any], int]] = []
        for (processing, target, delay), items in groups.items():
            keys = [processing, f"{processing}:deadlines"] + ([target] if target else [])
            for start in range(0, len(items), MANY_CHUNK):
                chunk = items[start:start + MANY_CHUNK]
                raws = [receipt.raw for receipt, _ in chunk]
                args: list[Any] = [repr(float(delay)), "".join(receipt.token for receipt, _ in chunk),
                                   ",".join(map(str, map(len, raws))), b"".join(raws), "", b""]
                if target:
                    bodies = [body for _, body in chunk]
                    args[4:] = [",".join(map(str, map(len, bodies))), b"".join(bodies)]
                calls.append((keys, args, len(chunk)))
        return calls

    def _settle_many(self, groups: dict[tuple[str, str | None, float], list[tuple[_Receipt, bytes]]],
                     action: str) -> None:
        """Settle reservations grouped by (processing list, target, delay) (see :meth:`_settle_calls`)."""
        gone = 0
        for keys, args, count in self._settle_calls(groups):
            with self._guard(action, keys[0]):
                gone += count - int(self._settle_many_script(keys=keys, args=args))
        self._warn_gone(gone)

    @staticmethod
    def _warn_gone(gone: int) -> None:
        if gone:
            logger.warning("%d Redis reservations were gone (settled already, or expired and requeued for another "
                           "delivery); nothing was changed for them", gone)

    def _ack_calls(self, messages: Sequence[ReceivedMessage]) -> list[tuple[list[str], list[_Receipt]]]:
        """``ACK_HEAD`` calls (keys, reservations) acking ``messages``: per processing list and chunk of 2000."""
        groups: dict[str, list[_Receipt]] = {}
        for message in messages:
            receipt = self._receipt_of(message)
            groups.setdefault(receipt.processing, []).append(receipt)
        return [([processing, f"{processing}:deadlines"], receipts[start:start + MANY_CHUNK])
                for processing, receipts in groups.items() for start in range(0, len(receipts), MANY_CHUNK)]

    def _release_groups(self, releases: Sequence[tuple[ReceivedMessage, float]], *, counted: bool = True
                        ) -> dict[tuple[str, str | None, float], list[tuple[_Receipt, bytes]]]:
        """Reservations to release, grouped for :meth:`_settle_calls`: a dead letter back on the DLQ it came from
        exactly as stored; a message to the end of its ready list (``:delayed`` with a delay), attempts + 1, or
        (not ``counted``: handed back) the value exactly as it was stored, frame and all."""
        groups: dict[tuple[str, str | None, float], list[tuple[_Receipt, bytes]]] = {}
        for message, delay in releases:
            receipt = self._receipt_of(message)
            delay = max(float(delay), 0.0)
            if message.from_dead_letter:
                group, body = (receipt.processing, _source_of(receipt), 0.0), message.body
            else:
                key = self._key(message.queue_name)
                group = (receipt.processing, f"{key}:delayed" if delay > 0 else key, delay)
                body = bumped_body(message) if counted else receipt.raw
            groups.setdefault(group, []).append((receipt, body))
        return groups

    @staticmethod
    def _receipt_of(message: ReceivedMessage) -> _Receipt:
        receipt = message.receipt
        if not isinstance(receipt, _Receipt):
            raise BindingError(f"this message was not reserved by a Redis binding (receipt {receipt!r})")
        return receipt

    def publish(
        self, body: bytes, queue_name: str, *, headers: Mapping[str, Any] | None = None, delay: float = 0
    ) -> None:
        """:param headers: with :attr:`RedisConfig.frames` on, stored in the SDKs' header frame around the body
            (byte for byte as Node and Python write it); off, dropped: the spec's value is the bare envelope, with
            nowhere to put headers (said once per binding at DEBUG; ``carries_headers`` is ``False`` then).
        :param delay: seconds before the body reaches the ready list; until then it waits in ``:delayed``."""
        key = self._key(queue_name)
        body = bytes(body)
        if headers:
            if self.config.frames:
                body = encode_frame(body, headers)
            elif not self._told_headers_dropped:
                self._told_headers_dropped = True
                logger.debug("Redis %r: headers %s not stored: frames are off for this connection (the spec's value "
                             "is the bare envelope); set frames=true to write the SDKs' header frame",
                             key, sorted(headers))
        check_sizes([body], self.config.max_message_bytes, f"Redis list {key!r}", "Redis's proto-max-bulk-len")
        with self._guard("publish", key):
            if delay > 0:
                args = ["", "", bytes(body), repr(float(delay)), secrets.token_hex(16)]
                self._settle_script(keys=[*self._keys(key, dead=True)[1:], f"{key}:delayed"], args=args)
            else:
                self.client.rpush(key, bytes(body))

    def publish_batch(self, bodies: Sequence[bytes], queue_name: str) -> None:
        """One variadic RPUSH per chunk of 1000: one round trip each, and a chunk lands whole or not at all.
        On a failure every body from the failing chunk on is reported as not delivered (a chunk whose reply
        was lost may still have landed: at-least-once)."""
        key = self._key(queue_name)
        check_sizes(bodies, self.config.max_message_bytes, f"Redis list {key!r}", "Redis's proto-max-bulk-len")
        for start in range(0, len(bodies), _CHUNK):
            try:
                with self._guard("publish a batch", key):
                    self.client.rpush(key, *(bytes(b) for b in bodies[start:start + _CHUNK]))
            except BindingError as exc:
                raise PublishBatchError(f"{exc}; {start} of {len(bodies)} bodies were delivered",
                                        range(start, len(bodies))) from exc

    def publish_remembering(self, bodies: Sequence[bytes], queue_name: str,
                            marks: Sequence[tuple[SeenStore, Sequence[str]]]) -> bool:
        """The RPUSHes and the marks' SADDs in one MULTI/EXEC transaction, when every store is a seen set of this
        binding (see :meth:`Binding.publish_remembering`). A connection lost before EXEC applies nothing; after
        it, everything (a lost reply then reports a failure for a batch that landed with its marks, which a
        re-run recognises)."""
        from .stores import RedisSeenStore

        own = [(store, keys) for store, keys in marks if isinstance(store, RedisSeenStore) and store.binding is self]
        if not bodies or len(own) < len(marks):
            return False
        key = self._key(queue_name)
        check_sizes(bodies, self.config.max_message_bytes, f"Redis list {key!r}", "Redis's proto-max-bulk-len")
        try:
            with self._guard("publish a batch and remember it", key):
                pipe = self.client.pipeline(transaction=True)
                for start in range(0, len(bodies), _CHUNK):
                    pipe.rpush(key, *(bytes(b) for b in bodies[start:start + _CHUNK]))
                for store, keys in own:
                    store.queue_adds(pipe, keys)
                pipe.execute()
        except BindingError as exc:
            raise PublishBatchError(f"{exc}; the transaction stored all of the {len(bodies)} bodies or none",
                                    range(len(bodies))) from exc
        return True

    def reserve(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        return self._take(queue_name, self._key(queue_name), timeout, dead=False)

    def _reserved(self, raws: list[bytes], queue_name: str, stem: str, processing: str) -> list[ReceivedMessage]:
        """The messages of a ``RESERVE_MANY`` reply on a ready list: reservation ``i`` (from 1) holds the token
        ``<stem><i as 8 hex>``, as the script registered it."""
        return [self._parsed(raw, queue_name, False, _Receipt(f"{stem}{index:08x}", raw, processing))
                for index, raw in enumerate(raws, 1)]

    def reserve_many(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """Up to ``limit`` messages with one script per 2000 (maintenance, then what LMOVE + a deadline member each
        does for :meth:`reserve`: the same crash recovery). A value over 1 MiB is reserved on its own by the single
        path (read in slices when it is over the decode limit) and one reply carries at most 8 MiB of values, so a
        batch of large bodies never lands in memory at once. When the list is empty, waits up to ``timeout`` for
        the first message with BLMOVE, then takes what else is ready without waiting."""
        if limit <= 0:
            return []
        source = self._key(queue_name)
        keys, vt = self._keys(source, dead=False), repr(float(self.config.visibility_timeout))
        out: list[ReceivedMessage] = []
        while len(out) < limit:
            want, stem = min(limit - len(out), MANY_CHUNK), secrets.token_hex(12)
            with self._guard("reserve", source):
                reply = self._reserve_many_script(keys=keys, args=[vt, stem, SWEEP_BATCH, want, LARGE_VALUE,
                                                                   _BATCH_REPLY_BUDGET])
            if isinstance(reply, int):  # the head is a large value: the single path reserves it
                if (message := self._take(queue_name, source, 0, dead=False)) is None:
                    break
                out.append(message)
                continue
            raws = as_bytes(reply)
            out += self._reserved(raws, queue_name, stem, keys[1])
            if len(raws) < want:  # nothing more ready now (or the batch stopped before a large value)
                break
        if out or timeout <= 0:
            return out
        message = self._take(queue_name, source, timeout, dead=False)
        if message is None:
            return []
        return [message, *(self.reserve_many(queue_name, limit - 1) if limit > 1 else ())]

    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        """The head of the first dead-letter source that has one. While all are empty it waits on the written
        list (BLMOVE) in slices of at most a second, looking at the others between slices."""
        sources = self.dead_letter_sources(queue_name)
        end = time.monotonic() + max(timeout, 0)
        while True:
            for source in sources:
                if (message := self._take(queue_name, source, 0, dead=True)) is not None:
                    return message
            if (remaining := end - time.monotonic()) < 0.01:
                return None
            wait = min(remaining, _BLOCK_SLICE) if len(sources) > 1 else remaining
            if (message := self._take(queue_name, sources[0], wait, dead=True)) is not None:
                return message

    def open_dead_letter_pipeline(self, queue_name: str, *, source: str | None = None
                                  ) -> RedisDeadLetterPipeline | None:
        """A connection on which a drain keeps reservations and acks of one of ``queue_name``'s DLQ lists
        (``source``, by default the written one) in flight, so the server reserves the next batch while the
        drain writes and syncs this one (see :class:`RedisDeadLetterPipeline`); the caller finishes or aborts it.
        ``None`` when the injected client has no connection pool to take a connection from (e.g. a cluster
        client): the drain then uses :meth:`reserve_dead_letters` and :meth:`ack_many`, one round trip each."""
        if not callable(getattr(getattr(self.client, "connection_pool", None), "get_connection", None)):
            return None
        from .pipeline import RedisDeadLetterPipeline

        return RedisDeadLetterPipeline(self, queue_name, source=source)

    def reserve_dead_letters(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        """Up to ``limit`` dead letters, from each source in order, with one script per source and 2000
        (maintenance, then what LMOVE + a deadline member each does for :meth:`reserve_dead_letter`). When every
        source is empty, waits up to ``timeout`` for the first one the single-message way, then takes what else
        is ready without waiting."""
        if limit <= 0:
            return []
        vt = repr(float(self.config.visibility_timeout))
        out: list[ReceivedMessage] = []
        for source in self.dead_letter_sources(queue_name):
            keys = self._keys(source, dead=True)
            while len(out) < limit:
                want, stem = min(limit - len(out), MANY_CHUNK), secrets.token_hex(12)
                with self._guard("reserve", source):
                    raws = as_bytes(self._reserve_many_script(keys=keys, args=[vt, stem, SWEEP_BATCH, want]))
                out.extend(DeadLetterBatch(self, queue_name, keys[1], stem, raws, want).messages())
                if len(raws) < want:  # this list has no more ready now
                    break
        if out or timeout <= 0:
            return out
        message = self.reserve_dead_letter(queue_name, timeout)
        if message is None:
            return []
        return [message, *(self.reserve_dead_letters(queue_name, limit - 1) if limit > 1 else ())]

    def ack(self, message: ReceivedMessage) -> None:
        self._settle(message, None)

    def ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        """Gated per reservation, exactly as :meth:`ack`: a member that expired and was handed out again is left
        alone. Per processing list and chunk of 2000, one script when the batch is the head of the processing
        list in reservation order (a drain's case: only the tokens travel), else one script that checks each
        reservation's own member (ZMSCORE) and removes the held ones."""
        slow: dict[tuple[str, str | None, float], list[tuple[_Receipt, bytes]]] = {}
        for keys, receipts in self._ack_calls(messages):
            with self._guard("ack reservations", keys[0]):
                done = int(self._ack_head_script(keys=keys, args=["".join(r.token for r in receipts)]))
            if done < 0:
                slow.setdefault((keys[0], None, 0.0), []).extend((receipt, b"") for receipt in receipts)
        self._settle_many(slow, "ack reservations")

    def release_many(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """:meth:`release` for many: one script per (processing list, target) and chunk, gated per member."""
        self._settle_many(self._release_groups([(message, delay) for message in messages]), "release reservations")

    def reservation_seconds(self, queue_name: str) -> float | None:
        """A reservation is swept back to the queue once ``visibility_timeout`` has passed."""
        return self.config.visibility_timeout

    def hand_back(self, messages: Sequence[ReceivedMessage], delay: float = 0) -> None:
        """Back to the end of the ready list (``:delayed`` with a delay) as the very value that was reserved: the
        body, its frame and its ``attempts`` unchanged. One script per processing list and chunk, gated per member."""
        groups = self._release_groups([(message, delay) for message in messages], counted=False)
        self._settle_many(groups, "hand back reservations")

    def settle_and_reserve(self, queue_name: str, limit: int, timeout: float = 0, *,
                           acks: Sequence[ReceivedMessage] = (),
                           releases: Sequence[tuple[ReceivedMessage, float]] = ()) -> list[ReceivedMessage]:
        """The previous batch's releases and acks and the next batch's reservation as one pipeline: one round trip
        per batch (the scripts run one after the other on the server, each atomic as on its own). Settlements
        carrying a value over 1 MiB go the separate way (:meth:`settle`, whose commands are sent in pieces)."""
        groups = self._release_groups(releases)
        large = any(len(body) > LARGE_VALUE or len(receipt.raw) > LARGE_VALUE
                    for items in groups.values() for receipt, body in items)
        if limit <= 0 or (not acks and not releases) or large:
            return super().settle_and_reserve(queue_name, limit, timeout, acks=acks, releases=releases)
        source = self._key(queue_name)
        keys, vt = self._keys(source, dead=False), repr(float(self.config.visibility_timeout))
        want, stem = min(limit, MANY_CHUNK), secrets.token_hex(12)
        settles, ack_calls = self._settle_calls(groups), self._ack_calls(acks)
        with self._guard("settle and reserve", source):
            pipe = self.client.pipeline(transaction=False)
            for call_keys, args, _count in settles:
                self._settle_many_script(keys=call_keys, args=args, client=pipe)
            for call_keys, receipts in ack_calls:
                self._ack_head_script(keys=call_keys, args=["".join(r.token for r in receipts)], client=pipe)
            self._reserve_many_script(keys=keys, args=[vt, stem, SWEEP_BATCH, want, LARGE_VALUE, _BATCH_REPLY_BUDGET],
                                      client=pipe)
            replies = pipe.execute()
        gone = sum(count - int(done) for (_k, _a, count), done in zip(settles, replies, strict=False))
        self._warn_gone(gone)
        slow: dict[tuple[str, str | None, float], list[tuple[_Receipt, bytes]]] = {}
        for (call_keys, receipts), done in zip(ack_calls, replies[len(settles):], strict=False):
            if int(done) < 0:  # not the head of the processing list: each reservation checked on its own
                slow.setdefault((call_keys[0], None, 0.0), []).extend((receipt, b"") for receipt in receipts)
        self._settle_many(slow, "ack reservations")
        reply = replies[-1]
        if isinstance(reply, int):  # the head is a large value: the single path reserves it
            return self.reserve_many(queue_name, limit, timeout)
        raws = as_bytes(reply)
        out = self._reserved(raws, queue_name, stem, keys[1])
        if not out:
            return self.reserve_many(queue_name, limit, timeout)
        if len(raws) == want and want < limit:
            out += self.reserve_many(queue_name, limit - want)
        return out

    def hold(self, messages: Sequence[ReceivedMessage], seconds: float) -> list[str]:
        """Move each reservation's deadline ``seconds`` ahead and record its stored value under its token in
        ``<processing>:held``; a receipt is the processing list's key and the token, on two lines. Ready-list
        reservations only."""
        by_list: dict[str, list[_Receipt]] = {}
        for message in messages:
            if message.from_dead_letter:
                raise BindingError("only reservations of ready messages can be held, not dead letters")
            receipt = self._receipt_of(message)
            by_list.setdefault(receipt.processing, []).append(receipt)
        for processing, receipts in by_list.items():
            args: list[Any] = [repr(float(max(seconds, 0)))]
            for receipt in receipts:
                args += [receipt.token, receipt.raw]
            with self._guard("hold reservations", processing):
                self._hold_script(keys=[f"{processing}:deadlines", f"{processing}:held"], args=args)
        return [f"{self._receipt_of(m).processing}\n{self._receipt_of(m).token}" for m in messages]

    def settle_held(self, receipts: Sequence[str], *, succeeded: bool) -> None:
        """Ack held reservations (``succeeded``) or put their values back at the end of the ready list, unchanged;
        one that expired meanwhile (and was handed out again) is left alone."""
        calls = []
        for text in receipts:
            processing, _, token = text.partition("\n")
            if not processing.endswith(":processing") or not token:
                raise BindingError(f"{text!r} is not a receipt of a held Redis reservation")
            keys = [processing, f"{processing}:deadlines", f"{processing}:held", processing[:-len(":processing")]]
            calls.append((keys, [token, "1" if succeeded else "0"]))
        if not calls:
            return
        with self._guard("settle held reservations", calls[0][0][0]):  # one round trip for them all
            pipe = self.client.pipeline(transaction=False)
            for keys, args in calls:
                self._settle_held_script(keys=keys, args=args, client=pipe)
            done = pipe.execute()
        self._warn_gone(len(calls) - sum(int(reply) for reply in done))

    def release(self, message: ReceivedMessage, delay: float = 0) -> None:
        """Back to the END of the ready list with ``attempts`` + 1 (to ``:delayed`` when ``delay`` > 0); a header
        frame keeps its headers around the bumped envelope (``bumped_body``). A message reserved from a DLQ goes
        back on the DLQ list it came from, exactly as it was stored."""
        if message.from_dead_letter:
            self._settle(message, _source_of(self._receipt_of(message)), message.body)
            return
        key = self._key(message.queue_name)
        self._settle(message, f"{key}:delayed" if delay > 0 else key, bumped_body(message), delay)

    def dead_letter(
        self, message: ReceivedMessage, reason: str, *, error: str | None = None, exception: str | None = None
    ) -> None:
        """The annotated envelope goes to the written DLQ list; a framed message's as the bare annotated envelope
        (as Node's worker does), so every DLQ reader and replay sees an envelope."""
        body: bytes | WrapperParts
        if message.envelope is None and len(message.body) > LARGE_VALUE:  # sent in parts, never held whole
            body = dead_letter_parts(message, reason, error=error, exception=exception)
        else:
            body = dead_letter_body(message, reason, error=error, exception=exception)
        self._settle(message, self.dead_letter_name(message.queue_name), body)

    def depth(self, queue_name: str) -> int:
        """LLEN of the ready list, after moving due delayed items and expired reservations onto it."""
        return self._length(self._key(queue_name), dead=False)

    def dead_letter_depth(self, queue_name: str) -> int:
        """LLEN of each DLQ source, summed (one script each, after requeueing drain reservations whose consumer
        died); a missing list counts 0."""
        return sum(self._length(source, dead=True) for source in self.dead_letter_sources(queue_name))

    def browse_dead_letters(self, queue_name: str, limit: int = 100) -> list[ReceivedMessage]:
        """LRANGE of each DLQ source in order, ``limit`` in all: nothing is reserved or removed (items under a
        drain are not listed)."""
        out: list[ReceivedMessage] = []
        for key in self.dead_letter_sources(queue_name):
            if len(out) >= limit:
                break
            with self._guard("browse", key):
                items = self.client.lrange(key, 0, limit - len(out) - 1)
            out += [self._parsed(bytes(raw), queue_name, True, source=key) for raw in items]
        return out

    def browse_dead_letter_raws(self, queue_name: str, start: int, stop: int, *,
                                source: str | None = None) -> list[bytes]:
        """The stored bytes of DLQ elements ``start``..``stop`` - 1 (LRANGE), without building messages: a browse
        drain writes only the bytes, and decoding each into a :class:`ReceivedMessage` cost more than the rest
        of the copy. Nothing is reserved or removed.

        :param source: positions within this DLQ list; ``None``: over every source in order (an LLEN each)."""
        if stop <= start:
            return []
        if source is not None:
            with self._guard("browse", source):
                items = self.client.lrange(source, start, stop - 1)
            return [raw if raw.__class__ is bytes else bytes(raw) for raw in items]
        out: list[bytes] = []
        for key in self.dead_letter_sources(queue_name):
            with self._guard("count", key):
                length = int(self.client.llen(key))
            if start < length and stop > 0:
                out += self.browse_dead_letter_raws(queue_name, max(start, 0), min(stop, length), source=key)
            start, stop = start - length, stop - length
            if stop <= 0:
                break
        return out

    def queue_names(self, limit: int = 200) -> list[str]:
        """The queues of the lists under the key prefix (``SCAN`` of at most 10,000 keys, ``TYPE list``): a ready
        list names its queue, a dead-letter list (the written suffix, or a suffix entry of ``dead_letter_sources``)
        and a processing list name theirs."""
        prefix, entries = self.config.key_prefix, self.config.dead_letter_sources
        assert isinstance(entries, tuple)  # normalised by RedisConfig
        suffixes = [self.config.dead_letter_suffix, *(entry for entry in entries
                                                      if entry[:1] in ".:-_" and "{" not in entry)]
        pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + "*"
        names: set[str] = set()
        with self._guard("list queues", prefix + "*"):
            for scanned, key in enumerate(self.client.scan_iter(match=pattern, count=1000, _type="list")):
                if scanned >= 10_000:
                    break
                name = (key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key))[len(prefix):]
                name = name.removesuffix(":processing")
                for suffix in suffixes:
                    if name.endswith(suffix) and len(name) > len(suffix):
                        name = name[: -len(suffix)]
                        break
                if name:
                    names.add(name)
        return sorted(names)[:limit]

    def dead_letters_failed_since(self, queue_name: str, since_ms: int, *,
                                  max_scan: int = 20_000) -> tuple[int, bool]:
        """Each DLQ list read from its tail (its newest) in LRANGE chunks until a dead letter that failed before
        ``since_ms``: a list holds its dead letters in the order they failed, so the read costs what arrived, not
        the depth. A body without ``failed_at`` neither counts nor stops the read."""
        from ...core.fingerprint import read_dead_letter

        count = scanned = 0
        for key in self.dead_letter_sources(queue_name):
            end = -1
            while True:
                with self._guard("browse", key):
                    items = self.client.lrange(key, end - 499, end)
                for raw in reversed(items):
                    failed_at = read_dead_letter(bytes(raw)).failed_at
                    scanned += 1
                    if failed_at is not None and failed_at < since_ms:
                        break
                    count += failed_at is not None
                    if scanned >= max_scan:
                        return count, False
                else:
                    if len(items) == 500:
                        end -= 500
                        continue
                break
        return count, True

    def discard_dead_letters(self, queue_name: str, bodies: Sequence[bytes]) -> int:
        """LREM of one copy per body, source list after source list (the first that held it)."""
        removed = 0
        keys = self.dead_letter_sources(queue_name)
        for body in bodies:
            for key in keys:
                with self._guard("remove a dead letter", key):
                    if self.client.lrem(key, 1, bytes(body)):
                        removed += 1
                        break
        return removed

    def seen_store(self, name: str) -> RedisSeenStore:
        from .stores import RedisSeenStore

        return RedisSeenStore(self, name)

    def ping(self) -> None:
        with self._guard("PING", "-"):
            self.client.ping()

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

