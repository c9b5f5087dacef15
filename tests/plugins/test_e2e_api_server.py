"""End to end through a real ``airflow api-server`` on loopback, in its own Airflow home.

The triage operator (with the report link, as ``operators/spark.py`` declares it) runs under ``airflow dags
test`` with spark-submit stubbed out (the report files are put where the job would write them); the API
server then lists the link on the task instance, refuses the report without a token or without a role,
serves it to a viewer and an admin through the simple auth manager's ``/auth/token``, and headless Chromium
opens both the report and the task's page in Airflow's UI (signed in by the UI's ``_token`` cookie).

Set ``BABELQUEUE_PLUGIN_SCREENSHOTS`` to a folder to keep the screenshots.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.browser import CHROMIUM
from tests.conftest import free_port
from tests.plugins.common import write_report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DAG_ID = "bq_report_link_e2e"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars"]
PASSWORDS = {"admin": uuid.uuid4().hex, "viewer": uuid.uuid4().hex, "nobody": uuid.uuid4().hex}

DAG_FILE = """
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG

from airflow_provider_babelqueue.operators.links import BabelQueueReportLink
from airflow_provider_babelqueue.operators.spark import BabelQueueSparkTriageOperator

# No Spark here: the report files are already where the job writes them. The operator's own code runs.
SparkSubmitOperator.execute = lambda self, context: None


class TriageWithReportLink(BabelQueueSparkTriageOperator):
    operator_extra_links = (BabelQueueReportLink(),)


with DAG({dag_id!r}, schedule=None, catchup=False):
    TriageWithReportLink(task_id="triage", job="triage", input={drain!r}, output={triage!r},
                         report_output={report!r}, conn_id="spark_local")
