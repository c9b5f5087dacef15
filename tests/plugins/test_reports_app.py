"""The plugin's report route inside Airflow's own API application, with the simple auth manager: a real DAG run
records report paths (local, ``file://``, ``memory://``) and the report link; each request goes through
Airflow's app, its auth manager and the metadata DB."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest

from tests.airflow_harness import run_dag, task_states, xcom
from tests.plugins.common import airflow_api_client, report_task_class, write_report

pytestmark = pytest.mark.timeout(300)

DAG_ID = "bq_plugin_reports"
LINK_KEY = "_link_BabelQueueReportLink"


@dataclass
class Site:
    client: Any
    run_id: str
    files: dict[str, Any]
    tokens: dict[str, str]
    cases: dict[str, Any]

    def url(self, task_id: str, tail: str = "", run_id: str | None = None, dag_id: str = DAG_ID) -> str:
        return f"/babelqueue/reports/{quote(dag_id, safe='')}/{quote(run_id or self.run_id, safe='')}/{task_id}{tail}"

    def get(self, path: str, user: str | None = "admin", **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.tokens[user]}"} if user else {}
        return self.client.get(path, headers=headers, **kwargs)

    def edit(self, value: Any) -> str:
        """Rewrite the ``edited`` task's return value, as Airflow's XCom API lets a user with write access do;
        returns the task's report URL."""
        from airflow.models.xcom import XComModel

        XComModel.set("return_value", value, dag_id=DAG_ID, task_id="edited", run_id=self.run_id)
        return self.url("edited")


def _returns(value: Any) -> Any:
    return lambda: value


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    import fsspec
    from airflow.sdk import DAG
    from airflow.sdk.io import attach

    base = tmp_path_factory.mktemp("plugin")
    root, outside = base / "runs", base / "elsewhere"
    html, summary = write_report(root / DAG_ID / "run" / "report", marker=" (local)")
    file_html, file_summary = write_report(root / DAG_ID / "run" / "report-job", marker=" (file url)")
    secret_html, _ = write_report(outside, marker=" SECRET")
    (root / "bad").mkdir()
    (root / "bad" / "notes.txt").write_text("SECRET notes")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    memory = fsspec.filesystem("memory")
    attach("memory", fs=memory)  # this process is the API server here; the store is the memory filesystem's
    memory_html = write_report(base / "mem", marker=" (memory)")[0].read_bytes()
    memory.pipe("/reports/runs/one/report/report.html", memory_html)
    memory.pipe("/secret/report.html", secret_html.read_bytes())

    # what the tasks return; the other cases are written over the ``edited`` task's XCom by the tests
    returns = {
        "triage": {"job": "triage", "summary": f"{root}/_triage_summary.json", "report": str(html),
                   "report_summary": str(summary)},
        "triage_only": {"job": "triage", "summary": f"{root}/_triage_summary.json"},
        "edited": {"job": "triage", "summary": f"{root}/_triage_summary.json"},
    }
    cases = {
        "report_job": {"job": "report", "summary": file_summary.as_uri(), "report": file_html.as_uri()},
        "memory": {"job": "report", "report": "memory://reports/runs/one/report/report.html"},
        "outside": {"report": str(secret_html)},
        "dotdot": {"report": f"{root}/../elsewhere/report.html"},
        "symlink": {"report": f"{root}/escape/report.html"},
        "not_a_report": {"report": f"{root}/bad/notes.txt"},
        "memory_dotdot": {"report": "memory://reports/runs/../../secret/report.html"},
        "gone": {"report": f"{root}/{DAG_ID}/deleted/report.html"},
        "no_filesystem": {"report": "nofs://reports/runs/one/report.html"},
    }
    task = report_task_class()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW__BABELQUEUE__REPORT_ROOTS", f"{root},memory://reports/runs,nofs://reports/runs")
        with DAG(DAG_ID, schedule=None, catchup=False) as dag:
            for task_id, value in returns.items():
                task(task_id=task_id, python_callable=_returns(value))
        run = run_dag(dag)
        assert set(task_states(run).values()) == {"success"}, task_states(run)
        links = {task_id: xcom(run, task_id, key=LINK_KEY) for task_id in returns}
        assert links["triage_only"] == "" and links["triage"].startswith("/babelqueue/reports/")

        client, tokens = airflow_api_client(patch)
        try:
            yield Site(client, run.run_id, {"html": html, "summary": summary, "file_html": file_html,
                                            "file_summary": file_summary, "memory": memory_html, "links": links,
                                            "secret": secret_html}, tokens, cases)
        finally:
            from airflow.api_fastapi import app as api_app

            api_app.purge_cached_app()


