"""Hostile dead-letter bodies: one corpus for every reader that must agree with the core on what is poison.

``BODIES`` is a list of ``(name, bytes)``: the exact stored bytes of each case. The core's verdict on a body is
whether ``core.frames.open_body`` (``core.envelope.decode`` for a bare body) raises; :func:`core_refuses` gives it.
Names are unique; most cases are a valid annotated envelope with one thing changed, so the change alone decides.
Nothing here needs Spark.
"""

from __future__ import annotations

import codecs

from airflow_provider_babelqueue.core.errors import EnvelopeDecodeError
from airflow_provider_babelqueue.core.frames import open_body

__all__ = ["BODIES", "META_ID", "SPARK_DISAGREES", "core_refuses", "envelope"]


#: The ``meta.id`` :func:`envelope` writes unless told; each case of :data:`BODIES` gets its own
#: (``hostile-<name>``), so a reader that deduplicates by ``meta.id`` keeps every case.
META_ID = "9d0c2a34-62a5-4f61-8a0e-2b6f7e3f0a11"


def envelope(attempts: str = "3", data: str = '{"order_id":1042}', error: str = '"timeout"', head: str = "",
             tail: str = "", meta_id: str = META_ID) -> bytes:
    """A valid annotated envelope's text, with raw JSON text put in for ``attempts``, ``data`` and ``error``
    (so a case can hold what no JSON writer would write), and ``head``/``tail`` around the object."""
    return (head + '{"job":"urn:babel:orders:created","trace_id":"0b7e5b8e-36a4-4a8e-9a49-3f0d0c4d3f10",'
            f'"data":{data},"meta":{{"id":"{meta_id}","queue":"orders","lang":"php",'
            f'"schema_version":1,"created_at":1749132727000}},"attempts":{attempts},"dead_letter":{{"reason":"failed",'
            f'"error":{error},"exception":"App\\\\Exceptions\\\\GatewayTimeout","failed_at":1749132730000,'
            f'"original_queue":"orders","attempts":{attempts},"lang":"php"}}}}' + tail).encode("utf-8")


def _nested(depth: int) -> str:
    """``data`` holding arrays nested so that the whole body is ``depth`` levels deep (the envelope is one)."""
    inner = depth - 1
    return "[" * inner + "]" * inner


