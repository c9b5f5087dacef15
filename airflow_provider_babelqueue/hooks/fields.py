"""The vocabulary a connection type is declared in, and what is rendered from it.

A BabelQueue connection type is described once, as a :class:`ConnectionSpec`: its extras (each an :class:`Extra`
with a kind, a label, a description and a default) and how the UI form shows the standard fields
(:class:`UiBehaviour`). From that one description come

* the parsing of the allowlisted extras (:func:`airflow_provider_babelqueue.hooks.base.read_extras`),
* the ``connection-types`` entries of the provider info (:meth:`ConnectionSpec.provider_info`),
* the extras table of each ``docs/connections/<broker>.md`` page (:meth:`ConnectionSpec.extras_table`).

Pure module: standard library only. Airflow imports the provider info while it loads its configuration, so
nothing reachable from here may import Airflow or a broker client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

__all__ = ["CONN_TYPE", "ConnectionSpec", "Extra", "Kind", "UiBehaviour"]

#: What a connection type may be spelled with: a lower-case letter first, then lower-case letters, digits and
#: ``+``. Airflow rewrites ``-`` in a connection URI's scheme to ``_`` (so ``-`` does not survive a round trip)
#: and logs a warning for every ``_`` whenever it renders such a connection as a URI.
CONN_TYPE = re.compile(r"[a-z][a-z0-9+]*")

#: How an extra's value is read: ``str`` and ``path`` as text, ``enum`` as one of ``choices``, ``int`` as a whole
#: number >= 0, ``float`` as a number >= 0, ``bool`` as true/false (``"yes"``, ``"0"`` and the like included).
Kind = Literal["str", "path", "enum", "int", "float", "bool"]

_JSON_TYPES: Mapping[str, str] = MappingProxyType(
    {"str": "string", "path": "string", "enum": "string", "int": "integer", "float": "number", "bool": "boolean"}
)


@dataclass(frozen=True)
class Extra:
    """One allowlisted extra of a connection type.

    :param name: the key in the connection's ``extra`` JSON, and the binding config's field when ``to_config``.
    :param kind: how the value is converted and checked (see :data:`Kind`); also gives the UI form's JSON type.
    :param label: the UI form's label.
    :param description: the UI form's help text, short enough to sit under the field.
    :param default: the binding's default, shown in the form and the docs; ``None`` when the binding has none
        (then the form leaves the field empty and the binding decides).
    :param choices: the values an ``enum`` accepts, in the spelling that reaches the binding.
    :param aliases: other spellings an ``enum`` accepts, each mapped to one of ``choices`` (old names people use).
    :param secret: the UI masks the value (``format: password``), as it does the password field.
    :param minimum: the smallest value the form offers. A UI hint only: the binding config checks its own ranges,
        so that one place words the error.
    :param exclusive_minimum: as ``minimum``, for a bound the value must stay above.
    :param maximum: the largest value the form offers (a UI hint only, as ``minimum``).
    :param to_config: the converted value goes to the binding config under ``name``; ``False`` for extras the
        hook turns into something else itself (part of a URL, a choice of driver).
    :param must: replaces the kind's words in the error ("must be a database number") where they would mislead.
    :param doc: the docs table's explanation (Markdown, one line); the ``description`` when empty.
    :param doc_default: the docs table's default column where the value alone does not say it (``queue name``,
        ``certifi``, a size in MiB beside the bytes); rendered from ``default`` when empty.
    """

    name: str
    kind: Kind
    label: str
    description: str = ""
    default: str | int | float | bool | None = None
    choices: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    secret: bool = False
    minimum: int | float | None = None
    exclusive_minimum: int | float | None = None
    maximum: int | float | None = None
    to_config: bool = True
    must: str = ""
    doc: str = ""
    doc_default: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _JSON_TYPES:
            raise ValueError(f"extra {self.name!r}: unknown kind {self.kind!r}")
        if (self.kind == "enum") != bool(self.choices):
            raise ValueError(f"extra {self.name!r}: choices go with the kind 'enum', and it needs them")
        if not set(self.aliases.values()) <= set(self.choices):
            raise ValueError(f"extra {self.name!r}: every alias must map to one of {self.choices}")
        if "|" in self.doc + self.doc_default + self.description:
            raise ValueError(f"extra {self.name!r}: '|' would split the docs table's row")
        object.__setattr__(self, "aliases", MappingProxyType(dict(self.aliases)))

    def schema(self) -> dict[str, Any]:
        """The JSON schema of the UI form's field: the kind's type (empty allowed), choices, secrecy, default,
        bounds."""
        schema: dict[str, Any] = {"type": [_JSON_TYPES[self.kind], "null"]}
        if self.choices:
            # No ``None`` among the choices, although the field may stay empty: Airflow's form lists every enum
            # value as an option, ``None`` as the word "null", and its dropdown is clearable anyway.
            schema["enum"] = list(self.choices)
        if self.secret:
            schema["format"] = "password"
        if self.default is not None:
            schema["default"] = self.default
        for key, bound in (("minimum", self.minimum), ("exclusiveMinimum", self.exclusive_minimum),
                           ("maximum", self.maximum)):
            if bound is not None:
                schema[key] = bound
        return schema

    def conn_field(self) -> dict[str, Any]:
        """The ``conn-fields`` entry of the provider info."""
        entry: dict[str, Any] = {"label": self.label}
        if self.description:
            entry["description"] = self.description
        entry["schema"] = self.schema()
        return entry

    def doc_row(self) -> str:
        """The docs table's row: ``| `name` | default | meaning |``."""
        return f"| `{self.name}` | {self.doc_default or _doc_value(self.default)} | {self.doc or self.description} |"


