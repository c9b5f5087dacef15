"""The provider info's connection types come from the hook declarations, stay cheap to import, and Airflow's
providers manager turns them into the connection form."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_provider_babelqueue.get_provider_info import get_provider_info
from airflow_provider_babelqueue.hooks.connection_specs import CONNECTION_SPECS

SPECS = {spec.conn_type: spec for spec in CONNECTION_SPECS}
JSON_TYPES = {"str": "string", "path": "string", "enum": "string", "int": "integer", "float": "number",
              "bool": "boolean"}


def test_get_provider_info_imports_no_airflow_and_no_broker_client() -> None:
    """Airflow imports the provider info while loading its configuration: importing a hook (the Airflow SDK,
    seconds) or a broker client there would slow every Airflow command down."""
    code = ("import sys; from airflow_provider_babelqueue.get_provider_info import get_provider_info; "
            "get_provider_info(); print(sorted({m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out.replace("'", '"')))
    assert not loaded & {"airflow", "redis", "pika", "boto3", "azure", "pulsar", "sqlalchemy", "orjson"}, loaded


@pytest.mark.parametrize("conn_type", sorted(SPECS))
def test_each_connection_field_says_what_its_declaration_says(conn_type: str) -> None:
    entry = next(e for e in get_provider_info()["connection-types"] if e["connection-type"] == conn_type)
    spec = SPECS[conn_type]
    assert (entry["hook-class-name"], entry["hook-name"]) == (spec.hook_class, spec.hook_name)
    assert list(entry["conn-fields"]) == list(spec.extra_names)
    for extra in spec.extras:
        field = entry["conn-fields"][extra.name]
        assert field["label"] == extra.label and field.get("description", "") == extra.description
        schema = field["schema"]
        assert schema["type"] == [JSON_TYPES[extra.kind], "null"]
        assert (schema.get("format") == "password") is extra.secret
        assert schema.get("default") == extra.default
        assert schema.get("enum") == ([*extra.choices, None] if extra.choices else None)


def test_the_hook_modules_listed_are_the_declared_ones() -> None:
    [hooks] = get_provider_info()["hooks"]
    assert sorted(hooks["python-modules"]) == sorted(spec.hook_module for spec in CONNECTION_SPECS)


def test_airflow_builds_the_connection_forms_from_the_declarations() -> None:
    """The API server's providers manager makes the forms from the provider info alone; the task runtime's
    imports each hook class and finds it testable."""
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    manager = ProvidersManager()
    widgets, behaviours = manager.connection_form_widgets, manager.field_behaviours
    hooks = ProvidersManagerTaskRuntime().hooks
    for conn_type, spec in SPECS.items():
        assert {key for key in widgets if key.startswith(f"extra__{conn_type}__")} == {
            f"extra__{conn_type}__{name}" for name in spec.extra_names
        }
        assert behaviours[conn_type] == {"hidden_fields": list(spec.ui.hidden), "relabeling": dict(spec.ui.relabeling),
                                         "placeholders": dict(spec.ui.placeholders)}
        info = hooks[conn_type]
        assert info is not None and (info.hook_class_name, info.hook_name) == (spec.hook_class, spec.hook_name)
        assert info.connection_testable
