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
                    "airflow_provider_babelqueue.hooks.azure_service_bus",
                    "airflow_provider_babelqueue.hooks.pulsar",
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
                    "max_message_bytes": {
                        "label": "Max message bytes",
                        "description": "Larger bodies are refused before the INSERT (SQLite's limit is 10^9 bytes)",
                        "schema": {"type": ["integer", "null"], "default": 1000000000, "minimum": 1},
                    },
                    "sslmode": {
                        "label": "PostgreSQL sslmode",
                        "description": "libpq sslmode: disable, require, verify-ca or verify-full",
                        "schema": {
                            "type": ["string", "null"],
                            "enum": ["disable", "allow", "prefer", "require", "verify-ca", "verify-full", None],
                        },
                    },
                    "sslrootcert": {"label": "PostgreSQL CA bundle path", "schema": {"type": ["string", "null"]}},
                    "sslcert": {"label": "PostgreSQL client certificate path", "schema": {"type": ["string", "null"]}},
                    "sslkey": {"label": "PostgreSQL client key path", "schema": {"type": ["string", "null"]}},
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
                    "max_message_bytes": {
                        "label": "Max message bytes",
                        "description": "Refused before sending when larger; Redis allows 512 MiB",
                        "schema": {"type": ["integer", "null"], "default": 536870912, "minimum": 1},
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
                    "max_message_bytes": {
                        "label": "Max message bytes",
                        "description": "Refused before sending when larger; RabbitMQ allows 128 MiB",
                        "schema": {"type": ["integer", "null"], "default": 134217728, "minimum": 1},
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
            {
                "connection-type": "babelqueue_pulsar",
                "hook-class-name": "airflow_provider_babelqueue.hooks.pulsar.BabelQueuePulsarHook",
                "hook-name": "BabelQueue Apache Pulsar",
                "ui-field-behaviour": {
                    "hidden-fields": ["login", "schema", "extra"],
                    "relabeling": {"host": "Broker host or service URL", "password": "Token (JWT)"},
                    "placeholders": {"host": "pulsar.internal  or  pulsar+ssl://pulsar.internal:6651", "port": "6650"},
                },
                "conn-fields": {
                    "ssl": {"label": "TLS (pulsar+ssl)", "schema": {"type": ["boolean", "null"], "default": False}},
                    "admin_url": {
                        "label": "Admin URL",
                        "description": "Admin REST API for queue depths; empty: http://<host>:8080 (https://<host>:8443)",
                        "schema": {"type": ["string", "null"]},
                    },
                    "tenant": {"label": "Tenant", "schema": {"type": ["string", "null"], "default": "public"}},
                    "namespace": {"label": "Namespace", "schema": {"type": ["string", "null"], "default": "default"}},
                    "subscription": {
                        "label": "Subscription",
                        "description": "The Shared subscription every consumer joins",
                        "schema": {"type": ["string", "null"], "default": "babelqueue"},
                    },
                    "dead_letter_suffix": {
                        "label": "Dead-letter suffix",
                        "description": "DLQ topic = <queue><suffix>",
                        "schema": {"type": ["string", "null"], "default": ".dlq"},
                    },
                    "tls_trust_certs_file_path": {"label": "CA bundle path", "schema": {"type": ["string", "null"]}},
                    "tls_validate_hostname": {
                        "label": "Verify TLS host name",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                    "tls_allow_insecure_connection": {
                        "label": "Accept any TLS certificate",
                        "description": "For a lab only",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "visibility_timeout": {
                        "label": "Visibility timeout (s)",
                        "description": "An unsettled reservation is negatively acknowledged after this; empty: never",
                        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
                    },
                    "redelivery_delay": {
                        "label": "Redelivery delay (s)",
                        "description": "Wait before a negatively acknowledged message is redelivered",
                        "schema": {"type": ["number", "null"], "default": 1, "minimum": 0},
                    },
                    "receiver_queue_size": {
                        "label": "Receiver queue size",
                        "description": "Messages a consumer prefetches; small keeps workers fair and depth close",
                        "schema": {"type": ["integer", "null"], "default": 1, "minimum": 1},
                    },
                    "max_message_bytes": {
                        "label": "Max message bytes",
                        "description": "Checked before sending; the broker's maxMessageSize",
                        "schema": {"type": ["integer", "null"], "default": 5242880, "minimum": 1024},
                    },
                    "create_subscription": {
                        "label": "Create the subscription",
                        "description": "Before the first publish to a topic, so no message is published unseen",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                    "operation_timeout_seconds": {
                        "label": "Operation timeout (s)",
                        "schema": {"type": ["integer", "null"], "default": 30, "minimum": 1},
                    },
                },
            },
            {
                "connection-type": "babelqueue_azure_service_bus",
                "hook-class-name": "airflow_provider_babelqueue.hooks.azure_service_bus.BabelQueueAzureServiceBusHook",
                "hook-name": "BabelQueue Azure Service Bus",
                "ui-field-behaviour": {
                    "hidden-fields": ["port", "schema", "login", "extra"],
                    "relabeling": {"host": "Fully qualified namespace", "password": "Connection string"},
                    "placeholders": {
                        "host": "contoso.servicebus.windows.net (DefaultAzureCredential)",
                        "password": "Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...",
                    },
                },
                "conn-fields": {
                    "native_dead_letter": {
                        "label": "Native dead-lettering",
                        "description": "Dead letters go to <queue>/$DeadLetterQueue; off: to the plain DLQ below",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                    "dead_letter_queue_suffix": {
                        "label": "Plain dead-letter queue suffix",
                        "description": "Also read <queue><suffix> as a DLQ ('.dlq' for the SDKs' apps); empty: none",
                        "schema": {"type": ["string", "null"]},
                    },
                    "create_queues": {
                        "label": "Create missing queues",
                        "description": "Needs Manage rights; off: queues are provisioned elsewhere (IaC)",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "lock_duration": {
                        "label": "Lock duration (s)",
                        "description": "PeekLock of queues the hook creates (Service Bus: 5-300); empty: 60",
                        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 300},
                    },
                    "max_delivery_count": {
                        "label": "Max delivery count",
                        "description": "Of queues the hook creates; Service Bus dead-letters past it; empty: 10",
                        "schema": {"type": ["integer", "null"], "minimum": 1, "maximum": 2000},
                    },
                    "min_receive_wait": {
                        "label": "Shortest receive wait (s)",
                        "description": "A receive is a round trip: how long a 'no wait' reserve still waits",
                        "schema": {"type": ["number", "null"], "default": 0.2, "minimum": 0.01, "maximum": 10},
                    },
                    "duplicate_detection": {
                        "label": "Queues detect duplicates",
                        "description": "RequiresDuplicateDetection is on: retries get MessageId <meta.id>:<attempts>",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "use_websockets": {
                        "label": "AMQP over WebSockets",
                        "description": "Port 443, for networks that block AMQP's 5671",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "connection_verify": {
                        "label": "CA bundle path",
                        "description": "Verify TLS with this CA bundle (e.g. behind a TLS-inspecting proxy)",
                        "schema": {"type": ["string", "null"]},
                    },
                },
            },
        ],
    }
