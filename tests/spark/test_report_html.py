"""The report page renders in headless Chromium: charts present, no console errors, nothing fetched from outside.

Chromium comes from the system (``.ci/system.sh`` installs Debian's ``chromium``); the test is skipped without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.spark.conftest import SparkRun

pytestmark = pytest.mark.timeout(300)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
CONSOLE_ERROR = re.compile(r"Uncaught|ERROR:CONSOLE|CONSOLE\(\d+\).*(?:Error|error)|Failed to load resource")


def chromium(page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (run .ci/system.sh)")
    with tempfile.TemporaryDirectory(prefix="bq-chromium-") as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
                              capture_output=True, text=True, timeout=120, check=False)


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if CONSOLE_ERROR.search(line)]


def test_console_error_detection_works(tmp_path: Path) -> None:
    """Negative control: a page that throws is caught by the same check."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>undefinedFunction()</script></body></html>")
    done = chromium(page, "--dump-dom")
    assert console_errors(done.stderr), done.stderr[-2000:]


def test_report_renders_with_charts_and_no_console_errors(spark_run: SparkRun, tmp_path: Path) -> None:
    page = spark_run.report_dir / "report.html"
    html = page.read_text(encoding="utf-8")
    # self-contained: no external script, stylesheet, image, font or frame; the only URL is the SVG namespace
    assert not re.search(r"<(?:link|img|iframe)\b|\bsrc=|@import|url\(", html)
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}

    done = chromium(page, "--dump-dom", "--virtual-time-budget=2000")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert console_errors(done.stderr) == []
    for chart in ("chart-reasons", "chart-hourly", "chart-ages", "chart-langs"):
        assert re.search(rf'<svg[^>]*id="{chart}"', dom), chart
    reasons_svg = re.search(r'<svg[^>]*id="chart-reasons".*?</svg>', dom, re.S).group(0)
    assert reasons_svg.count('class="bar"') == 4  # failed, poison, unknown_urn, unsupported_schema_version
    hourly_svg = re.search(r'<svg[^>]*id="chart-hourly".*?</svg>', dom, re.S).group(0)
    assert hourly_svg.count('class="bar"') == 3
    assert "timeout after &lt;n&gt;s for order &lt;n&gt;" in dom and ">15</b>" in dom

    shot = tmp_path / "report.png"
    done = chromium(page, f"--screenshot={shot}", "--window-size=1280,1500", "--virtual-time-budget=2000")
    assert done.returncode == 0 and console_errors(done.stderr) == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a real rendering, not a blank page
    target = os.environ.get("BABELQUEUE_REPORT_SCREENSHOT")
    if target:  # refresh the docs image: BABELQUEUE_REPORT_SCREENSHOT=docs/images/spark-report.png
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)
