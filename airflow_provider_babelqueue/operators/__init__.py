"""The generic operators, one import away: ``from airflow_provider_babelqueue.operators import ...``.

Each is loaded on first use, so a DAG that only publishes does not need the Spark provider installed.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .consume import BabelQueueConsumeOperator
    from .drain import BabelQueueDrainDeadLettersOperator
    from .publish import BabelQueuePublishOperator
    from .replay import BabelQueueReplayOperator
    from .settle import BabelQueueSettleRunOperator
    from .spark import BabelQueueSparkTriageOperator

__all__ = [
    "BabelQueueConsumeOperator",
    "BabelQueueDrainDeadLettersOperator",
    "BabelQueuePublishOperator",
    "BabelQueueReplayOperator",
    "BabelQueueSettleRunOperator",
    "BabelQueueSparkTriageOperator",
]

_MODULES = {
    "BabelQueueConsumeOperator": "consume",
    "BabelQueueDrainDeadLettersOperator": "drain",
    "BabelQueuePublishOperator": "publish",
    "BabelQueueReplayOperator": "replay",
    "BabelQueueSettleRunOperator": "settle",
    "BabelQueueSparkTriageOperator": "spark",
}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_MODULES[name]}", __name__), name)