"""


def _http(method: str, url: str, token: str | None = None, body: Any = None) -> tuple[int, bytes, Any]:
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode())
    if body is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read(), answer.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


class _SignedInBrowserProxy(ThreadingHTTPServer):
    """Forwards Chromium's requests to the API server with the ``_token`` cookie a signed-in browser sends
    (the simple auth manager's login page sets it; headless Chromium cannot be given a cookie otherwise)."""

    daemon_threads = True

    def __init__(self, upstream: str, token: str) -> None:
        self.upstream, self.token = upstream, token
        super().__init__(("127.0.0.1", 0), _ProxyHandler)


class _ProxyHandler(BaseHTTPRequestHandler):
    server: _SignedInBrowserProxy

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        request = urllib.request.Request(self.server.upstream + self.path)
        for name, value in self.headers.items():
            if name.lower() not in ("host", "cookie", "connection", "accept-encoding"):
                request.add_header(name, value)
        request.add_header("Cookie", f"_token={self.server.token}")
        try:
            answer = urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as error:
            answer = error
        body = answer.read()
        self.send_response(answer.status if hasattr(answer, "status") else answer.code)
        for name, value in answer.headers.items():
            if name.lower() not in ("transfer-encoding", "connection", "content-length", "set-cookie"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _chromium(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="bq-chromium-") as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                              capture_output=True, text=True, timeout=120, check=False)


def _keep(shot: Path) -> None:
    target = os.environ.get("BABELQUEUE_PLUGIN_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / shot.name)


@pytest.fixture()
def airflow_home(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh Airflow home (the suite's migrated DB copied in when there is one) and its environment."""
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    migrated = Path(os.environ["AIRFLOW_HOME"]) / "airflow.db"
    if migrated.is_file():
        shutil.copy(migrated, home / "airflow.db")
    (home / "passwords.json").write_text(json.dumps(PASSWORDS))
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer,nobody:",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex * 2,
        "AIRFLOW__API__SECRET_KEY": uuid.uuid4().hex,
        "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[1]"}),
    }
    env.pop("AIRFLOW__BABELQUEUE__REPORT_ROOTS", None)  # the default root: $AIRFLOW_HOME/babelqueue/runs
    if not any(point.name == "babelqueue" for point in entry_points(group="airflow.plugins")):
        # Without the package's `airflow.plugins` entry point, Airflow loads a provider's plugins (the provider
        # info's "plugins") only when it discovers providers eagerly.
        env["AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS"] = "False"
    yield home, env


def test_the_report_link_opens_the_report_through_the_api_server(airflow_home: tuple[Path, dict[str, str]],
                                                                  tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (run .ci/system.sh)")
    home, env = airflow_home
    airflow = str(Path(sys.executable).parent / "airflow")
    if not (home / "airflow.db").exists():
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
    work = home / "babelqueue" / "runs" / DAG_ID / "e2e"
    html, summary = write_report(work / "report", marker=" (end to end)")
    (home / "dags" / "report_link_dag.py").write_text(textwrap.dedent(DAG_FILE.format(
        dag_id=DAG_ID, drain=str(work / "drain"), triage=str(work / "triage"), report=str(work / "report"))))

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "api-server.log"
    server = subprocess.Popen([airflow, "api-server", "--port", str(port), "--host", "127.0.0.1", "--workers", "1"],
                              env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # the DAG runs while the API server starts
        for command in (["dags", "reserialize"], ["dags", "test", DAG_ID]):
            done = subprocess.run([airflow, *command], env=env, capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        deadline = time.monotonic() + 120
        while _http("GET", f"{base}/api/v2/monitor/health")[0] != 200:
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)

        tokens = {}
        for user, password in PASSWORDS.items():
            status, body, _ = _http("POST", f"{base}/auth/token", body={"username": user, "password": password})
            assert status == 201, (user, body)
            tokens[user] = json.loads(body)["access_token"]
        status, body, _ = _http("GET", f"{base}/api/v2/dags/{DAG_ID}/dagRuns", tokens["admin"])
        [run] = json.loads(body)["dag_runs"]
        assert run["state"] == "success", run
        run_id = quote(run["dag_run_id"], safe="")
        status, body, _ = _http("GET", f"{base}/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/triage/links",
                                tokens["admin"])
        assert status == 200, body
        link = json.loads(body)["extra_links"]["Dead-letter report"]
        assert link == f"/babelqueue/reports/{DAG_ID}/{run_id}/triage", link

        assert _http("GET", base + link)[0] == 401
        assert _http("GET", base + link, tokens["nobody"])[0] == 403
        for user in ("viewer", "admin"):
            status, page, headers = _http("GET", base + link, tokens[user])
            assert status == 200 and page == html.read_bytes(), user
            assert headers["Content-Type"] == "text/html; charset=utf-8" and "sandbox" in headers[
                "Content-Security-Policy"]
        status, data, _ = _http("GET", f"{base}{link}/summary.json", tokens["viewer"])
        assert status == 200 and data == summary.read_bytes()

        proxy = _SignedInBrowserProxy(base, tokens["viewer"])
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            site = f"http://127.0.0.1:{proxy.server_address[1]}"
            shot = tmp_path / "plugin-report.png"
            done = _chromium(site + link, f"--screenshot={shot}", "--window-size=1280,1100",
                             "--virtual-time-budget=3000")
            assert done.returncode == 0 and shot.read_bytes()[:4] == b"\x89PNG", done.stderr[-2000:]
            assert shot.stat().st_size > 20_000  # the rendered report, not an error page
            _keep(shot)
            dom = _chromium(site + link, "--dump-dom", "--virtual-time-budget=3000", "--enable-logging=stderr", "--v=0")
            assert 'id="chart-reasons"' in dom.stdout and "(end to end)" in dom.stdout
            assert "Content Security Policy" not in dom.stderr  # the policy blocks nothing the report uses
            task_page = f"{site}/dags/{DAG_ID}/runs/{run_id}/tasks/triage/details"  # where the UI lists links
            ui = _chromium(task_page, "--dump-dom", "--virtual-time-budget=20000", "--window-size=1400,1000")
            assert "Dead-letter report" in ui.stdout and link in ui.stdout, ui.stdout[-3000:]
            shot = tmp_path / "plugin-task-page.png"
            _chromium(task_page, f"--screenshot={shot}", "--virtual-time-budget=20000", "--window-size=1400,1000")
            _keep(shot)
        finally:
            proxy.shutdown()
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