def test_a_request_without_a_valid_token_is_refused(site: Site) -> None:
    assert site.get(site.url("triage"), user=None).status_code == 401
    assert site.get(site.url("triage/summary.json"), user=None).status_code == 401
    forged = site.client.get(site.url("triage"), headers={"Authorization": "Bearer not.a.jwt"})
    assert forged.status_code == 403
    assert "SECRET" not in forged.text and "dead-letter report" not in forged.text


def test_a_user_without_a_role_is_forbidden_and_every_role_can_read(site: Site) -> None:
    refused = site.get(site.url("triage"), user="norole")
    assert refused.status_code == 403 and "dead-letter report" not in refused.text
    for role in ("viewer", "user", "op", "admin"):
        assert site.get(site.url("triage"), user=role).status_code == 200, role


def test_the_admin_gets_the_exact_report_with_a_strict_policy(site: Site) -> None:
    page = site.get(site.url("triage"))
    assert page.status_code == 200 and page.content == site.files["html"].read_bytes()
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "sandbox" in policy and "script-src" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    data = site.get(site.url("triage", "/summary.json"))
    assert data.status_code == 200 and data.content == site.files["summary"].read_bytes()
    assert data.headers["content-type"] == "application/json" and json.loads(data.content)["version"] == 1


def test_the_ui_session_cookie_is_accepted(site: Site) -> None:
    site.client.cookies.set("_token", site.tokens["viewer"])
    try:
        page = site.client.get(site.url("triage"))
    finally:
        site.client.cookies.clear()
    assert page.status_code == 200 and page.content == site.files["html"].read_bytes()


def test_the_link_recorded_by_the_task_opens_the_report(site: Site) -> None:
    link = site.files["links"]["triage"]
    assert link == site.url("triage")  # relative to the site; the run id's ':' and '+' are escaped
    assert site.get(link).content == site.files["html"].read_bytes()
    assert site.files["links"]["edited"] == ""  # it returned no report: no button


def test_file_urls_and_object_storage_are_read_through_object_storage_path(site: Site) -> None:
    url = site.edit(site.cases["report_job"])
    assert site.get(url).content == site.files["file_html"].read_bytes()
    assert site.get(url + "/summary.json").content == site.files["file_summary"].read_bytes()
    memory = site.get(site.edit(site.cases["memory"]))
    assert memory.status_code == 200 and memory.content == site.files["memory"]
    answer = site.get(site.url("edited", "/summary.json"))  # a report, but no summary recorded
    assert answer.status_code == 404 and "No report yet" in answer.json()["detail"], answer.text


def test_a_missing_task_report_or_file_answers_404_saying_so(site: Site) -> None:
    for tail in ("", "/summary.json"):
        answer = site.get(site.url("triage_only", tail))
        assert answer.status_code == 404 and "No report yet" in answer.json()["detail"], answer.text
    missing = site.get(site.url("triage", run_id="manual__never"))
    assert missing.status_code == 404 and "No task instance" in missing.json()["detail"]
    unmapped = site.get(site.url("triage") + "?map_index=2")
    assert unmapped.status_code == 404 and "task 'triage' [2] of run" in unmapped.json()["detail"]
    assert site.get(site.url("triage") + "?map_index=-2").status_code == 422
    gone = site.get(site.edit(site.cases["gone"]))
    assert gone.status_code == 404 and "storage the API server can read" in gone.json()["detail"], gone.text
    unreadable = site.get(site.edit(site.cases["no_filesystem"]))  # e.g. the scheme's provider is not installed
    assert unreadable.status_code == 502 and "filesystem: 'nofs'" in unreadable.json()["detail"], unreadable.text


@pytest.mark.parametrize("case", ["outside", "dotdot", "symlink", "not_a_report", "memory_dotdot"])
def test_an_xcom_pointing_elsewhere_is_refused(site: Site, case: str) -> None:
    answer = site.get(site.edit(site.cases[case]))
    assert answer.status_code == 403, answer.text
    assert "SECRET" not in answer.text and "dead-letter report" not in answer.text


