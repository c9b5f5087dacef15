"""Redis lists in the cross-SDK layout: the binding, its Lua scripts, its drain pipeline and its seen-set."""

from __future__ import annotations

from .binding import (
    DeadLetterBatch,
    RedisBinding,
    RedisConfig,
)

__all__ = [
    "DeadLetterBatch",
    "RedisBinding",
    "RedisConfig",
]
