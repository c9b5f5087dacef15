"""The dead-letter console in a real browser, through a real ``airflow api-server`` (simple auth manager): headless
Chromium (driven over the DevTools protocol, :mod:`tests.cdp`) signs in as a person does, through Airflow's own
login form, and opens the console on a filter and a dead letter (the page's state is its URL fragment); the page
shows the depths, the filtered rows and the dead letter's bytes as text. An operator then clicks through it.

Signing in (:func:`_sign_in`): the browser asks Airflow's login entry ``/api/v2/auth/login?next=<console>``, which
sends it to the simple auth manager's login page ``/auth/login?next=...``; there it types the user name and the
password (from the users' password file) into the form's ``username`` and ``password`` fields with key presses
and clicks "Sign in" with the mouse. The page posts them to ``/auth/token``, keeps the token it gets as the UI's
``_token`` cookie and goes on to the console, which then answers as that user. Nothing puts a cookie in place.

Set ``BABELQUEUE_PLUGIN_SCREENSHOTS`` to a folder to keep the screenshots (docs/console.md shows them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from base64 import urlsafe_b64decode
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.hooks import get_hook
from tests.bindings.conftest import reserve_all
from tests.browser import CHROMIUM
from tests.conftest import free_port
from tests.plugins.test_e2e_api_server import (  # noqa: F401 - airflow_home is a fixture
    PASSWORDS,
    _http,
    _keep,
    airflow_home,
)

if TYPE_CHECKING:
    from tests.cdp import Browser

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


def _claims(token: str) -> dict[str, Any]:
    """The claims of a JWT (read, not verified: the API server verifies it)."""
    payload = token.split(".")[1]
    return dict(json.loads(urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def _sign_in(browser: Browser, base: str, user: str, page: str, shot: Path | None = None) -> None:
    """Sign ``user`` in through Airflow's login form, as a person does, and land on ``page`` (a path on ``base``,
    with its fragment); ``shot``, when given, is a screenshot of the filled-in form.

    Airflow's login entry redirects to the simple auth manager's login page, a form with a ``username`` and a
    ``password`` field and a "Sign in" button (disabled until both are filled in). The page posts them to
    ``/auth/token``, stores the token as the ``_token`` cookie and replaces itself with ``next``."""
    browser.go(f"{base}/api/v2/auth/login?" + urlencode({"next": page}))
    browser.wait("location.pathname === '/auth/login' && !!document.querySelector('form input[name=\"password\"]')")
    assert "_token" not in browser.cookies(base)  # not signed in yet: the form is what signs in
    browser.type('form input[name="username"]', user)
    browser.type('form input[name="password"]', PASSWORDS[user])
    button = 'form button[type="submit"]'
    assert browser.wait(f"!document.querySelector('{button}').disabled && "
                        f"document.querySelector('{button}').textContent") == "Sign in"
    if shot is not None:
        browser.screenshot(shot)
        _keep(shot)
    browser.click(button)
    browser.wait(f"location.pathname + location.hash === {json.dumps(page)} && document.readyState === 'complete'")
    assert _claims(browser.cookies(base)["_token"])["sub"] == user  # the session the form started is the user's


def test_the_console_page_shows_a_filtered_queue_and_one_dead_letter(
        airflow_home: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (run .ci/system.sh)")
    from tests.cdp import Browser

    home, env = airflow_home
    queue = _filled_queue(home, env, monkeypatch)
    with _api_server(home, env, tmp_path) as base, Browser() as browser:
        status, body, _ = _http("GET", f"{base}/api/v2/plugins", _token(base, "viewer"))
        [ours] = [p for p in json.loads(body)["plugins"] if p["name"] == "babelqueue"]
        assert ours["external_views"][0]["href"] == "/babelqueue/console/"  # in the UI's navigation
        view = urlencode({"conn_id": "bq_console", "queue_name": queue, "reason": "failed", "open": 3})
        _sign_in(browser, base, "viewer", f"/babelqueue/console/#{view}")
        signed_in = len(browser.events)
        shown = ["dead letters: 6", "4 shown, 6 read from position 0; end of the queue", "Dead letter at position 3"]
        page = browser.wait(f"(h => {json.dumps(shown)}.every(s => h.includes(s)) && h)"
                            "(document.documentElement.outerHTML)")
        overview = browser.wait(f"[...document.querySelectorAll('#overview tr.entry')].map(r => [...r.children]"
                                f".map(c => c.textContent)).filter(r => r[1] === {json.dumps(queue)})")
        assert [row[:5] for row in overview] == [["bq_console", queue, "0", "6", "6"]]  # the queues overview
        page = browser.run("document.documentElement.outerHTML")
        page = page[page.index('id="entries"'):]
        assert page.count('class="entry"') == 4 and "urn:babel:billing:charged" not in page
        # the markup in the error and in the stored bytes is shown as text, escaped, never as an element
        assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img src=" not in page
        browser.run("0")  # the browser's messages about the page have arrived
        refused = [e["params"]["entry"]["text"] for e in browser.events[signed_in:]
                   if e["method"] == "Log.entryAdded" and "Content Security Policy" in e["params"]["entry"]["text"]]
        assert not refused  # the policy blocks nothing the page uses
        shot = tmp_path / "console.png"
        browser.screenshot(shot)
        assert shot.read_bytes()[:4] == b"\x89PNG"
        _keep(shot)


def test_an_operator_filters_opens_replays_once_and_discards_with_archive_in_the_browser(
        airflow_home: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Clicks, as a person does: a viewer signs in through the login form and a click on Replay is refused; after
    the viewer signs out, an admin signs in through the form, filters by reason, opens a dead letter, previews and
    replays two (they reach the queue once; a second click replays nothing), discards one with archive (the
    archive holds exactly its bytes), and the console's action log names the admin."""
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
            page = "/babelqueue/console/#" + urlencode({"conn_id": "bq_console", "queue_name": queue})
            _sign_in(browser, base, "viewer", page)
            browser.wait("document.querySelectorAll('#entries tr.entry').length === 6")
            browser.run("document.querySelector('#entries input[data-position=\"0\"]').click()")
            browser.run("document.getElementById('replay').click()")
            assert "403" in browser.wait("document.getElementById('status').className === 'error' && "
                                         "document.getElementById('status').textContent")

            browser.go(f"{base}/api/v2/auth/logout")  # Airflow's "Log out": ends the session, back to the form
            browser.wait("location.pathname === '/auth/login' && !!document.querySelector('form')")
            shot = tmp_path / "console-sign-in.png"
            _sign_in(browser, base, "admin", page, shot)
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
            # the status speaks once the rows show the queue as it is now: one failed row fewer, none checked
            assert browser.run("[document.querySelectorAll('#entries tr.entry').length, "
                               "document.querySelectorAll('#entries input:checked').length]") == [3, 0]
            assert [record_body(json.loads(line)) for line in archive.read_bytes().splitlines()] == [stored[2]]
            assert binding.browse_dead_letter_bytes(queue, 0, 6) == [stored[i] for i in (0, 1, 3, 4, 5)]
            actions = browser.wait("document.querySelectorAll('#actions tr').length >= 4 && "
                                   "[...document.querySelectorAll('#actions tr')].map(r => [r.children[1].textContent, "
                                   "r.children[2].textContent])")
            assert actions[:4] == [["admin", "discard"], ["admin", "replay"], ["admin", "replay"],
                                   ["admin", "replay_preview"]]  # done as the user who signed in

            # nothing checked: everything matching the filter, replayed by a background job whose progress shows
            assert browser.run("document.querySelectorAll('#entries input:checked').length") == 0
            browser.run("document.getElementById('replay').click()")
            job = browser.wait("(r => r && r.querySelector('.state').textContent === 'succeeded' && "
                               "[...r.children].map(c => c.textContent))(document.querySelector('#jobs tr'))")
            assert job[1:5] == ["admin", "replay", f"bq_console / {queue}", "succeeded"]
            assert job[5] == "read 5 of 5, matched 3; duplicates_avoided 2, duplicates_kept 0, replayed 1", job
            assert binding.depth(queue) == 3  # the one failed dead letter not replayed before, once
            # to another queue, under a rate cap: that queue's ledger is its own, so all three go there
            other = f"{queue}-again"
            browser.run(f"document.getElementById('target').value = {json.dumps(other)}; "
                        "document.getElementById('rate').value = '20'")
            browser.run("document.getElementById('replay').click()")
            job = browser.wait("(r => r && r.querySelector('.state').textContent === 'succeeded' && "
                               f"r.children[0].textContent !== {json.dumps(job[0])} && "
                               "[...r.children].map(c => c.textContent))(document.querySelector('#jobs tr'))")
            assert job[5] == "read 5 of 5, matched 3; duplicates_avoided 0, duplicates_kept 0, replayed 3", job
            assert (binding.depth(queue), binding.depth(other)) == (3, 3)
            shot = tmp_path / "console-job.png"
            browser.run("document.getElementById('jobs').closest('table').scrollIntoView()")
            browser.screenshot(shot)
            _keep(shot)
    finally:
        hook.close()
