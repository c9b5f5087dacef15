"""Connection type names: ``babelqueue+<broker>``, which Airflow neither rewrites nor warns about, while
connections saved with the former ``babelqueue_<broker>`` names keep resolving to the right hook."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from importlib import import_module
from pathlib import Path

import pytest
from airflow.sdk import Connection

from airflow_provider_babelqueue.hooks import FORMER_CONN_TYPES, HOOK_CLASSES, current_conn_type, get_hook
from airflow_provider_babelqueue.hooks.connection_specs import CONNECTION_SPECS, REDIS
from airflow_provider_babelqueue.hooks.fields import CONN_TYPE, ConnectionSpec

SPECS = {spec.conn_type: spec for spec in CONNECTION_SPECS}
#: The names the provider used before ``babelqueue+<broker>``: connections saved with them must keep working.
FORMER = {
    "babelqueue_sql": "babelqueue+sql",
    "babelqueue_redis": "babelqueue+redis",
    "babelqueue_rabbitmq": "babelqueue+rabbitmq",
    "babelqueue_sqs": "babelqueue+sqs",
    "babelqueue_pulsar": "babelqueue+pulsar",
    "babelqueue_azure_service_bus": "babelqueue+servicebus",
}
#: The standard fields each type needs for its binding to be built (nothing is contacted here).
FIELDS = {"babelqueue+servicebus": {"host": "contoso.servicebus.windows.net"}}

#: Loads the provider the way Airflow's API server, scheduler and workers do, and renders a connection of each
#: given type as a URI (what Airflow does on every secrets lookup, ``connections list`` and UI test); prints each
#: URI's type as Airflow reads it back. Run in a fresh interpreter: the providers manager is a singleton.
LOAD = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("always")
    from airflow.models.connection import Connection
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    manager = ProvidersManager()
    manager.connection_form_widgets, manager.field_behaviours
    list(manager.iter_connection_type_hook_ui_metadata())
    hooks = ProvidersManagerTaskRuntime().hooks
    back = {}
    for conn_type in json.loads(sys.argv[1]):
        if conn_type in hooks:
            hooks[conn_type]  # imports the hook class, checking it against the provider info
        uri = Connection(conn_id="probe", conn_type=conn_type, host="broker.internal", port=1).get_uri()
        back[conn_type] = Connection(conn_id="again", uri=uri).conn_type
    print("ROUND-TRIP " + json.dumps(back))
    """
)


def load_in_airflow(conn_types: list[str]) -> tuple[str, dict[str, str]]:
    """Everything Airflow printed (stdout, stderr and Python warnings) while loading, and the round trips."""
    done = subprocess.run([sys.executable, "-c", LOAD, json.dumps(conn_types)], capture_output=True, text=True,
                          timeout=300, check=True)
    output = done.stdout + done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("ROUND-TRIP ")]
    return output, json.loads(line.removeprefix("ROUND-TRIP "))


def test_airflow_loads_the_provider_and_renders_its_types_without_a_warning_about_their_names() -> None:
    """Airflow warns "Connection schemes (type: …) shall not contain '_' according to RFC3986" whenever it renders
    a connection with such a type as a URI, and rewrites ``-`` to ``_`` when it reads one. The current names have
    neither: loading the provider and rendering them says nothing about them, and each URI comes back with the
    type it had. The former names, rendered in the same run, are the control: the warning appears for each of
    them (so the capture sees it), and their URIs come back under the former names, which is why those stay
    resolvable."""
    output, back = load_in_airflow(sorted(SPECS) + sorted(FORMER))
    warned = sorted(line.split("(type: ")[1].split(")")[0] for line in output.splitlines() if "RFC3986" in line)
    assert warned == sorted(FORMER), output
    noisy = [line for line in output.splitlines() if "RFC3986" not in line and "babelqueue" in line.lower()
             and any(word in line.lower() for word in ("warn", "error", "inconsisten"))]
    assert noisy == [], "\n".join(noisy)
    assert back == {conn_type: conn_type for conn_type in [*SPECS, *FORMER]}


