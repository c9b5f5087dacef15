"""Broker clients' own log lines in task logs: WARNING and above, unless the user set another level.

pika writes about twenty INFO lines per connection (socket connected, channel created, connection closed...),
botocore says where it found credentials, the Azure SDK logs every HTTP request and AMQP state change. They
describe the client's connection handling, not the task's work, and bury the task's own lines. So when a hook
builds a binding it sets each of the binding's :attr:`~airflow_provider_babelqueue.bindings.base.Binding.client_loggers`
to WARNING, as Airflow itself does for ``httpx`` and ``sqlalchemy.engine``, unless the user chose a level:

* Airflow's ``[logging] namespace_levels`` option (``AIRFLOW__LOGGING__NAMESPACE_LEVELS="pika=INFO"``) naming the
  logger, one of its parents or one of its children: the level given is applied to the stdlib logger (Airflow
  3.3 applies the option to its own structlog loggers only, so without this it would not reach pika);
* or a level already set on the logger itself (a ``logging_config_class`` with ``loggers: {pika: {level:
  INFO}}``, or code that ran ``logging.getLogger("pika").setLevel(...)`` first).

Only stdlib logger levels change; no handler, filter or propagation is touched.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

__all__ = ["CLIENT_LOG_LEVEL", "configured_levels", "parse_levels", "quiet_client_loggers"]

#: The level broker clients' loggers get when the user set none.
CLIENT_LOG_LEVEL = logging.WARNING

_SEPARATORS = re.compile(r"[\s,]+")


def parse_levels(value: str | None) -> dict[str, int]:
    """``<logger>=<level>`` pairs separated by whitespace or commas (the format of Airflow's
    ``namespace_levels``) as logger → numeric level. Malformed entries are skipped: Airflow reports them
    itself when it reads the option."""
    levels: dict[str, int] = {}
    names = logging.getLevelNamesMapping()
    for entry in _SEPARATORS.split((value or "").strip()):
        name, sep, level = entry.partition("=")
        number = names.get(level.strip().upper())
        if sep and name.strip() and isinstance(number, int):
            levels[name.strip()] = number
    return levels


def configured_levels() -> dict[str, int]:
    """Airflow's ``[logging] namespace_levels``, parsed; empty where no Airflow configuration can be read."""
    try:
        from airflow.sdk.configuration import conf

        return parse_levels(conf.get("logging", "namespace_levels", fallback=None))
    except Exception:  # noqa: BLE001 - no readable configuration means no user choice, not a failed task
        return {}


def _related(name: str, other: str) -> bool:
    """Whether ``other`` is ``name``, one of its parents or one of its children in the logger hierarchy."""
    return other == name or name.startswith(f"{other}.") or other.startswith(f"{name}.")


def quiet_client_loggers(names: Iterable[str], configured: Mapping[str, int] | None = None) -> None:
    """Set each of ``names`` to :data:`CLIENT_LOG_LEVEL` unless the user chose a level for it.

    :param names: the top loggers of a broker client (``pika``, ``botocore``); their children inherit.
    :param configured: logger → level the user asked for; by default Airflow's ``namespace_levels``. Entries
        related to a name (the name itself, a parent or a child) are applied to their stdlib loggers and leave
        that name as the user set it.
    """
    configured = configured_levels() if configured is None else configured
    for name in names:
        chosen = {other: level for other, level in configured.items() if _related(name, other)}
        for other, level in chosen.items():
            logging.getLogger(other).setLevel(level)
        client = logging.getLogger(name)
        if not chosen and client.level == logging.NOTSET:
            client.setLevel(CLIENT_LOG_LEVEL)
