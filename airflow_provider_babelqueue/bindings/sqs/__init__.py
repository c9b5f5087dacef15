"""Amazon SQS: its config, the message-attribute projection and attempts rule (wire) and the binding."""

from __future__ import annotations

from .binding import (
    BODY_ENCODING_ATTRIBUTE,
    SqsBinding,
    dead_letter_queue_name,
    message_attributes,
    reconcile_attempts,
)
from .config import SqsConfig

__all__ = [
    "BODY_ENCODING_ATTRIBUTE",
    "SqsBinding",
    "SqsConfig",
    "dead_letter_queue_name",
    "message_attributes",
    "reconcile_attempts",
]
