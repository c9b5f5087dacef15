"""RabbitMQ pieces that need no connection: the contract projection and the batch confirmer.

The broker's conformance rules as pure functions, so the conformance tests run them without a broker;
:mod:`.binding` applies them to a live client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core import envelope as bq
from ..message import parse_body

__all__ = ["MAX_BODY", "MIRROR", "amqp_properties", "confirmed_batch"]

#: RabbitMQ's default ``max_message_size``: a larger body is refused before anything is sent.
MAX_BODY = 128 * 1024 * 1024
#: Prefix of the received properties mirrored into ``ReceivedMessage.headers`` (dropped again on publish).
MIRROR = "amqp."
_CONTRACT = ("x-schema-version", "x-source-lang", "x-attempts")
#: Written by the broker (native dead-lettering, quorum queues): never forwarded on a republish.
_BROKER_HEADERS = ("x-death", "x-first-death-", "x-last-death-", "x-delivery-count")
_CONFIRM_TIMEOUT = 120.0  # longest wait for a batch's confirms


def _int64(value: Any) -> bool:
    return value.__class__ is int and -(2**63) <= value < 2**63


def amqp_properties(
    envelope_or_body: Mapping[str, Any] | bytes, headers: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The AMQP properties of one message as plain values (pure: the conformance test needs no broker).

    ``type`` = URN, ``correlation_id`` = trace_id, ``message_id`` = meta.id, ``app_id`` ``babelqueue``, the
    native-typed headers ``x-schema-version`` (int), ``x-source-lang`` (str), ``x-attempts`` (int), plus
    persistence and ``content_encoding`` ``utf-8`` like the official SDK. ``headers`` join the table but never
    replace a contract header; ``amqp.*`` mirrors and broker-written headers are dropped, so a received
    message's headers forward safely. An undecodable body gets the content type and persistence only:
    there is nothing to project. A string over AMQP's 255-byte short-string limit is left out rather than
    failing the publish (the body stays authoritative).
    """
    env = envelope_or_body if isinstance(envelope_or_body, Mapping) else parse_body(bytes(envelope_or_body))[0]
    table = {str(k): v for k, v in (headers or {}).items() if not str(k).startswith((MIRROR, *_BROKER_HEADERS))}
    props: dict[str, Any] = {"content_type": "application/json", "delivery_mode": 2}
    if env is not None:
        raw_meta = env.get("meta")
        meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
        props["content_encoding"] = "utf-8"
        for name, value in (
            ("type", bq.urn_of(env)),
            ("correlation_id", env.get("trace_id")),
            ("message_id", meta.get("id")),
        ):
            if isinstance(value, str) and value and len(value.encode("utf-8", "surrogatepass")) <= 255:
                props[name] = value
        props["app_id"] = "babelqueue"
        attempts = env.get("attempts", 0)
        contract = {
            "x-schema-version": meta.get("schema_version"),
            "x-source-lang": meta.get("lang"),
            "x-attempts": attempts if _int64(attempts) and attempts >= 0 else 0,
        }
        table = {k: v for k, v in table.items() if k not in _CONTRACT}
        table.update((k, v) for k, v in contract.items() if (isinstance(v, str) if k == "x-source-lang" else _int64(v)))
    if table:
        props["headers"] = table
    return props









def confirmed_batch(
    pika: Any, parameters: Any, queue: str, bodies: list[bytes], props: list[Any]
) -> tuple[list[int], str]:
    """Publish a batch on a fresh asynchronous connection and collect its confirms as they stream back.

    pika's ``BlockingChannel`` in confirm mode waits a round trip per message (about 1,100 msg/s here); this
    runs at the speed of unconfirmed publishing and still knows which body was acked, nacked or returned
    (delivery tags count the channel's publishes from 1). Returns the indexes not confirmed, and why.
    """
    outcome: list[str | None] = [None] * len(bodies)
    returned: set[int] = set()
    low, pending, next_return, opened, error = 1, len(bodies), 0, False, None

    def on_confirm(frame: Any) -> None:
        nonlocal low, pending
        method, ok = frame.method, isinstance(frame.method, pika.spec.Basic.Ack)
        for tag in range(low, method.delivery_tag + 1) if method.multiple else (method.delivery_tag,):
            if 0 < tag <= len(outcome) and outcome[tag - 1] is None:
                outcome[tag - 1] = ("returned" if tag - 1 in returned else "ok") if ok else "nacked"
                pending -= 1
        while low <= len(outcome) and outcome[low - 1] is not None:
            low += 1
        if not pending:
            conn.ioloop.stop()

    def on_return(_channel: Any, _method: Any, _props: Any, body: bytes) -> None:
        nonlocal next_return  # a Basic.Return has no delivery tag, but precedes its ack, in publish order
        for index in range(next_return, len(bodies)):
            if bodies[index] == body and outcome[index] is None:
                returned.add(index)
                next_return = index + 1
                return

    def on_channel(channel: Any) -> None:
        channel.add_on_close_callback(on_closed)
        channel.add_on_return_callback(on_return)
        channel.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda _frame: publish_all(channel))

    def publish_all(channel: Any) -> None:
        nonlocal opened
        opened = True
        for body, prop in zip(bodies, props, strict=True):
            channel.basic_publish("", queue, body, prop, mandatory=True)

    def on_closed(_source: Any, exc: BaseException) -> None:
        nonlocal error
        error = error or exc
        conn.ioloop.stop()

    conn = pika.SelectConnection(
        parameters,
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_open_error_callback=on_closed,
        on_close_callback=on_closed,
    )
    try:
        timer = conn.ioloop.call_later(_CONFIRM_TIMEOUT, conn.ioloop.stop)
        conn.ioloop.start()
        conn.ioloop.remove_timeout(timer)
        if not opened:
            raise error or pika.exceptions.AMQPConnectionError("timed out opening a connection")
        failed = [i for i, result in enumerate(outcome) if result != "ok"]
        why = {outcome[i] or "unconfirmed" for i in failed}
        if error is not None or pending:
            why.add(f"connection lost: {error}" if error else f"no confirm within {_CONFIRM_TIMEOUT:.0f} s")
        return failed, ", ".join(sorted(why))
    finally:
        if conn.is_open:
            conn.close()
            conn.ioloop.call_later(5.0, conn.ioloop.stop)
            conn.ioloop.start()  # until on_closed (or 5 s)
        conn.ioloop.close()
