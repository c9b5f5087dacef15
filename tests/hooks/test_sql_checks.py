"""The SQL connection's smaller promises: testing a SQLite connection creates nothing, a missing PostgreSQL driver
names the extra that installs it, and the connection form offers no "null" choice."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from airflow_provider_babelqueue.bindings.base import MissingExtraError
from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig, sqlite_url
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.hooks.connection_specs import CONNECTION_SPECS

PG = {"conn_type": "babelqueue+sql", "host": "127.0.0.1", "port": 5432, "login": "postgres", "schema": "test",
      "extra": {"dialect": "postgresql"}}
EXTRA = "pip install 'airflow-provider-babelqueue[postgres]'"


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, spec: dict) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(spec))
    return conn_id


def test_testing_a_sqlite_connection_whose_file_does_not_exist_creates_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Opening SQLite creates the file, so the test only checks that the folder can hold it, and says so."""
    path = tmp_path / "not-yet.sqlite"
    hook = get_hook(define(monkeypatch, "bq_sqlite_new", {"conn_type": "babelqueue+sql", "host": str(path)}))
    ok, message = hook.test_connection()
    assert ok is True
    assert message == (f"SQLite file {path} does not exist yet: the first use (a publish, a read) creates it, and "
                       "its folder exists and is writable. This test created nothing")
    assert list(tmp_path.iterdir()) == []  # no file, no -wal or -journal beside it


def test_testing_a_sqlite_connection_in_a_missing_folder_fails_and_creates_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "absent" / "q.sqlite"
    hook = get_hook(define(monkeypatch, "bq_sqlite_nodir", {"conn_type": "babelqueue+sql", "host": str(path)}))
    ok, message = hook.test_connection()
    assert ok is False
    assert f"SQLite file {path} does not exist, nor does its folder {path.parent}" in message
    assert list(tmp_path.iterdir()) == []


def test_testing_an_existing_sqlite_file_connects(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    binding = SqlBinding(SqlConfig(url=sqlite_url(path)))
    binding.publish(b'{"job":"urn:x"}', "orders")  # creates the file and its tables
    binding.close()
    hook = get_hook(define(monkeypatch, "bq_sqlite_old", {"conn_type": "babelqueue+sql", "host": str(path)}))
    assert hook.test_connection() == (True, f"Connected to BabelQueue SQL at sqlite file {path}")


def test_a_missing_postgresql_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mock: psycopg2 cannot be uninstalled from the shared test environment, so ``sys.modules`` makes its
    import fail exactly as a missing package does (``ModuleNotFoundError``)."""
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    binding = SqlBinding(SqlConfig(url="postgresql+psycopg2://postgres@127.0.0.1:5432/test"))
    with pytest.raises(MissingExtraError, match=r"psycopg2 is not installed.*" + EXTRA.replace("[", r"\[")) as caught:
        binding.depth("orders")
    assert isinstance(caught.value, ImportError)  # code that catches the import failure still does
    hook = get_hook(define(monkeypatch, "bq_pg_nodriver", PG))
    ok, message = hook.test_connection()
    assert ok is False and message.startswith("MissingExtraError: psycopg2 is not installed") and EXTRA in message


def test_another_postgresql_driver_in_a_url_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pg8000", None)  # a mock of a missing driver, as above
    binding = SqlBinding(SqlConfig(url="postgresql+pg8000://postgres@127.0.0.1:5432/test"))
    with pytest.raises(MissingExtraError, match=r"pg8000 is not installed.*postgresql\+pg8000.*postgresql\+psycopg2"):
        binding.depth("orders")


@pytest.mark.parametrize("extra", [(spec, extra) for spec in CONNECTION_SPECS for extra in spec.extras
                                   if extra.kind == "enum"], ids=lambda pair: f"{pair[0].conn_type}-{pair[1].name}")
def test_the_connection_form_offers_no_null_choice(extra: tuple) -> None:
    """What the UI gets from Airflow's API (``/ui/connections/hook_meta``): a dropdown of the real choices only.
    A ``None`` among them is listed as the option "null"; an empty field is the dropdown's clear button."""
    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService

    spec, field = extra
    meta = {m.connection_type: m for m in HookMetaService.hook_meta_data()}[spec.conn_type]
    schema = meta.extra_fields[field.name]["schema"]
    assert schema["enum"] == list(field.choices)
    assert None not in schema["enum"] and "null" in schema["type"]  # no null option, yet the field may be empty
