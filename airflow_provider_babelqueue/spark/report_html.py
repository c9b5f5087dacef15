"""Render the triage summary (``summary.json``) as one self-contained HTML page.

Pure Python, no pyspark: inline CSS and server-drawn inline SVG charts; no script, font, image or style is
loaded from anywhere, so the page works offline and behind any proxy. The summary is also embedded as JSON
(``<script type="application/json" id="summary-data">``, written by :func:`script_json`).

Every string in the summary can come from a dead letter (error text, queue name, URN, error pattern ...), so
nothing from it reaches the page unescaped: text goes through :func:`_text`, the embedded JSON through
:func:`script_json`.
"""

from __future__ import annotations

import datetime
import json
import re
from html import escape
from typing import Any

__all__ = ["render_report", "script_json"]

_PALETTE = {"failed": "#d9534f", "unknown_urn": "#f0ad4e", "poison": "#6f42c1", "unsupported_schema_version": "#5bc0de"}
_DEFAULT_COLOR = "#4a7bd0"

_CSS = """
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:#1f2733;background:#f4f6fa}header{background:#1f2a44;color:#fff;padding:18px 28px}
header h1{margin:0;font-size:20px}header p{margin:4px 0 0;color:#c5cde0;font-size:13px}
main{padding:20px 28px;display:grid;gap:18px;grid-template-columns:repeat(2,minmax(0,1fr))}
section{background:#fff;border:1px solid #dde3ee;border-radius:8px;padding:14px 16px}
section.wide{grid-column:1/-1}h2{margin:0 0 10px;font-size:15px}
.cards{display:grid;grid-template-columns:repeat(6,minmax(0,1fr));gap:12px}
.card{background:#fff;border:1px solid #dde3ee;border-radius:8px;padding:12px 14px}
.card b{display:block;font-size:24px}.card span{color:#5b6577;font-size:12px;text-transform:uppercase}
.card.alert b,strong.alert{color:#b02a37}table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #edf0f5;vertical-align:top}
th{color:#5b6577;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#f1f3f8;padding:1px 4px;border-radius:3px;
word-break:break-word}header code{background:#2e3b5c;color:#e6ebf5}
svg text{font:11px system-ui,sans-serif;fill:#3d4758}.muted{color:#8a93a3}
td{overflow-wrap:anywhere}code{unicode-bidi:isolate}
"""

# In the JSON text these characters can only be inside strings, where a \uXXXX escape means the same.
_SCRIPT_UNSAFE = re.compile("[<>&\u0000-\u001f\u007f-\u009f\u2028\u2029\ud800-\udfff]")
# In the page's text: C0 controls but tab and newline, DEL, C1 controls, lone surrogates.
_TEXT_UNSAFE = re.compile("[\u0000-\u0008\u000b-\u001f\u007f-\u009f\ud800-\udfff]")


