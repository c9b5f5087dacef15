"""RabbitMQ on the default exchange: its config, the AMQP projection (wire) and the binding."""

from __future__ import annotations

from .binding import (
    RabbitMQBinding,
)
from .config import RabbitMQConfig
from .wire import (
    MAX_BODY,
    MIRROR,
    amqp_properties,
)

__all__ = [
    "MAX_BODY",
    "MIRROR",
    "RabbitMQBinding",
    "RabbitMQConfig",
    "amqp_properties",
]
