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
from collections.abc import Iterator
from contextlib import contextmanager
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


def _filled_queue(home: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The SQLite connection ``bq_console`` in ``home``, for this process and the API server's, and a new queue on
    it filled by :func:`_fill`; returns the queue's name."""
    queue = f"orders-{uuid.uuid4().hex[:6]}"
    connection = json.dumps({"conn_type": "babelqueue+sql", "host": str(home / "console.sqlite")})
    env["AIRFLOW_CONN_BQ_CONSOLE"] = connection
    monkeypatch.setenv("AIRFLOW_CONN_BQ_CONSOLE", connection)
    _fill("bq_console", queue)
    return queue


@contextmanager
def _api_server(home: Path, env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A real ``airflow api-server`` on loopback for ``home``; yields its base URL once it is healthy."""
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
        yield base
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        server.wait(timeout=30)


def _token(base: str, user: str) -> str:
    status, body, _ = _http("POST", f"{base}/auth/token", body={"username": user, "password": PASSWORDS[user]})
    assert status == 201, body
    return str(json.loads(body)["access_token"])


def test_the_console_page_shows_a_filtered_queue_and_one_dead_letter(
        airflow_home: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (run .ci/system.sh)")
    home, env = airflow_home
    queue = _filled_queue(home, env, monkeypatch)
    with _api_server(home, env, tmp_path) as base:
        viewer = _token(base, "viewer")
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


def test_an_operator_filters_opens_replays_once_and_discards_with_archive_in_the_browser(
        airflow_home: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Clicks, as a person does: filter by reason, open a dead letter, preview and replay two (they reach the queue
    once; a second click replays nothing), discard one with archive (the archive holds exactly its bytes); a
    viewer's click on Replay is refused."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (run .ci/system.sh)")
    from airflow_provider_babelqueue.core.records import record_body
    from tests.cdp import Browser

    home, env = airflow_home
    env["AIRFLOW__BABELQUEUE__OUTPUT_ROOT"] = str(tmp_path / "runs")
    queue = _filled_queue(home, env, monkeypatch)
    hook = get_hook("bq_console")
    binding = hook.get_binding()
    stored = binding.browse_dead_letter_bytes(queue, 0, 6)
    try:
        with _api_server(home, env, tmp_path) as base, Browser() as browser:
            page = f"{base}/babelqueue/console/#" + urlencode({"conn_id": "bq_console", "queue_name": queue})
            browser.cookie(base, "_token", _token(base, "viewer"))
            browser.go(page)
            browser.wait("document.querySelectorAll('#entries tr.entry').length === 6")
            browser.run("document.querySelector('#entries input[data-position=\"0\"]').click()")
            browser.run("document.getElementById('replay').click()")
            assert "403" in browser.wait("document.getElementById('status').className === 'error' && "
                                         "document.getElementById('status').textContent")

            browser.cookie(base, "_token", _token(base, "admin"))
            browser.go(page)
            browser.wait("document.querySelectorAll('#entries tr.entry').length === 6")
            browser.run("document.getElementById('reason').value = 'failed'")
            browser.run("document.getElementById('load').click()")
            browser.wait("document.querySelectorAll('#entries tr.entry').length === 4")
            browser.run("document.querySelector('#entries tr.entry[data-position=\"3\"]').click()")
            body = browser.wait("!document.getElementById('detail').hidden && "
                                "document.getElementById('detail-body').textContent")
            assert body == stored[3].decode() and "onerror=alert(1)" in body
            assert browser.run("document.querySelectorAll('#detail img').length") == 0  # text, not markup

            for position in (0, 1):
                browser.run(f"document.querySelector('#entries input[data-position=\"{position}\"]').click()")
            browser.run("document.getElementById('preview').click()")
            assert browser.wait("document.getElementById('status').textContent.startsWith('preview:') && "
                                "document.getElementById('status').textContent").startswith(
                f'preview: 2 would be replayed to {{"{queue}":2}}')
            assert binding.depth(queue) == 0
            browser.run("document.getElementById('replay').click()")
            assert browser.wait("document.getElementById('status').textContent.startsWith('replayed') && "
                                "document.getElementById('status').textContent").startswith("replayed 2;")
            assert binding.depth(queue) == 2  # arrived once
            browser.run("document.getElementById('status').textContent = ''")
            browser.run("document.getElementById('replay').click()")
            assert browser.wait("document.getElementById('status').textContent.startsWith('replayed') && "
                                "document.getElementById('status').textContent").startswith(
                "replayed 0; 2 already replayed before")
            assert binding.depth(queue) == 2  # a second click replays nothing
            shot = tmp_path / "console-replayed.png"
            browser.screenshot(shot)
            _keep(shot)

            for position in (0, 1):  # uncheck, then check the one to discard
                browser.run(f"document.querySelector('#entries input[data-position=\"{position}\"]').click()")
            browser.run("document.querySelector('#entries input[data-position=\"2\"]').click()")
            browser.run("window.confirm = () => true")
            browser.run("document.getElementById('discard').click()")
            said = browser.wait("document.getElementById('status').textContent.startsWith('archived') && "
                                "document.getElementById('status').textContent")
            archive = Path(said.split(" in ", 1)[1].split(";", 1)[0])
            assert said.endswith("removed 1") and archive.is_relative_to(tmp_path / "runs")
            assert [record_body(json.loads(line)) for line in archive.read_bytes().splitlines()] == [stored[2]]
            assert binding.browse_dead_letter_bytes(queue, 0, 6) == [stored[i] for i in (0, 1, 3, 4, 5)]
            actions = browser.wait("document.querySelectorAll('#actions tr').length >= 4 && "
                                   "[...document.querySelectorAll('#actions tr')].map(r => r.children[2].textContent)")
            assert actions[:4] == ["discard", "replay", "replay", "replay_preview"]
    finally:
        hook.close()
