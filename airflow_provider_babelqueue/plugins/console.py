"""The dead-letter console's read API: ``/babelqueue/console/api/...`` (queues, pages of dead letters, one dead letter).

Reading needs what reading an asset needs in the configured auth manager (a dead-letter queue is the asset
``babelqueue://<conn id>/<queue>/dead-letters``): a viewer may read; the actions on a selection, which change a
queue, will need what changing an asset needs. Every route also needs a signed-in user (the application adds that
check to all of them: :mod:`.app`).

Nothing secret leaves: a connection is named by its id and type, never its host, login, password or extras; a
dead letter's bytes are returned as JSON strings (text, or hex when they are not UTF-8), so a page shows them as
text, never as markup. Broker calls block, so the routes are plain functions (FastAPI runs them on its thread
pool), and each opens the connection's hook and closes it when it answered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, status

from ..bindings.base import Binding, BindingError, NotSupportedError
from ..core.errors import BabelQueueError
from ..core.frames import open_body
from ..engine.browse import DeadLetterQuery, browse_page, dead_letter_headers, dead_letter_raw, entry_of
from ..observability.metrics import gauge_dlq_depth

__all__ = ["MAX_QUEUES", "asset_access", "connection_binding", "connection_hook", "router"]

router = APIRouter(prefix="/console/api", tags=["console"])


def asset_access(method: str) -> list[Any]:
    """The route's dependencies: the user may ``method`` assets (``GET`` to read, ``POST`` to act)."""
    from airflow.api_fastapi.core_api.security import requires_access_asset

    return [Depends(requires_access_asset(method))]  # type: ignore[arg-type]


_READ = asset_access("GET")
HOUR_MS = 3_600_000
#: Queues the overview of one connection shows at most.
MAX_QUEUES = 100

Names = Annotated[list[str] | None, Query()]


@contextmanager
def connection_binding(conn_id: str) -> Iterator[Binding]:
    """The connection's binding for one request; a connection that is missing or not a BabelQueue one is a 404, a
    broker that cannot be reached a 502, each saying which connection."""
    with connection_hook(conn_id) as hook:
        yield hook.get_binding()


@contextmanager
def connection_hook(conn_id: str) -> Iterator[Any]:
    """The connection's hook for one request, with :func:`connection_binding`'s answers to what goes wrong."""
    from ..hooks import get_hook

    try:
        hook = get_hook(conn_id)
    except Exception as exc:  # noqa: BLE001 - the connection lookup raises Airflow's own "not defined" error
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no BabelQueue connection {conn_id!r}: {exc}") from None
    try:
        yield hook
    except NotSupportedError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except (BindingError, BabelQueueError) as exc:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"connection {conn_id!r}: {exc}") from None
    finally:
        hook.close()


@router.get("/connections", dependencies=_READ)
def connections() -> dict[str, Any]:
    """The BabelQueue connections the API server can list: its metadata database, its ``AIRFLOW_CONN_*``
    environment variables, and the embedded default; id and type only. (A secrets backend cannot be listed: a
    connection kept there is opened by naming its id.)"""
    import os

    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    from ..hooks import DEFAULT_CONN_ID

    with create_session() as session:
        rows = session.query(Connection.conn_id, Connection.conn_type).filter(
            Connection.conn_type.like("babelqueue%")).all()
    found = {conn_id: conn_type for conn_id, conn_type in rows}
    for key, value in os.environ.items():
        if key.startswith("AIRFLOW_CONN_") and (conn_type := _env_conn_type(value)):
            found.setdefault(key.removeprefix("AIRFLOW_CONN_").lower(), conn_type)
    found.setdefault(DEFAULT_CONN_ID, "babelqueue+sql")
    ordered = sorted(found.items(), key=lambda item: (item[0] != DEFAULT_CONN_ID, item[0]))
    return {"connections": [{"conn_id": conn_id, "conn_type": conn_type} for conn_id, conn_type in ordered]}


def _env_conn_type(value: str) -> str | None:
    """The connection type of an ``AIRFLOW_CONN_*`` value (Airflow's JSON form or a URI), when it is a BabelQueue
    one; nothing else of the value is read."""
    import json

    text = value.strip()
    if text.startswith("{"):
        try:
            conn_type = json.loads(text).get("conn_type")
        except (ValueError, AttributeError):
            return None
    else:
        conn_type = text.split("://", 1)[0].replace("-", "_") if "://" in text else None
    return conn_type if isinstance(conn_type, str) and conn_type.startswith("babelqueue") else None


