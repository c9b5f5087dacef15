"""A queue's ``basic.consume`` on the RabbitMQ binding: the deliveries the broker pushed and the binding has not
handed out yet (its prefetch window), in arrival order."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

__all__ = ["Prefetch"]


class Prefetch:
    """One consumer of one queue, valid on the consume channel's ``generation`` it was started on.

    :ivar prefetch: the window the consumer was started with (``basic.qos`` prefetch count).
    :ivar tag: the consumer tag ``basic.consume`` returned (for ``basic.cancel``).
    :ivar waiting: ``(method, properties, body)`` of each delivery pushed and not handed out.
    """

    __slots__ = ("generation", "prefetch", "queue_name", "tag", "waiting")

    def __init__(self, queue_name: str, generation: int, prefetch: int) -> None:
        self.queue_name, self.generation, self.prefetch, self.tag = queue_name, generation, prefetch, ""
        self.waiting: deque[tuple[Any, Any, bytes]] = deque()

    def deliver(self, _channel: Any, method: Any, properties: Any, body: bytes) -> None:
        """pika's consumer callback (run inside ``process_data_events``, under the binding's lock)."""
        self.waiting.append((method, properties, body))

    def take(self, limit: int) -> list[tuple[Any, Any, bytes]]:
        """Up to ``limit`` waiting deliveries, oldest first, removed from the window."""
        return [self.waiting.popleft() for _ in range(min(limit, len(self.waiting)))]

    def sort(self) -> None:
        """Put the window in delivery-tag order (a ``basic.get`` result joins it out of turn)."""
        self.waiting = deque(sorted(self.waiting, key=lambda delivery: delivery[0].delivery_tag))

    def tags(self) -> Iterator[int]:
        """The delivery tags still waiting."""
        return (method.delivery_tag for method, _, _ in self.waiting)
