"""Sensors for queue depth and dead-letter arrival; they work with every BabelQueue connection."""

from __future__ import annotations

from .queue import BabelQueueDeadLetterSensor, BabelQueueQueueDepthSensor

__all__ = ["BabelQueueDeadLetterSensor", "BabelQueueQueueDepthSensor"]