@router.get("/queues", dependencies=_READ)
def queues(conn_id: str, queue_name: Annotated[list[str] | None, Query()] = None) -> dict[str, Any]:
    """Depths of the named queues on a connection, or with no ``queue_name``, of the queues it knows: those its
    ``console_queues`` extra names, then those the broker lists (SQL, Redis; at most :data:`MAX_QUEUES` in all).
    Per queue: ready messages, dead letters, each dead-letter source, the oldest dead letter's ``failed_at`` where
    the broker can read its dead-letter queue, and the dead letters that arrived in the last hour where the broker
    can tell (``dead_letters_last_hour``; ``..._whole`` false: at least that many, the count stopped reading).
    ``configured`` and ``listed`` say where the names came from (``listed`` is ``None`` when the broker cannot list
    its queues, or names were given). Each dead-letter depth is also sent as the
    ``babelqueue.dlq_depth.<conn>.<queue>`` gauge."""
    out = []
    with connection_hook(conn_id) as hook:
        binding = hook.get_binding()
        told: list[str] = []
        listed: list[str] | None = None
        if queue_name is None:
            try:
                told = hook.console_queues()
            except ValueError as exc:
                raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
            listed = binding.queue_names(MAX_QUEUES)
            queue_name = list(dict.fromkeys([*told, *(listed or [])]))[:MAX_QUEUES]
        for name in queue_name:
            dead = binding.dead_letter_depth(name)
            gauge_dlq_depth(conn_id, name, dead)
            row: dict[str, Any] = {"queue_name": name, "depth": binding.depth(name), "dead_letter_depth": dead,
                                   "dead_letter_sources": binding.dead_letter_sources(name),
                                   "can_browse": binding.can_browse, "can_discard": binding.can_discard,
                                   "oldest_failed_at": None, "dead_letters_last_hour": None,
                                   "dead_letters_last_hour_whole": None}
            if row["dead_letter_depth"]:
                raw = _first_raw(binding, name)
                row["oldest_failed_at"] = entry_of(0, raw).failed_at if raw is not None else None
            recent = binding.dead_letters_failed_since(name, int(time.time() * 1000) - HOUR_MS)
            if recent is not None:
                row["dead_letters_last_hour"], row["dead_letters_last_hour_whole"] = recent
            out.append(row)
    return {"conn_id": conn_id, "broker": binding.name, "queues": out, "configured": told, "listed": listed}


def _first_raw(binding: Binding, queue_name: str) -> bytes | None:
    try:
        return dead_letter_raw(binding, queue_name, 0)
    except NotSupportedError:
        return None


@router.get("/dead-letters", dependencies=_READ)
def dead_letters(
    conn_id: str,
    queue_name: str,
    reason: Names = None,
    urn: Names = None,
    exception_type: Names = None,
    fingerprint: Names = None,
    lang: Names = None,
    original_queue: Names = None,
    text: str | None = None,
    failed_after_ms: int | None = None,
    failed_before_ms: int | None = None,
    start: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> dict[str, Any]:
    """A page of the queue's dead letters from position ``start`` that pass the filters (``engine/browse.py``:
    the page stops after 20,000 dead letters read or 1.5 s and gives ``next_position``)."""
    query = DeadLetterQuery(reasons=tuple(reason or ()), urns=tuple(urn or ()),
                            exception_types=tuple(exception_type or ()), fingerprints=tuple(fingerprint or ()),
                            langs=tuple(lang or ()), original_queues=tuple(original_queue or ()),
                            text=text or None, failed_after_ms=failed_after_ms, failed_before_ms=failed_before_ms)
    with connection_binding(conn_id) as binding:
        page = browse_page(binding, queue_name, query, start=start, limit=limit)
    return {"conn_id": conn_id, "queue_name": queue_name, **page.as_dict()}


@router.get("/dead-letters/{position}", dependencies=_READ)
def dead_letter(conn_id: str, queue_name: str, position: int) -> dict[str, Any]:
    """One dead letter: its exact bytes (``body_text``, or ``body_hex`` when they are not UTF-8), its envelope and
    ``dead_letter`` block when it has them, its headers (a header frame's, or the broker's native properties), and
    what triage says about it (the entry, with the trace id and the triage job's fingerprint)."""
    with connection_binding(conn_id) as binding:
        raw = dead_letter_raw(binding, queue_name, position)
        if raw is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no dead letter at position {position} of {queue_name!r}")
        headers = dead_letter_headers(binding, queue_name, position, raw)
    try:
        body_text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError:
        body_text = None
    try:
        envelope: Any = open_body(raw)[0]
    except BabelQueueError:
        envelope = None
    block = envelope.get("dead_letter") if isinstance(envelope, dict) else None
    return {"conn_id": conn_id, "queue_name": queue_name, "entry": entry_of(position, raw).as_dict(),
            "body_text": body_text, "body_hex": raw.hex() if body_text is None else None, "size": len(raw),
            "envelope": envelope if isinstance(envelope, dict) else None,
            "dead_letter": block if isinstance(block, dict) else None, "headers": headers}
