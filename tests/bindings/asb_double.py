"""An Azure Service Bus test double: AMQP 1.0 on python-qpid-proton, plus the HTTPS management feed (tests only).

There is no Service Bus emulator without Docker, so this small server stands in for a namespace. The UNMODIFIED
azure-servicebus SDK talks to it through a connection string with ``UseDevelopmentEmulator=true`` (plain AMQP,
the port kept), and the unmodified ``ServiceBusAdministrationClient`` through HTTPS on the same port: the SDK
sends management calls to ``https://<Endpoint host:port>`` even for the emulator, so the first byte of each
accepted connection decides (0x16, a TLS ClientHello → HTTPS; anything else → AMQP). The certificate is
self-signed for 127.0.0.1; the binding's ``connection_verify`` (a CA bundle option real deployments use behind
TLS-inspecting proxies) points at it. Nothing in the binding knows it talks to a double.

What it does, as Service Bus does it:

* ``$cbs`` put-token is answered (202), SASL ANONYMOUS is accepted.
* Sends: single messages and SDK batches (message format 0x80013700: one AMQP message whose data sections each
  hold an encoded message) are split into messages; the link advertises 256 KiB (the Standard tier) as
  max-message-size, which is what the SDK sizes ``ServiceBusMessageBatch`` by. The sections a sender wrote
  (properties, application properties, body) are stored and delivered byte for byte.
* PeekLock receive: each delivery has a fresh 16-byte UUID delivery tag (the SDK's lock token), the
  annotations ``x-opt-sequence-number``, ``x-opt-enqueued-time`` and ``x-opt-locked-until``, and the header
  ``delivery-count`` 0 on the first delivery (the AMQP count of earlier failed attempts; .NET shows it + 1).
* Outcomes, echoed back because the SDK settles in receiver-settle-mode second: accepted = complete;
  modified with delivery-failed = abandon (delivery count + 1); released = back without a count; rejected =
  dead-letter to ``<queue>/$DeadLetterQueue`` with the application properties ``DeadLetterReason`` and
  ``DeadLetterErrorDescription`` from the rejection's error info. A settle after the lock expired is answered
  ``com.microsoft:message-lock-lost``. Locks expire after the queue's LockDuration (the message comes back with
  delivery count + 1); MaxDeliveryCount dead-letters with ``MaxDeliveryCountExceeded``.
* ``x-opt-scheduled-enqueue-time`` holds a message back until then (counted as scheduled meanwhile).
* Receivers on ``<queue>/$DeadLetterQueue`` (any case); ``com.microsoft:peek-message`` on ``<entity>/$management``.
* HTTPS ATOM: GET ``/<queue>`` (QueueDescription with CountDetails: ActiveMessageCount counts available and
  locked messages, as on Service Bus), GET ``/$Resources/queues`` (the list), PUT (create with LockDuration and
  MaxDeliveryCount, 409 when it exists), DELETE. An unknown queue reads as the empty feed Service Bus returns;
  an AMQP link to it is refused as Service Bus does (an attach with a null terminus, then a detach with
  ``amqp:not-found``), so the SDK raises MessagingEntityNotFoundError. Errors carry an info map (a tracking
  id): the SDK reads one and hangs on a send rejection without it.

Fidelity limits: tokens are not checked (any SAS or Entra token is accepted); one namespace, queues only (no
topics, subscriptions, sessions, partitions, duplicate detection, deferral, transactions, TTL expiry or auto
forwarding); the only management operation over AMQP is peek (no renew-lock, no schedule/cancel, no
update-disposition fallback); batch detection reads the structure (an outer message without application
properties whose every data section is itself an encoded AMQP message), since proton does not expose the
transfer's message format; ``released`` never counts a delivery (AMQP's meaning; the SDK releases what arrives
outside a receive call); a peek also returns scheduled messages; limits such as the 5 s minimum LockDuration,
quotas and throttling are not enforced; the DLQ keeps the message's original sequence number; timers (lock
expiry, schedules) tick every 20 ms.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import heapq
import http.server
import re
import select
import socket
import ssl
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cproton import bytes2pybytes, lib
from proton import (
    Collector,
    Condition,
    Connection,
    Data,
    Delivery,
    Described,
    Event,
    Message,
    Terminus,
    Transport,
    int32,
    symbol,
    timestamp,
    uint,
    ulong,
)

__all__ = ["AsbDouble", "shared_double"]

MAX_MESSAGE_BYTES = 262_144
_HEADER, _ANNOTATIONS, _PROPERTIES, _APPLICATION, _DATA = 0x70, 0x72, 0x73, 0x74, 0x75
_DLQ = "/$deadletterqueue"
_ATOM, _SB = "http://www.w3.org/2005/Atom", "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"


@dataclass(eq=False)
class _Stored:
    seq: int
    annotations: dict[Any, Any]
    properties: bytes  # the sender's properties section, byte for byte
    application: bytes  # the sender's application-properties section
    rest: bytes  # body sections and footer
    enqueued_ms: int
    delivery_count: int = 0  # the AMQP header's: earlier failed deliveries
    visible_ms: int = 0

    def __lt__(self, other: _Stored) -> bool:
        return self.seq < other.seq


@dataclass(eq=False)
class _Entity:
    name: str
    lock_duration: float = 60.0
    max_delivery_count: int = 10
    ready: list[_Stored] = field(default_factory=list)  # a heap by sequence number: Service Bus's order
    scheduled: list[_Stored] = field(default_factory=list)
    locked: dict[bytes, tuple[_Stored, float]] = field(default_factory=dict)
    dead: _Entity | None = None
    transfers: int = 0  # AMQP transfers received (an SDK batch is one)
    created: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))


def _sections(raw: bytes) -> list[tuple[int, bytes, Any]]:
    """``(descriptor, encoded bytes, decoded value)`` of each section of an encoded AMQP message."""
    out, pos = [], 0
    while pos < len(raw):
        data = Data()
        size = data.decode(raw[pos:])
        data.rewind()
        data.next()
        value = data.get_object()
        if not isinstance(value, Described) or size <= 0:
            raise ValueError("not an AMQP message section")
        out.append((int(value.descriptor), bytes(raw[pos : pos + size]), _own(value.value)))
        pos += size
    return out


def _own(value: Any) -> Any:
    """Copy proton's binary views (they point into the decoder's buffer, freed with it) into bytes."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return {_own(k): _own(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_own(v) for v in value]
    return value


