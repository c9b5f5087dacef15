"""The connection declarations: the hooks read them, the extras convert by kind, the docs tables follow them.

No broker is contacted: bindings are built (they connect lazily) and only their configs are read.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import Connection

from airflow_provider_babelqueue.hooks import HOOK_CLASSES
from airflow_provider_babelqueue.hooks.base import BabelQueueHook, ConnectionConfigError, convert_extra, read_extras
from airflow_provider_babelqueue.hooks.connection_specs import CONNECTION_SPECS, SQL
from airflow_provider_babelqueue.hooks.fields import ConnectionSpec, Extra
from airflow_provider_babelqueue.hooks.sql import sql_url

ROOT = Path(__file__).resolve().parents[2]
SPECS = {spec.conn_type: spec for spec in CONNECTION_SPECS}
DIALECT = next(extra for extra in SQL.extras if extra.name == "dialect")

#: Text values the binding configs accept for extras whose form a config checks (names, URLs, ARNs).
TEXT_SAMPLES = {
    "region_name": "eu-west-1",
    "endpoint_url": "http://127.0.0.1:9",
    "role_arn": "arn:aws:iam::123456789012:role/sample",
    "dead_letter_suffix": "-sample",
    "dead_letter_queue_suffix": ".sample",
    "table": "sample_jobs",
    "key_prefix": "sample:",
}
#: The standard fields a connection of each type needs before any extra matters.
BASE_FIELDS: dict[str, dict[str, Any]] = {"babelqueue+servicebus": {"host": "contoso.servicebus.windows.net"}}


def hook_class(spec: ConnectionSpec) -> type[BabelQueueHook]:
    module, _, name = spec.hook_class.rpartition(".")
    return getattr(import_module(module), name)


def sample(extra: Extra) -> tuple[str, Any]:
    """A value for ``extra`` as the connection form would store it (text), other than its default, and the value
    the binding config must end up with."""
    if extra.kind == "bool":
        value = not extra.default
        return str(value).lower(), value
    if extra.kind in ("int", "float"):
        number = extra.minimum if extra.minimum is not None else (extra.exclusive_minimum or 0) + 1
        if number == extra.default:
            number += 1
        return str(number), (int if extra.kind == "int" else float)(number)
    if extra.kind == "enum":
        choice = next(choice for choice in extra.choices if choice != extra.default)
        return choice.upper(), choice
    text = TEXT_SAMPLES.get(extra.name, "/etc/ssl/sample.pem" if extra.kind == "path" else "sample")
    return text, text


@pytest.mark.parametrize("conn_type", sorted(SPECS))
def test_each_hook_class_takes_its_names_from_its_declaration(conn_type: str) -> None:
    spec = SPECS[conn_type]
    cls = hook_class(spec)
    assert cls.connection_spec is spec
    assert (cls.conn_type, cls.hook_name, cls.extra_fields) == (spec.conn_type, spec.hook_name, spec.extra_names)
    assert HOOK_CLASSES[conn_type] == spec.hook_class


@pytest.mark.parametrize("conn_type", sorted(SPECS))
def test_every_declared_extra_reaches_the_binding_config(conn_type: str, tmp_path: Path) -> None:
    """Each ``to_config`` extra, given as text, arrives converted under its own name: the declaration, the parser
    and the binding config agree on names and types."""
    spec = SPECS[conn_type]
    samples = {extra.name: sample(extra) for extra in spec.extras if extra.to_config}
    fields = BASE_FIELDS.get(conn_type, {"host": str(tmp_path / "q.sqlite")} if spec is SQL else {})
    connection = Connection(conn_id="declared", conn_type=conn_type, **fields,
                            extra=json.dumps({name: raw for name, (raw, _) in samples.items()}))
    hook = hook_class(spec)("declared", connection=connection)
    try:
        config = hook.get_binding().config  # type: ignore[attr-defined]
        got = {name: getattr(config, name) for name in samples}
    finally:
        hook.close()
    expected = {name: value for name, (_, value) in samples.items()}
    assert got == expected
    assert {name: type(value) for name, value in got.items()} == {k: type(v) for k, v in expected.items()}


@pytest.mark.parametrize(
    ("extra", "raw", "expected"),
    [
        (Extra("flag", "bool", "Flag"), "Yes", True),
        (Extra("flag", "bool", "Flag"), "off", False),
        (Extra("flag", "bool", "Flag"), 0, False),
        (Extra("count", "int", "Count"), "4096", 4096),
        (Extra("count", "int", "Count"), 2.0, 2),
        (Extra("seconds", "float", "Seconds"), "0.5", 0.5),
        (Extra("name", "str", "Name"), 12, "12"),
        (Extra("ca", "path", "CA"), "/etc/ca b.pem", "/etc/ca b.pem"),
        (DIALECT, " PostgreSQL ", "postgresql"),
        (DIALECT, "postgres", "postgresql"),
    ],
)
def test_values_convert_by_kind_and_converting_twice_changes_nothing(extra: Extra, raw: Any, expected: Any) -> None:
    value = convert_extra(extra, raw)
    assert value == expected and type(value) is type(expected)
    assert convert_extra(extra, value) == value  # sql_url and Pulsar's urls() take raw or converted extras


@pytest.mark.parametrize(
    ("extra", "raw", "message"),
    [
        (Extra("flag", "bool", "Flag"), "maybe", "extra 'flag' must be true or false, got 'maybe'"),
        (Extra("count", "int", "Count"), "1.5", "extra 'count' must be a whole number, got '1.5'"),
        (Extra("count", "int", "Count"), "-1", "extra 'count' must not be negative, got '-1'"),
        (Extra("seconds", "float", "Seconds"), "soon", "extra 'seconds' must be a number, got 'soon'"),
        (Extra("db", "int", "Db", must="a database number"), "-1", "extra 'db' must be a database number, got '-1'"),
        (Extra("mode", "enum", "Mode", choices=("a", "b", "c")), "d", "extra 'mode' must be 'a', 'b' or 'c', got 'd'"),
        (DIALECT, "oracle", "extra 'dialect' must be 'sqlite' or 'postgresql', got 'oracle'"),
    ],
)
def test_bad_values_name_the_extra_and_what_it_must_be(extra: Extra, raw: Any, message: str) -> None:
    with pytest.raises(ConnectionConfigError) as caught:
        convert_extra(extra, raw)
    assert str(caught.value) == message


def test_extras_are_read_by_name_and_empty_values_mean_unset() -> None:
    declared = (Extra("count", "int", "Count"), Extra("flag", "bool", "Flag"), Extra("name", "str", "Name"))
    raw = {"count": "3", "flag": "", "name": None, "undeclared": "x", "__class__": "y"}
    assert read_extras(declared, raw) == {"count": 3}


def test_sql_url_takes_the_dialect_in_any_case_and_its_old_alias() -> None:
    connection = Connection(conn_id="x", conn_type="babelqueue+sql", host="db", schema="d")
    for dialect in ("postgresql", "PostgreSQL", "postgres"):
        assert sql_url(connection, {"dialect": dialect}) == "postgresql+psycopg2://db/d"
    with pytest.raises(ConnectionConfigError, match="'sslmode' must be 'disable', 'allow', 'prefer', 'require'"):
        sql_url(connection, {"dialect": "postgresql", "sslmode": "always"})


def test_connection_config_error_is_part_of_the_package_error_tree() -> None:
    """One ``except BabelQueueError`` catches it (at either path of the tree), and old ``except ValueError`` too."""
    from airflow_provider_babelqueue.core.errors import BabelQueueError

    assert import_module("airflow_provider_babelqueue.exceptions").BabelQueueError is BabelQueueError
    assert issubclass(ConnectionConfigError, BabelQueueError) and issubclass(ConnectionConfigError, ValueError)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Extra("mode", "enum", "Mode"), "choices go with the kind 'enum'"),
        (lambda: Extra("name", "str", "Name", choices=("a",)), "choices go with the kind 'enum'"),
        (lambda: Extra("mode", "enum", "Mode", choices=("a",), aliases={"x": "b"}), "every alias must map"),
        (lambda: Extra("size", "bytes", "Size"), "unknown kind 'bytes'"),  # type: ignore[arg-type]
        (lambda: Extra("name", "str", "Name", doc="a | b"), "split the docs table"),
        (lambda: dataclasses.replace(SQL, extras=(*SQL.extras, SQL.extras[0])), "declared twice"),
    ],
)
def test_a_declaration_that_cannot_render_is_refused_when_written(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("conn_type", sorted(SPECS))
def test_the_docs_extras_table_is_the_one_the_declarations_render(conn_type: str) -> None:
    """The page must contain the rendered table verbatim; on failure, paste the table printed below."""
    spec = SPECS[conn_type]
    page = ROOT / "docs" / "connections" / (spec.hook_module.rpartition(".")[2].replace("_", "-") + ".md")
    table = spec.extras_table()
    assert f"\n{table}\n\n" in page.read_text(encoding="utf-8"), (  # the whole table, no row more or less
        f"{page.relative_to(ROOT)}: its extras table differs from the declarations in "
        f"airflow_provider_babelqueue/hooks/connection_specs.py; replace it with:\n\n{table}\n"
    )
