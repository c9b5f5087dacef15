"""Azure Service Bus: its config, the native projection, attempts and dead-letter rules (wire) and the binding."""

from __future__ import annotations

from .binding import (
    AzureServiceBusBinding,
)
from .config import AzureServiceBusConfig
from .wire import (
    DEAD_LETTER_SUBQUEUE,
    MAX_DEAD_LETTER_TEXT,
    application_properties,
    dead_letter_description,
    message_fields,
    native_dead_letter_body,
    outgoing_message,
    parse_dead_letter_description,
    received_message,
    reconcile_attempts,
    service_delivery_count,
)

__all__ = [
    "AzureServiceBusBinding",
    "AzureServiceBusConfig",
    "DEAD_LETTER_SUBQUEUE",
    "MAX_DEAD_LETTER_TEXT",
    "application_properties",
    "dead_letter_description",
    "message_fields",
    "native_dead_letter_body",
    "outgoing_message",
    "parse_dead_letter_description",
    "received_message",
    "reconcile_attempts",
    "service_delivery_count",
]
