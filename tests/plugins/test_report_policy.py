"""The Content-Security-Policy the plugin sends lets the self-contained report render in Chromium with no
violation, and the same check catches a policy that would break it (the negative control)."""

from __future__ import annotations

import subprocess
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.browser import CHROMIUM
from tests.plugins.common import write_report

pytestmark = pytest.mark.timeout(300)



def csp_violations(stderr: str) -> list[str]:
    """Chromium's console lines (``--enable-logging=stderr``) that report a blocked style, script or fetch."""
    return [line for line in stderr.splitlines() if "Content Security Policy" in line]


def open_page(url: str) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (run .ci/system.sh)")
    with tempfile.TemporaryDirectory(prefix="bq-chromium-") as profile:
        return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               "--disable-background-networking", "--enable-logging=stderr", "--v=0",
                               f"--user-data-dir={profile}", "--dump-dom", "--virtual-time-budget=2000", url],
                              capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture()
def serve(tmp_path: Path) -> Iterator[object]:
    """Serves the report with the given headers, from a loopback server of its own."""
    body = write_report(tmp_path / "report")[0].read_bytes()
    servers: list[ThreadingHTTPServer] = []

    def start(headers: dict[str, str]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}/report.html"

    yield start
    for server in servers:
        server.shutdown()


def test_the_plugins_policy_renders_the_report_without_a_violation(serve) -> None:
    from airflow_provider_babelqueue.plugins.reports import RESPONSE_HEADERS

    done = open_page(serve({"Content-Type": "text/html; charset=utf-8", **RESPONSE_HEADERS}))
    assert done.returncode == 0, done.stderr[-2000:]
    assert csp_violations(done.stderr) == []
    assert 'id="chart-reasons"' in done.stdout and 'class="bar"' in done.stdout


def test_a_policy_without_inline_styles_is_caught(serve) -> None:
    done = open_page(serve({"Content-Type": "text/html; charset=utf-8",
                            "Content-Security-Policy": "default-src 'none'; sandbox"}))
    assert csp_violations(done.stderr), done.stderr[-2000:]
