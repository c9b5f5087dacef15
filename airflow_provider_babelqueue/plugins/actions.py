"""The dead-letter console's actions: preview or run a replay, and export, of a selection or of everything matching
a filter, under ``/babelqueue/console/api/actions``.

An action needs what changing an asset needs in the configured auth manager (with the simple auth manager: the
``op`` role and above; a viewer is refused). A selection names positions together with the ``meta.id`` seen
there, so an action never lands on a dead letter the caller did not see (the queue changed: 409). Every action is
written to Airflow's audit log (``babelqueue.console.<action>``: who, the connection and queue, the selection or
filter, the counts, the replay ledger), which Airflow's own audit log page lists, and ``GET /actions`` lists them
for the console.

A replay goes through the replay engine with its ledger (``replay:<target queue>``, by default on the same
connection as the replay operator's default, so the console and the DAGs share it: a second replay of the same
dead letters publishes nothing; ``ledger_conn_id`` names another, for a broker that cannot hold one) and rate cap;
the dead letters stay in their queue.

A selection, or a filter matching up to :data:`MAX_ITEMS` dead letters, is acted on inside the request. An action
on a filter with ``background: true`` runs as a job outside the request over the whole queue, however many match
(:mod:`.jobs`: the answer is ``202`` with the job, whose progress ``GET /jobs/<id>`` gives); a discard job archives
and removes :data:`MAX_ITEMS` dead letters at a time, each part's archive file closed before its dead letters are
removed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Response, status
from pydantic import BaseModel, Field

from ..bindings.base import Binding, NotSupportedError
from ..core.records import RecordTemplate
from ..engine.browse import DeadLetterQuery, MatchScan, SelectionChanged, matching, selected
from ..engine.drain.sinks import Sink, safe_segment
from ..engine.replay import Item, Replayer
from .auth import CurrentUser
from .console import asset_access, connection_binding
from .jobs import Job, Progress, new_job, records_response, start_job

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
    #: Run an action on a filter as a background job (any number of matches; ``202`` with the job).
    background: bool = False


class ReplayRequest(Selection):
    """A replay: ``dry_run`` (the default) previews it: how many, to which queues, what would be skipped and why.

    :ivar target_queue_name: publish everything there instead of each message's original queue.
    :ivar max_messages_per_second: the rate cap.
    :ivar ledger_conn_id: the connection that holds the replay ledger (a SQL or Redis one), when the queue's own
        broker cannot hold one (RabbitMQ, SQS, Service Bus, Pulsar); by default the queue's connection.
    """

    dry_run: bool = True
    target_queue_name: str | None = None
    max_messages_per_second: float | None = Field(default=None, gt=0)
    ledger_conn_id: str | None = None


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
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"{exc}, or run the action in the background" if request.filter else str(exc)) from None


class _Chunks:
    """The dead letters an action works on, as chunks: the request's selection at once, or a job's scan of the
    whole queue (told what a discard removed, and reporting its progress)."""

    def __init__(self, bodies: list[bytes] | None = None, scan: MatchScan | None = None,
                 progress: Progress | None = None) -> None:
        self.bodies, self.scan, self.progress = bodies, scan, progress

    def __iter__(self) -> Iterator[list[bytes]]:
        if self.scan is None:
            yield self.bodies or []
            return
        while not self.scan.done:
            yield self.scan.next_chunk()

    def removed(self, count: int) -> None:
        if self.scan is not None:
            self.scan.removed(count)

    def report(self, **counts: Any) -> None:
        if self.scan is not None and self.progress is not None:
            self.progress.update(scanned=self.scan.scanned, matched=self.scan.matched, **counts)


def _records(binding: Binding, request: Selection, bodies: list[bytes], drained_at: int) -> list[bytes]:
    """The selection's drain records (export and discard's archive write the same)."""
    template = RecordTemplate(broker=binding.name, queue_name=request.queue_name,
                              dead_letter_queue=binding.dead_letter_name(request.queue_name),
                              source_conn_id=request.conn_id)
    return template.of_raws(bodies, RecordTemplate.stamp(drained_at))


def _audit(action: str, who: str, request: Selection, **details: Any) -> None:
    """One row of Airflow's audit log for the action."""
    from airflow.models.log import Log
    from airflow.utils.session import create_session

    what = {"conn_id": request.conn_id, "queue_name": request.queue_name,
            "selection": ({"positions": len(request.positions or [])} if request.filter is None
                          else {"filter": request.filter.model_dump(exclude_defaults=True)}), **details}
    with create_session() as session:
        session.add(Log(event=_EVENT + action, owner=who, extra=json.dumps(what, sort_keys=True)))


