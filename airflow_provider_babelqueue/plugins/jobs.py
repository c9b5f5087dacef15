"""The console's background jobs: an action on everything matching a filter, run outside the web request.

An action on a filter reads the whole dead-letter queue (a million dead letters take minutes), so the console
starts it as a job: a thread of the API server that reads the queue in chunks (:class:`~..engine.browse.MatchScan`)
and acts on each chunk as it goes, while its state is kept in a file beside the console's archives,
``<output root>/console/jobs/<job id>.json`` (a shared folder or object storage every API server reaches), so
any API server process answers ``GET /babelqueue/console/api/jobs/<id>`` with the progress: dead letters read
out of the queue's depth, matched, and the action's counts so far.

A job records its start and its end in Airflow's audit log (``babelqueue.console.<action>_started``, then
``babelqueue.console.<action>`` with the counts and the job id). Cancelling asks the job to stop after its current
chunk (a ``<job id>.cancel`` file, so the request and the job never write the same file). A job whose API server
stopped keeps its last state with an old ``updated_at``: the console shows it as stalled. Running the action again
is safe: a replay's ledger skips what the stopped job replayed, a discard archives before it removes.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, status
from fastapi.responses import StreamingResponse

from ..engine.drain.sinks import safe_segment
from ..locations import is_object_storage, local_path
from ..workspace import default_output_root
from .console import asset_access

__all__ = ["STALE_AFTER", "Job", "JobStore", "Progress", "new_job", "records_response", "router", "start_job"]

router = APIRouter(prefix="/console/api/jobs", tags=["console"])

#: Seconds without an update after which a running job is shown as stalled (its API server stopped).
STALE_AFTER = 120.0
#: How often a running job writes its progress, at most (seconds).
WRITE_EVERY = 1.0
_READ = asset_access("GET")
_ACT = asset_access("POST")
JobId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]


@dataclass
class Job:
    """One background action and where it is.

    :ivar state: ``running``, ``succeeded``, ``failed`` or ``cancelled``.
    :ivar scanned: dead letters read so far; ``depth`` the queue's dead-letter depth when the job started.
    :ivar counts: the action's counts so far (a replay's ``replayed``/``skipped``..., a discard's ``archived``
        and ``discarded``, an export's ``exported``).
    :ivar output: the file the job writes (an export's records, a discard's archive).
    """

    id: str
    action: str
    who: str
    conn_id: str
    queue_name: str
    filter: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    state: str = "running"
    depth: int = 0
    scanned: int = 0
    matched: int = 0
    counts: dict[str, Any] = field(default_factory=dict)
    output: str | None = None
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        out = asdict(self)
        out["stalled"] = self.state == "running" and (now or time.time()) - self.updated_at > STALE_AFTER
        return out


class JobStore:
    """The job files under ``<root>/console/jobs`` (a local folder or an object-storage URL)."""

    def __init__(self, root: str | None = None) -> None:
        base = (root or default_output_root()).rstrip("/") + "/console/jobs"
        self.local = not is_object_storage(base)
        if self.local:
            self.folder: Any = local_path(base)
        else:
            from airflow.sdk import ObjectStoragePath

            self.folder = ObjectStoragePath(base)

    def _path(self, name: str) -> Any:
        return os.path.join(self.folder, name) if self.local else self.folder / name

    def save(self, job: Job) -> None:
        data = json.dumps(asdict(job), sort_keys=True).encode()
        if self.local:
            os.makedirs(self.folder, exist_ok=True)
            temporary = self._path(f".{job.id}.json.tmp")
            with open(temporary, "wb") as handle:
                handle.write(data)
            os.replace(temporary, self._path(f"{job.id}.json"))
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._path(f"{job.id}.json").write_bytes(data)

    def load(self, job_id: str) -> Job | None:
        try:
            data = self._read(f"{job_id}.json")
        except FileNotFoundError:
            return None
        return Job(**json.loads(data))

    def _read(self, name: str) -> bytes:
        if self.local:
            with open(self._path(name), "rb") as handle:
                return handle.read()
        path = self._path(name)
        if not path.exists():
            raise FileNotFoundError(str(path))
        return bytes(path.read_bytes())

    def latest(self, limit: int) -> list[Job]:
        """The newest jobs first."""
        try:
            names = os.listdir(self.folder) if self.local else [path.name for path in self.folder.iterdir()]
        except FileNotFoundError:
            return []
        jobs = [job for name in names if name.endswith(".json") and not name.startswith(".")
                if (job := self.load(name.removesuffix(".json"))) is not None]
        return sorted(jobs, key=lambda job: job.started_at, reverse=True)[:limit]

    def request_cancel(self, job_id: str) -> None:
        if self.local:
            with open(self._path(f"{job_id}.cancel"), "wb"):
                pass
        else:
            self._path(f"{job_id}.cancel").write_bytes(b"")

    def cancel_requested(self, job_id: str) -> bool:
        path = self._path(f"{job_id}.cancel")
        return os.path.exists(path) if self.local else bool(path.exists())


class Cancelled(Exception):
    """The job was asked to stop."""


class Progress:
    """What a job's work reports as it goes: written to the job file at most every :data:`WRITE_EVERY` seconds,
    and where a cancel request is noticed."""

    def __init__(self, store: JobStore, job: Job) -> None:
        self.store, self.job = store, job
        self._written = 0.0

    def update(self, *, scanned: int, matched: int, **counts: Any) -> None:
        """The totals so far; raises :class:`Cancelled` when a cancel was requested."""
        self.job.scanned, self.job.matched = scanned, matched
        self.job.counts.update(counts)
        now = time.monotonic()
        if now - self._written >= WRITE_EVERY:
            self._written = now
            self.job.updated_at = time.time()
            self.store.save(self.job)
            if self.store.cancel_requested(self.job.id):
                raise Cancelled


Work = Callable[[Progress], dict[str, Any]]
Audit = Callable[[str, Job, dict[str, Any]], None]


def start_job(job: Job, work: Work, audit: Audit, store: JobStore | None = None) -> dict[str, Any]:
    """Save the job, record its start, and run ``work`` on a thread of this process; its result (the final
    counts) and state are saved and recorded when it ends. ``work`` opens and closes its own broker connections:
    the request that started the job has answered by then. Returns the job as it started (the thread changes
    ``job`` from then on)."""
    store = store or JobStore()
    store.save(job)
    audit(job.action + "_started", job, {})
    started = job.as_dict()
    thread = threading.Thread(target=_run, args=(store, job, work, audit), name=f"babelqueue-job-{job.id}",
                              daemon=True)
    thread.start()
    return started


def _run(store: JobStore, job: Job, work: Work, audit: Audit) -> None:
    try:
        job.counts.update(work(Progress(store, job)))
        job.state = "succeeded"
    except Cancelled:
        job.state = "cancelled"
    except Exception as exc:  # noqa: BLE001 - a job's failure is its state, shown in the console
        detail = getattr(exc, "detail", None)  # a connection's error, worded for an answer (console.connection_hook)
        job.state, job.error = "failed", detail if isinstance(detail, str) else f"{type(exc).__name__}: {exc}"
    job.finished_at = job.updated_at = time.time()
    store.save(job)
    audit(job.action, job, {"state": job.state, "scanned": job.scanned, "matched": job.matched,
                            **job.counts, **({"error": job.error} if job.error else {})})


def new_job(action: str, who: str, conn_id: str, queue_name: str, filter_: dict[str, Any],
            **options: Any) -> Job:
    return Job(id=uuid.uuid4().hex, action=action, who=who, conn_id=conn_id, queue_name=queue_name,
               filter=filter_, options=options)


@router.get("", dependencies=_READ)
def jobs(limit: Annotated[int, Query(ge=1, le=200)] = 20) -> dict[str, Any]:
    """The latest background jobs, newest first, with their progress."""
    now = time.time()
    return {"jobs": [job.as_dict(now) for job in JobStore().latest(limit)]}


@router.get("/{job_id}", dependencies=_READ)
def job(job_id: JobId) -> dict[str, Any]:
    """One job's state and progress."""
    found = JobStore().load(job_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no console job {job_id}")
    return found.as_dict()


@router.post("/{job_id}/cancel", status_code=status.HTTP_202_ACCEPTED, dependencies=_ACT)
def cancel(job_id: JobId) -> dict[str, Any]:
    """Ask a running job to stop after its current chunk (what it did so far stays done, and is recorded)."""
    store = JobStore()
    found = store.load(job_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no console job {job_id}")
    if found.state != "running":
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} has ended ({found.state})")
    store.request_cancel(job_id)
    return {"id": job_id, "cancel_requested": True}


@router.get("/{job_id}/file", dependencies=_ACT)
def job_file(job_id: JobId) -> StreamingResponse:
    """The records an export job wrote (JSON Lines, drain-record format)."""
    found = JobStore().load(job_id)
    if found is None or found.action != "export" or not found.output or found.state != "succeeded":
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} has no finished export")
    location = found.output

    def chunks() -> Iterator[bytes]:
        if is_object_storage(location):
            from airflow.sdk import ObjectStoragePath

            handle = ObjectStoragePath(location).open("rb")
        else:
            handle = open(local_path(location), "rb")  # noqa: SIM115 - closed below, after the last chunk
        with handle:
            while block := handle.read(1 << 20):
                yield block

    return records_response(chunks(), found.conn_id, found.queue_name)


def records_response(chunks: Iterator[bytes], conn_id: str, queue_name: str) -> StreamingResponse:
    """Drain records as a JSON Lines download named after the connection and queue."""
    name = f"{safe_segment(conn_id)}-{safe_segment(queue_name)}-dead-letters.jsonl"
    return StreamingResponse(chunks, media_type="application/x-ndjson",
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})
