"""Triggers for deferrable sensors and event-driven (AssetWatcher) DAGs."""

from __future__ import annotations

from .messages import BabelQueueMessageTrigger
from .queue import BabelQueueDeadLetterTrigger, BabelQueueDepthTrigger

__all__ = ["BabelQueueDeadLetterTrigger", "BabelQueueDepthTrigger", "BabelQueueMessageTrigger"]
