"""Apache Pulsar: its config, topics, properties and attempts (wire), the admin API behind the counts, the binding."""

from __future__ import annotations

from .binding import (
    PulsarBinding,
)
from .config import PulsarConfig
from .wire import (
    CLIENT_HINTS,
    DEFAULT_MAX_MESSAGE_BYTES,
    MIRROR,
    PROJECTED,
    Hold,
    Receipt,
    dead_letter_topic,
    delay_millis,
    message_key,
    message_properties,
    outgoing_properties,
    partition_key,
    property_attempts,
    ready_count,
    received,
    reconcile_attempts,
    stats_path,
    topic_name,
)

__all__ = [
    "CLIENT_HINTS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Hold",
    "MIRROR",
    "PROJECTED",
    "PulsarBinding",
    "PulsarConfig",
    "Receipt",
    "dead_letter_topic",
    "delay_millis",
    "message_key",
    "message_properties",
    "outgoing_properties",
    "partition_key",
    "property_attempts",
    "ready_count",
    "received",
    "reconcile_attempts",
    "stats_path",
    "topic_name",
]