def _doc_value(value: str | float | bool | None) -> str:
    """A default as the docs write it: JSON spelling in code quotes, a dash for none."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


@dataclass(frozen=True)
class UiBehaviour:
    """How the UI form shows the standard connection fields (Airflow's ``ui-field-behaviour``).

    :param hidden: standard fields the connection type does not use (``extra`` too: the declared extras have
        their own inputs, and a free JSON box would invite keys the hook ignores).
    :param relabeling: standard field → the label that says what it holds for this broker.
    :param placeholders: standard field → an example value shown in the empty input.
    """

    hidden: tuple[str, ...] = ("extra",)
    relabeling: Mapping[str, str] = field(default_factory=dict)
    placeholders: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "relabeling", MappingProxyType(dict(self.relabeling)))
        object.__setattr__(self, "placeholders", MappingProxyType(dict(self.placeholders)))

    def provider_info(self) -> dict[str, Any]:
        return {"hidden-fields": list(self.hidden), "relabeling": dict(self.relabeling),
                "placeholders": dict(self.placeholders)}


@dataclass(frozen=True)
class ConnectionSpec:
    """Everything said about one connection type, once.

    :param conn_type: Airflow's connection type, ``babelqueue+<broker>``. Namespaced, because plain broker names
        belong to other providers and a clash stops Airflow from loading either. Nothing but letters, digits and
        ``+``: the type is also a connection URI's scheme, where Airflow turns ``-`` into ``_`` and warns about
        every ``_`` (RFC 3986 does not allow it), so only such a name comes back from a URI as it went in.
    :param hook_name: the name the UI lists the type under.
    :param hook_class: the dotted path of the hook class (a path, not the class: this module imports no Airflow).
    :param extras: the only extras the hook reads, in the order the form and the docs show them.
    :param ui: how the form shows the standard fields.
    :param former_conn_types: earlier names of this type, still resolved to the same hook so that connections
        saved with them keep working (they are not registered with Airflow: the UI lists each type once).
    """

    conn_type: str
    hook_name: str
    hook_class: str
    extras: tuple[Extra, ...]
    ui: UiBehaviour = UiBehaviour()
    former_conn_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [extra.name for extra in self.extras]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.conn_type}: an extra is declared twice in {names}")
        if not CONN_TYPE.fullmatch(self.conn_type):
            raise ValueError(f"connection type {self.conn_type!r}: letters, digits and '+' only (a URI scheme "
                             "Airflow neither rewrites nor warns about)")

    @property
    def conn_types(self) -> tuple[str, ...]:
        """Every name that means this type: the current one first, then the former ones."""
        return (self.conn_type, *self.former_conn_types)

    @property
    def extra_names(self) -> tuple[str, ...]:
        return tuple(extra.name for extra in self.extras)

    @property
    def hook_module(self) -> str:
        return self.hook_class.rpartition(".")[0]

    def provider_info(self) -> dict[str, Any]:
        """The ``connection-types`` entry of the provider info."""
        return {
            "connection-type": self.conn_type,
            "hook-class-name": self.hook_class,
            "hook-name": self.hook_name,
            "ui-field-behaviour": self.ui.provider_info(),
            "conn-fields": {extra.name: extra.conn_field() for extra in self.extras},
        }

    def extras_table(self) -> str:
        """The Markdown table of the extras for ``docs/connections/<broker>.md`` (a test keeps the page in step)."""
        return "\n".join(["| Extra | Default | Meaning |", "|---|---|---|", *(e.doc_row() for e in self.extras)])
