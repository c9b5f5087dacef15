"""The provider's Airflow plugin: pages and API routes served by Airflow's own API server.

Laid out so that a route, its access check and the storage it reads stay separate ideas:

* :mod:`.plugin`: the ``AirflowPlugin`` subclass that the provider info registers. It imports nothing heavy:
  Airflow imports every plugin in the scheduler, the DAG processor and each task process, and only the API
  server needs the web application, which is built the first time Airflow asks for ``fastapi_apps``;
* :mod:`.app`: that application (FastAPI), one router per feature, every route behind Airflow's login;
* :mod:`.auth`: the access checks, Airflow's own auth-manager dependencies, for any route to reuse;
* :mod:`.reports`: the triage report pages (``report.html``, ``summary.json``) of a task instance;
* :mod:`.storage`: where a report may be read from (``[babelqueue] report_roots``) and the reading itself.
"""

from __future__ import annotations

__all__: list[str] = []