BODIES: list[tuple[str, bytes]] = [
    ("valid", envelope()),
    # NUL and other control characters: escaped they are text, raw they are not JSON
    ("nul-escaped", envelope(error='"a\\u0000b"')),
    ("nul-raw", envelope(error='"a\x00b"')),
    ("control-raw", envelope(error='"a\x1fb"')),
    # integers: the contract's signed 64-bit range, in the envelope's own fields and deep in data
    ("attempts-2^31", envelope(attempts=str(2**31))),
    ("attempts-2^63-1", envelope(attempts=str(2**63 - 1))),
    ("attempts-2^63", envelope(attempts=str(2**63))),
    ("attempts--1", envelope(attempts="-1")),
    ("attempts--2^63", envelope(attempts=str(-(2**63)))),
    ("attempts--2^63-1", envelope(attempts=str(-(2**63) - 1))),
    ("attempts-10^30", envelope(attempts=str(10**30))),
    ("data-2^63", envelope(data=f'{{"n":{2**63}}}')),
    ("data-2^64-in-array", envelope(data=f'{{"n":[1,{2**64}]}}')),
    ("data-2^63-as-string", envelope(data=f'{{"n":"{2**63}"}}')),
    ("data-400-digits", envelope(data='{"n":' + "9" * 400 + "}")),
    # floats: doubles by contract; out of range is refused, underflow is zero
    ("nan", envelope(data='{"x":NaN}')),
    ("infinity", envelope(data='{"x":Infinity}')),
    ("minus-infinity", envelope(attempts="-Infinity")),
    ("1e400", envelope(data='{"x":1e400}')),
    ("-1.5E+400", envelope(data='{"x":[-1.5E+400]}')),
    ("big-mantissa-float", envelope(data='{"x":' + "9" * 400 + ".5}")),
    ("1e308", envelope(data='{"x":1e308}')),
    ("1e-400", envelope(data='{"x":1e-400}')),
    ("long-fraction", envelope(data='{"x":0.' + "0" * 1500 + "1}")),
    ("1e400-in-string", envelope(data='{"x":"1e400"}')),
    # where a number literal stands: after whitespace, and text in a string that looks like one
    ("1e400-after-whitespace", envelope(data='{"x": \n\t1e400}')),
    ("2^64-after-whitespace-in-array", envelope(data=f'{{"n":[ 1,\r\n {2**64}]}}')),
    ("1e400-after-colon-in-string", envelope(data='{"x":"limit: 1e400"}')),
    ("2^64-after-colon-in-string", envelope(error=f'"card: {2**64}"')),
    ("hex-id-exponent-look", envelope(data='{"ref":"0b7e5e123a4a"}')),
    # text
    ("invalid-utf8", envelope().replace(b'"timeout"', b'"time\xff\xfeout"')),
    ("lone-high-surrogate", envelope(error='"\\ud800"')),
    ("lone-low-surrogate", envelope(error='"\\uDC00x"')),
    ("reversed-surrogates", envelope(error='"\\udc00\\ud800"')),
    ("surrogate-pair", envelope(error='"\\ud83d\\ude00"')),
    ("escaped-backslash-then-ud800", envelope(error='"\\\\ud800"')),
    ("lone-surrogate-in-key", envelope(data='{"\\ud800":1}')),
    ("bom-prefix", codecs.BOM_UTF8 + envelope()),
    ("bom-after-space", b" " + codecs.BOM_UTF8 + envelope()),
    ("single-quotes", envelope(error="'timeout'")),
    ("leading-zero", envelope(attempts="03")),
    ("comment", envelope(data='{"a":1/* no */}')),
    # structure
    ("nesting-1001", envelope(data=_nested(1001))),
    ("nesting-1024", envelope(data=_nested(1024))),
    ("nesting-1024-unknown-key", envelope().replace(b'"attempts":3,', ('"x":' + _nested(1024) + ',"attempts":3,')
                                                                   .encode(), 1)),
    ("nesting-1025", envelope(data=_nested(1025))),
    ("nesting-10000", envelope(data=_nested(10_000))),
    ("duplicate-keys", envelope(data='{"a":1,"a":2}')),
    ("duplicate-envelope-key", envelope().replace(b'"job":', b'"job":"urn:babel:orders:first","job":', 1)),
    ("top-level-array", b"[" + envelope() + b"]"),
    ("top-level-string", b'"urn:babel:orders:created"'),
    ("top-level-number", b"42"),
    ("top-level-null", b"null"),
    ("top-level-true", b"true"),
    ("empty", b""),
    ("whitespace-only", b" \t\r\n "),
    ("surrounding-whitespace", envelope(head=" \n", tail="\r\n\t ")),
    ("trailing-garbage", envelope(tail=" xyz")),
    ("trailing-brace", envelope(tail="}")),
    ("trailing-bracket", envelope(tail="]")),
    ("trailing-comma", envelope(tail=",")),
    ("trailing-object", envelope(tail=' {"job":"x"}')),
    ("trailing-comma-object-bracket", envelope(tail=',{"a":1}]')),
    # closes an array around the body early, then carries on as JSON an object around it would take
    ("trailing-bracket-then-key", envelope(tail='],"w":[1')),
    ("trailing-nul", envelope(tail="\x00")),
    ("truncated", envelope()[:-1]),
    ("long-key", envelope(data='{"' + "k" * 60_000 + '":1}')),
]

BODIES = [(name, body.replace(META_ID.encode(), f"hostile-{name}".encode())) for name, body in BODIES]

#: The cases where Spark's parser cannot give the core's verdict, and what it gives (poison or not), with why:
#: Spark reads these bodies as poison though the core decodes them.
SPARK_DISAGREES: dict[str, str] = {
    # Spark copies a field it reads as text (data) with a JSON writer whose nesting limit (Jackson's
    # StreamWriteConstraints.maxNestingDepth, 1,000) no Spark option raises; the core's parser goes to 1,024
    "nesting-1024": "a field read as text nested deeper than 1,000 levels",
    # Jackson's StreamReadConstraints.maxNameLength (50,000 characters): no Spark option raises it
    "long-key": "an object key longer than 50,000 characters",
}


def core_refuses(body: bytes) -> bool:
    """The core's verdict: ``True`` when ``open_body`` (``decode``, and a frame's inner envelope) raises."""
    try:
        open_body(body)
    except EnvelopeDecodeError:
        return True
    return False