@pytest.mark.parametrize("spec", CONNECTION_SPECS, ids=lambda spec: spec.conn_type)
def test_each_type_is_named_babelqueue_plus_broker_and_keeps_its_former_name(spec: ConnectionSpec) -> None:
    assert CONN_TYPE.fullmatch(spec.conn_type) and spec.conn_type.startswith("babelqueue+")
    former = next(old for old, new in FORMER.items() if new == spec.conn_type)
    assert spec.former_conn_types == (former,) and spec.conn_types == (spec.conn_type, former)
    assert FORMER_CONN_TYPES[former] == spec.conn_type
    assert current_conn_type(former) == current_conn_type(spec.conn_type) == spec.conn_type
    assert former not in HOOK_CLASSES  # registered once: the UI lists each type a single time


def test_a_name_airflow_would_rewrite_or_warn_about_is_refused_when_declared() -> None:
    for bad in ("babelqueue_redis", "babelqueue-redis", "BabelQueue+redis", "babelqueue.redis"):
        with pytest.raises(ValueError, match="letters, digits and '\\+' only"):
            ConnectionSpec(conn_type=bad, hook_name="x", hook_class="x.Y", extras=())


def _hook_class_name(hook: object) -> str:
    return f"{type(hook).__module__}.{type(hook).__qualname__}"


@pytest.mark.parametrize("former", sorted(FORMER))
def test_a_connection_saved_with_a_former_type_name_resolves_to_its_hook(
    former: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As a JSON connection and as a URI (Airflow reads ``babelqueue-redis://`` as ``babelqueue_redis``); the
    hook builds its binding from the same fields and extras as under the current name, and the task log notes
    the former name once, at INFO."""
    current = FORMER[former]
    fields = FIELDS.get(current, {"host": str(tmp_path / "q.sqlite")} if current == "babelqueue+sql" else {})
    monkeypatch.setenv("AIRFLOW_CONN_BQ_FORMER_JSON", json.dumps({"conn_type": former, **fields}))
    host = fields.get("host", "broker.internal")
    monkeypatch.setenv("AIRFLOW_CONN_BQ_FORMER_URI", f"{former.replace('_', '-')}://{host.replace('/', '%2F')}")
    monkeypatch.setenv("AIRFLOW_CONN_BQ_CURRENT", json.dumps({"conn_type": current, **fields}))
    with caplog.at_level(logging.INFO, logger="airflow_provider_babelqueue.hooks"):
        hooks = [get_hook(conn_id) for conn_id in ("bq_former_json", "bq_former_json", "bq_former_uri")]
    assert {_hook_class_name(hook) for hook in hooks} == {HOOK_CLASSES[current]}
    assert hooks[2].connection.conn_type == former  # Airflow's reading of the URI: the hook takes it as it is
    for hook in hooks[:1] + hooks[2:]:
        try:
            assert type(hook.get_binding()).__name__ == type(get_hook("bq_current").get_binding()).__name__
        finally:
            hook.close()
    notes = [r.getMessage() for r in caplog.records if "former type name" in r.getMessage()]
    assert len(notes) == 2 and all(r.levelno == logging.INFO for r in caplog.records if "former" in r.getMessage())
    assert f"'{former}', still accepted; its current name is '{current}'" in notes[0]


def test_form_keys_under_a_former_type_name_are_read() -> None:
    """Old UI forms stored extras as ``extra__<type>__<name>``; under the former name they still count."""
    module, _, name = REDIS.hook_class.rpartition(".")
    hook_class = getattr(import_module(module), name)
    extra = {"extra__babelqueue_redis__key_prefix": "old:", "extra__babelqueue+redis__db": "3"}
    connection = Connection(conn_id="form", conn_type="babelqueue_redis", host="127.0.0.1", extra=json.dumps(extra))
    hook = hook_class("form", connection=connection)
    assert hook.extras(connection) == {"key_prefix": "old:", "db": "3"}
    config = hook.get_binding().config
    assert (config.key_prefix, config.db) == ("old:", 3)
    hook.close()
