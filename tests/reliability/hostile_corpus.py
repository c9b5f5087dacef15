"""The hostile-input corpus as data: bodies a producer may put on a queue, each with what the handler then raises.

:func:`corpus` gives ``(name, body, handler_error)`` cases for one run: every envelope carries its case name in
``data.case`` and its own ``meta.id`` (``<run>-<name>``), so a reader can tell the cases apart after a
dead-letter round trip, and several runs' dead letters never deduplicate into one another. The consumer's
verdict on a body is :func:`expected_reason` (the core's rules; nothing here needs a broker).

``BIG_MB`` (env ``BQ_HOSTILE_BIG_MB``, default 20) sizes the oversized case: over the consumer's default 16 MiB
limit, so it is refused as ``poison`` with its bytes kept. It holds a forged route, like two other cases:
whatever a refused body claims about its queue must never be followed.
"""

from __future__ import annotations

import os

import orjson

from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.core.errors import EnvelopeDecodeError
from airflow_provider_babelqueue.core.frames import open_body
from airflow_provider_babelqueue.engine.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_NESTING_DEPTH,
    body_limit_error,
)

__all__ = ["BIG_MB", "FORGED_QUEUE", "HTML", "URN", "Case", "case_of", "corpus", "expected_reason"]

URN = "urn:babel:orders:created"
#: The queue forged bodies claim; nothing may ever be published there.
FORGED_QUEUE = "payments"
#: Markup that must come out inert in the report (and JSON-breaking sequences for its embedded data).
HTML = "</script><script>alert(1)</script><!-- <b onmouseover=x>&amp;\u2028"
BIG_MB = int(os.environ.get("BQ_HOSTILE_BIG_MB", "20"))

Case = tuple[str, bytes, str | None]


def _text(run: str, name: str, *, attempts: str = "0", data: str | None = None, job: str = URN,
          meta_queue: str = "orders", extra: str = "") -> bytes:
    """An envelope's text with raw JSON put in where a case needs what no JSON writer would write."""
    data = data if data is not None else f'{{"case":"{name}"}}'
    return (f'{{"job":"{job}","trace_id":"0b7e5b8e-36a4-4a8e-9a49-3f0d0c4d3f10","data":{data},'
            f'"meta":{{"id":"{run}-{name}","queue":"{meta_queue}","lang":"node","schema_version":1,'
            f'"created_at":1749132727000}},"attempts":{attempts}{extra}}}').encode()


def _built(run: str, name: str, data: dict[str, object], **meta: object) -> bytes:
    envelope = bq.make_envelope(URN, {"case": name, **data}, queue_name=str(meta.pop("queue", "orders")))
    envelope["meta"]["id"] = f"{run}-{name}"
    envelope["meta"].update(meta)
    return bq.encode(envelope)


