"""The binding contract against a real Pulsar broker, when one is reachable. CI has none, so this module is skipped
there (the contract runs on the fake client instead: ``pulsar`` in conftest.BINDINGS, tests/bindings/pulsar_fake.py).

Run it against any broker, for instance ``docker run -p 6650:6650 -p 8080:8080 apachepulsar/pulsar:latest
bin/pulsar standalone``::

    PULSAR_SERVICE_URL=pulsar://localhost:6650 PULSAR_ADMIN_URL=http://localhost:8080 \\
        .venv/bin/python -m pytest tests/bindings/test_pulsar_live.py -p no:cacheprovider

Optional: ``PULSAR_TOKEN`` (token authentication), ``PULSAR_TLS_TRUST_CERTS`` (CA bundle for pulsar+ssl / https),
``PULSAR_TENANT`` / ``PULSAR_NAMESPACE`` (default ``public`` / ``default``; the namespace must allow automatic
topic creation). Every topic a test created (its name holds the test's unique queue name) is deleted afterwards.

The test bodies are the shared ones of test_contract.py and test_batch_ops.py, collected again here with a
``make_binding`` that builds live bindings; the same pairs as on the fake are not applicable (conftest.NOT_APPLICABLE).
"""

from __future__ import annotations

import inspect
import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pulsar
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.pulsar import PulsarBinding, PulsarConfig, topic_name
from tests.bindings import test_batch_ops, test_contract
from tests.bindings.conftest import NOT_APPLICABLE, Factory
from tests.conftest import compact, conformance_manifest, fixture_dict

SERVICE_URL, ADMIN_URL = os.environ.get("PULSAR_SERVICE_URL"), os.environ.get("PULSAR_ADMIN_URL")
TOKEN, CA = os.environ.get("PULSAR_TOKEN") or None, os.environ.get("PULSAR_TLS_TRUST_CERTS") or None
TENANT, NAMESPACE = os.environ.get("PULSAR_TENANT", "public"), os.environ.get("PULSAR_NAMESPACE", "default")

pytestmark = pytest.mark.skipif(
    not (SERVICE_URL and ADMIN_URL),
    reason="no Pulsar broker: set PULSAR_SERVICE_URL and PULSAR_ADMIN_URL to run the contract against a real one "
    "(CI runs it against the fake client and admin server in tests/bindings/pulsar_fake.py)",
)

# The shared contract, collected again in this module (so it uses the live make_binding below).
for _module in (test_contract, test_batch_ops):
    for _name, _test in vars(_module).items():
        if _name.startswith("test_") and {"binding", "make_binding"} & set(inspect.signature(_test).parameters):
            globals()[_name] = _test


def config(**options: Any) -> PulsarConfig:
    return PulsarConfig(
        **({"service_url": SERVICE_URL, "admin_url": ADMIN_URL, "token": TOKEN, "tls_trust_certs_file_path": CA,
            "tenant": TENANT, "namespace": NAMESPACE} | options)
    )


def admin(method: str, path: str) -> Any:
    """One admin REST call with the test token (``None`` for an empty answer)."""
    cfg = config()
    headers = {"Authorization": f"Bearer {TOKEN}"} if TOKEN else {}
    request = urllib.request.Request(ADMIN_URL.rstrip("/") + path, method=method, headers=headers)
    context = cfg.ssl_context() if ADMIN_URL.startswith("https:") else None
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        payload = response.read()
    return json.loads(payload) if payload else None


def delete_topics_of(queue_name: str) -> None:
    for topic in admin("GET", f"/admin/v2/persistent/{TENANT}/{NAMESPACE}"):
        if queue_name in topic:
            local = topic.rsplit("/", 1)[1]
            admin("DELETE", f"/admin/v2/persistent/{TENANT}/{NAMESPACE}/{quote(local, safe='')}?force=true")


@pytest.fixture
def make_binding(request: pytest.FixtureRequest, queue_name: str) -> Iterator[Factory]:
    """Live bindings; the topics of this test's queue are deleted afterwards."""
    if reason := NOT_APPLICABLE.get(("pulsar", request.node.originalname)):
        pytest.skip(f"not applicable to pulsar: {reason}")
    made: list[Binding] = []

    def factory(**options: Any) -> Binding:
        made.append(PulsarBinding(config(**options)))
        return made[-1]

    yield factory
    for binding in made:
        binding.close()
    delete_topics_of(queue_name)


def test_projection_as_a_plain_consumer_receives_it(make_binding: Factory, queue_name: str) -> None:
    block = conformance_manifest()["pulsar"]["property_projection"]
    body = compact(fixture_dict(block["envelope_file"]))
    make_binding().publish(body, queue_name)
    options = config().client_options(pulsar)
    client = pulsar.Client(SERVICE_URL, **options)
    try:
        consumer = client.subscribe(topic_name(queue_name, TENANT, NAMESPACE), f"inspect-{uuid.uuid4().hex[:6]}",
                                    initial_position=pulsar.InitialPosition.Earliest)
        message = consumer.receive(timeout_millis=5000)
        assert message.data() == body and message.properties() == block["properties"]
        assert message.redelivery_count() == 0
    finally:
        client.close()


def test_ping_and_depth(make_binding: Factory, queue_name: str) -> None:
    binding = make_binding()
    binding.ping()
    binding.publish(bq.encode(bq.make_envelope("urn:babel:orders:created", {}, queue_name=queue_name)), queue_name)
    assert binding.depth(queue_name) == 1 and binding.dead_letter_depth(queue_name) == 0
