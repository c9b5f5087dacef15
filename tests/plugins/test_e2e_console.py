"""The dead-letter console in a real browser, through a real ``airflow api-server`` (simple auth manager): headless
Chromium, signed in by the UI's ``_token`` cookie, opens the console on a filter and a dead letter (the page's
state is its URL fragment), and the page shows the depths, the filtered rows and the dead letter's bytes as text.

Set ``BABELQUEUE_PLUGIN_SCREENSHOTS`` to a folder to keep the screenshots (docs/console.md shows them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.hooks import get_hook
from tests.bindings.conftest import reserve_all
from tests.browser import CHROMIUM
from tests.conftest import free_port
from tests.plugins.test_e2e_api_server import (  # noqa: F401 - airflow_home is a fixture
    PASSWORDS,
    _chromium,
    _http,
    _keep,
    _SignedInBrowserProxy,
    airflow_home,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HOSTILE = "<img src=x onerror=alert(1)>"


def _fill(conn_id: str, queue: str) -> None:
    """Six dead letters: four timeouts of orders (one with markup in its error), two unknown URNs."""
    hook = get_hook(conn_id)
    try:
        binding = hook.get_binding()
        for n in range(6):
            urn = "urn:babel:orders:created" if n < 4 else "urn:babel:billing:charged"
            binding.publish(bq.encode(bq.make_envelope(urn, {"order_id": 1040 + n}, queue_name=queue)), queue)
        for message in reserve_all(binding, queue, 6):
            n = message.envelope["data"]["order_id"] - 1040
            if n < 4:
                error = f"gateway timeout after {30 + n}s for order {1040 + n}" + (f" {HOSTILE}" if n == 3 else "")
                binding.dead_letter(message, bq.Reason.FAILED, error=error, exception="App\\Exceptions\\GatewayTimeout")
            else:
                binding.dead_letter(message, bq.Reason.UNKNOWN_URN, error="no handler for urn:babel:billing:charged")
    finally:
        hook.close()


def test_the_console_page_shows_a_filtered_queue_and_one_dead_letter(
        airflow_home: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (run .ci/system.sh)")
    home, env = airflow_home
    queue = f"orders-{uuid.uuid4().hex[:6]}"
    connection = json.dumps({"conn_type": "babelqueue+sql", "host": str(home / "console.sqlite")})
    env["AIRFLOW_CONN_BQ_CONSOLE"] = connection
    monkeypatch.setenv("AIRFLOW_CONN_BQ_CONSOLE", connection)
    _fill("bq_console", queue)
    airflow = str(Path(sys.executable).parent / "airflow")
    if not (home / "airflow.db").exists():
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "api-server.log"
    server = subprocess.Popen([airflow, "api-server", "--port", str(port), "--host", "127.0.0.1", "--workers", "1"],
                              env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _http("GET", f"{base}/api/v2/monitor/health")[0] == 200:
                    break
            except OSError:  # not listening yet
                pass
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        status, body, _ = _http("POST", f"{base}/auth/token",
                                body={"username": "viewer", "password": PASSWORDS["viewer"]})
        assert status == 201, body
        viewer = json.loads(body)["access_token"]
        status, body, _ = _http("GET", f"{base}/api/v2/plugins", viewer)
        [ours] = [p for p in json.loads(body)["plugins"] if p["name"] == "babelqueue"]
        assert ours["external_views"][0]["href"] == "/babelqueue/console/"  # in the UI's navigation
        proxy = _SignedInBrowserProxy(base, viewer)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            site = f"http://127.0.0.1:{proxy.server_address[1]}"
            view = urlencode({"conn_id": "bq_console", "queue_name": queue, "reason": "failed", "open": 3})
            url = f"{site}/babelqueue/console/#{view}"
            dom = _chromium(url, "--dump-dom", "--virtual-time-budget=8000", "--enable-logging=stderr", "--v=0")
            page = dom.stdout
            assert "dead letters: 6" in page, page[-3000:]
            assert "4 shown, 6 read from position 0; end of the queue" in page, page[-3000:]
            assert page.count('class="entry"') == 4 and "urn:babel:billing:charged" not in page.split("<tbody")[1]
            assert "Dead letter at position 3" in page
            # the markup in the error and in the stored bytes is shown as text, escaped, never as an element
            assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img src=" not in page
            assert "Content Security Policy" not in dom.stderr  # the policy blocks nothing the page uses
            shot = tmp_path / "console.png"
            done = _chromium(url, f"--screenshot={shot}", "--window-size=1400,1100", "--virtual-time-budget=8000")
            assert done.returncode == 0 and shot.read_bytes()[:4] == b"\x89PNG", done.stderr[-2000:]
            _keep(shot)
        finally:
            proxy.shutdown()
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        server.wait(timeout=30)
