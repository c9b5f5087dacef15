"""The Service Bus binding's configuration: where the namespace is, how we authenticate, where dead letters go.

Checked when built (exactly one way to authenticate, Service Bus's own limits on lock duration and delivery
count), so a wrong connection extra fails where it is configured, not at the first receive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..base import Binding
from .wire import DEAD_LETTER_SUBQUEUE

__all__ = ["DEFAULT_DEAD_LETTER_SOURCES", "AzureServiceBusConfig"]


_SUFFIX = re.compile(r"[A-Za-z0-9._-]{1,50}")


#: What DLQ reads take in besides the written DLQ unless configured: the native sub-queue and the plain
#: ``<queue>.dlq`` queue the official SDKs' apps write.
DEFAULT_DEAD_LETTER_SOURCES = (f"/{DEAD_LETTER_SUBQUEUE}", ".dlq")


@dataclass(frozen=True, slots=True)
class AzureServiceBusConfig:
    """Where the namespace is, how we authenticate, and where dead letters go.

    :param connection_string: a namespace connection string (SAS key or SAS token). Kept out of ``repr`` and
        errors. Give it or ``fully_qualified_namespace``, not both.
    :param fully_qualified_namespace: e.g. ``contoso.servicebus.windows.net``: authenticate with
        ``DefaultAzureCredential`` (workload or managed identity, environment, Azure CLI), the better choice
        in production. Needs the Azure Service Bus Data Sender/Receiver roles, and Data Owner for the counts.
    :param native_dead_letter: ``True``: dead letters go to the queue's ``$DeadLetterQueue`` sub-queue with
        DeadLetterReason / DeadLetterErrorDescription set. ``False``: an annotated copy is sent to the plain
        queue ``<queue><dead_letter_queue_suffix>`` (the official SDKs' apps' layout) and the original completed.
    :param dead_letter_queue_suffix: a plain dead-letter queue ``<queue><suffix>`` (``.dlq`` for the SDKs' apps):
        where dead letters are written when ``native_dead_letter`` is off, and read (after the sources below)
        whenever it is set.
    :param dead_letter_sources: the DLQs *read* besides the written one (always read, first): suffixes
        (``/$DeadLetterQueue`` is the native sub-queue, ``.dlq`` a plain queue), ``{queue}`` templates or full
        names, as a list or comma text. The default reads the sub-queue and the SDKs' plain ``<queue>.dlq``; a
        plain queue that does not exist reads as empty and is never created by a read.
    :param create_queues: create missing queues on first use (needs Manage rights); off: a missing queue is an
        error naming it (queues are usually provisioned with the namespace, by IaC).
    :param lock_duration: seconds of PeekLock for queues we create (Service Bus allows 5-300; ``None`` = its
        default, 60). A reservation not settled within it comes back with DeliveryCount + 1.
    :param max_delivery_count: for queues we create; Service Bus dead-letters a message delivered this often
        (``MaxDeliveryCountExceeded``). ``None`` = its default, 10.
    :param min_receive_wait: seconds a ``reserve(timeout=0)`` still waits: Service Bus has no "take if ready",
        a receive asks for a message and the broker sends one if it has one, which takes a round trip.
    :param duplicate_detection: the queues have RequiresDuplicateDetection: a release copy then gets the MessageId
        ``<meta.id>:<attempts>``, since Service Bus drops a second message with the same MessageId (meta.id)
        inside its detection window, and the retry would be lost.
    :param use_websockets: AMQP over WebSockets on port 443, for networks that block 5671.
    :param connection_verify: a CA bundle to verify TLS with (AMQP and the HTTPS management API), e.g. behind a
        TLS-inspecting proxy; ``None`` = the bundled certifi roots.
    """

    connection_string: str | None = field(default=None, repr=False)
    fully_qualified_namespace: str | None = None
    native_dead_letter: bool = True
    dead_letter_queue_suffix: str | None = None
    dead_letter_sources: tuple[str, ...] | str | None = DEFAULT_DEAD_LETTER_SOURCES
    create_queues: bool = False
    lock_duration: float | None = None
    max_delivery_count: int | None = None
    min_receive_wait: float = 0.2
    duplicate_detection: bool = False
    use_websockets: bool = False
    connection_verify: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dead_letter_sources", Binding.source_entries(self.dead_letter_sources))
        for bad, problem in (
            (
                bool(self.connection_string) == bool(self.fully_qualified_namespace),
                "give connection_string or fully_qualified_namespace (DefaultAzureCredential), exactly one",
            ),
            (
                self.dead_letter_queue_suffix is not None and not _SUFFIX.fullmatch(self.dead_letter_queue_suffix),
                "dead_letter_queue_suffix must be 1-50 letters, digits, '.', '-' or '_'",
            ),
            (
                not self.native_dead_letter and not self.dead_letter_queue_suffix,
                "native_dead_letter=False needs dead_letter_queue_suffix (the plain queue dead letters go to)",
            ),
            (not 0 < (self.lock_duration or 1) <= 300, "lock_duration must be more than 0 and at most 300 s"),
            (not 1 <= (self.max_delivery_count or 1) <= 2000, "max_delivery_count must be 1-2000"),
            (not 0.01 <= self.min_receive_wait <= 10, "min_receive_wait must be 0.01-10 s"),
        ):
            if bad:
                raise ValueError(problem)

    @property
    def namespace(self) -> str:
        """The namespace host (from the connection string's Endpoint), for messages; never a secret."""
        if self.fully_qualified_namespace:
            return self.fully_qualified_namespace
        found = re.search(r"(?i)(?:^|;)\s*Endpoint\s*=\s*[a-z]+://([^/;]+)", self.connection_string or "")
        return found.group(1) if found else "(namespace from the connection string)"