def script_json(value: Any) -> str:
    """``value`` as JSON text that is safe as the content of an HTML ``<script>`` element.

    Inside ``<script>`` the HTML tokenizer does not know JSON: ``</script`` ends the element, ``<!--`` enters the
    "script data escaped" state and a ``<script`` after it the "double escaped" one, where ``</script>`` no
    longer ends the element, which then swallows the rest of the page (escaping only ``</`` does not help). So
    ``<``, ``>`` and ``&`` are written as ``\\u003c``, ``\\u003e``, ``\\u0026``; U+2028 and U+2029 (line
    terminators in older JavaScript), every control character (U+0000–U+001F, U+007F–U+009F) and lone
    surrogates (which cannot be encoded as UTF-8) as ``\\uXXXX`` too. In JSON text these characters can only
    occur inside strings, where the escape means the same character, so ``JSON.parse`` and ``json.loads``
    return exactly ``value``. The result is pure JSON (no HTML entities) and contains no raw control character.
    """
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return _SCRIPT_UNSAFE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def _visible(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # the Control Pictures block: ␀ ␁ … ␟
    if code == 0x7F:
        return "\u2421"  # ␡
    return "\ufffd"  # C1 controls and lone surrogates


def _text(value: Any) -> str:
    """``value`` as HTML text (also safe in a quoted attribute): HTML-escaped, and the characters that have no
    place in a page (controls other than tab and newline, lone surrogates) shown as visible stand-ins (C0 as
    their Control Pictures symbol, DEL as ␡, the rest as U+FFFD); ``summary.json`` keeps the exact text."""
    return _TEXT_UNSAFE.sub(lambda match: _visible(match.group()), escape(str(value)))


def _num(value: int | float) -> str:
    return f"{value:,}"


def _iso(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return "—"
    return datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _hbar_chart(items: list[tuple[str, int]], chart_id: str, colors: dict[str, str] | None = None) -> str:
    """A horizontal bar chart: one labelled bar per item."""
    if not items:
        return '<p class="muted">No data.</p>'
    top = max(count for _, count in items) or 1
    label_w, bar_w, row_h = 190, 330, 26
    height = row_h * len(items) + 6
    parts = [f'<svg id="{chart_id}" class="chart" role="img" width="100%" viewBox="0 0 {label_w + bar_w + 70} '
             f'{height}" xmlns="http://www.w3.org/2000/svg">']
    for index, (label, count) in enumerate(items):
        y = index * row_h + 4
        width = max(2, round(bar_w * count / top))
        color = (colors or {}).get(label, _DEFAULT_COLOR)
        parts.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end">{_text(label[:32])}</text>'
                     f'<rect class="bar" x="{label_w}" y="{y}" width="{width}" height="{row_h - 8}" rx="3" '
                     f'fill="{color}"><title>{_text(label)}: {_num(count)}</title></rect>'
                     f'<text x="{label_w + width + 6}" y="{y + 15}">{_num(count)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _time_chart(points: list[dict[str, Any]], chart_id: str) -> str:
    """Dead letters per hour (by ``dead_letter.failed_at``): bars on a time axis."""
    if not points:
        return '<p class="muted">No dead letter carries a failed_at.</p>'
    width, height, left, bottom, top_pad = 900, 220, 50, 30, 10
    plot_w, plot_h = width - left - 10, height - bottom - top_pad
    top = max(p["count"] for p in points) or 1
    step = plot_w / len(points)
    parts = [f'<svg id="{chart_id}" class="chart" role="img" width="100%" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg">',
             f'<line x1="{left}" y1="{top_pad + plot_h}" x2="{width - 10}" y2="{top_pad + plot_h}" stroke="#9aa3b2"/>',
             f'<text x="{left - 6}" y="{top_pad + 8}" text-anchor="end">{_num(top)}</text>',
             f'<text x="{left - 6}" y="{top_pad + plot_h}" text-anchor="end">0</text>']
    for index, point in enumerate(points):
        h = plot_h * point["count"] / top
        x = left + index * step
        bar = min(max(step * 0.8, 1), 40)
        parts.append(f'<rect class="bar" x="{x + (step - bar) / 2:.1f}" y="{top_pad + plot_h - h:.1f}" '
                     f'width="{bar:.1f}" height="{h:.1f}" fill="#4a7bd0">'
                     f'<title>{_text(point["hour"])}: {_num(point["count"])}</title></rect>')
    labels = min(len(points), 6)
    for k in range(labels):
        index = round(k * (len(points) - 1) / max(labels - 1, 1))
        x = left + (index + 0.5) * step
        parts.append(f'<text x="{x:.1f}" y="{height - 10}" text-anchor="middle">'
                     f'{_text(points[index]["hour"][5:16].replace("T", " "))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(headers: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    head = "".join(f"<th>{_text(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="n">{cell}</td>' if i in numeric else f"<td>{cell}</td>"
                                    for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_report(summary: dict[str, Any]) -> str:
    """The report page for a summary produced by ``report.py``."""
    totals = summary["totals"]
    reasons = sorted(summary["by_reason"].items(), key=lambda item: (-item[1], item[0]))
    cards = [("Dead letters", totals["dead_letters"], False), ("Poison", totals["poison"], totals["poison"] > 0),
             ("Duplicates removed", totals["duplicates_removed"], False), ("URNs", totals["urns"], False),
             ("Queues", totals["queues"], False), ("Error fingerprints", totals["fingerprints"], False)]
    card_html = "".join(f'<div class="card{" alert" if alert else ""}"><span>{_text(label)}</span>'
                        f"<b>{_num(value)}</b></div>" for label, value, alert in cards)
    fingerprints = [[f"<code>{_text(f['fingerprint'])}</code>", _num(f["count"]), _text(f["exception_type"] or "—"),
                     f"<code>{_text(f['error_pattern'] or '')}</code>", _text(f["example_error"] or ""),
                     _text(", ".join(f["reasons"]))] for f in summary["top_fingerprints"]]
    groups = [[_text(g["reason"]), _text(g["urn"] or "—"), _text(g["original_queue"] or "—"), _num(g["count"])]
              for g in summary["by_reason_urn_queue"][:50]]
    ages = [(bucket["bucket"], bucket["count"]) for bucket in summary["age_buckets"]]
    langs = sorted(summary["by_lang"].items(), key=lambda item: (-item[1], item[0]))
    span = f"failed between {_iso(totals['first_failed_at'])} and {_iso(totals['last_failed_at'])}"
    unreadable = int(totals.get("unreadable") or 0)
    if unreadable:  # lines triage could not read: never silent (the causes are in summary.json too)
        causes = ", ".join(f"{_text(cause)} {_num(count)}" for cause, count in
                           sorted((summary.get("unreadable_by_cause") or {}).items()) if count)
        span += f'; <strong class="alert">{_num(unreadable)} unreadable</strong> ({causes})'
    carried = summary.get("carried_over") or {}
    if carried.get("files"):  # drain files an earlier run left for triage: say so, they are not today's
        span += (f"; {_num(int(carried.get('records') or 0))} of the drain records come from "
                 f"{_num(int(carried['files']))} file(s) left by earlier runs whose triage did not finish")
    data = script_json(summary)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>BabelQueue dead-letter report</title><style>{_CSS}</style></head>
<body><header><h1>BabelQueue dead-letter report</h1>
<p>{_num(totals["dead_letters"])} distinct dead letters from {_num(totals["records"])} drain records; {span}.
Input: <code>{_text(str(summary.get("input", "")))}</code></p></header>
<main><div class="cards wide" style="grid-column:1/-1">{card_html}</div>
<section><h2>Dead letters by reason</h2>{_hbar_chart(reasons, "chart-reasons", _PALETTE)}</section>
<section><h2>Age when it failed (failed_at − created_at)</h2>{_hbar_chart(ages, "chart-ages")}</section>
<section class="wide"><h2>Dead letters per hour (failed_at, UTC)</h2>{_time_chart(summary["hourly"], "chart-hourly")}
</section>
<section class="wide"><h2>Top error fingerprints</h2>
{_table(["Fingerprint", "Count", "Exception", "Pattern", "Example error", "Reasons"], fingerprints, {1})}</section>
<section><h2>By reason × URN × original queue</h2>{_table(["Reason", "URN", "Queue", "Count"], groups, {3})}</section>
<section><h2>Producer languages</h2>{_hbar_chart(langs, "chart-langs")}</section>
</main><script type="application/json" id="summary-data">{data}</script></body></html>
"""
