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
        "config": {
            "babelqueue": {
                "description": "The BabelQueue provider's Airflow plugin.",
                "options": {
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
