"""What every BabelQueue hook shares: lazy binding creation, allowlisted extras, ``test_connection``.

Hooks are thin: connection → allowlisted extras → typed config → binding. They never look up a
connection or build a client in ``__init__`` (DAG files are parsed constantly); the binding is created
on first use and closed by :meth:`BabelQueueHook.close`.

Extras: each hook points at its :class:`~airflow_provider_babelqueue.hooks.fields.ConnectionSpec`, which names
every extra it reads and its kind. :func:`read_extras` reads those extras by name and converts each by its kind,
so a hook's :meth:`~BabelQueueHook.build_binding` keeps only what is particular to its broker (which standard
field means what, URLs, rules that join two fields).

Secrets: Airflow masks a connection's password and extras with sensitive names (``aws_session_token``) in
logs by itself. It cannot know about secrets inside other values: the password in a URL's userinfo or a secret
URL query parameter (``?password=``, ``?token=``, ``?sig=`` in ``sqlalchemy_url``, ``endpoint_url``,
``admin_url``, a host given as a URL) or the key inside an Azure connection string. :func:`connection_secrets`
finds those (the rule is :mod:`~airflow_provider_babelqueue.bindings.redaction`'s); hooks register them with
Airflow's masker whenever they build a binding, and ``test_connection`` and ``describe`` (whose text goes to the
UI unmasked) redact and scrub them out.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Self, TypeVar
from urllib.parse import quote, quote_plus

from airflow.sdk import BaseHook, Connection

from ..bindings.base import Binding
from ..bindings.redaction import is_secret_name, redact, scrub, url_secrets
from ..core.errors import ConnectionConfigError
from .client_logs import quiet_client_loggers
from .fields import ConnectionSpec, Extra

__all__ = [
    "BabelQueueHook",
    "ConnectionConfigError",
    "as_bool",
    "as_float",
    "as_int",
    "connection_secrets",
    "convert_extra",
    "login_options",
    "make_config",
    "read_extras",
    "scrub",
]

#: Shorter strings are not scrubbed from messages: a one-letter password would garble every message.
_MIN_SCRUBBED = 4


T = TypeVar("T")


def as_bool(value: Any, field: str) -> bool:
    """True or false from an extra (a JSON boolean or number, or text such as ``yes``/``off``), or an error naming
    the extra."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on", "false", "0", "no", "off", ""):
        return value.strip().lower() in ("true", "1", "yes", "on")
    if isinstance(value, int):
        return bool(value)
    raise ConnectionConfigError(f"extra {field!r} must be true or false, got {value!r}")


def as_float(value: Any, field: str) -> float:
    """A number >= 0 from an extra (a JSON number or its text), or an error naming the extra."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConnectionConfigError(f"extra {field!r} must be a number, got {value!r}") from None
    if number < 0:
        raise ConnectionConfigError(f"extra {field!r} must not be negative, got {value!r}")
    return number


def as_int(value: Any, field: str) -> int:
    """A whole number >= 0 from an extra (a JSON number or its text), or an error naming the extra."""
    number = as_float(value, field)
    if not number.is_integer():
        raise ConnectionConfigError(f"extra {field!r} must be a whole number, got {value!r}")
    return int(number)


def _as_choice(extra: Extra, value: Any) -> str:
    """One of an enum's ``choices`` (any case, or an alias), or an error that lists them."""
    text = str(value).strip().lower()
    text = extra.aliases.get(text, text)
    for choice in extra.choices:
        if text == choice.lower():
            return choice
    quoted = [repr(choice) for choice in extra.choices]
    allowed = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
    raise ConnectionConfigError(f"extra {extra.name!r} must be {allowed}, got {value!r}")


_CONVERTERS: dict[str, Callable[[Any, str], Any]] = {
    "str": lambda value, _: str(value),
    "path": lambda value, _: str(value),
    "bool": as_bool,
    "int": as_int,
    "float": as_float,
}


def convert_extra(extra: Extra, value: Any) -> Any:
    """``value`` as ``extra``'s kind says, or a :class:`ConnectionConfigError` that names the extra.

    Converting a converted value changes nothing, so helpers may take raw or converted extras alike.
    """
    if extra.kind == "enum":
        return _as_choice(extra, value)
    try:
        return _CONVERTERS[extra.kind](value, extra.name)
    except ConnectionConfigError:
        if not extra.must:
            raise
        raise ConnectionConfigError(f"extra {extra.name!r} must be {extra.must}, got {value!r}") from None


def read_extras(declared: Iterable[Extra], extras: Mapping[str, Any]) -> dict[str, Any]:
    """Each declared extra present in ``extras`` (and not empty), converted by its kind; nothing else.

    :param declared: the extras a connection type reads (its spec's ``extras``): the allowlist, by name.
    :param extras: raw extras, e.g. :meth:`BabelQueueHook.extras`; keys not declared are never looked at.
    """
    return {extra.name: convert_extra(extra, extras[extra.name]) for extra in declared
            if extras.get(extra.name) not in (None, "")}


