"""Hook for the Amazon SQS binding (connection type ``babelqueue_sqs``)."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.sdk import Connection

from ..bindings.base import Binding
from .base import BabelQueueHook, ConnectionConfigError, as_bool, as_float, as_int, make_config

__all__ = ["BabelQueueSqsHook"]


class BabelQueueSqsHook(BabelQueueHook):
    """Amazon SQS queues: the envelope is the message body, with the six ``bq-*`` message attributes.

    Fields: login = AWS access key id, password = secret access key. Leave both empty to use the default
    credential chain (environment, profile, instance or task role), which production should prefer.
    Extras: ``region_name``, ``endpoint_url`` (VPC endpoint, LocalStack, moto), ``aws_session_token``,
    ``role_arn`` (assumed through STS), ``fifo_group_id``, ``content_based_dedup``, ``dead_letter_suffix``
    (``-failed``), ``max_message_bytes`` (262144), ``include_in_flight_in_depth``, ``create_queues`` (true),
    ``visibility_timeout`` and ``wait_time_seconds``.
    """

    conn_type: ClassVar[str] = "babelqueue_sqs"
    hook_name: ClassVar[str] = "BabelQueue Amazon SQS"
    extra_fields: ClassVar[tuple[str, ...]] = (
        "region_name",
        "endpoint_url",
        "aws_session_token",
        "role_arn",
        "fifo_group_id",
        "content_based_dedup",
        "dead_letter_suffix",
        "max_message_bytes",
        "include_in_flight_in_depth",
        "create_queues",
        "visibility_timeout",
        "wait_time_seconds",
    )

    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        from ..bindings.sqs import SqsBinding, SqsConfig

        if bool(connection.login) != bool(connection.password):
            raise ConnectionConfigError(
                "login (access key id) and password (secret access key) go together; leave both empty to use "
                "the default AWS credential chain"
            )
        options: dict[str, Any] = {"aws_access_key_id": connection.login or None,
                                   "aws_secret_access_key": connection.password or None}
        for name in ("region_name", "endpoint_url", "aws_session_token", "role_arn", "fifo_group_id",
                     "dead_letter_suffix"):
            if name in extras:
                options[name] = str(extras[name])
        for name in ("content_based_dedup", "include_in_flight_in_depth", "create_queues"):
            if name in extras:
                options[name] = as_bool(extras[name], name)
        for name in ("max_message_bytes", "wait_time_seconds"):
            if name in extras:
                options[name] = as_int(extras[name], name)
        if "visibility_timeout" in extras:
            options["visibility_timeout"] = as_float(extras["visibility_timeout"], "visibility_timeout")
        config = make_config(SqsConfig, connection, options)
        return SqsBinding(config)

    def describe(self, connection: Connection) -> str:
        extras = self.extras(connection)
        where = extras.get("endpoint_url") or "AWS"
        return f"{where} (region {extras.get('region_name') or 'from the AWS config'})"
