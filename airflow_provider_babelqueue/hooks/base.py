"""What every BabelQueue hook shares: lazy binding creation, allowlisted extras, ``test_connection``.

Hooks are thin: connection → allowlisted extras → typed config → binding. They never look up a
connection or build a client in ``__init__`` (DAG files are parsed constantly); the binding is created
on first use and closed by :meth:`BabelQueueHook.close`.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from airflow.sdk import BaseHook, Connection

from ..bindings.base import Binding

__all__ = ["BabelQueueHook", "ConnectionConfigError", "as_bool", "as_float"]


class ConnectionConfigError(ValueError):
    """A connection field or extra has a value the hook cannot use; the message names the field."""


def as_bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on", "false", "0", "no", "off", ""):
        return value.strip().lower() in ("true", "1", "yes", "on")
    if isinstance(value, int):
        return bool(value)
    raise ConnectionConfigError(f"extra {field!r} must be true or false, got {value!r}")


def as_float(value: Any, field: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConnectionConfigError(f"extra {field!r} must be a number, got {value!r}") from None
    if number < 0:
        raise ConnectionConfigError(f"extra {field!r} must not be negative, got {value!r}")
    return number


class BabelQueueHook(BaseHook, abc.ABC):
    """Base of the per-broker hooks.

    :param babelqueue_conn_id: the Airflow connection that says where the broker is; its type selects the
        hook (see :func:`airflow_provider_babelqueue.hooks.get_hook`).
    """

    conn_name_attr = "babelqueue_conn_id"
    default_conn_name = "babelqueue_default"
    conn_type: ClassVar[str] = ""
    hook_name: ClassVar[str] = ""
    #: The only extras read from the connection; anything else in ``extra`` is ignored.
    extra_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, babelqueue_conn_id: str = default_conn_name, *, connection: Connection | None = None) -> None:
        super().__init__()
        self.babelqueue_conn_id = babelqueue_conn_id
        self._connection = connection
        self._binding: Binding | None = None

    # ---------------------------------------------------------------------------------- subclasses

    @abc.abstractmethod
    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        """Make the binding from the connection fields and the allowlisted extras."""

    def describe(self, connection: Connection) -> str:
        """Where the connection points, without secrets (used in messages)."""
        return f"{connection.host or 'localhost'}:{connection.port or ''}".rstrip(":")

    # ------------------------------------------------------------------------------------- shared

    @property
    def connection(self) -> Connection:
        if self._connection is None:
            self._connection = self.get_connection(self.babelqueue_conn_id)
        return self._connection

    def extras(self, connection: Connection) -> dict[str, Any]:
        """Allowlisted extras, read by name (the UI's ``extra__<type>__<name>`` form is accepted too)."""
        raw = connection.extra_dejson or {}
        out: dict[str, Any] = {}
        for name in self.extra_fields:
            for key in (name, f"extra__{self.conn_type}__{name}"):
                if key in raw and raw[key] not in (None, ""):
                    out[name] = raw[key]
                    break
        return out

    def get_binding(self) -> Binding:
        """The binding for this connection, created on first use and reused afterwards."""
        if self._binding is None:
            connection = self.connection
            self._binding = self.build_binding(connection, self.extras(connection))
        return self._binding

    def test_connection(self) -> tuple[bool, str]:
        """Reach the broker once. Returns ``(False, what is wrong)`` instead of raising."""
        try:
            connection = self.connection
            binding = self.build_binding(connection, self.extras(connection))
            try:
                binding.ping()
            finally:
                binding.close()
        except Exception as exc:  # noqa: BLE001 - the UI wants a message, not a traceback
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"Connected to {self.hook_name} at {self.describe(connection)}"

    def close(self) -> None:
        if self._binding is not None:
            self._binding.close()
            self._binding = None
