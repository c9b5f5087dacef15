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

The bounds, above the baseline, sit between the measured figures and what one more copy of the body would cost:
Redis 2x (about 1.15x: the body, read in slices, and the slices; the dead letter is sent in parts), SQLite 2.5x
(2.00x: SQLite works in the process, and stamping the reservation and copying the row to the dead-letter table
each read the payload and build a new record) and PostgreSQL 0.5x (about 0.2 MB: the refused body never leaves
the server). docs/benchmarks.md has the 100 MB figures and where the memory goes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.benchmark_modules import load_benchmark

BODY_BYTES = 40_000_000
BOUNDS = {"redis": 2.0, "sqlite": 2.5, "postgresql": 0.5}  # peak - baseline <= bound x body

pytestmark = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self")


def _bench() -> Any:
    return load_benchmark("bench_body_limit")


@pytest.mark.parametrize("kind", ["redis", "sqlite", "postgresql"])
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
    assert ratio <= BOUNDS[kind], (
        f"{kind}: refusing a {body / 1e6:.0f} MB body raised the peak resident set by {result['delta'] / 1e6:.0f} MB "
        f"= {ratio:.2f}x the body (bound {BOUNDS[kind]}x; orjson.loads of it alone: {reference:.2f}x)")
