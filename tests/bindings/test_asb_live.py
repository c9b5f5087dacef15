"""The binding contract against a real Azure Service Bus namespace, when ``AZURE_SERVICEBUS_CONNECTION_STRING`` is set.

CI has no namespace (and no emulator without Docker): there the same suites run against the AMQP 1.0 test double
(``asb_double.py``, the ``azure-service-bus`` factory in conftest.py). This module re-runs every test of
test_contract.py and test_batch_ops.py that takes a binding, with a binding on the real namespace. The
connection string needs Manage rights: each test's queues are created by the binding (``create_queues``) and
deleted afterwards.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_provider_babelqueue.bindings.azure_service_bus import AzureServiceBusBinding, AzureServiceBusConfig
from tests.bindings import test_batch_ops, test_contract

CONNECTION_STRING = os.environ.get("AZURE_SERVICEBUS_CONNECTION_STRING", "")

pytestmark = pytest.mark.skipif(
    not CONNECTION_STRING,
    reason="AZURE_SERVICEBUS_CONNECTION_STRING is not set: the live Service Bus suite needs a real namespace "
    "(with Manage rights); CI runs the same contract against the AMQP 1.0 test double",
)

_SHORT_LOCK = "asks for a 1 s lock; Service Bus refuses a LockDuration under 5 s (the double runs it)"
#: Tests that cannot hold on a real namespace, with the reason.
NOT_LIVE = {
    "test_publish_reserve_ack": "Service Bus counts a peek-locked message as active (test_asb_binding.py covers it)",
    "test_unacked_reservation_returns_after_the_visibility_timeout": _SHORT_LOCK,
    "test_an_unacked_batch_returns_after_the_visibility_timeout": _SHORT_LOCK,
    "test_a_late_ack_many_after_reclamation_changes_nothing": _SHORT_LOCK,
    "test_seen_many_and_remember_many": "a Service Bus queue holds no seen-set",
}

for _module in (test_contract, test_batch_ops):
    for _name, _test in inspect.getmembers(_module, inspect.isfunction):
        if _name.startswith("test_") and {"binding", "make_binding"} & set(inspect.signature(_test).parameters):
            globals()[_name] = _test


@pytest.fixture
def make_binding(request: pytest.FixtureRequest) -> Iterator[Callable[..., AzureServiceBusBinding]]:
    """Replaces conftest's parametrised factory here: bindings on the real namespace, queues removed after."""
    if reason := NOT_LIVE.get(request.node.originalname):
        pytest.skip(reason)
    made: list[AzureServiceBusBinding] = []

    def factory(**options: Any) -> AzureServiceBusBinding:
        made.append(AzureServiceBusBinding(AzureServiceBusConfig(connection_string=CONNECTION_STRING,
                                                                 create_queues=True, **options)))
        return made[-1]

    yield factory
    created = sorted({name for binding in made for name in binding._ensured})
    for binding in made:
        binding.close()
    if created:
        from azure.servicebus.management import ServiceBusAdministrationClient

        with ServiceBusAdministrationClient.from_connection_string(CONNECTION_STRING) as admin:
            for name in created:
                admin.delete_queue(name)
