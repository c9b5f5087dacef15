"""Rendered-template clean-up for operator parameters, in one place.

A templated field arrives as whatever Jinja rendered: a list, or its JSON or Python text, ``"None"`` for an unset
``params`` entry, ``""`` from a trigger form's empty box. These functions turn such values into what the
engines take, with an error that names the parameter.
"""

from __future__ import annotations

import ast
import json
import math
import os
from collections.abc import Sequence
from typing import Any

__all__ = [
    "is_template",
    "is_unset",
    "parse_count",
    "parse_flag",
    "parse_list",
    "parse_names",
    "parse_number",
    "parse_rendered",
    "text_or_none",
]


def is_unset(value: Any) -> bool:
    """Whether a rendered value means "not given": ``None``, blank text, or the text ``"None"`` (what
    ``{{ params.x }}`` renders for an unset param)."""
    return value is None or (isinstance(value, str) and value.strip() in ("", "None"))


def is_template(value: Any) -> bool:
    """Whether ``value`` is only known once the task runs, so a check when the DAG is parsed must skip it: an
    unrendered Jinja template, an upstream task's output (``XComArg``) or anything else Airflow resolves at run
    time (not plain data), or a list holding one."""
    if isinstance(value, str):
        return "{{" in value
    if value is None or isinstance(value, bool | int | float | bytes | os.PathLike):
        return False
    if isinstance(value, list | tuple | set | frozenset):
        return any(is_template(item) for item in value)
    return not isinstance(value, dict)


def parse_list(value: Any, name: str) -> list[str]:
    """A templated list, in order: a list/tuple/set, its rendered text (JSON or Python's), or comma-separated
    text; unset is ``[]``."""
    if is_unset(value):
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "(")):
            value = parse_rendered(text, name, "a list of strings")
        else:
            value = [part.strip() for part in text.split(",")]
    if not isinstance(value, Sequence | set | frozenset) or isinstance(value, str | bytes):
        raise ValueError(f"{name} must be a list of strings, got {value!r}")
    return [text for text in (str(item).strip() for item in value) if text]


def parse_rendered(text: str, name: str, expected: str) -> Any:
    """The value a templated field's rendered text stands for.

    A template renders text: JSON when the author wrote ``| tojson``, and Python's text of the value when not
    (Jinja writes ``{{ params.order }}`` as ``{'order_id': 1}``, an XCom of bytes as ``[b'...']``). Python's text
    of dicts, lists, strings, bytes, numbers, booleans and ``None`` reads back to exactly the value it was
    written from, so both are taken; anything else (a datetime, a Decimal, an object) cannot be read back
    faithfully and is refused with the ways to pass the value itself.

    :param expected: what the field takes, for the error (``"a dict or a list of dicts"``).
    :raises ValueError: when the text is neither JSON nor a Python literal.
    """
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        shown = text if len(text) <= 80 else f"{text[:77]}..."
        raise ValueError(
            f"{name} must be {expected}; it was rendered to text that is neither JSON nor a Python literal: "
            f"{shown!r}. Pass the XComArg itself (e.g. extract.output), add '| tojson' to the template, or set "
            "render_template_as_native_obj=True on the DAG."
        ) from None


def parse_names(value: Any, name: str) -> frozenset[str] | None:
    """A templated list as a filter: :func:`parse_list`'s names as a set; empty means no filter (``None``)."""
    return frozenset(parse_list(value, name)) or None


def parse_number(value: Any, name: str) -> float | None:
    """A templated finite number >= 0 (``None``, ``""`` and ``"None"`` mean unset)."""
    if is_unset(value):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if number < 0 or not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return number


def parse_count(value: Any, name: str) -> int | None:
    """A templated whole number >= 0, or ``None`` when unset (a bound such as ``max_messages``)."""
    try:
        number = None if is_unset(value) else int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a whole number, got {value!r}") from None
    if number is not None and number < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return number


def parse_flag(value: Any, name: str) -> bool:
    """A templated boolean: a bool, an int, or true/false/1/0/yes/no text."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no", ""):
        return value.strip().lower() in ("true", "1", "yes")
    if isinstance(value, int):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r}")


def text_or_none(value: Any) -> str | None:
    """``value`` when it is a string that is set (not blank, not the ``"None"`` an unset param renders), else
    ``None``: an optional name (a target queue, a store) must never become a queue or store called "None"."""
    return value if isinstance(value, str) and not is_unset(value) else None
