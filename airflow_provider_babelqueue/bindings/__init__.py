"""Broker bindings: one small module per broker, all implementing :class:`~.base.Binding`.

Bindings never import Airflow; broker clients are imported lazily by each module.
"""

from __future__ import annotations

from .base import Binding, BindingError, MissingExtraError, NotSupportedError, PublishBatchError
from .message import ReceivedMessage

__all__ = [
    "Binding",
    "BindingError",
    "MissingExtraError",
    "NotSupportedError",
    "PublishBatchError",
    "ReceivedMessage",
]
