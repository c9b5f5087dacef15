"""Hook for the Amazon SQS binding (connection type ``babelqueue+sqs``)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Connection

from ..bindings.base import Binding
from ..bindings.redaction import redact
from .base import BabelQueueHook, ConnectionConfigError, make_config, read_extras
from .connection_specs import SQS

__all__ = ["BabelQueueSqsHook"]


class BabelQueueSqsHook(BabelQueueHook):
    """Amazon SQS queues: the envelope is the message body, with the six ``bq-*`` message attributes.

    Fields: login = AWS access key id, password = secret access key. Leave both empty to use the default
    credential chain (environment, profile, instance or task role), which production should prefer.
    The extras (region, endpoint, session token, role to assume, FIFO settings, DLQ suffix and the DLQs reads
    take, size limit, depth, queue creation, visibility and long-poll times) are declared in
    :data:`~airflow_provider_babelqueue.hooks.connection_specs.SQS` and go to the config as they are, except
    ``dead_letter_sources``: comma-separated text in the form, which the config splits into a tuple.
    """

    connection_spec = SQS

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.sqs import SqsBinding, SqsConfig

        if bool(connection.login) != bool(connection.password):
            raise ConnectionConfigError(
                "login (access key id) and password (secret access key) go together; leave both empty to use "
                "the default AWS credential chain"
            )
        options: dict[str, Any] = {"aws_access_key_id": connection.login or None,
                                   "aws_secret_access_key": connection.password or None,
                                   **self.config_options(extras)}
        # Comma text in the form; the config splits it (Binding.source_entries), "none" reading only the written DLQ.
        options |= read_extras([e for e in SQS.extras if e.name == "dead_letter_sources"], extras)
        return SqsBinding(make_config(SqsConfig, connection, options))

    def describe(self, connection: Connection) -> str:
        extras = self.extras(connection)
        where = redact(str(extras.get("endpoint_url") or "AWS"))
        return f"{where} (region {extras.get('region_name') or 'from the AWS config'})"
