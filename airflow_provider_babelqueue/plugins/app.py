"""The plugin's web application: one FastAPI app, mounted by the API server under ``/babelqueue``.

Each feature is a router: :mod:`.reports` (the triage report pages) and :mod:`.console`, :mod:`.actions` and
:mod:`.jobs` (the dead-letter console's API). The login check is added to
the application itself, so no route can be served to an anonymous caller, whatever its own checks; each route
adds the DAG permission it needs (:func:`.auth.dag_access`). The interactive API docs are off: they would be
routes outside that check.
"""

from __future__ import annotations

from fastapi import FastAPI

from .actions import router as actions_router
from .auth import AUTHENTICATED
from .console import router as console_router
from .jobs import router as jobs_router
from .page import router as page_router
from .reports import router as reports_router

__all__ = ["create_app"]


def create_app() -> FastAPI:
    """A new application with every router of the plugin (the plugin keeps one; tests build their own)."""
    app = FastAPI(title="BabelQueue", dependencies=list(AUTHENTICATED), docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.include_router(reports_router)
    app.include_router(console_router)
    app.include_router(actions_router)
    app.include_router(jobs_router)
    app.include_router(page_router)
    return app
