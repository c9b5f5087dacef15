"""The dead-letter console's actions: preview or run a replay, and export, of a selection or of everything matching
a filter, under ``/babelqueue/console/api/actions``.

An action needs what changing an asset needs in the configured auth manager (with the simple auth manager: the
``op`` role and above; a viewer is refused). A selection names positions together with the ``meta.id`` seen
there, so an action never lands on a dead letter the caller did not see (the queue changed: 409). Every action is
written to Airflow's audit log (``babelqueue.console.<action>``: who, the connection and queue, the selection or
filter, the counts, the replay ledger), which Airflow's own audit log page lists, and ``GET /actions`` lists them
for the console.

A replay goes through the replay engine with its ledger (``replay:<target queue>`` on the same connection, as the
replay operator's default, so the console and the DAGs share it: a second replay of the same dead letters
publishes nothing) and rate cap; the dead letters stay in their queue. Actions run inside the request for up to
:data:`MAX_ITEMS` dead letters; a larger one is refused with the reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from ..bindings.base import Binding
from ..core.records import RecordTemplate
from ..engine.browse import DeadLetterQuery, SelectionChanged, matching, selected
from ..engine.drain.sinks import safe_segment
from ..engine.replay import Item, Replayer
from .auth import CurrentUser
from .console import asset_access, connection_binding

__all__ = ["MAX_ITEMS", "router"]

router = APIRouter(prefix="/console/api/actions", tags=["console"])

#: Dead letters one action handles inside its request.
MAX_ITEMS = 10_000
_ACT = asset_access("POST")
_READ = asset_access("GET")
_EVENT = "babelqueue.console."


class Filter(BaseModel):
    """The page filters (``GET /dead-letters``), for "everything matching"."""

    reason: list[str] = []
    urn: list[str] = []
    exception_type: list[str] = []
    fingerprint: list[str] = []
    lang: list[str] = []
    original_queue: list[str] = []
    text: str | None = None
    failed_after_ms: int | None = None
    failed_before_ms: int | None = None

    def query(self) -> DeadLetterQuery:
        return DeadLetterQuery(reasons=tuple(self.reason), urns=tuple(self.urn),
                               exception_types=tuple(self.exception_type), fingerprints=tuple(self.fingerprint),
                               langs=tuple(self.lang), original_queues=tuple(self.original_queue),
                               text=self.text or None, failed_after_ms=self.failed_after_ms,
                               failed_before_ms=self.failed_before_ms)


class Selection(BaseModel):
    """Which dead letters: ``positions`` with the ``meta_ids`` seen there (``null`` for one without), or
    ``filter`` (everything matching it)."""

    conn_id: str
    queue_name: str
    positions: list[int] | None = None
    meta_ids: list[str | None] | None = None
    filter: Filter | None = None


class ReplayRequest(Selection):
    """A replay: ``dry_run`` (the default) previews it: how many, to which queues, what would be skipped and why.

    :ivar target_queue_name: publish everything there instead of each message's original queue.
    :ivar max_messages_per_second: the rate cap.
    """

    dry_run: bool = True
    target_queue_name: str | None = None
    max_messages_per_second: float | None = Field(default=None, gt=0)


def _bodies(binding: Binding, request: Selection) -> list[bytes]:
    if (request.positions is None) == (request.filter is None):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "give either positions (with meta_ids) or filter")
    try:
        if request.positions is not None:
            if len(request.positions) > MAX_ITEMS:
                raise ValueError(f"select at most {MAX_ITEMS} dead letters")
            return selected(binding, request.queue_name, request.positions, request.meta_ids or [])
        assert request.filter is not None
        return matching(binding, request.queue_name, request.filter.query(), MAX_ITEMS)
    except SelectionChanged as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None


def _records(binding: Binding, request: Selection, bodies: list[bytes], drained_at: int) -> list[bytes]:
    """The selection's drain records (export and discard's archive write the same)."""
    template = RecordTemplate(broker=binding.name, queue_name=request.queue_name,
                              dead_letter_queue=binding.dead_letter_name(request.queue_name),
                              source_conn_id=request.conn_id)
    return template.of_raws(bodies, RecordTemplate.stamp(drained_at))


def _audit(action: str, user: Any, request: Selection, **details: Any) -> None:
    """One row of Airflow's audit log for the action."""
    from airflow.models.log import Log
    from airflow.utils.session import create_session

    what = {"conn_id": request.conn_id, "queue_name": request.queue_name,
            "selection": ({"positions": len(request.positions or [])} if request.filter is None
                          else {"filter": request.filter.model_dump(exclude_defaults=True)}), **details}
    with create_session() as session:
        session.add(Log(event=_EVENT + action, owner=user.get_name(), extra=json.dumps(what, sort_keys=True)))