def _error(name: str, description: str) -> Condition:
    """An error as Service Bus sends it: with an info map (the SDK reads ``info`` and fails without one)."""
    return Condition(name, description, {symbol("com.microsoft:tracking-id"): uuid.uuid4().hex})


def _encode(*values: Any) -> bytes:
    data = Data()
    for value in values:
        data.put_object(value)
    return bytes(data.encode())


def _iso_seconds(text: str | None, default: float) -> float:
    match = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:([\d.]+)S)?)?", (text or "").strip())
    if not text or not match:
        return default
    d, h, m, s = (float(g or 0) for g in match.groups())
    return ((d * 24 + h) * 60 + m) * 60 + s


class AsbDouble:
    """One in-process namespace on ``127.0.0.1:<port>``; :meth:`start` it, use :attr:`connection_string`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.entities: dict[str, _Entity] = {}
        self._seq = 0
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._dir = tempfile.TemporaryDirectory(prefix="asb-double-")
        self.ca_file = str(Path(self._dir.name) / "cert.pem")
        self._tls = self._certificate()
        self._conns: dict[socket.socket, tuple[Transport, Connection, Collector]] = {}
        self._links: dict[Any, tuple[str, str]] = {}  # proton link → (kind, entity or node key)
        self._replies: dict[tuple[Any, str], Any] = {}  # (connection, node) → our sending link
        self._outbox: dict[Any, list[bytes]] = {}
        self._new: list[socket.socket] = []
        self._partial: dict[tuple[Any, bytes], bytes] = {}  # multi-frame transfers being received
        self._new_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="asb-double", daemon=True)

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://127.0.0.1:{self.port};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )

    def start(self) -> AsbDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        self._dir.cleanup()

    # ------------------------------------------------------------------------------------- state

    def create_queue(self, name: str, lock_duration: float = 60.0, max_delivery_count: int = 10) -> bool:
        with self.lock:
            if name.lower() in self.entities:
                return False
            self.entities[name.lower()] = _Entity(
                name, lock_duration, max_delivery_count, dead=_Entity(name + "/$DeadLetterQueue", lock_duration)
            )
            return True

    def delete_queue(self, name: str) -> bool:
        with self.lock:
            return self.entities.pop(name.lower(), None) is not None

    def entity(self, path: str) -> _Entity | None:
        """The queue or its dead-letter sub-queue for an address (``amqp://host/q``, ``q/$DeadLetterQueue``)."""
        path = path.split("://", 1)[1].split("/", 1)[1] if "://" in path else path
        path = path.lower().removesuffix("/$management")
        queue = self.entities.get(path.removesuffix(_DLQ))
        return queue.dead if queue is not None and path.endswith(_DLQ) else queue

    def counts(self, name: str) -> dict[str, int] | None:
        with self.lock:
            if (queue := self.entities.get(name.lower())) is None:
                return None
            dead = queue.dead
            assert dead is not None
            return {
                "ActiveMessageCount": len(queue.ready) + len(queue.locked),
                "DeadLetterMessageCount": len(dead.ready) + len(dead.locked),
                "ScheduledMessageCount": len(queue.scheduled),
                "TransferMessageCount": 0,
                "TransferDeadLetterMessageCount": 0,
            }

    def _store(self, entity: _Entity, raw: bytes) -> None:
        sections = _sections(raw)
        annotations = next((v for c, _, v in sections if c == _ANNOTATIONS), None) or {}
        part = {c: b for c, b, _ in sections if c in (_PROPERTIES, _APPLICATION)}
        self._seq += 1
        now = int(time.time() * 1000)
        at = annotations.get(symbol("x-opt-scheduled-enqueue-time"))
        at = int(at.timestamp() * 1000) if isinstance(at, dt.datetime) else int(at or 0)
        stored = _Stored(
            self._seq,
            dict(annotations),
            part.get(_PROPERTIES, b""),
            part.get(_APPLICATION, b""),
            b"".join(b for c, b, _ in sections if c > _APPLICATION),
            now,
            visible_ms=at,
        )
        if at > now:
            entity.scheduled.append(stored)
        else:
            heapq.heappush(entity.ready, stored)

    @staticmethod
    def _messages(raw: bytes) -> list[bytes]:
        """The messages in one transfer: an SDK batch's data sections, else the transfer itself."""
        sections = _sections(raw)
        data = [bytes(v) for c, _, v in sections if c == _DATA]
        if not data or any(c == _APPLICATION for c, _, _ in sections):
            return [raw]
        try:
            inner = [[c for c, _, _ in _sections(d)] for d in data]
        except Exception:  # noqa: BLE001 - proton raises its own DataException for bytes that are not AMQP
            return [raw]
        if all(codes and set(codes) <= set(range(_HEADER, 0x79)) and _DATA <= codes[-1] for codes in inner):
            return data
        return [raw]

    def _dead_letter(self, entity: _Entity, stored: _Stored, reason: str | None, description: str | None) -> None:
        if entity.dead is None:  # a message on a DLQ is not dead-lettered again; it stays there
            heapq.heappush(entity.ready, stored)
            return
        application = dict(_sections(stored.application)[0][2] or {}) if stored.application else {}
        for key, value in (("DeadLetterReason", reason), ("DeadLetterErrorDescription", description)):
            if value is not None:
                application[key] = value
        stored.application = _encode(Described(ulong(_APPLICATION), application))
        heapq.heappush(entity.dead.ready, stored)

    def _return(self, entity: _Entity, stored: _Stored, failed: bool) -> None:
        if failed:
            stored.delivery_count += 1
            if entity.dead is not None and stored.delivery_count >= entity.max_delivery_count:
                text = f"Message could not be consumed after {entity.max_delivery_count} delivery attempts."
                self._dead_letter(entity, stored, "MaxDeliveryCountExceeded", text)
                return
        heapq.heappush(entity.ready, stored)

    def _tick(self) -> None:
        now = time.time()
        for queue in list(self.entities.values()):
            for entity in (queue, queue.dead):
                assert entity is not None
                for tag, (stored, until) in list(entity.locked.items()):
                    if until <= now:
                        del entity.locked[tag]
                        self._return(entity, stored, failed=True)
                due = [s for s in entity.scheduled if s.visible_ms <= now * 1000]
                for stored in due:
                    entity.scheduled.remove(stored)
                    heapq.heappush(entity.ready, stored)

    def _wire(self, stored: _Stored, locked_until: float | None) -> bytes:
        annotations = dict(stored.annotations)
        annotations[symbol("x-opt-sequence-number")] = stored.seq
        annotations[symbol("x-opt-enqueued-time")] = timestamp(stored.enqueued_ms)
        if locked_until is not None:
            annotations[symbol("x-opt-locked-until")] = timestamp(int(locked_until * 1000))
        header = Described(ulong(_HEADER), [True, None, None, None, uint(stored.delivery_count)])
        head = _encode(header, Described(ulong(_ANNOTATIONS), annotations))
        return head + stored.properties + stored.application + stored.rest

    # -------------------------------------------------------------------------------------- AMQP

    def _run(self) -> None:
        self._sock.settimeout(0)
        while not self._stop.is_set():
            with self._new_lock:
                for sock in self._new:
                    self._open(sock)
                self._new.clear()
            writers = [s for s, (t, _, _) in self._conns.items() if t.pending() > 0]
            readable, _, _ = select.select([self._sock, *self._conns], writers, [], 0.02)
            with self.lock:
                for sock in readable:
                    if sock is self._sock:
                        with contextlib.suppress(BlockingIOError):
                            conn, _ = self._sock.accept()
                            threading.Thread(target=self._sniff, args=(conn,), daemon=True).start()
                    elif sock in self._conns:
                        self._read(sock)
                self._tick()
                for _, _, collector in list(self._conns.values()):
                    self._dispatch(collector)
                self._pump()
                for sock, (transport, _, collector) in list(self._conns.items()):
                    self._dispatch(collector)
                    transport.tick(time.monotonic())
                    self._write(sock)
        for sock in list(self._conns):
            self._drop(sock)

    def _sniff(self, sock: socket.socket) -> None:
        """First byte 0x16 (a TLS ClientHello): the administration client's HTTPS; else AMQP for the engine."""
        sock.settimeout(10)
        try:
            first = sock.recv(1, socket.MSG_PEEK)
        except OSError:
            first = b""
        if first == b"\x16":
            self._serve_https(sock)
        elif first:
            with self._new_lock:
                self._new.append(sock)
        else:
            sock.close()

    def _open(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        transport = Transport(Transport.SERVER)
        transport.sasl().allowed_mechs("ANONYMOUS PLAIN")
        transport.require_auth(False)
        connection = Connection()
        collector = Collector()
        connection.collect(collector)
        transport.bind(connection)
        self._conns[sock] = (transport, connection, collector)

    def _read(self, sock: socket.socket) -> None:
        transport = self._conns[sock][0]
        capacity = transport.capacity()
        try:
            data = sock.recv(max(capacity, 1)) if capacity > 0 else b""
        except OSError:
            data = b""
        if data:
            transport.push(data)
        else:
            transport.close_tail()
            self._drop(sock)

    def _write(self, sock: socket.socket) -> None:
        transport = self._conns[sock][0]
        pending = transport.pending()
        if pending < 0:
            self._drop(sock)
            return
        if pending:
            try:
                sent = sock.send(transport.peek(pending))
                transport.pop(sent)
            except BlockingIOError:
                pass
            except OSError:
                self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        entry = self._conns.pop(sock, None)
        if entry is not None:
            connection = entry[1]
            for link in [link for link in self._links if link.connection == connection]:
                self._links.pop(link, None)
                self._outbox.pop(link, None)
            for key in [k for k in self._replies if k[0] == connection]:
                del self._replies[key]
        with contextlib.suppress(OSError):
            sock.close()

    def _dispatch(self, collector: Collector) -> None:
        while (event := collector.peek()) is not None:
            kind = event.type
            if kind == Event.CONNECTION_REMOTE_OPEN:
                event.connection.container = "asb-double"
                event.connection.open()
            elif kind == Event.CONNECTION_REMOTE_CLOSE:
                event.connection.close()
            elif kind == Event.SESSION_REMOTE_OPEN:
                event.session.open()
            elif kind == Event.SESSION_REMOTE_CLOSE:
                event.session.close()
            elif kind == Event.LINK_REMOTE_OPEN:
                self._attach(event.link)
            elif kind == Event.LINK_REMOTE_CLOSE:
                self._links.pop(event.link, None)
                self._outbox.pop(event.link, None)
                event.link.close()
            elif kind == Event.DELIVERY:
                if event.link.is_receiver:
                    self._incoming(event.delivery)
                else:
                    self._outcome(event.delivery)
            collector.pop()

    def _attach(self, link: Any) -> None:
        link.snd_settle_mode, link.rcv_settle_mode = link.remote_snd_settle_mode, link.remote_rcv_settle_mode
        address = (link.remote_target if link.is_receiver else link.remote_source).address or ""
        node = address.split("://", 1)[1].split("/", 1)[1] if "://" in address else address
        if node.lower() == "$cbs" or node.lower().endswith("/$management"):
            kind = "cbs" if node.lower() == "$cbs" else "management"
            if kind == "management" and self.entity(node) is None:
                return self._refuse(link, node)
            link.source.copy(link.remote_source)
            link.target.copy(link.remote_target)
            link.open()
            self._links[link] = (kind, node.lower())
            if link.is_receiver:
                link.flow(100)
            else:
                self._replies[(link.connection, node.lower())] = link
            return None
        if self.entity(node) is None:
            return self._refuse(link, node)
        if link.is_receiver and node.lower().endswith(_DLQ):
            return self._refuse(link, node, "amqp:not-allowed", "Cannot send to a dead-letter sub-queue.")
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.open()
        self._links[link] = ("queue", node.lower())
        if link.is_receiver:
            link.max_message_size = MAX_MESSAGE_BYTES
            link.flow(1000)
        return None

    @staticmethod
    def _refuse(link: Any, node: str, name: str = "amqp:not-found", text: str = "") -> None:
        """As Service Bus refuses a link: an attach with a null terminus, then a detach with the error."""
        link.source.type = link.target.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = _error(name, text or f"The messaging entity '{node}' could not be found.")
        link.close()

    def _incoming(self, delivery: Any) -> None:
        link = delivery.link
        if not delivery.readable:
            return
        key = (link, bytes2pybytes(lib.pn_delivery_tag(delivery._impl)))
        self._partial[key] = self._partial.get(key, b"") + (link.recv(delivery.pending) or b"")  # frees the window
        if delivery.partial:
            return
        raw = self._partial.pop(key)
        link.advance()
        kind, node = self._links.get(link, ("", ""))
        outcome, condition = Delivery.ACCEPTED, None
        if kind in ("cbs", "management"):
            self._request(link.connection, kind, node, raw)
        elif kind == "queue" and (entity := self.entity(node)) is not None:
            entity.transfers += 1
            messages = self._messages(raw)
            if any(len(m) > MAX_MESSAGE_BYTES for m in messages):
                outcome = Delivery.REJECTED
                condition = _error("amqp:link:message-size-exceeded", f"The message is over {MAX_MESSAGE_BYTES} bytes.")
            else:
                for message in messages:
                    self._store(entity, message)
        if not delivery.settled:
            delivery.local.condition = condition
            delivery.update(outcome)
            delivery.settle()
        if link.credit < 500:
            link.flow(1000 - link.credit)

    def _request(self, connection: Any, kind: str, node: str, raw: bytes) -> None:
        request = Message()
        request.decode(raw)
        operation = (request.properties or {}).get("operation")
        body: Any = None
        if kind == "cbs":
            status = {"status-code": int32(202), "status-description": "Accepted"}
        elif operation == "com.microsoft:peek-message" and (entity := self.entity(node)) is not None:
            start, count = int(request.body.get("from-sequence-number", 1)), int(request.body.get("message-count", 1))
            held = sorted([*entity.ready, *(s for s, _ in entity.locked.values()), *entity.scheduled])
            found = [s for s in held if s.seq >= start][:count]
            body = {"messages": [{"message": self._wire(s, None)} for s in found]} if found else None
            status = {"statusCode": int32(200 if found else 204), "statusDescription": "OK" if found else "No Content"}
        else:
            status = {
                "statusCode": int32(501),
                "statusDescription": f"the test double does not implement {operation!r}",
                "errorCondition": symbol("com.microsoft:not-implemented"),
            }
        reply = Message(correlation_id=request.id, properties=status, body=body)
        self._outbox.setdefault(self._replies.get((connection, node)), []).append(bytes(reply.encode()))

    def _pump(self) -> None:
        now = time.time()
        for link, (kind, node) in list(self._links.items()):
            if link.is_receiver:
                continue
            if kind in ("cbs", "management"):
                queued = self._outbox.get(link, [])
                while queued and link.credit > 0:
                    delivery = link.delivery(uuid.uuid4().bytes)
                    link.send(queued.pop(0))
                    link.advance()
                    delivery.settle()
                continue
            entity = self.entity(node)
            while entity is not None and entity.ready and link.credit > 0:
                stored = heapq.heappop(entity.ready)
                tag = uuid.uuid4().bytes  # the SDK reads it as the lock token (uuid.UUID(bytes_le=tag))
                entity.locked[tag] = (stored, now + entity.lock_duration)
                link.delivery(tag)
                link.send(self._wire(stored, now + entity.lock_duration))
                link.advance()
            if link.drain_mode and link.credit > 0:
                link.drained()

    def _outcome(self, delivery: Any) -> None:
        state = delivery.remote_state
        if not state:
            return
        kind, node = self._links.get(delivery.link, ("", ""))
        entity = self.entity(node) if kind == "queue" else None
        tag = bytes2pybytes(lib.pn_delivery_tag(delivery._impl))  # proton's Delivery.tag decodes it as UTF-8
        held = entity.locked.pop(tag, None) if entity is not None else None
        if held is None:
            delivery.local.condition = _error(
                "com.microsoft:message-lock-lost",
                "The lock supplied is invalid. Either the lock expired, or the message has already been removed.",
            )
            delivery.update(Delivery.REJECTED)
            delivery.settle()
            return
        stored = held[0]
        if state == Delivery.MODIFIED:
            self._return(entity, stored, failed=bool(delivery.remote.failed))
            delivery.local.failed = delivery.remote.failed
            delivery.local.undeliverable = delivery.remote.undeliverable
        elif state == Delivery.RELEASED:
            self._return(entity, stored, failed=False)
        elif state == Delivery.REJECTED:
            info = (delivery.remote.condition.info or {}) if delivery.remote.condition else {}
            info = {str(k): v for k, v in info.items()}
            self._dead_letter(entity, stored, info.get("DeadLetterReason"), info.get("DeadLetterErrorDescription"))
        delivery.update(state)
        delivery.settle()

    # ------------------------------------------------------------------------------------- HTTPS

    def _certificate(self) -> ssl.SSLContext:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "asb-double")])
        now = dt.datetime.now(dt.UTC)
        import ipaddress

        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        Path(self.ca_file).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file = Path(self._dir.name) / "key.pem"
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca_file, key_file)
        return context

    def _serve_https(self, sock: socket.socket) -> None:
        try:
            with self._tls.wrap_socket(sock, server_side=True) as tls:
                _Management(tls, ("127.0.0.1", 0), self)
        except (OSError, ssl.SSLError):
            pass

    def entry_xml(self, name: str) -> bytes:
        """The ATOM entry of a queue, as the management endpoint returns it."""
        with self.lock:
            queue = self.entities[name.lower()]
            counts = self.counts(name) or {}
            total = counts["ActiveMessageCount"] + counts["DeadLetterMessageCount"] + counts["ScheduledMessageCount"]
        stamp = queue.created.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        detail = "".join(f"<d2p1:{k}>{v}</d2p1:{k}>" for k, v in counts.items())
        fields = {
            "LockDuration": f"PT{queue.lock_duration:g}S",
            "MaxSizeInMegabytes": 1024,
            "RequiresDuplicateDetection": "false",
            "RequiresSession": "false",
            "DefaultMessageTimeToLive": "P10675199DT2H48M5.4775807S",
            "DeadLetteringOnMessageExpiration": "false",
            "DuplicateDetectionHistoryTimeWindow": "PT10M",
            "MaxDeliveryCount": queue.max_delivery_count,
            "EnableBatchedOperations": "true",
            "SizeInBytes": 0,
            "MessageCount": total,
            "IsAnonymousAccessible": "false",
            "Status": "Active",
            "CreatedAt": stamp,
            "UpdatedAt": stamp,
            "AccessedAt": stamp,
            "SupportOrdering": "true",
        }
        inner = "".join(f"<{k}>{v}</{k}>" for k, v in fields.items())
        return (
            f'<entry xmlns="{_ATOM}"><id>https://127.0.0.1:{self.port}/{queue.name}</id>'
            f'<title type="text">{queue.name}</title><published>{stamp}</published><updated>{stamp}</updated>'
            f'<content type="application/xml"><QueueDescription xmlns="{_SB}" '
            f'xmlns:i="http://www.w3.org/2001/XMLSchema-instance">{inner}'
            f'<CountDetails xmlns:d2p1="http://schemas.microsoft.com/netservices/2011/06/servicebus">{detail}'
            "</CountDetails><AutoDeleteOnIdle>P10675199DT2H48M5.4775807S</AutoDeleteOnIdle>"
            "<EnablePartitioning>false</EnablePartitioning><EntityAvailabilityStatus>Available"
            "</EntityAvailabilityStatus><EnableExpress>false</EnableExpress></QueueDescription></content></entry>"
        ).encode()


