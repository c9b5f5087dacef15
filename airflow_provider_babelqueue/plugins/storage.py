"""Where the plugin may read a report from, and the reading.

The API server opens the file that a task instance's XCom names: a local path, a ``file://`` URL or any
``ObjectStoragePath`` URL (``s3://``, ``gs://``, ``abfs://`` ...). An XCom is not a trusted path, though: a DAG
author's task or any user allowed to write XComs could name ``/opt/airflow/airflow.cfg``, and the API server
(whose files and cloud credentials are not the DAG author's) would serve it. So a location is read only when

* its file name is the one the route serves (``report.html``, ``summary.json``),
* it has no ``.`` or ``..`` segment, and a local path (symbolic links resolved) stays inside its root,
* it lies under one of the report roots: ``[babelqueue] report_roots`` (comma-separated folders or URLs;
  ``AIRFLOW__BABELQUEUE__REPORT_ROOTS``), by default the default output root, ``$AIRFLOW_HOME/babelqueue/runs``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..locations import is_object_storage, local_path
from ..workspace import default_output_root

__all__ = ["MAX_BYTES", "Location", "LocationRefused", "allowed_roots", "checked_location", "read_limited"]

#: A report larger than this is not loaded into the API server's memory (real reports are well under 1 MB).
MAX_BYTES = 32 * 1024 * 1024


class LocationRefused(ValueError):
    """The XCom names a location the plugin will not read; the message says which rule it breaks."""


@dataclass(frozen=True)
class Location:
    """A normalized place: ``scheme`` is ``""`` for a local path, ``host`` the bucket or account, ``path``
    absolute and ``/``-separated. ``source`` is what to open: the resolved local path, or the URL as given
    (with any ``conn_id@`` in it, which picks the Airflow connection ``ObjectStoragePath`` reads with)."""

    scheme: str
    host: str
    path: str
    source: str

    def is_under(self, root: Location) -> bool:
        if (self.scheme, self.host) != (root.scheme, root.host):
            return False
        base = root.path.rstrip("/")
        return self.path == base or self.path.startswith(base + "/")

    def __str__(self) -> str:
        return self.path if not self.scheme else f"{self.scheme}://{self.host}{self.path}"


def _location(text: str) -> Location:
    text = text.strip()
    if not text:
        raise LocationRefused("the location is empty")
    if not is_object_storage(text):
        local = local_path(text)
        if not os.path.isabs(local):
            raise LocationRefused(f"{text!r} is not an absolute path")
        resolved = os.path.realpath(local)
        return Location("", "", resolved, resolved)
    parts = urlsplit(text)
    if parts.query or parts.fragment:
        raise LocationRefused(f"{text!r} has a query or fragment")
    segments = parts.path.split("/")
    if any(segment in (".", "..") for segment in segments):
        raise LocationRefused(f"{text!r} has a '.' or '..' segment")
    host = parts.netloc.rpartition("@")[2].lower()  # drop a conn_id: it picks credentials, not a place
    path = "/" + "/".join(segment for segment in segments if segment)
    return Location(parts.scheme.lower(), host, path, text)


def allowed_roots() -> list[Location]:
    """The configured report roots, read at each request (a change needs no restart of the API server)."""
    from airflow.configuration import conf

    configured = conf.get("babelqueue", "report_roots", fallback="") or ""
    roots = [part.strip() for part in configured.split(",") if part.strip()] or [default_output_root()]
    return [_location(root) for root in roots]


def checked_location(text: Any, file_name: str, roots: list[Location] | None = None) -> Location:
    """The location an XCom names, once it passes the rules above; :class:`LocationRefused` otherwise.

    :param text: the XCom's value (anything: it is checked to be a string).
    :param file_name: the only file name this route serves.
    :param roots: the report roots; default :func:`allowed_roots`.
    """
    if not isinstance(text, str):
        raise LocationRefused(f"the location is a {type(text).__name__}, not a string")
    location = _location(text)
    if location.path.rsplit("/", 1)[-1] != file_name:
        raise LocationRefused(f"{text!r} is not a {file_name}")
    roots = allowed_roots() if roots is None else roots
    if not any(location.is_under(root) for root in roots):
        raise LocationRefused(f"{text!r} is outside the report roots ({', '.join(map(str, roots))}); add its "
                              "output root to [babelqueue] report_roots (AIRFLOW__BABELQUEUE__REPORT_ROOTS)")
    return location


def read_limited(location: Location, limit: int = MAX_BYTES) -> bytes:
    """The file's bytes, through ``ObjectStoragePath`` (local or object storage alike).

    :raises FileNotFoundError: nothing there (not written yet, or written on a disk the API server cannot see).
    :raises OSError: the storage failed, or the API server has no filesystem for the URL's scheme (its provider
        is not installed there).
    :raises LocationRefused: larger than ``limit``.
    """
    from airflow.sdk import ObjectStoragePath

    try:
        path = ObjectStoragePath(location.source)
        stream = path.open("rb")
    except ValueError as exc:  # "No filesystem registered for scheme ..."
        raise OSError(str(exc)) from exc
    with stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise LocationRefused(f"{location} is larger than {limit} bytes")
    return bytes(data)
