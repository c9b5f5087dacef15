"""``BabelQueuePlugin``: the provider's Airflow plugin, registered through the provider info (``plugins``).

Airflow imports plugin classes in every component (the scheduler for timetables, the DAG processor for extra
links, each task process for macros), so this module imports only ``AirflowPlugin``. The FastAPI application
and Airflow's API-server security module (seconds to import) are loaded when Airflow reads ``fastapi_apps``,
which only the API server does.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin

__all__ = ["APP_NAME", "URL_PREFIX", "BabelQueuePlugin"]

#: Where the API server mounts the plugin's application (operators/links.py builds its URLs under it).
URL_PREFIX = "/babelqueue"
APP_NAME = "BabelQueue"


@cache
def _fastapi_apps() -> list[dict[str, Any]]:
    from .app import create_app

    return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": APP_NAME}]


class _BuiltOnFirstRead:
    """A class attribute whose value (``fastapi_apps``) is built the first time it is read, then kept."""

    def __get__(self, instance: object, owner: type | None = None) -> list[dict[str, Any]]:
        return _fastapi_apps()


class BabelQueuePlugin(AirflowPlugin):
    """Serves the Spark triage report of a task instance at ``/babelqueue/reports/...`` (the triage task's
    "Dead-letter report" extra link opens it), behind Airflow's own login and DAG permissions, and the dead-letter
    console (``/babelqueue/console/``, in the UI's navigation as ``BabelQueue``) behind its asset permissions.
    Each feature is a router of the same application (see :mod:`.app`).
    """

    name = "babelqueue"
    fastapi_apps = _BuiltOnFirstRead()  # a list, built when first read
    #: The dead-letter console in the Airflow UI's navigation, shown inside the UI at ``/plugin/babelqueue``.
    external_views = [{"name": "BabelQueue", "href": f"{URL_PREFIX}/console/", "destination": "nav",
                       "url_route": "babelqueue"}]
