"""Body limits bound memory (issue #29 point 6): refusing an oversized body must not cost several times its size.

The consumer refuses a body over ``max_body_bytes`` (16 MiB by default) as ``poison`` without decoding it
(``Binding.decode_limit``), and the dead letter keeps the exact bytes. This runs the benchmark's own case
(``benchmarks/bench_body_limit.py``, ``make bench-body-limit``) at a CI size: one 40 MB envelope per binding, each
in a fresh child process, which publishes it, measures the resident set's high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``) above the baseline while ``Consumer(...).run(max_messages=1)`` refuses it, then checks
that it was dead-lettered as ``poison``, that the DLQ holds the exact bytes (Redis: the poison wrapper's ``raw``;
SQL: the ``payload`` column) and that the ready queue is empty.

40 MB rather than less: above glibc's largest dynamic mmap threshold (32 MiB), every buffer of the body's size is
its own mapping and leaves the resident set when freed, as at the benchmark's 100 MB, so no freed heap hides a copy.

The bound is generous, 4x the body: the body itself once, the dead letter's bytes once, and room for a driver's
transient copies. Redis and PostgreSQL are above it today (about 9x, see docs/benchmarks.md for where it goes):
they are strict xfails, so the day a fix brings them under the bound the marker has to go.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BODY_BYTES = 40_000_000
BOUND = 4.0  # peak - baseline <= BOUND x body

pytestmark = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self")


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_body_limit", ROOT / "benchmarks" / "bench_body_limit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_body_limit", module)
    spec.loader.exec_module(module)
    return module


OVER_BOUND = {
    "redis": "about 9x: hiredis.pack_command copies the settle script's arguments (the reservation's raw value and "
             "the poison wrapper, 2x the body) three times over, the hiredis reader keeps its reply buffer, and "
             "wrap_raw holds a str of the body beside its output (docs/benchmarks.md)",
    "postgresql": "about 9x: psycopg2 sends the bytea as a hex literal inside the INSERT's text (2x the body, held "
                  "as the escaped value, the query and libpq's output buffer), and the SELECT's result arrives as "
                  "hex too (docs/benchmarks.md)",
}


@pytest.mark.parametrize("kind", [
    pytest.param(kind, marks=pytest.mark.xfail(strict=True, reason=OVER_BOUND[kind]) if kind in OVER_BOUND else ())
    for kind in ("redis", "sqlite", "postgresql")
])
def test_refusing_an_oversized_body_costs_about_its_size(kind: str) -> None:
    result = _bench().run_case(kind, BODY_BYTES, timeout=300)
    body = result["body_bytes"]
    # the child asserted these already; repeated so a failure here names them
    assert abs(body - BODY_BYTES) < 1000
    assert result["dead_lettered"] == {"poison": 1}
    assert result["exact_bytes"] is True
    assert result["ready_depth"] == 0
    ratio = result["delta"] / body
    reference = result["reference_delta"] / body
    assert ratio <= BOUND, (
        f"{kind}: refusing a {body / 1e6:.0f} MB body raised the peak resident set by {result['delta'] / 1e6:.0f} MB "
        f"= {ratio:.2f}x the body (bound {BOUND}x; orjson.loads of it alone: {reference:.2f}x)")