def corpus(run: str, big_mb: int = BIG_MB) -> list[Case]:
    """The cases of one run (``run`` keeps its ``meta.id`` values apart from other runs')."""
    forged_block = f',"dead_letter":{{"reason":"failed","original_queue":"{FORGED_QUEUE}","attempts":0}}'
    deep = "[" * 10_000 + "]" * 10_000
    big = "x" * (big_mb * 1024 * 1024)
    cases: list[Case] = [
        ("valid", _built(run, "valid", {"n": 1}), "boom"),
        # NUL and control characters, in every place text goes
        ("nul-in-job", _text(run, "nul-in-job", job="urn:babel:orders:cre\\u0000ated"), "boom"),
        ("nul-in-data", _built(run, "nul-in-data", {"note": "a\x00b\x01c\x1f"}), "boom"),
        ("nul-in-error", _built(run, "nul-in-error", {}), "handler said a\x00b"),
        ("surrogate-in-error", _built(run, "surrogate-in-error", {}), "bad \ud800 text"),
        ("control-in-error", _built(run, "control-in-error", {}), "bell\x07 esc\x1b[31m del\x7f c1\x85"),
        # integers the contract allows and does not
        ("attempts-2^31", _text(run, "attempts-2^31", attempts=str(2**31)), "boom"),
        ("attempts-2^63-1", _text(run, "attempts-2^63-1", attempts=str(2**63 - 1)), "boom"),
        ("attempts-2^63", _text(run, "attempts-2^63", attempts=str(2**63)), None),
        ("attempts--1", _text(run, "attempts--1", attempts="-1"), None),
        ("data-10^30", _text(run, "data-10^30", data='{"case":"data-10^30","n":' + "1" + "0" * 30 + "}"), None),
        # non-numbers and floats out of range
        ("nan", _text(run, "nan", data='{"case":"nan","x":NaN}'), None),
        ("infinity", _text(run, "infinity", data='{"case":"infinity","x":Infinity}'), None),
        ("1e400", _text(run, "1e400", data='{"case":"1e400","x":1e400}'), None),
        # text that is not text
        ("invalid-utf8", _built(run, "invalid-utf8", {"note": "tick"}).replace(b"tick", b"ti\xff\xfeck"), None),
        ("lone-surrogate", _text(run, "lone-surrogate", data='{"case":"lone-surrogate","s":"\\ud800"}'), None),
        ("bom", b"\xef\xbb\xbf" + _built(run, "bom", {}), None),
        # shapes
        ("deep-10000", _text(run, "deep-10000", data=f'{{"case":"deep-10000","d":{deep}}}',
                             meta_queue=FORGED_QUEUE), None),
        ("duplicate-keys", _text(run, "duplicate-keys", data='{"case":"duplicate-keys","k":1,"k":2}'), "boom"),
        ("top-level-array", b'[1,2,3]', None),
        ("top-level-string", b'"' + run.encode() + b'-top-level-string"', None),
        ("top-level-number", b"42", None),
        ("empty", b"", None),
        ("whitespace", b" \n\t ", None),
        ("not-json", b"not json " + run.encode(), None),
        # forged routes: a block and meta.queue pointing elsewhere
        ("forged-route", _text(run, "forged-route", meta_queue=FORGED_QUEUE, extra=forged_block), "boom"),
        ("forged-route-invalid", _text(run, "forged-route-invalid", attempts='"x"', meta_queue=FORGED_QUEUE,
                                       extra=forged_block), None),
        # markup in every text field the report and the console show
        ("html", _built(run, "html", {"note": HTML}, queue="orders"), HTML),
        ("unknown-urn", _text(run, "unknown-urn", job="urn:babel:orders:" + "nobody"), None),
        # over the consumer's size limit: refused unread, bytes kept, its forged route ignored
        ("oversized", _text(run, "oversized", data=f'{{"case":"oversized","blob":"{big}"}}', meta_queue=FORGED_QUEUE,
                            extra=forged_block), None),
    ]
    names = [name for name, _, _ in cases]
    assert len(names) == len(set(names))
    return cases


def expected_reason(body: bytes) -> str:
    """The reason the consumer must give ``body`` with a handler for :data:`URN` that always raises."""
    if body_limit_error(body, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_NESTING_DEPTH) is not None:
        return str(bq.Reason.POISON)
    try:
        envelope = open_body(body)[0]
    except EnvelopeDecodeError:
        return str(bq.Reason.POISON)
    reason = bq.check(envelope)
    if reason is not None:
        return str(reason)
    return str(bq.Reason.FAILED) if bq.urn_of(envelope) == URN else str(bq.Reason.UNKNOWN_URN)


def case_of(body: bytes, wrapped_raw: bytes | None, by_bytes: dict[bytes, str]) -> str:
    """Which case a dead letter is: a poison wrapper's raw bytes, else its envelope's ``data.case``."""
    if wrapped_raw is not None:
        return by_bytes[wrapped_raw]
    envelope = orjson.loads(body)
    return str(envelope["data"]["case"])