class _Management(http.server.BaseHTTPRequestHandler):
    """The ATOM management API for queues: GET, PUT (create), DELETE."""

    protocol_version = "HTTP/1.1"
    timeout = 30
    server: AsbDouble  # type: ignore[assignment]

    def _name(self) -> str:
        return self.path.split("?", 1)[0].strip("/")

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/atom+xml;type=entry;charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the http.server naming
        name = self._name()
        if name.lower() == "$resources/queues":  # list_queues: one page of entries
            query = dict(p.split("=", 1) for p in self.path.partition("?")[2].split("&") if "=" in p)
            skip, top = int(query.get("$skip", 0)), int(query.get("$top", 100))
            names = sorted(q.name for q in list(self.server.entities.values()))[skip : skip + top]
            entries = b"".join(self.server.entry_xml(n) for n in names)
            return self._answer(200, f'<feed xmlns="{_ATOM}"><title type="text">Queues</title>'.encode() + entries
                                + b"</feed>")
        if self.server.counts(name) is None:  # Service Bus answers an unknown entity with an empty feed
            feed = f'<feed xmlns="{_ATOM}"><title type="text">Publicly Listed Services</title></feed>'
            return self._answer(200, feed.encode())
        return self._answer(200, self.server.entry_xml(name))

    def do_PUT(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        values = {el.tag.rsplit("}", 1)[-1]: el.text for el in ET.fromstring(body).iter()} if body else {}
        lock = _iso_seconds(values.get("LockDuration"), 60.0)
        created = self.server.create_queue(self._name(), lock, int(values.get("MaxDeliveryCount") or 10))
        if not created:
            return self._answer(409, b"<Error><Code>409</Code><Detail>The entity already exists.</Detail></Error>")
        return self._answer(201, self.server.entry_xml(self._name()))

    def do_DELETE(self) -> None:  # noqa: N802
        return self._answer(200 if self.server.delete_queue(self._name()) else 404)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass


_shared: AsbDouble | None = None
_shared_lock = threading.Lock()


def shared_double() -> AsbDouble:
    """This test process's double, started on first use and stopped at interpreter exit (like the moto server)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = AsbDouble().start()
            atexit.register(_shared.stop)
        return _shared