def _replay(binding: Binding, ledger: Binding, request: ReplayRequest, chunks: _Chunks) -> dict[str, Any]:
    """The replay (or its preview) of every chunk through one replayer; its result."""
    replayer = Replayer(target=binding, ledger_binding=ledger, target_queue_name=request.target_queue_name,
                        dry_run=request.dry_run, max_messages_per_second=request.max_messages_per_second)
    try:
        for bodies in chunks:
            for body in bodies:  # reported as it goes: a rate cap may make one chunk take minutes
                replayer.feed(Item(body, request.queue_name, None, True))
                chunks.report(replayed=replayer.result.replayed)
            chunks.report(replayed=replayer.result.replayed)
        replayer.finish()
    except BaseException:
        replayer.abort()
        raise
    result = replayer.result.as_dict()
    ledgers = sorted(f"replay:{queue}" for queue in result["targets"]) if not request.dry_run else []
    return {**result, "ledgers": ledgers}


def _archive_folder(request: Selection) -> str:
    from ..workspace import default_output_root

    return "/".join((default_output_root().rstrip("/"), "console", _segment(request.conn_id),
                     _segment(request.queue_name)))


def _write_closed(sink: Sink, data: bytes) -> str:
    """Write ``data`` to ``sink`` and close it (durable); nothing is left of it when that fails."""
    try:
        sink.write(data)
        sink.sync()
        sink.close()
    except BaseException:
        sink.abort(0)
        raise
    return sink.location


def _discard(binding: Binding, request: Selection, chunks: _Chunks) -> dict[str, Any]:
    """Archive, then remove, :data:`MAX_ITEMS` dead letters at a time (one archive file each, closed first)."""
    from ..operators.drain import open_destination

    stamp = int(time.time() * 1000)
    folder = _archive_folder(request)
    archived = discarded = 0
    archives: list[str] = []
    pending: list[bytes] = []

    def settle(part: list[bytes]) -> None:
        nonlocal archived, discarded
        name = f"discard-{stamp}" + (f"-{len(archives) + 1:04d}" if chunks.scan is not None else "")
        archives.append(_write_closed(open_destination(folder, name), b"".join(
            _records(binding, request, part, int(time.time() * 1000)))))
        archived += len(part)
        removed = binding.discard_dead_letters(request.queue_name, part)
        discarded += removed
        chunks.removed(removed)

    for bodies in chunks:
        pending += bodies
        while len(pending) >= MAX_ITEMS:
            settle(pending[:MAX_ITEMS])
            del pending[:MAX_ITEMS]
        chunks.report(archived=archived, discarded=discarded)
    if pending:
        settle(pending)
    return {"archived": archived, "discarded": discarded, "archive": archives[0] if len(archives) == 1 else folder,
            "archives": archives}


def _export_to(binding: Binding, request: Selection, chunks: _Chunks, sink: Sink) -> dict[str, Any]:
    """Every chunk's drain records into ``sink`` (an export job's file)."""
    exported = 0
    try:
        for bodies in chunks:
            if bodies:
                sink.write(b"".join(_records(binding, request, bodies, int(time.time() * 1000))))
                exported += len(bodies)
            chunks.report(exported=exported)
        sink.sync()
        sink.close()
    except BaseException:
        sink.abort(0)
        raise
    return {"exported": exported, "output": sink.location}