def login_options(connection: Connection) -> dict[str, str]:
    """``username`` and ``password`` from the connection's login and password, each only when set: a broker that
    accepts anonymous clients (Redis without ACLs, say) gets neither rather than an empty credential."""
    options = {}
    if connection.login:
        options["username"] = connection.login
    if connection.password:
        options["password"] = connection.password
    return options


def make_config(config_class: Callable[..., T], connection: Connection, options: Mapping[str, Any]) -> T:
    """``config_class(**options)``; a value the config refuses becomes a :class:`ConnectionConfigError` that
    names the connection, so the UI and the task log say which connection to fix."""
    try:
        return config_class(**options)
    except ValueError as exc:
        raise ConnectionConfigError(f"connection {connection.conn_id!r}: {exc}") from None


def _configured_dead_letter_sources() -> str:
    """``[babelqueue] dead_letter_sources``: the DLQ sources of every connection that names none itself (the names
    or suffixes the fleet's SDKs write, e.g. ``.dlq,:failed``)."""
    from airflow.sdk.configuration import conf

    return (conf.get("babelqueue", "dead_letter_sources", fallback="") or "").strip()


def _encoded_forms(secret: str) -> tuple[str, ...]:
    """The percent-encoded spellings of ``secret`` that :func:`scrub` also replaces."""
    return tuple(dict.fromkeys((quote(secret, safe=""), quote_plus(secret), quote(secret))))


def connection_secrets(connection: Connection | None, extras: Mapping[str, Any] | None = None) -> list[str]:
    """Every string of a connection that must never be shown, longest first.

    The password; allowlisted extras whose names say they are secret
    (:func:`~airflow_provider_babelqueue.bindings.redaction.is_secret_name`); the userinfo password and the secret
    query parameters of any URL (in the host, the password or an extra); the secret segments of a connection
    string (Azure Service Bus keeps one in the password field, with a SAS key or signature inside). Values shorter
    than 4 characters are left out (scrubbing them would garble every message; the structural redaction of URLs
    still hides them), and so is a value that is only the percent-encoding of another (:func:`scrub` replaces
    those forms anyway).

    :param extras: the allowlisted extras the hook read (never the raw ``extra``: unknown keys are ignored).
    """
    if connection is None:
        return []
    values: list[str] = []
    password = connection.password or ""
    if password:
        values.append(password)
        values.extend(url_secrets(password))
    values.extend(url_secrets(connection.host or ""))
    for name, value in (extras or {}).items():
        if isinstance(value, str):
            if is_secret_name(name):
                values.append(value)
            values.extend(url_secrets(value))
    found = {value for value in values if len(value) >= _MIN_SCRUBBED}
    encodings = {form for value in found for form in _encoded_forms(value) if form != value}
    return sorted(found - encodings, key=len, reverse=True)


