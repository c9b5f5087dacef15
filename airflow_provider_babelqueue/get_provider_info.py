"""Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``).

It must stay importable without side effects: Airflow imports it while loading its configuration.
"""

from __future__ import annotations

from typing import Any

from . import __version__

__all__ = ["get_provider_info"]


def get_provider_info() -> dict[str, Any]:
    """Describe the provider; ``package-name`` must equal the distribution name."""
    return {
        "package-name": "airflow-provider-babelqueue",
        "name": "BabelQueue",
        "description": "BabelQueue polyglot message envelope: publish, consume, dead-letter triage on Spark "
        "and safe replay across Redis, RabbitMQ, Amazon SQS, Azure Service Bus, Apache Pulsar and SQL.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "BabelQueue",
                "external-doc-url": "https://pypi.org/project/airflow-provider-babelqueue/",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "BabelQueue",
                "python-modules": [
                    "airflow_provider_babelqueue.hooks.sql",
                    "airflow_provider_babelqueue.hooks.redis",
                ],
            }
        ],
        "sensors": [
            {"integration-name": "BabelQueue", "python-modules": ["airflow_provider_babelqueue.sensors.queue"]}
        ],
        "triggers": [
            {"integration-name": "BabelQueue", "python-modules": ["airflow_provider_babelqueue.triggers.queue"]}
        ],
        "queues": [
            "airflow_provider_babelqueue.queues.BabelQueueSqlQueueProvider",
            "airflow_provider_babelqueue.queues.BabelQueueRedisQueueProvider",
            "airflow_provider_babelqueue.queues.BabelQueueRabbitMQQueueProvider",
            "airflow_provider_babelqueue.queues.BabelQueueSqsQueueProvider",
            "airflow_provider_babelqueue.queues.BabelQueueAzureServiceBusQueueProvider",
            "airflow_provider_babelqueue.queues.BabelQueuePulsarQueueProvider",
        ],
        "connection-types": [
            {
                "connection-type": "babelqueue_sql",
                "hook-class-name": "airflow_provider_babelqueue.hooks.sql.BabelQueueSqlHook",
                "hook-name": "BabelQueue SQL",
                "ui-field-behaviour": {
                    "hidden-fields": ["extra"],
                    "relabeling": {"host": "Host, or SQLite file path", "schema": "Database"},
                    "placeholders": {"host": "/opt/airflow/babelqueue.sqlite  or  db.internal"},
                },
                "conn-fields": {
                    "dialect": {
                        "label": "Dialect",
                        "description": "sqlite (default: host is the file path) or postgresql",
                        "schema": {
                            "type": ["string", "null"],
                            "enum": ["sqlite", "postgresql", None],
                            "default": "sqlite",
                        },
                    },
                    "sqlalchemy_url": {
                        "label": "SQLAlchemy URL",
                        "description": "Overrides the fields above, for any SQLAlchemy driver",
                        "schema": {"type": ["string", "null"], "format": "password"},
                    },
                    "table": {
                        "label": "Table",
                        "description": "Ready-message table; dead letters go to <table>_failed",
                        "schema": {"type": ["string", "null"], "default": "jobs"},
                    },
                    "visibility_timeout": {
                        "label": "Visibility timeout (s)",
                        "description": "An unacked reservation returns to the queue after this many seconds",
                        "schema": {"type": ["number", "null"], "default": 300},
                    },
                },
            },
            {
                "connection-type": "babelqueue_redis",
                "hook-class-name": "airflow_provider_babelqueue.hooks.redis.BabelQueueRedisHook",
                "hook-name": "BabelQueue Redis",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "extra"],
                    "relabeling": {"login": "ACL user"},
                    "placeholders": {"host": "127.0.0.1", "port": "6379"},
                },
                "conn-fields": {
                    "db": {"label": "Database number", "schema": {"type": ["integer", "null"], "default": 0}},
                    "ssl": {"label": "TLS (rediss)", "schema": {"type": ["boolean", "null"], "default": False}},
                    "ssl_ca_certs": {"label": "CA bundle path", "schema": {"type": ["string", "null"]}},
                    "key_prefix": {
                        "label": "Key prefix",
                        "description": "Prepended to every key this connection touches",
                        "schema": {"type": ["string", "null"]},
                    },
                    "dead_letter_suffix": {
                        "label": "Dead-letter suffix",
                        "description": "DLQ list = <queue><suffix>; ':failed' by default, '.dlq' for the SDKs' apps",
                        "schema": {"type": ["string", "null"], "default": ":failed"},
                    },
                    "visibility_timeout": {
                        "label": "Visibility timeout (s)",
                        "description": "A reservation left by a crashed consumer returns to the queue after this",
                        "schema": {"type": ["number", "null"], "default": 300},
                    },
                },
            },
        ],
    }
