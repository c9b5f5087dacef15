"""Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``).

It must stay importable without side effects, and cheap: Airflow imports it while loading its configuration.
The connection types come from their declarations in :mod:`airflow_provider_babelqueue.hooks.connection_specs`,
a pure module (importing the hook classes would import the Airflow SDK, seconds instead of milliseconds).
"""

from __future__ import annotations

from typing import Any

from . import __version__
from .hooks.connection_specs import CONNECTION_SPECS

__all__ = ["OPERATOR_MODULES", "get_provider_info"]

#: The modules of ``airflow_provider_babelqueue.operators`` that define operators (``links``, ``pending`` and the
#: private helpers do not).
OPERATOR_MODULES = ("publish", "consume", "drain", "replay", "settle", "spark")


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
        # The plugin serves the triage report that the link opens (docs/plugin.md); both are named, not imported.
        "plugins": [
            {"name": "babelqueue", "plugin-class": "airflow_provider_babelqueue.plugins.plugin.BabelQueuePlugin"}
        ],
        "extra-links": ["airflow_provider_babelqueue.operators.links.BabelQueueReportLink"],
        "operators": [
            {
                "integration-name": "BabelQueue",
                "python-modules": [f"airflow_provider_babelqueue.operators.{name}" for name in OPERATOR_MODULES],
            }
        ],
        # babelqueue://<conn id>/<queue>[/dead-letters]: normalised, built and named for OpenLineage (assets.py)
        "asset-uris": [
            {
                "schemes": ["babelqueue"],
                "handler": "airflow_provider_babelqueue.assets.sanitize_uri",
                "factory": "airflow_provider_babelqueue.assets.create_asset",
                "to_openlineage_converter": "airflow_provider_babelqueue.assets.convert_asset_to_openlineage",
            }
        ],
        "notifications": ["airflow_provider_babelqueue.notifications.BabelQueueDeadLetterNotifier"],
        "config": {
            "babelqueue": {
                "description": "Provider-wide defaults of the BabelQueue provider: where runs write, which dead-letter "
                "queues every connection reads, tracing, and the report pages of its Airflow plugin.",
                "options": {
                    "output_root": {
                        "description": "Where the triage DAGs write each run's drain files, triage Parquet, report "
                        "and replay set when a run names no output_root: a folder every worker and the Spark driver "
                        "reach, or an object-storage URL (s3://bucket/runs). Blank: $AIRFLOW_HOME/babelqueue/runs "
                        "on the machine that runs the task (one machine only).",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "s3://aws_default@dlq/runs",
                        "default": "",
                    },
                    "dead_letter_sources": {
                        "description": "The dead-letter queues every Redis, RabbitMQ, SQS, Service Bus and Pulsar "
                        "connection reads besides the one it writes, when the connection's own dead_letter_sources "
                        "extra is blank (the SQL table's sources are tables, set per connection): the names or "
                        "suffixes the fleet's SDKs write (comma-separated; {queue} is replaced by the queue name). "
                        "Blank: each broker's default.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": ".dlq,:failed,legacy-{queue}-dead",
                        "default": "",
                    },
                    "tracing": {
                        "description": "OpenTelemetry spans for publish, receive, process and settle, and W3C trace "
                        "context in the brokers' native headers: auto (when Airflow's [traces] otel_on is on), on "
                        "(to whichever tracer provider the process set up) or off (no span, no header).",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "on",
                        "default": "auto",
                    },
                    "report_roots": {
                        "description": "Comma-separated folders or object-storage URLs (s3://bucket/runs, ...) under "
                        "which the API server may read the triage reports that task instances' XComs name. A "
                        "report anywhere else is refused. Blank: the default output root, "
                        "$AIRFLOW_HOME/babelqueue/runs.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/data/babelqueue/runs,s3://aws_default@dlq-reports/runs",
                        "default": "",
                    }
                },
            }
        },
        "connection-types": [spec.provider_info() for spec in CONNECTION_SPECS],
    }