def _mask_in_logs(secrets: Iterable[str]) -> None:
    """Register secrets, and their percent-encoded forms, with Airflow's log masker (task, triggerer and
    supervisor logs), where available. Airflow's masker replaces exact strings only: a driver that logs the URL
    would print ``p%40ss`` for the registered ``p@ss``."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older task SDKs: Airflow still masks the password itself
        return
    for secret in secrets:
        for form in dict.fromkeys((secret, *_encoded_forms(secret))):
            mask_secret(form)


class BabelQueueHook(BaseHook, abc.ABC):
    """Base of the per-broker hooks.

    :param babelqueue_conn_id: the Airflow connection that says where the broker is; its type selects the
        hook (see :func:`airflow_provider_babelqueue.hooks.get_hook`).
    """

    conn_name_attr = "babelqueue_conn_id"
    default_conn_name = "babelqueue_default"
    #: Whether ``[babelqueue] dead_letter_sources`` applies to this connection type when its extra is blank: the
    #: brokers the SDKs write to, not the SQL table (its sources are tables, named per database).
    reads_fleet_dead_letter_sources = True
    #: The connection type this hook serves, declared once; ``conn_type``, ``hook_name`` and ``extra_fields``
    #: are read from it when a subclass is defined.
    connection_spec: ClassVar[ConnectionSpec]
    conn_type: ClassVar[str] = ""
    hook_name: ClassVar[str] = ""
    #: The only extras read from the connection; anything else in ``extra`` is ignored.
    extra_fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("connection_spec")
        if spec is not None:
            cls.conn_type, cls.hook_name, cls.extra_fields = spec.conn_type, spec.hook_name, spec.extra_names

    def __init__(self, babelqueue_conn_id: str = default_conn_name, *, connection: Connection | None = None) -> None:
        super().__init__()
        self.babelqueue_conn_id = babelqueue_conn_id
        self._connection = connection
        self._binding: Binding | None = None

    # ---------------------------------------------------------------------------------- subclasses

    @abc.abstractmethod
    def build_binding(self, connection: Connection, extras: dict[str, Any]) -> Binding:
        """Make the binding from the connection fields and the allowlisted extras (see :meth:`config_options`)."""

    def describe(self, connection: Connection) -> str:
        """Where the connection points, without secrets (used in messages; a host given as a URL is redacted)."""
        return f"{redact(connection.host or 'localhost')}:{connection.port or ''}".rstrip(":")

    def reached(self, connection: Connection, binding: Binding) -> str:
        """What :meth:`test_connection` reports after ``binding.ping()`` succeeded; a hook whose ping can succeed
        without connecting (a SQLite file that does not exist yet) says so instead."""
        return f"Connected to {self.hook_name} at {self.describe(connection)}"

    # ------------------------------------------------------------------------------------- shared

    @property
    def connection(self) -> Connection:
        if self._connection is None:
            self._connection = self.get_connection(self.babelqueue_conn_id)
        return self._connection

    def extras(self, connection: Connection) -> dict[str, Any]:
        """Allowlisted extras, read by name (the UI's ``extra__<type>__<name>`` form is accepted too, under the
        type's current or former names)."""
        raw = connection.extra_dejson or {}
        out: dict[str, Any] = {}
        conn_types = self.connection_spec.conn_types
        for name in self.extra_fields:
            for key in (name, *(f"extra__{conn_type}__{name}" for conn_type in conn_types)):
                if key in raw and raw[key] not in (None, ""):
                    out[name] = raw[key]
                    break
        if self.reads_fleet_dead_letter_sources and "dead_letter_sources" not in out:
            fleet = _configured_dead_letter_sources()
            if fleet:
                out["dead_letter_sources"] = fleet
        return out

    def config_options(self, extras: Mapping[str, Any]) -> dict[str, Any]:
        """The converted extras that go to the binding config under their own names (``to_config``), and
        ``dead_letter_sources`` as it is (a JSON list, or comma text from the form): every broker's config splits
        and checks it itself (``Binding.source_entries``), so its errors name the entry at fault."""
        declared = [extra for extra in self.connection_spec.extras if extra.to_config]
        options = read_extras(declared, extras)
        if "dead_letter_sources" in extras:
            options["dead_letter_sources"] = extras["dead_letter_sources"]
        return options

    def console_queues(self) -> list[str]:
        """The queues the connection's ``console_queues`` extra names, for the dead-letter console's list (a JSON
        list or comma text; blank entries dropped).

        :raises ValueError: an entry is not text."""
        value = self.extras(self.connection).get("console_queues")
        if isinstance(value, list) and not all(isinstance(entry, str) for entry in value):
            raise ValueError(f"the console_queues extra of {self.babelqueue_conn_id!r} must list queue names (text), "
                             f"got {value!r}")
        return list(Binding.source_entries(value))

    def get_binding(self) -> Binding:
        """The binding for this connection, created on first use and reused afterwards.

        The connection's embedded secrets (see :func:`connection_secrets`) are registered with Airflow's log
        masker first, so a broker error that echoes a URL cannot print them in a task log. The broker client's
        loggers are set to WARNING unless the user chose their level
        (:func:`~airflow_provider_babelqueue.hooks.client_logs.quiet_client_loggers`).
        """
        if self._binding is None:
            connection = self.connection
            extras = self.extras(connection)
            _mask_in_logs(connection_secrets(connection, extras))
            binding = self.build_binding(connection, extras)
            quiet_client_loggers(binding.client_loggers)  # bindings connect lazily: before any client line
            self._binding = binding
        return self._binding

    def test_connection(self) -> tuple[bool, str]:
        """Reach the broker once. Returns ``(False, what is wrong)`` instead of raising.

        The message is shown in the UI as it is (no log masking applies), so every secret of the connection is
        scrubbed from it, success or failure; the secrets are registered with Airflow's masker first, as
        :meth:`get_binding` does, since a driver may log while it connects.
        """
        connection: Connection | None = None
        extras: dict[str, Any] = {}
        try:
            connection = self.connection
            extras = self.extras(connection)
            _mask_in_logs(connection_secrets(connection, extras))
            binding = self.build_binding(connection, extras)
            quiet_client_loggers(binding.client_loggers)
            try:
                binding.ping()
                message = self.reached(connection, binding)
            finally:
                binding.close()
        except Exception as exc:  # noqa: BLE001 - the UI wants a message, not a traceback
            return False, scrub(f"{type(exc).__name__}: {exc}", connection_secrets(connection, extras))
        return True, scrub(message, connection_secrets(connection, extras))

    def close(self) -> None:
        """Close the binding's broker connections, if one was made; the hook can make a new one afterwards."""
        if self._binding is not None:
            self._binding.close()
            self._binding = None

    def __enter__(self) -> Self:
        """``with get_hook("orders") as hook:`` closes the broker connections when the block ends, also on an
        error: a task's own code then never leaves a connection open on a worker that runs many tasks."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
