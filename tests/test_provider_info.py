"""The provider info's connection types come from the hook declarations, stay cheap to import, and Airflow's
providers manager turns them into the connection form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
        # no None among the choices: Airflow's form would offer it as the option "null" (the field stays clearable)
        assert schema.get("enum") == (list(extra.choices) if extra.choices else None)


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


def test_provider_info_is_valid_for_airflows_schema() -> None:
    """The schema Airflow validates provider info with (``plugins``, ``extra-links`` and ``config`` included)."""
    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(get_provider_info())


def test_the_plugin_and_the_report_link_are_registered_and_importable() -> None:
    """Airflow's providers manager lists the plugin and the link from the provider info; each named class is
    what Airflow expects (a plugin by name, a BaseOperatorLink)."""
    from airflow._shared.module_loading import import_string
    from airflow.plugins_manager import is_valid_plugin
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk import BaseOperatorLink

    info = get_provider_info()
    assert info["plugins"] == [
        {"name": "babelqueue", "plugin-class": "airflow_provider_babelqueue.plugins.plugin.BabelQueuePlugin"}
    ]
    assert info["extra-links"] == ["airflow_provider_babelqueue.operators.links.BabelQueueReportLink"]
    manager = ProvidersManager()
    manager.initialize_providers_plugins()
    [plugin] = [p for p in manager.plugins if p.provider_name == "airflow-provider-babelqueue"]
    assert (plugin.name, plugin.plugin_class) == ("babelqueue", info["plugins"][0]["plugin-class"])
    assert is_valid_plugin(import_string(plugin.plugin_class))
    assert set(info["extra-links"]) <= set(manager.extra_links_class_names)
    assert issubclass(import_string(info["extra-links"][0]), BaseOperatorLink)
    assert set(info["config"]) == {"babelqueue"} and "report_roots" in info["config"]["babelqueue"]["options"]


def test_importing_the_plugin_leaves_the_web_application_unbuilt() -> None:
    """Every Airflow component imports plugin classes (the scheduler, the DAG processor, each task process): the
    FastAPI app and Airflow's API-server security module load only when ``fastapi_apps`` is read."""
    code = ("import sys; from airflow_provider_babelqueue.plugins.plugin import BabelQueuePlugin as P\n"
            "heavy = sorted(m for m in sys.modules if m == 'fastapi' or m.startswith('airflow.api_fastapi'))\n"
            "assert not heavy, heavy\n"
            "[app] = P.fastapi_apps\n"
            "assert app['url_prefix'] == '/babelqueue' and type(app['app']).__name__ == 'FastAPI', app\n"
            "assert P.fastapi_apps[0]['app'] is app['app']\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def test_providers_manager_loads_the_notifier_and_the_config_section() -> None:
    """What Airflow's providers manager loads equals what the package defines: the notifier class and every
    option of the ``[babelqueue]`` section, whose defaults Airflow's configuration then answers with."""
    from airflow._shared.module_loading import import_string
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.bases.notifier import BaseNotifier

    info = get_provider_info()
    manager = ProvidersManager()
    manager.initialize_providers_notifications()
    ours = [name for name in manager.notification if name.startswith("airflow_provider_babelqueue.")]
    assert ours == info["notifications"] == ["airflow_provider_babelqueue.notifications.BabelQueueDeadLetterNotifier"]
    assert issubclass(import_string(ours[0]), BaseNotifier)
    manager.initialize_providers_configuration()
    loaded = dict(manager.provider_configs)["airflow-provider-babelqueue"]
    assert loaded == info["config"]
    assert sorted(info["config"]["babelqueue"]["options"]) == [
        "dead_letter_sources", "output_root", "report_roots", "tracing"]
    code = ("from airflow.configuration import conf; "
            "print([conf.get('babelqueue', k) for k in ('tracing', 'output_root', 'dead_letter_sources')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300).stdout
    assert out.strip().splitlines()[-1] == "['auto', '', '']"
