"""Redis lists in the cross-SDK layout: its config, the binding, its Lua scripts, drain pipeline and seen-set."""

from __future__ import annotations

from .binding import (
    DeadLetterBatch,
    RedisBinding,
)
from .config import RedisConfig

__all__ = [
    "DeadLetterBatch",
    "RedisBinding",
    "RedisConfig",
]