@router.post("/replay", dependencies=_ACT)
def replay(request: ReplayRequest, user: CurrentUser) -> dict[str, Any]:
    """Preview (``dry_run``) or run a replay of the selection through the replay engine and its ledger."""
    with connection_binding(request.conn_id) as binding:
        bodies = _bodies(binding, request)
        replayer = Replayer(target=binding, ledger_binding=binding, target_queue_name=request.target_queue_name,
                            dry_run=request.dry_run, max_messages_per_second=request.max_messages_per_second)
        try:
            for body in bodies:
                replayer.feed(Item(body, request.queue_name, None, True))
            replayer.finish()
        except BaseException:
            replayer.abort()
            raise
        result = replayer.result.as_dict()
    ledgers = sorted(f"replay:{queue}" for queue in result["targets"]) if not request.dry_run else []
    _audit("replay_preview" if request.dry_run else "replay", user, request, selected=len(bodies),
           replayed=result["replayed"], skipped=result["skipped"], duplicates_avoided=result["duplicates_avoided"],
           targets=result["targets"], ledgers=ledgers)
    return {"selected": len(bodies), "ledgers": ledgers, **result}


@router.post("/export", dependencies=_ACT)
def export(request: Selection, user: CurrentUser) -> StreamingResponse:
    """The selection as drain records, one JSON Lines record per dead letter (``docs/drain-records.md``)."""
    with connection_binding(request.conn_id) as binding:
        records = _records(binding, request, _bodies(binding, request), int(time.time() * 1000))
    _audit("export", user, request, exported=len(records))

    def lines() -> Iterator[bytes]:
        yield from records

    name = f"{request.conn_id}-{request.queue_name}-dead-letters.jsonl".replace("/", "_")
    return StreamingResponse(lines(), media_type="application/x-ndjson",
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.post("/discard", dependencies=_ACT)
def discard(request: Selection, user: CurrentUser) -> dict[str, Any]:
    """Archive the selection as drain records under the output root (``[babelqueue] output_root``), durably, then
    remove those dead letters from their queue. A dead letter taken meanwhile (a drain) is archived but not
    counted as discarded; nothing is removed when the archive could not be written."""
    from ..engine.drain.sinks import Sink
    from ..operators.drain import open_destination
    from ..workspace import default_output_root

    with connection_binding(request.conn_id) as binding:
        bodies = _bodies(binding, request)
        stamp = int(time.time() * 1000)
        folder = "/".join((default_output_root().rstrip("/"), "console", _segment(request.conn_id),
                           _segment(request.queue_name)))
        sink: Sink = open_destination(folder, f"discard-{stamp}")
        try:
            sink.write(b"".join(_records(binding, request, bodies, stamp)))
            sink.sync()
            sink.close()
        except BaseException:
            sink.abort(0)
            raise
        discarded = binding.discard_dead_letters(request.queue_name, bodies)
    archive = sink.location
    _audit("discard", user, request, selected=len(bodies), archived=len(bodies), discarded=discarded,
           archive=archive)
    return {"selected": len(bodies), "archived": len(bodies), "discarded": discarded, "archive": archive}


def _segment(text: str) -> str:
    """A path segment from a connection id or queue name (the drain files' rule, and never ``.`` or ``..``)."""
    return safe_segment(text).strip(".") or "_"


@router.get("", dependencies=_READ)
def actions(limit: Annotated[int, Query(ge=1, le=500)] = 50) -> dict[str, Any]:
    """The latest console actions from Airflow's audit log, newest first."""
    from airflow.models.log import Log
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (session.query(Log).filter(Log.event.like(_EVENT + "%")).order_by(Log.id.desc()).limit(limit).all())
        return {"actions": [{"id": row.id, "when": row.dttm.isoformat() if row.dttm else None,
                             "action": row.event.removeprefix(_EVENT), "who": row.owner,
                             "details": json.loads(row.extra or "{}")} for row in rows]}
