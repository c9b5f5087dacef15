"""common.messaging queue providers: ``MessageQueueTrigger(scheme="babelqueue+<broker>", ...)``.

Each scheme selects :class:`~airflow_provider_babelqueue.triggers.BabelQueueMessageTrigger`, which fires for
live messages on ``queue_name`` of ``babelqueue_conn_id`` (at least once: a message is settled only after its
event is stored), as the official schemes do; the keyword arguments given to ``MessageQueueTrigger`` go to that
trigger. Dead-letter watching is :class:`~airflow_provider_babelqueue.triggers.BabelQueueDeadLetterTrigger`,
used directly in an ``AssetWatcher``. The scheme names the broker for readers of the DAG; the connection decides
which broker is read. Schemes are namespaced (``babelqueue+``) so they never
collide with other providers' ``sqs`` or ``redis+pubsub``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

if TYPE_CHECKING:
    from airflow.triggers.base import BaseEventTrigger

__all__ = [
    "BabelQueueAzureServiceBusQueueProvider",
    "BabelQueuePulsarQueueProvider",
    "BabelQueueRabbitMQQueueProvider",
    "BabelQueueRedisQueueProvider",
    "BabelQueueSqlQueueProvider",
    "BabelQueueSqsQueueProvider",
]


class _BabelQueueProvider(BaseMessageQueueProvider):
    def trigger_class(self) -> type[BaseEventTrigger]:
        from .triggers.messages import BabelQueueMessageTrigger

        return BabelQueueMessageTrigger


class BabelQueueSqlQueueProvider(_BabelQueueProvider):
    scheme = "babelqueue+sql"


class BabelQueueRedisQueueProvider(_BabelQueueProvider):
    scheme = "babelqueue+redis"


class BabelQueueRabbitMQQueueProvider(_BabelQueueProvider):
    scheme = "babelqueue+rabbitmq"


class BabelQueueSqsQueueProvider(_BabelQueueProvider):
    scheme = "babelqueue+sqs"


class BabelQueueAzureServiceBusQueueProvider(_BabelQueueProvider):
    scheme = "babelqueue+azure-service-bus"


class BabelQueuePulsarQueueProvider(_BabelQueueProvider):
    scheme = "babelqueue+pulsar"

