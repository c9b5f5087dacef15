"""The triage report of a task instance, as a page: ``GET /babelqueue/reports/{dag_id}/{run_id}/{task_id}``.

The route reads the task instance's return value (XCom ``return_value``) from the metadata DB, as Airflow's
own XCom endpoint does (straight from the DB, not through a custom XCom backend), takes the ``report`` entry
that ``BabelQueueSparkTriageOperator`` writes (``report_summary``/``summary`` for ``summary.json``) and serves
that file from wherever the output root is (see :mod:`.storage`). Nothing in the request names a file: the
path parameters only pick the task instance, and a user sees its report only with read access to the DAG's
runs and task instances.
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import quote

from airflow.api_fastapi.common.db.common import SessionDep
from fastapi import APIRouter, HTTPException, Query, Response, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from .auth import CurrentUser, DagAccessEntity, dag_access
from .storage import LocationRefused, checked_location, read_limited

__all__ = ["CONTENT_SECURITY_POLICY", "RESPONSE_HEADERS", "report_file", "router"]

#: For the self-contained report: its CSS is inline (a ``<style>`` element and ``style`` attributes), its
#: charts inline SVG, and its one ``<script>`` a JSON data block that is never executed. So no script may run
#: and nothing may be fetched; ``sandbox`` also gives the page an opaque origin, so that even markup that got
#: into a report could not act with the viewer's Airflow session.
CONTENT_SECURITY_POLICY = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'self'; sandbox")
RESPONSE_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "Cache-Control": "private, no-cache"}

router = APIRouter(prefix="/reports", tags=["reports"])

_READ = dag_access("GET", DagAccessEntity.RUN, DagAccessEntity.TASK_INSTANCE)
MapIndex = Annotated[int, Query(ge=-1, description="the mapped task instance's index; -1 when not mapped")]


def report_file(value: Any, file_name: str) -> str | None:
    """Which location a task's return value gives for ``file_name`` (``None``: the task recorded none).

    ``report.html`` is ``report``; ``summary.json`` is ``report_summary`` (a triage task that also wrote the
    report) or ``summary`` of a ``job="report"`` task (a triage task's own ``summary`` is its triage summary).
    """
    if not isinstance(value, dict):
        return None
    if file_name == "report.html":
        found = value.get("report")
    else:
        found = value.get("report_summary") or (value.get("summary") if value.get("job") == "report" else None)
    return found if isinstance(found, str) and found else None


def _return_value(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int) -> Any:
    from airflow.models.xcom import XCOM_RETURN_KEY, XComModel

    query = XComModel.get_many(run_id=run_id, key=XCOM_RETURN_KEY, dag_ids=dag_id, task_ids=task_id,
                               map_indexes=map_index, limit=1)
    row = session.execute(query.with_only_columns(XComModel.value)).first()
    if row is None:
        return None
    value = row.value
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _task_state(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int) -> str | None:
    """The task instance's state (``"none"`` when it has none yet); ``None`` when there is no such instance."""
    from airflow.models.taskinstance import TaskInstance

    row = session.execute(select(TaskInstance.state).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id,
        TaskInstance.map_index == map_index)).first()
    return None if row is None else str(row.state or "none")


def _serve(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int, file_name: str,
           media_type: str) -> Response:
    index = f" [{map_index}]" if map_index >= 0 else ""
    where = f"task {task_id!r}{index} of run {run_id!r} of DAG {dag_id!r}"
    state = _task_state(session, dag_id, run_id, task_id, map_index)
    if state is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"No task instance: {where}.")
    source = report_file(_return_value(session, dag_id, run_id, task_id, map_index), file_name)
    if source is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"No report yet for {where} (task state: {state}): the {file_name} appears once a "
                            "triage task with report_output, or a report task, has succeeded.")
    try:
        data = read_limited(checked_location(source, file_name))
    except LocationRefused as exc:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"Not serving the {file_name} of {where}: {exc}.") from None
    except FileNotFoundError:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"The {file_name} of {where} is recorded at {source!r} but the API server finds nothing "
                            "there: was it deleted, or written to a worker's own disk? The output root must be "
                            "storage the API server can read too (docs/plugin.md).") from None
    except OSError as exc:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY,
                            f"The {file_name} of {where} at {source!r} could not be read: {exc}") from None
    return Response(content=data, media_type=media_type, headers=RESPONSE_HEADERS)


#: Task results looked at, newest first, for the list of reports.
_LIST_SCAN = 2000


@router.get("", summary="The latest triage reports the user may read")
def list_reports(user: CurrentUser, session: SessionDep,
                 limit: Annotated[int, Query(ge=1, le=500)] = 50) -> dict[str, Any]:
    """The latest task results that name a triage report, in the DAGs the user may read (their runs and task
    instances), newest first, each with the URL of its page; the console lists them."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.models.xcom import XCOM_RETURN_KEY, XComModel

    readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
    query = (select(XComModel.dag_id, XComModel.run_id, XComModel.task_id, XComModel.map_index, XComModel.timestamp,
                    XComModel.value)
             .where(XComModel.key == XCOM_RETURN_KEY, XComModel.dag_id.in_(readable))
             .order_by(XComModel.timestamp.desc()).limit(_LIST_SCAN))
    found = []
    for row in session.execute(query):
        value = row.value
        if isinstance(value, str | bytes):
            try:
                value = json.loads(value)
            except ValueError:
                continue
        if report_file(value, "report.html") is None:
            continue
        path = "/".join(quote(part, safe="") for part in (row.dag_id, row.run_id, row.task_id))
        found.append({"dag_id": row.dag_id, "run_id": row.run_id, "task_id": row.task_id, "map_index": row.map_index,
                      "when": row.timestamp.isoformat() if row.timestamp else None,
                      "url": f"/babelqueue/reports/{path}" + (f"?map_index={row.map_index}" if row.map_index >= 0
                                                               else "")})
        if len(found) >= limit:
            break
    return {"reports": found}


@router.get("/{dag_id}/{run_id}/{task_id}", dependencies=_READ, response_class=Response,
            summary="The task instance's triage report (report.html)")
def get_report(dag_id: str, run_id: str, task_id: str, session: SessionDep, map_index: MapIndex = -1) -> Response:
    """The self-contained HTML report that the task instance's XCom names."""
    return _serve(session, dag_id, run_id, task_id, map_index, "report.html", "text/html; charset=utf-8")


@router.get("/{dag_id}/{run_id}/{task_id}/summary.json", dependencies=_READ, response_class=Response,
            summary="The numbers behind the task instance's report (summary.json)")
def get_summary(dag_id: str, run_id: str, task_id: str, session: SessionDep, map_index: MapIndex = -1) -> Response:
    """The report's ``summary.json``, byte for byte as the Spark job wrote it."""
    return _serve(session, dag_id, run_id, task_id, map_index, "summary.json", "application/json")
