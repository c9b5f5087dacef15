"""The ``babelqueue`` asset URI scheme (assets.py) and the provider registration Airflow loads for it.

The URIs the sample DAGs use stay valid; Airflow's providers manager finds the normaliser, the factory and the
OpenLineage converter from the provider info; the namespace of each broker is exact and never holds a secret.
"""

from __future__ import annotations

import importlib
import inspect
import json
from urllib.parse import urlsplit

import pytest

from airflow_provider_babelqueue import assets
from airflow_provider_babelqueue.get_provider_info import OPERATOR_MODULES, get_provider_info


@pytest.mark.parametrize(("uri", "expected"), [
    ("babelqueue://babelqueue_default/orders/dead-letters", ("babelqueue_default", "orders", True)),
    ("babelqueue://bq_redis/order-events", ("bq_redis", "order-events", False)),
    ("babelqueue://e2e/dead-letters", ("e2e", "dead-letters", False)),  # a queue named so, not its DLQ
    ("babelqueue://c/persistent%3A/tenant/ns/orders", ("c", "persistent:/tenant/ns/orders", False)),
    ("babelqueue://c//orders//", ("c", "orders", False)),
])
def test_parse_uri(uri: str, expected: tuple[str, str, bool]) -> None:
    assert assets.parse_uri(uri) == expected


@pytest.mark.parametrize(("uri", "says"), [
    ("babelqueue:///orders", "names no connection id"),
    ("babelqueue://conn", "names no queue"),
    ("babelqueue://conn/", "names no queue"),
    ("redis://conn/orders", "is not a babelqueue:// URI"),
])
def test_parse_uri_refuses_what_names_no_queue(uri: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        assets.parse_uri(uri)


def test_sanitize_uri_normalises_equal_queues_to_one_uri() -> None:
    for uri in ("babelqueue://c/orders/", "babelqueue://c//orders", "babelqueue://c/orders?x=1#y"):
        assert assets.sanitize_uri(urlsplit(uri)).geturl() == "babelqueue://c/orders"
    assert assets.sanitize_uri(urlsplit("babelqueue://c/orders/dead-letters/")).geturl() == \
        "babelqueue://c/orders/dead-letters"


@pytest.mark.parametrize(("conn_type", "host", "port", "schema", "extra", "namespace"), [
    ("babelqueue+redis", "redis.internal", 6380, None, {"key_prefix": "x:"}, "redis://redis.internal:6380"),
    ("babelqueue_redis", None, None, None, {}, "redis://localhost:6379"),
    ("babelqueue+rabbitmq", "mq", None, "/", {}, "amqp://mq:5672"),
    ("babelqueue+sqs", None, None, None, {"region_name": "eu-west-1"}, "sqs://eu-west-1"),
    ("babelqueue+sqs", None, None, None, {"endpoint_url": "http://127.0.0.1:5000"}, "sqs://127.0.0.1:5000"),
    ("babelqueue+servicebus", "ns.servicebus.windows.net", None, None, {}, "servicebus://ns.servicebus.windows.net"),
    ("babelqueue+pulsar", "pulsar.internal", None, None, {}, "pulsar://pulsar.internal:6650"),
    ("babelqueue+sql", "/data/queues.sqlite", None, None, {}, "sqlite:/data/queues.sqlite"),
    ("babelqueue+sql", "pg", 5433, "jobs", {"dialect": "postgresql"}, "postgres://pg:5433/jobs"),
])
def test_lineage_namespace_per_broker(conn_type: str, host: str | None, port: int | None, schema: str | None,
                                      extra: dict[str, str], namespace: str) -> None:
    assert assets.lineage_namespace(conn_type, host, port, schema, extra) == namespace


def test_the_converter_names_the_queue_in_its_connections_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_BQ_LINEAGE", json.dumps(
        {"conn_type": "babelqueue+redis", "host": "127.0.0.1", "port": 6379, "password": "s3cret"}))
    asset = assets.create_asset(babelqueue_conn_id="bq_lineage", queue_name="orders", dead_letters=True)
    assert asset.uri == "babelqueue://bq_lineage/orders/dead-letters"
    identity = assets.lineage_identity(asset.uri)
    assert identity == ("redis://127.0.0.1:6379", "orders:failed")  # as the operators' lineage names the DLQ
    assert "s3cret" not in json.dumps(identity)
    namespace, name = assets.lineage_identity("babelqueue://babelqueue_default/orders")
    assert namespace.startswith("sqlite:") and name == "orders"


def test_airflow_loads_what_the_provider_info_declares() -> None:
    """Airflow's providers manager registers the scheme's three functions, and an Asset built in a DAG is
    normalised by ours."""
    from airflow.sdk import Asset
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    manager = ProvidersManagerTaskRuntime()
    assert manager.asset_uri_handlers["babelqueue"] is assets.sanitize_uri
    assert manager.asset_factories["babelqueue"] is assets.create_asset
    assert manager.asset_to_openlineage_converters["babelqueue"] is assets.convert_asset_to_openlineage
    assert Asset("babelqueue://c/orders/").uri == "babelqueue://c/orders"


def test_the_operator_modules_listed_define_every_operator() -> None:
    """``operators`` in the provider info lists exactly the modules that define the package's operators."""
    from airflow.sdk import BaseOperator

    from airflow_provider_babelqueue import operators

    [entry] = get_provider_info()["operators"]
    assert entry["python-modules"] == [f"airflow_provider_babelqueue.operators.{m}" for m in OPERATOR_MODULES]
    defined = {}
    for name in OPERATOR_MODULES:
        module = importlib.import_module(f"airflow_provider_babelqueue.operators.{name}")
        found = [cls for cls in vars(module).values()
                 if inspect.isclass(cls) and issubclass(cls, BaseOperator) and cls.__module__ == module.__name__]
        assert found, f"operators.{name} defines no operator"
        defined.update({cls.__name__: cls for cls in found})
    assert sorted(defined) == sorted(operators.__all__)
