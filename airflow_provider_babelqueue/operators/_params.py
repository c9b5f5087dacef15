"""Rendered-template clean-up for operator parameters, in one place.

A templated field arrives as whatever Jinja rendered: a list or its JSON text, ``"None"`` for an unset
``params`` entry, ``""`` from a trigger form's empty box. These functions turn such values into what the
engines take, with an error that names the parameter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["parse_flag", "parse_names", "parse_number", "text_or_none"]


def parse_names(value: Any, name: str) -> frozenset[str] | None:
    """A templated list: a list/tuple/set, JSON list text, or comma-separated text; empty = no filter."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text or text == "None":
            return None
        if text.startswith("["):
            value = json.loads(text)
        else:
            value = [part.strip() for part in text.split(",")]
    if not isinstance(value, Sequence | set | frozenset) or isinstance(value, bytes):
        raise ValueError(f"{name} must be a list of strings, got {value!r}")
    out = frozenset(str(item) for item in value if str(item))
    return out or None


def parse_number(value: Any, name: str, *, integer: bool = False) -> float | int | None:
    """A templated number >= 0 (``None``, ``""`` and ``"None"`` mean unset)."""
    if value is None or value == "" or value == "None":
        return None
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a {'whole ' if integer else ''}number, got {value!r}") from None
    if number < 0 or (not integer and not math.isfinite(number)):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
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
    """``value`` when it is a non-blank string, else ``None``."""
    return value if isinstance(value, str) and value.strip() else None
