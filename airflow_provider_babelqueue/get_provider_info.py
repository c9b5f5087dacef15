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
        "connection-types": [],
    }