def _in_background(action: str, who: str, request: Selection, run: Any, **options: Any) -> Response:
    """Start ``run(binding, chunks)`` as a job over every dead letter matching the request's filter; ``202``."""
    if request.filter is None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "a background action works on a filter")
    query = request.filter.query()
    with connection_binding(request.conn_id) as probe:  # refuse now what the job could not do
        try:
            MatchScan(probe, request.queue_name, query)
        except NotSupportedError as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
        depth = probe.dead_letter_depth(request.queue_name)
    job = new_job(action, who, request.conn_id, request.queue_name,
                  request.filter.model_dump(exclude_defaults=True), **options)
    job.depth = depth

    def work(progress: Progress) -> dict[str, Any]:
        with connection_binding(request.conn_id) as binding:
            result: dict[str, Any] = run(binding, _Chunks(scan=MatchScan(binding, request.queue_name, query),
                                                          progress=progress))
        job.output = result.pop("output", None) or result.get("archive")
        return result

    def audit(event: str, done: Job, details: dict[str, Any]) -> None:
        _audit(event, done.who, request, job=done.id, **details)

    try:
        started = start_job(job, work, audit)
    except OSError as exc:
        raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR,
                            f"cannot keep the job's state under the output root ([babelqueue] output_root): "
                            f"{exc}") from None
    return Response(json.dumps({"job": started}), status_code=status.HTTP_202_ACCEPTED,
                    media_type="application/json")


@router.post("/replay", dependencies=_ACT, response_model=None)
def replay(request: ReplayRequest, user: CurrentUser) -> dict[str, Any] | Response:
    """Preview (``dry_run``) or run a replay of the selection through the replay engine and its ledger."""
    action = "replay_preview" if request.dry_run else "replay"

    def run(binding: Binding, chunks: _Chunks) -> dict[str, Any]:
        with ExitStack() as stack:
            ledger = binding
            if request.ledger_conn_id and request.ledger_conn_id != request.conn_id:
                ledger = stack.enter_context(connection_binding(request.ledger_conn_id))
            return _replay(binding, ledger, request, chunks)

    if request.background:
        return _in_background(action, user.get_name(), request, run, dry_run=request.dry_run,
                              target_queue_name=request.target_queue_name, ledger_conn_id=request.ledger_conn_id)
    with connection_binding(request.conn_id) as binding:
        bodies = _bodies(binding, request)
        result = run(binding, _Chunks(bodies))
    _audit(action, user.get_name(), request, selected=len(bodies), replayed=result["replayed"],
           skipped=result["skipped"], duplicates_avoided=result["duplicates_avoided"], targets=result["targets"],
           ledgers=result["ledgers"], **({"ledger_conn_id": request.ledger_conn_id} if request.ledger_conn_id else {}))
    return {"selected": len(bodies), **result}


@router.post("/export", dependencies=_ACT, response_model=None)
def export(request: Selection, user: CurrentUser) -> Response:
    """The selection as drain records, one JSON Lines record per dead letter (``docs/drain-records.md``); in the
    background, the records are written to a file under the output root, served by ``GET /jobs/<id>/file``."""
    if request.background:
        from ..operators.drain import open_destination

        def run(binding: Binding, chunks: _Chunks) -> dict[str, Any]:
            sink = open_destination(_archive_folder(request), f"export-{int(time.time() * 1000)}")
            return _export_to(binding, request, chunks, sink)

        return _in_background("export", user.get_name(), request, run)
    with connection_binding(request.conn_id) as binding:
        records = _records(binding, request, _bodies(binding, request), int(time.time() * 1000))
    _audit("export", user.get_name(), request, exported=len(records))
    return records_response(iter(records), request.conn_id, request.queue_name)


@router.post("/discard", dependencies=_ACT, response_model=None)
def discard(request: Selection, user: CurrentUser) -> dict[str, Any] | Response:
    """Archive the selection as drain records under the output root (``[babelqueue] output_root``), durably, then
    remove those dead letters from their queue. A dead letter taken meanwhile (a drain) is archived but not
    counted as discarded; nothing is removed when the archive could not be written."""
    with connection_binding(request.conn_id) as binding:
        if not binding.can_discard:  # refused before anything is archived
            raise NotSupportedError(f"the {binding.name} binding cannot remove chosen dead letters; drain the queue "
                                    "instead")
    if request.background:
        return _in_background("discard", user.get_name(), request, lambda binding, chunks: _discard(
            binding, request, chunks))
    with connection_binding(request.conn_id) as binding:
        bodies = _bodies(binding, request)
        result = _discard(binding, request, _Chunks(bodies))
    _audit("discard", user.get_name(), request, selected=len(bodies), archived=result["archived"],
           discarded=result["discarded"], archive=result["archive"])
    return {"selected": len(bodies), "archived": result["archived"], "discarded": result["discarded"],
            "archive": result["archive"]}


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
