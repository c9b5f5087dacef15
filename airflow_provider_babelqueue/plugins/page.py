"""The dead-letter console's page: ``/babelqueue/console/`` (HTML) with its script and style sheet.

The Airflow UI shows it in its navigation (``BabelQueue``, the plugin's ``external_views``). The files are plain
HTML, CSS and JavaScript kept in ``plugins/static`` (no build step, nothing fetched from elsewhere); the page
calls the console's API with the browser's Airflow session (the ``_token`` cookie), and its content security
policy allows only this application's own script and style sheet.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Response

from .console import asset_access

__all__ = ["CONTENT_SECURITY_POLICY", "router"]

CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                           "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'self'")
_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
_TYPES = {"console.html": "text/html; charset=utf-8", "console.js": "text/javascript; charset=utf-8",
          "console.css": "text/css; charset=utf-8"}

router = APIRouter(prefix="/console", tags=["console"])
_READ = asset_access("GET")


@cache
def _static(name: str) -> bytes:
    return (files(__package__) / "static" / name).read_bytes()


def _file(name: str) -> Response:
    return Response(_static(name), media_type=_TYPES[name], headers=_HEADERS)


@router.get("/", dependencies=_READ)
def page() -> Response:
    return _file("console.html")


@router.get("/app.js", dependencies=_READ)
def script() -> Response:
    return _file("console.js")


@router.get("/app.css", dependencies=_READ)
def style() -> Response:
    return _file("console.css")