@pytest.mark.parametrize("path", [
    "/babelqueue/reports/../../../etc/passwd",
    "/babelqueue/reports/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    f"/babelqueue/reports/{DAG_ID}/%2e%2e%2f%2e%2e%2fetc%2fpasswd/triage",
    f"/babelqueue/reports/{DAG_ID}/run/..%2F..%2Felsewhere%2Freport.html",
    "/babelqueue/reports/x/y/z/../../../../../etc/passwd",
    "/babelqueue/static/../reports",
])
def test_request_paths_cannot_name_a_file(site: Site, path: str) -> None:
    """Dot segments are resolved before routing (some land on Airflow's UI page, which answers any path), and
    an escaped ``/`` stays inside one path parameter, where it only fails to match a task instance."""
    answer = site.get(path)
    assert "root:" not in answer.text and "SECRET" not in answer.text
    assert not answer.headers.get("content-security-policy", "").endswith("sandbox"), path  # not the plugin's page
    if answer.url.path == "/babelqueue/reports":  # the list of reports: names, never a file's content
        assert answer.status_code == 200 and set(answer.json()) == {"reports"}
    elif answer.url.path.startswith("/babelqueue/"):
        assert answer.status_code == 404 and answer.json()["detail"].startswith(("No task instance", "Not Found"))


def test_every_route_of_the_plugin_checks_the_login(site: Site) -> None:
    """Each route sits behind Airflow's login, a reports route behind the DAG's read permission and a console
    route behind the asset read permission, whatever its own code does."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.routing import APIRoute

    from airflow_provider_babelqueue.plugins.plugin import BabelQueuePlugin

    [entry] = BabelQueuePlugin.fastapi_apps
    assert entry["url_prefix"] == "/babelqueue" and BabelQueuePlugin.fastapi_apps is BabelQueuePlugin.fastapi_apps

    def calls(dependant: Any) -> set[Any]:
        return {dependant.call} | {call for sub in dependant.dependencies for call in calls(sub)}

    routes = [route for route in entry["app"].routes if isinstance(route, APIRoute)]
    assert {route.path for route in routes} == {"/reports/{dag_id}/{run_id}/{task_id}",
                                                "/reports/{dag_id}/{run_id}/{task_id}/summary.json",
                                                "/console/api/connections", "/console/api/queues",
                                                "/console/api/dead-letters", "/console/api/dead-letters/{position}",
                                                "/console/api/actions", "/console/api/actions/replay",
                                                "/console/api/actions/export", "/console/api/actions/discard",
                                                "/console/api/jobs", "/console/api/jobs/{job_id}",
                                                "/console/api/jobs/{job_id}/cancel", "/console/api/jobs/{job_id}/file",
                                                "/console/", "/console/app.js", "/console/app.css", "/reports"}
    assert [route.path for route in entry["app"].routes if not isinstance(route, APIRoute)] == []
    for route in routes:
        names = {getattr(call, "__qualname__", "") for call in calls(route.dependant)}
        assert get_user in calls(route.dependant), route.path
        if route.path == "/reports":  # the list: filtered to the DAGs the user may read, by the auth manager
            continue
        needed = "requires_access_dag" if route.path.startswith("/reports/") else "requires_access_asset"
        assert f"{needed}.<locals>.inner" in names, route.path


def test_the_reports_are_listed_for_the_dags_a_user_may_read(site: Site) -> None:
    assert site.get("/babelqueue/reports", user=None).status_code == 401
    listed = site.get("/babelqueue/reports", user="viewer").json()["reports"]
    mine = [r for r in listed if r["dag_id"] == DAG_ID and r["run_id"] == site.run_id]
    assert {r["task_id"] for r in mine} >= {"triage"} and "triage_only" not in {r["task_id"] for r in mine}
    [triage] = [r for r in mine if r["task_id"] == "triage"]
    assert triage["url"] == site.url("triage")
    assert site.get(triage["url"], user="viewer").status_code == 200
    assert site.get("/babelqueue/reports", user="norole").json() == {"reports": []}  # no DAG it may read
