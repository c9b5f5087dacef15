"""RabbitMQ on the default exchange: the AMQP projection (wire) and the binding."""

from __future__ import annotations

from .binding import (
    RabbitMQBinding,
)
from .wire import (
    MAX_BODY,
    MIRROR,
    RabbitMQConfig,
    amqp_properties,
)

__all__ = [
    "MAX_BODY",
    "MIRROR",
    "RabbitMQBinding",
    "RabbitMQConfig",
    "amqp_properties",
]
