"""The report page renders in headless Chromium: charts present, no console errors, nothing fetched from outside;
and no string in the summary (every one of them can come from a dead letter) can break the page or its embedded
JSON.

Chromium comes from the system (``.ci/system.sh`` installs Debian's ``chromium``); the tests that need it are
skipped without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from html import escape
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue.spark.report_html import render_report, script_json
from tests.browser import CHROMIUM
from tests.spark.conftest import SparkRun

pytestmark = pytest.mark.timeout(300)

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


# --- strings that try to end, comment out or corrupt the page and its embedded JSON ----------------------------

INJECTION_CORPUS: list[str] = [
    "</script><script>document.documentElement.setAttribute('data-pwned','script')</script>",
    "<!--",
    "<!-- <script>",
    "<!-- <script> </script> -->",
    "-->",
    "<![CDATA[",
    "]]>",
    "&lt;",
    "&amp;lt;&#60;&#x3c;",
    "</SCRIPT >",
    "</script",
    "<script",
    "<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','img')\">",
    "<svg onload=\"document.documentElement.setAttribute('data-pwned','svg')\"></svg>",
    "\" ' ` = > < /",
    "\\u003c/script\\u003e \\ \\\\ \\\"",
    "line\u2028separator",
    "paragraph\u2029separator",
    "nul\x00byte",
    "".join(chr(code) for code in range(0x20)),  # every C0 control
    "del\x7fete",
    "".join(chr(code) for code in range(0x80, 0xA0)),  # every C1 control
    "lone high \ud800 surrogate",
    "lone low \udfff surrogate",
    "reversed pair \udc00\ud83d",
    "emoji 😀👍🏽👨‍👩‍👧 and astral 𝄞",
    "RTL \u202eevil.exe\u202c \u200fמשהו\u200e عربي \u2067isolate\u2069",
    "\ufeffBOM and \ufffd replacement and \uffff noncharacter",
    "\r\n CRLF \r lone CR \t tab \n newline",
    "</script><!--" * 1500,  # 21 000 characters
    "x" * 20_000,
    "😀" * 5_000,
]


def injection_summary(corpus: list[str] = INJECTION_CORPUS) -> dict[str, Any]:
    """A summary with the shape ``report.summarize`` returns and a ``corpus`` string in every text field."""
    n = len(corpus)
    return {
        "version": 1,
        "input": " | ".join(corpus[:20]),
        "totals": {"dead_letters": 3 * n, "records": 4 * n, "poison": 2, "urns": n, "queues": n, "fingerprints": n,
                   "first_failed_at": 1_764_000_000_000, "last_failed_at": 1_764_100_000_000,
                   "without_failed_at": 1, "duplicates_removed": n},
        "by_reason": {text: i + 1 for i, text in enumerate(corpus)},
        "by_reason_urn_queue": [{"reason": text, "urn": corpus[(i - 1) % n], "original_queue": corpus[(i - 2) % n],
                                 "count": i + 1} for i, text in enumerate(corpus)],
        "top_fingerprints": [{"fingerprint": text, "count": n - i, "exception": corpus[(i - 1) % n],
                              "exception_type": corpus[(i - 2) % n], "error_pattern": corpus[(i - 3) % n],
                              "example_error": corpus[(i - 4) % n], "reasons": [text, corpus[(i - 5) % n]],
                              "first_failed_at": 1_764_000_000_000 + i, "last_failed_at": 1_764_100_000_000 + i}
                             for i, text in enumerate(corpus)],
        "hourly": [{"hour": text, "epoch_ms": 1_764_000_000_000 + i * 3_600_000, "count": i}
                   for i, text in enumerate(corpus)],
        "age_buckets": [{"bucket": text, "count": i} for i, text in enumerate(corpus)],
        "by_lang": {"lang:" + text: i for i, text in enumerate(corpus)},
    }


RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # tab and newline are the page's own whitespace
SUMMARY_OPEN = '<script type="application/json" id="summary-data">'


def embedded_json(html: str) -> str:
    start = html.index(SUMMARY_OPEN) + len(SUMMARY_OPEN)
    return html[start:html.index("</script>", start)]


def test_script_json_escapes_every_unsafe_character() -> None:
    text = script_json(["<>&\u2028\u2029\x00\x1f\x7f\x80\x9f\ud800\udfff", {"</script>": "<!--"}])
    assert text == ('["\\u003c\\u003e\\u0026\\u2028\\u2029\\u0000\\u001f\\u007f\\u0080\\u009f\\ud800\\udfff",'
                    '{"\\u003c/script\\u003e":"\\u003c!--"}]')
    for value in INJECTION_CORPUS:
        text = script_json({value: [value]})
        assert not re.search("[<>&\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]", text), repr(value[:40])
        assert json.loads(text) == {value: [value]}  # lone surrogates come back as the same lone surrogates


def test_injection_corpus_cannot_break_the_page() -> None:
    """In Python: one page per corpus string and one with them all."""
    page_tags = {"!DOCTYPE", "html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "p", "code",
                 "main", "div", "span", "b", "section", "svg", "text", "rect", "line", "table", "thead", "tbody", "tr",
                 "th", "td", "script"}
    for summary in [injection_summary([text]) for text in INJECTION_CORPUS] + [injection_summary()]:
        name = ascii(summary["top_fingerprints"][0]["fingerprint"][:60])
        html = render_report(summary)
        html.encode("utf-8")  # no lone surrogate reached the page
        assert RAW_CONTROL.search(html) is None, name
        data = embedded_json(html)
        assert "\u2028" not in data and "\u2029" not in data, name
        # one script element, closed once; no comment opener anywhere (in text it is &lt;!--, in JSON \u003c!--)
        assert len(re.findall("<script", html, re.I)) == 1 and len(re.findall("</script", html, re.I)) == 1, name
        assert html.index("</script>") == html.index(SUMMARY_OPEN) + len(SUMMARY_OPEN) + len(data), name
        assert "<!--" not in html and "]]>" not in html, name
        assert json.loads(data) == summary, name  # lone surrogates: "\ud800" loads as the same lone surrogate
        # the server-rendered text is escaped: no tag but the page's own
        assert set(re.findall(r"<([a-zA-Z!][a-zA-Z0-9]*)", html)) <= page_tags, name


# A probe appended to the page for the test (the page itself has no script): it parses the embedded JSON as the
# browser sees it and writes, on <body>, a digest of the parsed value and of every table cell's text. A digest
# names each string's length and FNV-1a hash over its UTF-16 code units, so exact values are compared.
PROBE = """<script>
(function () {
  function h(s) {
    var x = 0x811c9dc5;
    for (var i = 0; i < s.length; i++) { x = Math.imul(x ^ s.charCodeAt(i), 16777619) >>> 0; }
    return "s" + s.length + ":" + x.toString(16);
  }
  function d(v) {
    if (v === null) return "n";
    if (typeof v === "boolean") return v ? "t" : "f";
    if (typeof v === "number") return "d" + String(v);
    if (typeof v === "string") return h(v);
    if (Array.isArray(v)) return "[" + v.map(d).join(",") + "]";
    return "{" + Object.keys(v).sort().map(function (k) { return h(k) + "=" + d(v[k]); }).join(",") + "}";
  }
  var body = document.body;
  try {
    var value = JSON.parse(document.getElementById("summary-data").textContent);
    body.setAttribute("data-digest", d(value));
    var prints = value.top_fingerprints;
    body.setAttribute("data-example-error", h(prints[prints.length > 4 ? 4 : 0].example_error));
    var cells = document.querySelectorAll("td");
    body.setAttribute("data-cells", d(Array.prototype.map.call(cells, function (td) { return td.textContent; })));
    body.setAttribute("data-scripts", String(document.scripts.length));
    body.setAttribute("data-parsed", "ok");
  } catch (e) { body.setAttribute("data-parsed", "error " + e.name); }
})();
</script>"""


def _h(text: str) -> str:
    units = text.encode("utf-16-le", "surrogatepass")
    x = 0x811C9DC5
    for i in range(0, len(units), 2):
        x = ((x ^ int.from_bytes(units[i:i + 2], "little")) * 16777619) & 0xFFFFFFFF
    return f"s{len(units) // 2}:{x:x}"


def _digest(value: Any) -> str:
    """The probe's digest, in Python (keys ordered by UTF-16 code units, as JavaScript's ``sort()`` does)."""
    if value is None:
        return "n"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return f"d{value}"
    if isinstance(value, str):
        return _h(value)
    if isinstance(value, list):
        return "[" + ",".join(_digest(item) for item in value) + "]"
    keys = sorted(value, key=lambda key: key.encode("utf-16-be", "surrogatepass"))
    return "{" + ",".join(f"{_h(key)}={_digest(value[key])}" for key in keys) + "}"


def _shown(text: str) -> str:
    """What a table cell shows for ``text``: C0 controls (not tab, newline) as Control Pictures, DEL as ␡, C1
    controls and lone surrogates as U+FFFD."""
    def one(char: str) -> str:
        code = ord(char)
        if char in "\t\n" or 0x9F < code < 0xD800 or code > 0xDFFF or 0x1F < code < 0x7F:
            return char
        return chr(0x2400 + code) if code < 0x20 else "\u2421" if code == 0x7F else "\ufffd"
    return "".join(one(char) for char in text)


def _cells(summary: dict[str, Any]) -> list[str]:
    """The text of every table cell, in page order, as the page shows it."""
    rows = [[f["fingerprint"], f"{f['count']:,}", f["exception_type"], f["error_pattern"], f["example_error"],
             ", ".join(f["reasons"])] for f in summary["top_fingerprints"]]
    rows += [[g["reason"], g["urn"], g["original_queue"], f"{g['count']:,}"] for g in summary["by_reason_urn_queue"]]
    return [_shown(cell) for row in rows for cell in row]


# Loads each page in an iframe (srcdoc: parsed by the same HTML parser, same origin as this page), then copies
# what each page's probe found onto <div class="result"> elements and drops the frames (the DOM dump stays small).
HARNESS = """<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{frames}<script>
window.addEventListener("load", function () {{
  Array.prototype.forEach.call(document.querySelectorAll("iframe"), function (frame, i) {{
    var doc = frame.contentDocument, out = document.createElement("div");
    out.className = "result";
    out.setAttribute("data-page", String(i));
    Array.prototype.forEach.call(doc.body.attributes, function (a) {{ out.setAttribute(a.name, a.value); }});
    if (doc.documentElement.hasAttribute("data-pwned")) out.setAttribute("data-pwned", "yes");
    document.body.appendChild(out);
    frame.remove();
  }});
  document.body.setAttribute("data-harness", "done");
}});
</script></body></html>"""


def test_injection_corpus_parses_in_chromium(tmp_path: Path) -> None:
    """The real check, with Chromium's HTML tokenizer (its script-data-escaped states) and ``JSON.parse``: one page
    per corpus string (one string alone must not break its page; together, a ``-->`` could hide what a ``<!--``
    did) and one with the whole corpus. Each page's probe must run and see exactly the summary and the cells."""
    summaries = [injection_summary([text]) for text in INJECTION_CORPUS] + [injection_summary()]
    pages = []
    for summary in summaries:
        html = render_report(summary)
        assert html.count("</body></html>") == 1
        pages.append(html.replace("</body></html>", PROBE + "</body></html>"))
    harness = tmp_path / "harness.html"
    harness.write_text(HARNESS.format(frames="".join(f'<iframe srcdoc="{escape(page, quote=True)}"></iframe>'
                                                     for page in pages)), encoding="utf-8")

    done = chromium(harness, "--dump-dom", "--virtual-time-budget=5000")
    assert done.returncode == 0, done.stderr[-2000:]
    assert console_errors(done.stderr) == []
    assert 'data-harness="done"' in done.stdout, done.stdout[-2000:]
    results = [dict(re.findall(r'([a-z-]+)="([^"]*)"', tag)) for tag in re.findall(r'<div class="result"[^>]*>',
                                                                                     done.stdout)]
    assert [int(r["data-page"]) for r in results] == list(range(len(summaries)))
    for result, summary in zip(results, summaries, strict=True):
        text = summary["top_fingerprints"][0]["fingerprint"]
        assert result.get("data-parsed") == "ok", (ascii(text[:60]), result)
        assert "data-pwned" not in result, ascii(text[:60])  # no payload ran
        assert result["data-scripts"] == "2", ascii(text[:60])  # the summary and the probe: nothing injected
        assert result["data-digest"] == _digest(summary), ascii(text[:60])
        assert result["data-cells"] == _digest(_cells(summary)), ascii(text[:60])
    whole = summaries[-1]
    assert results[-1]["data-example-error"] == _h(whole["top_fingerprints"][4]["example_error"]) == _h(
        INJECTION_CORPUS[0])

    page = tmp_path / "report_injection.html"
    page.write_text(pages[-1], encoding="utf-8")
    shot = Path(os.environ.get("BABELQUEUE_INJECTION_SCREENSHOT") or tmp_path / "report_injection.png")
    done = chromium(page, f"--screenshot={shot}", "--window-size=1280,1600")
    assert done.returncode == 0 and console_errors(done.stderr) == [], done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unreadable_lines_are_named_on_the_page() -> None:
    summary = injection_summary(["x"])
    summary["totals"] = {**summary["totals"], "unreadable": 4}
    summary["unreadable_by_cause"] = {"torn": 1, "too_large": 0, "unknown_version": 3}
    page = render_report(summary)
    assert '<strong class="alert">4 unreadable</strong> (torn 1, unknown_version 3)' in page
    del summary["totals"]["unreadable"]
    assert "unreadable</strong>" not in render_report(summary)
