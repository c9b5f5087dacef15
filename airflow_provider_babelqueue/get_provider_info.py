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
                    "airflow_provider_babelqueue.hooks.rabbitmq",
                    "airflow_provider_babelqueue.hooks.sqs",
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
            {
                "connection-type": "babelqueue_rabbitmq",
                "hook-class-name": "airflow_provider_babelqueue.hooks.rabbitmq.BabelQueueRabbitMQHook",
                "hook-name": "BabelQueue RabbitMQ",
                "ui-field-behaviour": {
                    "hidden-fields": ["extra"],
                    "relabeling": {"schema": "Virtual host"},
                    "placeholders": {"host": "127.0.0.1", "port": "5672", "schema": "/", "login": "guest"},
                },
                "conn-fields": {
                    "ssl": {"label": "TLS (amqps)", "schema": {"type": ["boolean", "null"], "default": False}},
                    "ssl_ca_certs": {"label": "CA bundle path", "schema": {"type": ["string", "null"]}},
                    "dead_letter_suffix": {
                        "label": "Dead-letter suffix",
                        "description": "DLQ = <queue><suffix>; '.failed' by default, '.dlq' for the SDKs' apps",
                        "schema": {"type": ["string", "null"], "default": ".failed"},
                    },
                    "declare_queues": {
                        "label": "Declare missing queues",
                        "description": "Off: only use queues someone else declared (passive declares)",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                    "publisher_confirms": {
                        "label": "Publisher confirms",
                        "description": "Wait for the broker to confirm every publish",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                    "heartbeat": {
                        "label": "Heartbeat (s)",
                        "description": "Empty: the broker's (60); 0 turns heartbeats off",
                        "schema": {"type": ["integer", "null"], "minimum": 0},
                    },
                },
            },
            {
                "connection-type": "babelqueue_sqs",
                "hook-class-name": "airflow_provider_babelqueue.hooks.sqs.BabelQueueSqsHook",
                "hook-name": "BabelQueue Amazon SQS",
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "port", "schema", "extra"],
                    "relabeling": {"login": "AWS access key id", "password": "AWS secret access key"},
                    "placeholders": {"login": "empty: default chain", "password": "empty: default chain"},
                },
                "conn-fields": {
                    "region_name": {
                        "label": "Region",
                        "description": "e.g. eu-west-1; empty: AWS_DEFAULT_REGION or the profile",
                        "schema": {"type": ["string", "null"]},
                    },
                    "endpoint_url": {
                        "label": "Endpoint URL",
                        "description": "A VPC endpoint, LocalStack or moto; empty for AWS",
                        "schema": {"type": ["string", "null"]},
                    },
                    "aws_session_token": {
                        "label": "Session token",
                        "description": "For temporary credentials",
                        "schema": {"type": ["string", "null"], "format": "password"},
                    },
                    "role_arn": {
                        "label": "Role ARN",
                        "description": "Assume this IAM role through STS (refreshed before it expires)",
                        "schema": {"type": ["string", "null"]},
                    },
                    "fifo_group_id": {
                        "label": "FIFO group id",
                        "description": "MessageGroupId on .fifo queues; empty: the queue name",
                        "schema": {"type": ["string", "null"]},
                    },
                    "content_based_dedup": {
                        "label": "Content-based deduplication",
                        "description": "Send no MessageDeduplicationId (the FIFO queue hashes the body)",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "dead_letter_suffix": {
                        "label": "Dead-letter suffix",
                        "description": "DLQ = <queue><suffix> without a RedrivePolicy; '-dlq' for the SDKs' apps",
                        "schema": {"type": ["string", "null"], "default": "-failed"},
                    },
                    "max_message_bytes": {
                        "label": "Max message bytes",
                        "description": "Checked before sending (body + attributes); SQS allows up to 1048576",
                        "schema": {
                            "type": ["integer", "null"],
                            "default": 1048576,
                            "minimum": 1024,
                            "maximum": 1048576,
                        },
                    },
                    "include_in_flight_in_depth": {
                        "label": "Depth includes in-flight",
                        "description": "Count in-flight and delayed messages in depth",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "create_queues": {
                        "label": "Create missing queues",
                        "description": "Off: queues are provisioned elsewhere (IaC); a missing queue is an error",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                    "visibility_timeout": {
                        "label": "Visibility timeout (s)",
                        "description": "Whole seconds a received message stays hidden; empty: the queue's own",
                        "schema": {"type": ["integer", "null"], "minimum": 0, "maximum": 43200},
                    },
                    "wait_time_seconds": {
                        "label": "Long-poll wait (s)",
                        "description": "Longest single ReceiveMessage wait",
                        "schema": {"type": ["integer", "null"], "default": 20, "minimum": 1, "maximum": 20},
                    },
                },
            },
        ],
    }
